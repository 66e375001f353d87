"""Read traces from Grafana Tempo's HTTP API: a TraceQL search, then each trace by id.

Search, ``GET /api/search?q=<TraceQL>&start=<s>&end=<s>&limit=<n>`` (times in **seconds** since the
epoch)::

    {"traces": [{"traceID": "7a1d2dd4deaf177e0acf55b3c49032", "rootServiceName": "...",
                 "rootTraceName": "...", "startTimeUnixNano": "...", "durationMs": 6,
                 "spanSet": {...}, "spanSets": [...]}], "metrics": {...}}

(``traceID`` is hex and may lack leading zeros.) Trace by id, ``GET /api/traces/<traceID>``, is
OTLP/JSON as written by a protobuf JSON marshaler, wrapped in ``batches``::

    {"batches": [{"resource": {"attributes": [...]},
                  "scopeSpans": [{"scope": {...}, "spans": [{"traceId": "<base64>",
                      "spanId": "<base64>", "parentSpanId": "<base64>", "name": "...",
                      "kind": "SPAN_KIND_INTERNAL", "startTimeUnixNano": "<ns>",
                      "endTimeUnixNano": "<ns>", "attributes": [...], "status": {}}]}]}]}

Tempo 1.x writes ``instrumentationLibrarySpans`` / ``instrumentationLibrary`` instead of
``scopeSpans`` / ``scope``; the v2 endpoint (``/api/v2/traces/<id>``) wraps the same data as
``{"trace": {"resourceSpans": [...]}, "status": ...}``. :func:`parse_tempo_trace` reads all three
shapes and hands them to the OTLP/JSON parser (:func:`otel_stages.analysis.otlp_json.
parse_export_request`, which reads the pre-1.0 names too), which decodes base64 or hex ids and
keeps nanosecond times as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from otel_stages.analysis.http_source import (
    DEFAULT_TIMEOUT_S,
    SourceError,
    get_json,
    http_client,
    read_traces,
)
from otel_stages.analysis.jaeger import DEFAULT_LIMIT
from otel_stages.analysis.model import Recording
from otel_stages.analysis.otlp_json import parse_export_request


def parse_tempo_trace(doc: Any, *, where: str = "tempo") -> Recording:
    """A Tempo trace-by-id response (v1 ``batches``, v2 ``trace``, or plain ``resourceSpans``) ->
    :class:`Recording`. Pure; malformed parts become ``problems`` prefixed with ``where``, as
    does a v2 ``status`` other than complete (``PARTIAL``: the trace was cut by a size limit)."""
    if not isinstance(doc, Mapping):
        return Recording(problems=[f"{where}: expected a JSON object, got {type(doc).__name__}"])
    problems: list[str] = []
    body: Any = doc
    if isinstance(doc.get("trace"), Mapping):  # /api/v2/traces/<id>
        status = str(doc.get("status", "") or "")
        if status and status.upper() not in ("COMPLETE", "0"):
            problems.append(f"{where}: Tempo says the trace is {status}: {doc.get('message', '')}")
        body = doc["trace"]
    batches = body.get("batches", body.get("resourceSpans"))
    if batches is None:
        if not body:  # Tempo answers {} for a trace it has no spans of
            return Recording(problems=[*problems, f"{where}: empty trace"])
        keys = ", ".join(sorted(map(str, body))[:5])
        return Recording(problems=[*problems, f"{where}: not a Tempo trace (keys: {keys})"])
    if not isinstance(batches, list):
        return Recording(problems=[*problems, f"{where}: batches is not a list"])
    out = parse_export_request({"resourceSpans": batches}, where=where)
    out.problems[:0] = problems
    return out


def search_params(query: str, start_s: int, end_s: int, limit: int) -> dict[str, str]:
    """Query parameters of ``GET /api/search`` (``start``/``end`` in seconds since the epoch)."""
    return {"q": query, "start": str(start_s), "end": str(end_s), "limit": str(limit)}


def trace_ids(found: Any) -> list[str]:
    """Trace ids of a ``/api/search`` response, in order, without duplicates. Raises
    ``ValueError`` when the response has no ``traces`` list."""
    if not isinstance(found, Mapping) or not isinstance(found.get("traces", []), list):
        raise ValueError("not a Tempo search response (no 'traces' list)")
    ids = (t.get("traceID") for t in found.get("traces") or [] if isinstance(t, Mapping))
    return list(dict.fromkeys(str(i) for i in ids if i))


def fetch_tempo(
    base_url: str,
    query: str,
    *,
    start_ns: int,
    end_ns: int,
    limit: int = DEFAULT_LIMIT,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_trace: Callable[[int, int], None] | None = None,
) -> Recording:
    """Traces matching the TraceQL ``query`` in ``[start_ns, end_ns]`` (ns since the epoch, sent
    as whole seconds, widened to cover the window), at most ``limit``, each read in full.

    Raises :class:`SourceError` when the search fails, or when every trace read fails. One trace
    that cannot be read (gone since the search: 404; above Tempo's size limit: 422) is a problem
    and the rest is reported (:func:`~otel_stages.analysis.http_source.read_traces`). Reaching
    ``limit`` adds a problem saying so. ``on_trace(done, total)``: called after each trace read.
    """
    root = base_url.rstrip("/")
    start_s, end_s = start_ns // 1_000_000_000, -(-end_ns // 1_000_000_000)
    with http_client(timeout_s) as client:
        found = get_json(client, f"{root}/api/search", search_params(query, start_s, end_s, limit))
        try:
            ids = trace_ids(found)
        except ValueError as exc:
            raise SourceError(f"GET {root}/api/search: {exc}") from None

        return read_traces(client, root, ids,
                           lambda doc, where: parse_tempo_trace(doc, where=where),
                           source="tempo", limit=limit, on_trace=on_trace)
