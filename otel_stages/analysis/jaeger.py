"""Read traces from Jaeger's HTTP query API (Jaeger v1 query service and Jaeger v2 alike).

Wire format (the JSON the Jaeger UI uses, ``GET /api/traces``)::

    {"data": [{"traceID": "<hex>", "spans": [{"traceID", "spanID", "operationName",
               "references": [{"refType": "CHILD_OF", "traceID", "spanID"}],
               "startTime": <int µs since epoch>, "duration": <int µs>,
               "tags": [{"key", "type": "string|bool|int64|float64|binary", "value"}],
               "logs": [...], "processID": "p1", "warnings": null}],
               "processes": {"p1": {"serviceName": "...", "tags": [...]}}, "warnings": null}],
     "total": 0, "limit": 0, "offset": 0, "errors": null}

Jaeger keeps **microseconds**: ``startTime`` is µs since the Unix epoch and ``duration`` µs, each
truncated from the nanoseconds the OTLP span carried. This module converts with integer math:
``start_ns = startTime * 1000`` and ``end_ns = (startTime + duration) * 1000``.

Raw times: the query service *adjusts* traces by default (clock-skew correction moves child spans
into their parent when hosts differ; other adjusters dedupe and sort). ``raw=true`` turns that off,
but Jaeger v1 and early v2 honor it only on ``GET /api/traces/{traceID}``; their search endpoint
always adjusts. So :func:`fetch_jaeger` searches only to learn trace ids and then re-reads every
trace with ``/api/traces/{id}?raw=true``, which returns stored times on every version.

Translation back to the OTLP model: ``serviceName`` and the process tags become the span's
resource; the tags the OTLP->Jaeger translator adds (``span.kind``, ``otel.scope.*``,
``otel.status_*``, ``error``...) are dropped from the attributes, ``error=true`` or
``otel.status_code=ERROR`` set :attr:`Span.error`; the parent is the ``CHILD_OF`` reference in the
same trace.

This module also holds the small HTTP helpers :class:`SourceError` and :func:`get_json` that the
Tempo and Prometheus readers share.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from otel_stages import semconv
from otel_stages.analysis.model import AttributeValue, Span, Telemetry

#: Seconds to wait for connect / each read before giving up on a request.
DEFAULT_TIMEOUT_S = 30.0
#: Traces asked for when no ``--limit`` is given (Jaeger's own default search depth is 100).
DEFAULT_LIMIT = 100
#: Traces re-read in parallel (each is one small GET).
FETCH_WORKERS = 8
#: Characters of an error response body quoted in a :class:`SourceError`.
_BODY_SNIPPET = 300

#: Tags the OTLP->Jaeger translator adds; they are span fields in OTLP, not attributes.
TRANSLATOR_TAGS = frozenset(
    {
        "span.kind",
        "otel.scope.name",
        "otel.scope.version",
        "otel.library.name",
        "otel.library.version",
        "otel.status_code",
        "otel.status_description",
        "error",
        "w3c.tracestate",
        "internal.span.format",
    }
)


class SourceError(Exception):
    """A remote source could not be read. The message names the URL and what went wrong
    (unreachable, timeout, HTTP status with the server's own error text, not JSON); ``status`` is
    the HTTP status when the server answered with an error, else ``None``."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# --- shared HTTP helper ------------------------------------------------------------------------


def http_client(timeout_s: float = DEFAULT_TIMEOUT_S):
    """An ``httpx.Client`` with ``timeout_s`` and ``Accept: application/json`` (Tempo would
    otherwise be free to answer in protobuf). The caller closes it (use it as a context manager)."""
    import httpx  # only the remote sources need it

    return httpx.Client(
        timeout=httpx.Timeout(timeout_s),
        headers={"Accept": "application/json", "User-Agent": "otel-stages"},
        follow_redirects=True,
    )


def get_json(client: Any, url: str, params: Mapping[str, Any] | None = None) -> Any:
    """``GET url`` with ``params`` and return the decoded JSON body.

    Raises :class:`SourceError` naming the full URL (query string included) when the server cannot
    be reached, does not answer within the client's timeout, answers with a status other than
    200 (the message quotes the server's error text: Prometheus ``error``, Jaeger ``errors[].msg``,
    or the start of the body), or answers with something that is not JSON.
    """
    import httpx

    try:
        response = client.get(url, params=params)
    except httpx.TimeoutException as exc:
        raise SourceError(f"GET {_full_url(url, params)}: no answer in time ({exc})") from None
    except httpx.HTTPError as exc:
        raise SourceError(f"GET {_full_url(url, params)}: cannot connect ({exc})") from None
    where = str(response.request.url)
    if response.status_code != 200:
        raise SourceError(
            f"GET {where}: HTTP {response.status_code} {response.reason_phrase}"
            f"{_error_text(response.text)}",
            status=response.status_code,
        )
    try:
        return response.json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise SourceError(f"GET {where}: the answer is not JSON ({exc})") from None


def _full_url(url: str, params: Mapping[str, Any] | None) -> str:
    if not params:
        return url
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
    return f"{url}?{query}"


def _error_text(body: str) -> str:
    """The server's own error message, if the body says one."""
    text = body.strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, Mapping):
        if isinstance(doc.get("error"), str):  # Prometheus
            return f": {doc.get('errorType', 'error')}: {doc['error']}"
        errors = doc.get("errors")
        if isinstance(errors, list) and errors:  # Jaeger
            msgs = [str(e.get("msg", e)) if isinstance(e, Mapping) else str(e) for e in errors]
            return ": " + "; ".join(msgs)
    if not text:
        return ""
    return ": " + (text[:_BODY_SNIPPET] + ("..." if len(text) > _BODY_SNIPPET else ""))


# --- pure parsing ------------------------------------------------------------------------------


def decode_tags(tags: Any) -> dict[str, AttributeValue]:
    """Jaeger ``[{"key", "type", "value"}]`` -> dict. ``int64`` -> int, ``float64`` -> float,
    ``bool`` -> bool, ``string``/``binary`` -> str (numbers sent as strings are converted).
    ``None`` gives ``{}``. Raises ``ValueError`` for an entry without a key."""
    if tags is None:
        return {}
    if not isinstance(tags, list):
        raise ValueError("tags is not a list")
    out: dict[str, AttributeValue] = {}
    for tag in tags:
        if not isinstance(tag, Mapping) or not isinstance(tag.get("key"), str):
            raise ValueError(f"tag without a key: {tag!r}")
        kind = str(tag.get("type", "string")).lower()
        value = tag.get("value")
        if kind == "int64":
            value = int(value)
        elif kind == "float64":
            value = float(value)
        elif kind == "bool":
            value = value if isinstance(value, bool) else str(value).lower() == "true"
        elif value is not None:
            value = str(value)
        out[tag["key"]] = value
    return out


def _hex_id(raw: Any, n_bytes: int) -> str | None:
    """Jaeger prints ids as hex without leading zeros for 64-bit trace ids; pad to full width."""
    if raw is None or raw == "":
        return None
    text = str(raw).strip().lower()
    if len(text) > 2 * n_bytes or not all(c in "0123456789abcdef" for c in text):
        raise ValueError(f"id {raw!r} is not hex of at most {n_bytes} bytes")
    text = text.rjust(2 * n_bytes, "0")
    return None if set(text) == {"0"} else text


def _parent(span: Mapping[str, Any], trace_id: str) -> str | None:
    for ref in span.get("references") or []:
        if not isinstance(ref, Mapping) or str(ref.get("refType", "")).upper() != "CHILD_OF":
            continue
        ref_trace = _hex_id(ref.get("traceID"), 16) or trace_id
        if ref_trace == trace_id:
            return _hex_id(ref.get("spanID"), 8)
    return _hex_id(span.get("parentSpanID"), 8)  # deprecated field, still sent by some versions


def _resource(process: Any) -> dict[str, AttributeValue]:
    if not isinstance(process, Mapping):
        return {}
    resource = decode_tags(process.get("tags"))
    if process.get("serviceName"):
        resource[semconv.SERVICE_NAME] = str(process["serviceName"])
    return resource


def parse_jaeger_span(raw: Any, processes: Mapping[str, Any] | None = None) -> Span:
    """One Jaeger span -> :class:`Span` (µs -> ns with integer math). ``processes`` is the trace's
    ``processes`` map for ``processID``; an inline ``process`` object wins. Raises ``ValueError``
    for a span without ids, name or integer times."""
    if not isinstance(raw, Mapping):
        raise ValueError("span is not an object")
    trace_id = _hex_id(raw.get("traceID"), 16)
    span_id = _hex_id(raw.get("spanID"), 8)
    if trace_id is None or span_id is None:
        raise ValueError("missing traceID or spanID")
    name = raw.get("operationName")
    if not isinstance(name, str) or not name:
        raise ValueError("missing operationName")
    start_us, duration_us = raw.get("startTime"), raw.get("duration")
    if not isinstance(start_us, int) or isinstance(start_us, bool):
        raise ValueError(f"startTime is not integer microseconds ({start_us!r})")
    if not isinstance(duration_us, int) or isinstance(duration_us, bool) or duration_us < 0:
        raise ValueError(f"duration is not non-negative integer microseconds ({duration_us!r})")
    tags = decode_tags(raw.get("tags"))
    error = tags.get("error") is True or tags.get("otel.status_code") == "ERROR"
    process = raw.get("process") or (processes or {}).get(str(raw.get("processID")))
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=_parent(raw, trace_id),
        name=name,
        start_ns=start_us * 1000,
        end_ns=(start_us + duration_us) * 1000,
        attributes={k: v for k, v in tags.items() if k not in TRANSLATOR_TAGS},
        resource=_resource(process),
        error=error,
    )


def parse_jaeger_response(doc: Any, *, where: str = "jaeger") -> Telemetry:
    """A Jaeger ``{"data": [trace, ...]}`` response (search or get-trace) -> :class:`Telemetry`.

    Pure. A malformed trace or span becomes a ``problems`` message prefixed with ``where``; the
    ``errors`` list of the response and span/trace ``warnings`` (e.g. clock-skew notes) are
    reported as problems too.
    """
    out = Telemetry()
    if not isinstance(doc, Mapping) or not isinstance(doc.get("data"), list):
        out.problems.append(f"{where}: not a Jaeger API response (no 'data' list)")
        return out
    for err in doc.get("errors") or []:
        msg = err.get("msg") if isinstance(err, Mapping) else err
        tid = err.get("traceID") if isinstance(err, Mapping) else None
        out.problems.append(f"{where}: {msg}" + (f" (trace {tid})" if tid else ""))
    for i, trace in enumerate(doc["data"]):
        if not isinstance(trace, Mapping):
            out.problems.append(f"{where}: data[{i}] is not a trace object")
            continue
        processes = trace.get("processes") if isinstance(trace.get("processes"), Mapping) else {}
        label = f"{where}: trace {trace.get('traceID', i)}"
        for warning in trace.get("warnings") or []:
            out.problems.append(f"{label}: {warning}")
        for j, raw in enumerate(trace.get("spans") or []):
            try:
                out.spans.append(parse_jaeger_span(raw, processes))
            except (ValueError, TypeError, AttributeError) as exc:
                out.problems.append(f"{label}: span {j}: {exc}")
                continue
            for warning in raw.get("warnings") or []:
                out.problems.append(f"{label}: span {raw.get('spanID')}: {warning}")
    return out


# --- fetching ----------------------------------------------------------------------------------


def search_params(service: str, start_us: int, end_us: int, limit: int) -> dict[str, str]:
    """Query parameters of ``GET /api/traces``: ``start``/``end`` in µs since the epoch."""
    return {
        "service": service,
        "start": str(start_us),
        "end": str(end_us),
        "limit": str(limit),
        "raw": "true",  # honored by recent Jaeger v2 search; harmless elsewhere
    }


def fetch_jaeger(
    base_url: str,
    service: str,
    *,
    start_ns: int,
    end_ns: int,
    limit: int = DEFAULT_LIMIT,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Telemetry:
    """Traces of ``service`` that started in ``[start_ns, end_ns]`` (ns since the epoch, sent as
    µs), at most ``limit`` (the most recent ones; Jaeger has no paging), with raw span times.

    Raises :class:`SourceError` when the search fails. A trace that vanished between search and
    read (HTTP 404) is a problem, not an error. Reaching ``limit`` adds a problem saying so.
    """
    root = base_url.rstrip("/")
    with http_client(timeout_s) as client:
        found = get_json(
            client,
            f"{root}/api/traces",
            search_params(service, start_ns // 1000, end_ns // 1000, limit),
        )
        if not isinstance(found, Mapping) or not isinstance(found.get("data"), list):
            raise SourceError(f"GET {root}/api/traces: not a Jaeger API response (no 'data' list)")
        ids = list(
            dict.fromkeys(
                str(t["traceID"])
                for t in found["data"]
                if isinstance(t, Mapping) and t.get("traceID")
            )
        )

        def read(trace_id: str) -> Telemetry:
            url = f"{root}/api/traces/{quote(trace_id, safe='')}"
            try:
                doc = get_json(client, url, {"raw": "true"})
            except SourceError as exc:
                if exc.status != 404:
                    raise
                return Telemetry(problems=[f"jaeger: trace {trace_id} not found any more ({exc})"])
            return parse_jaeger_response(doc, where=f"jaeger {trace_id}")

        out = Telemetry()
        with ThreadPoolExecutor(max_workers=FETCH_WORKERS) as pool:
            for part in pool.map(read, ids):
                out.extend(part)
    if len(ids) >= limit:
        out.problems.append(
            f"jaeger: the search returned the limit of {limit} traces; older ones in the window"
            " were left out (raise --limit or shorten --since)"
        )
    return out
