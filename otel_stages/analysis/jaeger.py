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
same trace, else the first ``FOLLOWS_FROM`` reference in the same trace (kept as the parent, with
:attr:`Span.parent_follows_from` set: Jaeger's UI nests such a span under its reference too,
``getTraceSpanIdsAsTree`` in jaeger-ui takes ``references[0]`` of either kind, so a ``forward``
span that follows from its request belongs to that request rather than becoming a request of its
own). ``logs`` become :attr:`Span.events`: the ``event`` field names the event (the OTLP->Jaeger
translator writes the OTLP event name there), the other fields are its attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.http_source import (
    DEFAULT_TIMEOUT_S,
    SourceError,
    get_json,
    http_client,
    read_traces,
)
from otel_stages.analysis.model import AttributeValue, Recording, Span, SpanEvent

#: Traces asked for when no ``--limit`` is given (Jaeger's own default search depth is 100).
DEFAULT_LIMIT = 100

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
        value: Any = tag.get("value")
        if kind in ("int64", "float64") and value is None:
            raise ValueError(f"tag {tag['key']!r} of type {kind} has no value")
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


def _parent(span: Mapping[str, Any], trace_id: str) -> tuple[str | None, bool]:
    """(parent span id, whether the relation is FOLLOWS_FROM): a ``CHILD_OF`` reference in the
    same trace wins, then the first same-trace ``FOLLOWS_FROM``, then ``parentSpanID``."""
    follows: str | None = None
    for ref in span.get("references") or []:
        if not isinstance(ref, Mapping):
            continue
        kind = str(ref.get("refType", "")).upper()
        if kind not in ("CHILD_OF", "FOLLOWS_FROM"):
            continue
        ref_trace = _hex_id(ref.get("traceID"), 16) or trace_id
        if ref_trace != trace_id:
            continue  # a link into another trace is not a parent
        ref_span = _hex_id(ref.get("spanID"), 8)
        if kind == "CHILD_OF" and ref_span is not None:
            return ref_span, False
        if follows is None:
            follows = ref_span
    if follows is not None:
        return follows, True
    return _hex_id(span.get("parentSpanID"), 8), False  # deprecated field, still sent by some


def _events(logs: Any) -> tuple[SpanEvent, ...]:
    """Jaeger ``logs`` (``[{"timestamp": µs, "fields": [tags]}]``) -> events in time order."""
    if not logs:
        return ()
    if not isinstance(logs, list):
        raise ValueError("logs is not a list")
    events = []
    for log in logs:
        if not isinstance(log, Mapping):
            raise ValueError(f"log entry is not an object: {log!r}")
        ts = log.get("timestamp")
        if not isinstance(ts, int) or isinstance(ts, bool):
            raise ValueError(f"log timestamp is not integer microseconds ({ts!r})")
        fields = decode_tags(log.get("fields"))
        name = fields.pop("event", None)
        events.append(SpanEvent(name=str(name or ""), time_ns=ts * 1000, attributes=fields))
    events.sort(key=lambda e: e.time_ns)
    return tuple(events)


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
    parent, follows_from = _parent(raw, trace_id)
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        name=name,
        start_ns=start_us * 1000,
        end_ns=(start_us + duration_us) * 1000,
        attributes={k: v for k, v in tags.items() if k not in TRANSLATOR_TAGS},
        resource=_resource(process),
        error=error,
        events=_events(raw.get("logs")),
        parent_follows_from=follows_from,
    )


def parse_jaeger_response(doc: Any, *, where: str = "jaeger") -> Recording:
    """A Jaeger ``{"data": [trace, ...]}`` response (search or get-trace) -> :class:`Recording`.

    Pure. A malformed trace or span becomes a ``problems`` message prefixed with ``where``; the
    ``errors`` list of the response and span/trace ``warnings`` (e.g. clock-skew notes) are
    reported as problems too.
    """
    out = Recording()
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
    on_trace: Callable[[int, int], None] | None = None,
) -> Recording:
    """Traces of ``service`` that started in ``[start_ns, end_ns]`` (ns since the epoch, sent as
    µs), at most ``limit`` (the most recent ones; Jaeger has no paging), with raw span times.

    Raises :class:`SourceError` when the search fails, or when every trace read fails. One trace
    that cannot be read (vanished since the search: 404; a storage error on that trace: 5xx) is a
    problem, not an error, and the rest is reported. Reaching ``limit`` adds a problem saying so.
    ``on_trace(done, total)``: called after each trace read.
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

        return read_traces(client, root, ids,
                           lambda doc, where: parse_jaeger_response(doc, where=where),
                           source="jaeger", limit=limit, on_trace=on_trace, params={"raw": "true"})
