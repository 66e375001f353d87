"""The embedded span file: OTLP/JSON lines, encoded without the official exporter's per-span cost.

:class:`JsonLinesSpanExporter` writes exactly the bytes the official
``opentelemetry-exporter-otlp-json-file`` ``FileSpanExporter`` (0.66b1, pinned in pyproject)
writes for the same spans: one ``ExportTraceServiceRequest`` per line, compact separators,
``json.dumps`` defaults (ASCII escapes, ``NaN``/``Infinity`` as strings for doubles). It skips two
costs of the official path, measured in ``benchmarks/exporter.py``:

* the official encoder groups spans by ``Resource`` in a dict, and ``Resource.__hash__``
  serialises every resource attribute to JSON: once per span. Here spans are grouped by the
  resource *object* first and equal resources merged after (same groups, same order);
* it builds a generated dataclass per message and then converts each to a dict; here the dicts
  are built directly, with the same keys in the same order and the same fields left out.

Sources the layout follows, field by field: ``opentelemetry/exporter/otlp/json/common/_internal/
trace_encoder/__init__.py`` and ``_internal/__init__.py`` (what is encoded, grouping, order),
``opentelemetry/proto_json/trace/v1/trace.py`` and ``common/v1/common.py`` (each message's
``to_dict``: lowerCamelCase keys, which falsy fields are omitted, int64 as strings, ids as hex),
``opentelemetry/exporter/otlp/json/file/_internal.py`` (one ``json.dumps(entry,
separators=(",", ":"))`` plus newline per batch, flushed). ``tests/test_json_lines.py`` compares
both exporters byte for byte on the same spans. This module imports the SDK (setup side).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

import orjson
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

logger = logging.getLogger("otel_stages")

_HAS_IS_REMOTE = 256  # SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = 512  # SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
#: API SpanKind -> OTLP Span.SpanKind number (the official ``_SPAN_KIND_MAP``)
_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4,
         SpanKind.CONSUMER: 5}


def _value(value: Any) -> dict[str, Any]:
    """``AnyValue.to_dict()`` for one attribute value (the official ``_encode_value`` order)."""
    kind = type(value)
    if kind is str:
        return {"stringValue": value}
    if kind is int:
        return {"intValue": str(value)}
    if kind is float:
        return {"doubleValue": _double(value)}
    if kind is bool:
        return {"boolValue": value}
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": _double(value)}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("utf-8") if value else ""}
    if isinstance(value, Sequence):
        values = [_value(v) for v in value]
        return {"arrayValue": {"values": values} if values else {}}
    if isinstance(value, Mapping):
        pairs = [_key_value(str(k), v) for k, v in value.items()]
        return {"kvlistValue": {"values": pairs} if pairs else {}}
    raise TypeError(f"Invalid type {type(value)} of value {value}")


class _Double(float):
    """A finite double attribute value that orjson would write differently from ``json.dumps``.
    orjson does not serialise float subclasses itself: it asks :func:`_orjson_default`, which
    writes ``float.__repr__``, as ``json.dumps`` does."""

    __slots__ = ()


#: From this magnitude up (and for zero) orjson writes a double exactly as ``float.__repr__``
#: does: both give the shortest round-trip digits, and ``repr`` switches to an exponent only below
#: 1e-4 (``9.99e-05`` where orjson writes ``0.0000999``) and from 1e16 up, where both write
#: ``1e+16``. :data:`_NATIVE_FLOATS` checks this once per process on values around each boundary
#: (a future orjson could format differently); ``tests/test_json_lines.py`` on random doubles.
_REPR_FIXED_MIN = 1e-4
_FLOAT_PROBES = (0.0, -0.0, 1e-4, -1e-4, 0.00010000000000000002, 0.1, 1 / 3, 2.5, 123.456,
                 1e15 + 0.5, 9999999999999998.0, 1e16, 1.2345e17, 1e22, 1.7976931348623157e308)


def _orjson_writes_repr(values: Sequence[float]) -> bool:
    return all(orjson.dumps(v) == float.__repr__(v).encode() for v in values)


_NATIVE_FLOATS = _orjson_writes_repr(_FLOAT_PROBES)


def _double(value: float) -> float | str:
    if _NATIVE_FLOATS and (value == 0.0 or _REPR_FIXED_MIN <= abs(value) < math.inf):
        return value  # the common case: orjson's own format is json.dumps' here
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return _Double(value)


def _orjson_default(value: Any) -> Any:
    if isinstance(value, float):
        return orjson.Fragment(float.__repr__(value).encode())
    raise TypeError(f"cannot encode {type(value).__name__}")  # not built by this module


def _key_value(key: str, value: Any) -> dict[str, Any]:
    encoded = _value(value)
    return {"key": key, "value": encoded} if key else {"value": encoded}


def _attributes(attributes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The official ``_encode_attributes``: a value that cannot be encoded is logged and left out."""
    if attributes is None:
        return []
    # BoundedAttributes keeps a plain dict in ``_dict``; iterating it directly skips the
    # Mapping protocol's per-key Python calls (SDK pinned in pyproject).
    items = getattr(attributes, "_dict", attributes)
    out = []
    for key, value in items.items():
        kind = type(value)  # the common exact types first, as _value would encode them
        if kind is str:
            encoded: dict[str, Any] = {"stringValue": value}
        elif kind is int:
            encoded = {"intValue": str(value)}
        elif kind is bool:
            encoded = {"boolValue": value}
        else:
            try:
                encoded = _value(value)
            except Exception as error:
                logger.exception("Failed to encode key %s: %s", key, error)
                continue
        out.append({"key": key, "value": encoded} if key else {"value": encoded})
    return out


def _flags(context: Any) -> int:
    return _HAS_IS_REMOTE | _IS_REMOTE if context is not None and context.is_remote else _HAS_IS_REMOTE


def _span(span: ReadableSpan) -> dict[str, Any]:
    # ReadableSpan's fields are read directly: its properties cost a Python call each and
    # copy events and links (SDK pinned in pyproject; tests/test_json_lines.py compares the
    # output with the official encoder's).
    ctx = span._context
    out: dict[str, Any] = {
        "traceId": f"{ctx.trace_id if ctx else 0:032x}",
        "spanId": f"{ctx.span_id if ctx else 0:016x}",
    }
    state = ctx.trace_state if ctx else None
    if state:
        out["traceState"] = ",".join([f"{key}={value}" for key, value in state.items()])
    parent = span._parent
    if parent:
        out["parentSpanId"] = f"{parent.span_id:016x}"
        out["flags"] = _HAS_IS_REMOTE | _IS_REMOTE if parent.is_remote else _HAS_IS_REMOTE
    else:
        out["flags"] = _HAS_IS_REMOTE
    if span._name:
        out["name"] = span._name
    out["kind"] = _KIND[span._kind]
    if span._start_time:
        out["startTimeUnixNano"] = str(span._start_time)
    if span._end_time:
        out["endTimeUnixNano"] = str(span._end_time)
    attributes = span._attributes
    if attributes:
        encoded = _attributes(attributes)
        if encoded:
            out["attributes"] = encoded
        dropped = getattr(attributes, "dropped", 0)  # BoundedAttributes only, as the property
        if dropped and isinstance(attributes, BoundedAttributes):
            out["droppedAttributesCount"] = dropped
    events = span._events
    if events:
        out["events"] = [_event(event) for event in events]
    if span.dropped_events:
        out["droppedEventsCount"] = span.dropped_events
    links = span._links
    if links:
        out["links"] = [_link(link) for link in links]
    if span.dropped_links:
        out["droppedLinksCount"] = span.dropped_links
    status = span._status
    code = status.status_code.value
    description = status.description
    if description:
        out["status"] = {"message": description, "code": code} if code else {"message": description}
    else:
        out["status"] = {"code": code} if code else {}
    return out


def _event(event: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if event.timestamp:
        out["timeUnixNano"] = str(event.timestamp)
    if event.name:
        out["name"] = event.name
    attributes = _attributes(event.attributes)
    if attributes:
        out["attributes"] = attributes
    if event.dropped_attributes:
        out["droppedAttributesCount"] = event.dropped_attributes
    return out


def _link(link: Any) -> dict[str, Any]:
    ctx = link.context
    out: dict[str, Any] = {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}"}
    attributes = _attributes(link.attributes)
    if attributes:
        out["attributes"] = attributes
    if link.dropped_attributes:
        out["droppedAttributesCount"] = link.dropped_attributes
    out["flags"] = _flags(ctx)
    return out


def _scope(scope: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if scope is None:
        return out
    if scope.name:
        out["name"] = scope.name
    if scope.version:
        out["version"] = scope.version
    attributes = _attributes(scope.attributes)
    if attributes:
        out["attributes"] = attributes
    return out


def encode_spans(spans: Sequence[ReadableSpan]) -> dict[str, Any] | None:
    """One ``ExportTraceServiceRequest`` as the dict the official encoder's ``to_dict()`` gives
    (``None`` for no spans: the official exporter then writes nothing)."""
    # Group by resource, then scope, in order of first appearance. Resources are compared by
    # identity first (one provider: one object) and merged by equality, as the official dict
    # keyed by Resource does, without hashing every span's resource.
    by_object: dict[int, dict[Any, list[dict[str, Any]]]] = {}
    groups: list[tuple[Any, dict[Any, list[dict[str, Any]]]]] = []
    for span in spans:
        resource = span.resource
        scopes = by_object.get(id(resource))
        if scopes is None:
            for known, known_scopes in groups:
                if known == resource:
                    scopes = known_scopes
                    break
            else:
                scopes = {}
                groups.append((resource, scopes))
            by_object[id(resource)] = scopes
        scope = span.instrumentation_scope or None
        encoded = scopes.get(scope)
        if encoded is None:
            encoded = scopes[scope] = []
        encoded.append(_span(span))
    if not groups:
        return None
    resource_spans = []
    for resource, scopes in groups:
        scope_spans = []
        for scope, encoded in scopes.items():
            block: dict[str, Any] = {"scope": _scope(scope), "spans": encoded}
            if scope is not None and scope.schema_url:
                block["schemaUrl"] = scope.schema_url
            scope_spans.append(block)
        resource_block: dict[str, Any] = {}
        attributes = _attributes(resource.attributes)
        resource_block["resource"] = {"attributes": attributes} if attributes else {}
        resource_block["scopeSpans"] = scope_spans
        if resource.schema_url:
            resource_block["schemaUrl"] = resource.schema_url
        resource_spans.append(resource_block)
    return {"resourceSpans": resource_spans}


def encode_line(spans: Sequence[ReadableSpan]) -> bytes | None:
    """The line (UTF-8, with its newline) the official file exporter writes for ``spans``, or
    ``None`` when there are none.

    Serialised by orjson (about 15x faster than ``json.dumps`` here) when that gives the same
    bytes: pure ASCII without DEL. ``json.dumps`` escapes every other character (``ensure_ascii``)
    and orjson cannot (or refuses lone surrogates), so such batches go through ``json.dumps``."""
    request = encode_spans(spans)
    if request is None:
        return None
    try:
        out = orjson.dumps(request, default=_orjson_default, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:
        out = b""  # e.g. a lone surrogate in a string: json.dumps escapes it
    if out.isascii() and b"\x7f" not in out and out:
        return out
    return (json.dumps(request, separators=(",", ":")) + "\n").encode("utf-8")


class JsonLinesSpanExporter(SpanExporter):
    """Appends one OTLP/JSON ``ExportTraceServiceRequest`` line per batch to ``path`` (UTF-8),
    flushed after each batch: a drop-in for the official ``FileSpanExporter(path)`` with the same
    output (module docstring). Thread-safe: one lock around each write. ``export`` returns
    ``FAILURE`` (and logs) when writing fails or after :meth:`shutdown`. Raises ``OSError`` when
    ``path`` cannot be opened for appending.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path
        self._stream: IO[bytes] = open(path, "ab")  # noqa: SIM115 - closed in shutdown()
        self._lock = threading.Lock()
        self._shutdown = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            logger.warning("otel_stages span file: exporter already shut down, batch not written")
            return SpanExportResult.FAILURE
        try:
            line = encode_line(spans)
            with self._lock:
                if self._stream.closed:
                    return SpanExportResult.FAILURE
                if line is not None:
                    self._stream.write(line)
                self._stream.flush()
        except Exception as error:
            logger.exception("otel_stages span file: failed to write a batch of %d spans: %r",
                             len(spans), error)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        with self._lock:
            self._stream.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
