"""One JSON log line per finished request, built from spans as they end (an SDK span processor).

The line carries what an on-call engineer greps for::

    {"request.id": "9f..", "trace_id": "4bf9..", "request.seq": 7, "request.cold_start": false,
     "image.size": 948123, "image.width": 1920, "image.height": 1080,
     "stages_ms": {"download": 3.1, "decode": 18.2, "resize": 4.0, "queue": 0.4, "forward": 95.3},
     "total_ms": 121.9, "error": null}

``request.id`` is the trace id when none was given. The line is written through :mod:`logging`
(logger ``otel_stages.requests``, level INFO) as the JSON text, so any handler or log shipper
takes it. Off by default (``OTEL_STAGES_LOG_REQUESTS``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

from otel_stages import semconv

REQUEST_LOGGER = logging.getLogger("otel_stages.requests")

#: Bound on requests with finished stages but no finished request span yet (e.g. stages under a
#: parent that is not a request): the oldest are dropped so memory stays flat.
MAX_PENDING_REQUESTS = 10_000

_IMAGE_KEYS = (semconv.IMAGE_SIZE, semconv.IMAGE_WIDTH, semconv.IMAGE_HEIGHT)


class RequestLogProcessor(SpanProcessor):
    """Accumulates stage spans by parent span id; logs one line when the request span ends.

    A request span is recognised by its ``request.seq`` attribute (set by
    :func:`otel_stages.request`). Thread-safe: spans may end on any thread.
    """

    def __init__(self, logger: logging.Logger = REQUEST_LOGGER) -> None:
        self._logger = logger
        self._pending: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        attrs = span.attributes or {}
        if semconv.REQUEST_SEQ in attrs:
            with self._lock:
                entry = self._pending.pop(span.context.span_id, None)
            self._emit(span, entry or {"stages_ms": {}})
            return
        if span.parent is None or span.start_time is None or span.end_time is None:
            return
        with self._lock:
            entry = self._pending.get(span.parent.span_id)
            if entry is None:
                entry = self._pending[span.parent.span_id] = {"stages_ms": {}}
                if len(self._pending) > MAX_PENDING_REQUESTS:
                    self._pending.popitem(last=False)
            stages = entry["stages_ms"]
            stages[span.name] = stages.get(span.name, 0.0) + (span.end_time - span.start_time) / 1e6
            for key in _IMAGE_KEYS:
                if key in attrs:
                    entry[key] = attrs[key]

    def _emit(self, span: ReadableSpan, entry: dict[str, Any]) -> None:
        attrs = span.attributes or {}
        total_ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
        trace_id = format(span.context.trace_id, "032x")
        line = {
            semconv.REQUEST_ID: attrs.get(semconv.REQUEST_ID, trace_id),
            "trace_id": trace_id,
            semconv.REQUEST_SEQ: attrs.get(semconv.REQUEST_SEQ),
            semconv.REQUEST_COLD_START: attrs.get(semconv.REQUEST_COLD_START),
            **{k: entry.get(k, attrs.get(k)) for k in _IMAGE_KEYS},
            "stages_ms": {k: round(v, 3) for k, v in entry["stages_ms"].items()},
            "total_ms": round(total_ms, 3),
            "error": span.status.description if span.status.status_code is StatusCode.ERROR else None,
        }
        self._logger.info(json.dumps(line, separators=(",", ":")))

    def shutdown(self) -> None:
        with self._lock:
            self._pending.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
