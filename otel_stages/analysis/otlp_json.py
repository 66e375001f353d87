"""Parse OTLP/JSON export requests: the Collector ``file`` exporter format and the OTLP JSON file
exporter's.

Each line of a ``*.jsonl`` file is one ``ExportTraceServiceRequest`` (``{"resourceSpans": [...]}``)
or ``ExportMetricsServiceRequest`` (``{"resourceMetrics": [...]}``) JSON object.
:func:`parse_export_request` turns one decoded JSON object into a :class:`Recording` (pure; no
I/O). OTLP before 1.0 (``instrumentationLibrarySpans`` / ``instrumentationLibraryMetrics`` /
``instrumentationLibrary``, as Tempo 1.x and old SDKs write) is read like ``scopeSpans``.
:func:`decode_any_value` / :func:`decode_attributes` / :func:`normalize_id` are reusable by other
loaders.

Reading files, folders and stdin (every format, compressed or not) lives in
:mod:`otel_stages.analysis.files`; ``load_paths`` / ``load_file`` / ``load_bytes`` here forward to
it. Nothing raises for bad input: every malformed span or point becomes a ``Recording.problems``
message that names where it was (``traces.jsonl:12: resourceSpans[0]: span 3 ('decode'): ...``).
"""

from __future__ import annotations

import base64
import binascii
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from otel_stages.analysis.model import AttributeValue, MetricPoint, Recording, Span, SpanEvent

#: OTLP before 1.0 -> 1.0 field names (protobuf JSON of opentelemetry-proto < 0.15).
LEGACY_KEYS: dict[str, str] = {
    "instrumentationLibrarySpans": "scopeSpans",
    "instrumentationLibraryMetrics": "scopeMetrics",
    "instrumentationLibraryLogs": "scopeLogs",
    "instrumentationLibrary": "scope",
}

_HEX = frozenset("0123456789abcdefABCDEF")
_STATUS_ERROR = (2, "STATUS_CODE_ERROR")


class _Malformed(ValueError):
    """Raised inside the parser for one span / point; turned into a problem message."""


# --- attribute and id decoding ----------------------------------------------------------------


def decode_any_value(value: Any) -> AttributeValue:
    """Decode one OTLP JSON ``AnyValue`` object (``{"intValue": "1"}``...) to a Python value.

    ``intValue`` (string or number) -> int, ``doubleValue`` -> float (``"NaN"``/``"Infinity"``
    accepted), ``boolValue`` -> bool, ``stringValue`` -> str, ``bytesValue`` -> its base64 text,
    ``arrayValue`` -> list, ``kvlistValue`` -> dict. An empty object gives ``None``.
    Raises ``ValueError`` for anything else.
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"attribute value is not an object: {value!r}")
    if not value:
        return None
    if "stringValue" in value:
        return str(value["stringValue"])
    if "boolValue" in value:
        raw = value["boolValue"]
        return raw if isinstance(raw, bool) else str(raw).lower() == "true"
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [decode_any_value(v) for v in (value["arrayValue"] or {}).get("values") or []]
    if "kvlistValue" in value:
        return decode_attributes((value["kvlistValue"] or {}).get("values", []))
    if "bytesValue" in value:
        return str(value["bytesValue"])
    raise ValueError(f"unknown attribute value kind {sorted(value)}")


def decode_attributes(items: Any) -> dict[str, AttributeValue]:
    """Decode an OTLP JSON ``KeyValue`` list (``[{"key": .., "value": {..}}]``) to a dict.

    ``None`` or a missing list gives ``{}``. Raises ``ValueError`` for a malformed entry.
    """
    if items is None:
        return {}
    if not isinstance(items, list):
        raise ValueError("attributes is not a list")
    out: dict[str, AttributeValue] = {}
    for item in items:
        if not isinstance(item, Mapping) or "key" not in item:
            raise ValueError(f"attribute without a key: {item!r}")
        out[str(item["key"])] = decode_any_value(item.get("value", {}))
    return out


def normalize_id(raw: Any, n_bytes: int) -> str | None:
    """Return a trace id (``n_bytes=16``) or span id (``8``) as lowercase hex, or ``None``.

    Accepts hex (what OTLP/JSON specifies) and base64 (what generic protobuf JSON writers emit),
    told apart by length and alphabet. ``None``/``""``/all-zero ids give ``None``.
    Raises ``ValueError`` when the text is neither.
    """
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        raise ValueError(f"id is not a string: {raw!r}")
    if len(raw) == 2 * n_bytes and set(raw) <= _HEX:
        hex_id = raw.lower()
    else:
        try:
            decoded = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            decoded = b""
        if len(decoded) != n_bytes:
            try:  # some writers use the URL-safe alphabet
                decoded = base64.urlsafe_b64decode(raw)
            except (binascii.Error, ValueError):
                decoded = b""
        if len(decoded) != n_bytes:
            raise ValueError(f"id {raw!r} is neither {2 * n_bytes} hex digits nor base64")
        hex_id = decoded.hex()
    return None if set(hex_id) == {"0"} else hex_id


def _time_ns(raw: Any, field: str) -> int:
    if raw is None or isinstance(raw, bool):
        raise _Malformed(f"missing {field}")
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise _Malformed(f"{field} is not an integer ({raw!r})") from None


# --- pure parsing of one decoded request -----------------------------------------------------


def parse_export_request(obj: Any, *, where: str = "") -> Recording:
    """Turn one decoded OTLP JSON export request into :class:`Recording` (pure, no I/O).

    ``obj`` is a dict with ``resourceSpans`` and/or ``resourceMetrics`` (``resourceLogs`` is
    ignored). Gauge and sum points (``asDouble``/``asInt``) become :class:`MetricPoint`; other
    metric kinds are skipped. ``where`` (e.g. ``"traces.jsonl:12"``) prefixes problem messages.
    A malformed span or point is skipped with a problem; the rest of the object still loads.
    """
    out = Recording()
    prefix = f"{where}: " if where else ""
    if not isinstance(obj, Mapping):
        out.problems.append(f"{prefix}expected a JSON object, got {type(obj).__name__}")
        return out
    known = {"resourceSpans", "resourceMetrics", "resourceLogs"}
    if not known & set(obj):
        keys = ", ".join(sorted(map(str, obj))[:5]) or "none"
        out.problems.append(
            f"{prefix}not an OTLP export request (no resourceSpans/resourceMetrics; keys: {keys})"
        )
        return out
    for i, rs in enumerate(_list(obj.get("resourceSpans"), out, prefix, "resourceSpans")):
        _parse_resource_spans(rs, out, f"{prefix}resourceSpans[{i}]: ")
    for i, rm in enumerate(_list(obj.get("resourceMetrics"), out, prefix, "resourceMetrics")):
        _parse_resource_metrics(rm, out, f"{prefix}resourceMetrics[{i}]: ")
    return out


def _list(value: Any, out: Recording, prefix: str, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        out.problems.append(f"{prefix}{field} is not a list")
        return []
    return value


def _resource(block: Any, out: Recording, prefix: str) -> dict[str, AttributeValue] | None:
    if not isinstance(block, Mapping):
        out.problems.append(f"{prefix}not an object")
        return None
    try:
        return decode_attributes((block.get("resource") or {}).get("attributes"))
    except (ValueError, TypeError, AttributeError) as exc:
        out.problems.append(f"{prefix}bad resource attributes ({exc})")
        return None


def _scopes(block: Mapping[str, Any], key: str, out: Recording, prefix: str) -> list[Any]:
    """``block[key]`` (``scopeSpans``/``scopeMetrics``), or its pre-1.0 name when only that is there."""
    if key not in block:
        legacy = next((k for k, v in LEGACY_KEYS.items() if v == key and k in block), None)
        if legacy is not None:
            return _list(block.get(legacy), out, prefix, legacy)
    return _list(block.get(key), out, prefix, key)


def _scope_lists(block: Any, scopes_key: str, items_key: str, out: Recording,
                 prefix: str) -> Iterator[list[Any]]:
    """Each scope's ``items_key`` list (``spans`` / ``metrics``); a scope that is not an object
    is a problem and skipped."""
    for scope in _scopes(block, scopes_key, out, prefix):
        if not isinstance(scope, Mapping):
            out.problems.append(f"{prefix}{scopes_key} entry is not an object")
            continue
        yield _list(scope.get(items_key), out, prefix, items_key)


def _parse_resource_spans(rs: Any, out: Recording, prefix: str) -> None:
    resource = _resource(rs, out, prefix)
    if resource is None:
        return
    for spans in _scope_lists(rs, "scopeSpans", "spans", out, prefix):
        for j, raw in enumerate(spans):
            try:
                out.spans.append(_parse_span(raw, resource))
            except (_Malformed, ValueError, TypeError, AttributeError) as exc:
                name = raw.get("name") if isinstance(raw, Mapping) else None
                label = f"span {j}" + (f" ({name!r})" if isinstance(name, str) else "")
                out.problems.append(f"{prefix}{label}: {exc}")


def _parse_span(raw: Any, resource: dict[str, AttributeValue]) -> Span:
    if not isinstance(raw, Mapping):
        raise _Malformed("not an object")
    trace_id = normalize_id(raw.get("traceId"), 16)
    span_id = normalize_id(raw.get("spanId"), 8)
    if trace_id is None:
        raise _Malformed("missing traceId")
    if span_id is None:
        raise _Malformed("missing spanId")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise _Malformed("missing name")
    start_ns = _time_ns(raw.get("startTimeUnixNano"), "startTimeUnixNano")
    end_ns = _time_ns(raw.get("endTimeUnixNano"), "endTimeUnixNano")
    if end_ns < start_ns:
        raise _Malformed(f"ends before it starts ({end_ns} < {start_ns})")
    status = raw.get("status") or {}
    code = status.get("code") if isinstance(status, Mapping) else None
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=normalize_id(raw.get("parentSpanId"), 8),
        name=name,
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=decode_attributes(raw.get("attributes")),
        resource=resource,
        error=code in _STATUS_ERROR,
        events=_events(raw.get("events")),
        links=_links(raw.get("links")),
    )


def _events(raw: Any) -> tuple[SpanEvent, ...]:
    """OTLP ``events`` (``[{"timeUnixNano", "name", "attributes"}]``) in time order; ``()`` when
    there are none (the common case costs nothing)."""
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise _Malformed("events is not a list")
    events = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise _Malformed(f"event {i} is not an object")
        events.append(
            SpanEvent(
                name=str(item.get("name") or ""),
                time_ns=_time_ns(item.get("timeUnixNano"), f"event {i} timeUnixNano"),
                attributes=decode_attributes(item.get("attributes")),
            )
        )
    events.sort(key=lambda e: e.time_ns)
    return tuple(events)


def _links(raw: Any) -> tuple[tuple[str, str], ...]:
    """``Span.links`` (``[{"traceId", "spanId", "attributes", "flags"...}]``, the shape the OTLP
    JSON file exporter writes: ``opentelemetry/exporter/otlp/json/common/_internal/trace_encoder``
    ``_encode_links``) as ``(trace_id, span_id)`` pairs; link attributes are not kept."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _Malformed("links is not a list")
    out = []
    for i, link in enumerate(raw):
        try:
            trace_id = normalize_id(link.get("traceId"), 16) if isinstance(link, Mapping) else None
            span_id = normalize_id(link.get("spanId"), 8) if isinstance(link, Mapping) else None
        except ValueError as exc:
            raise _Malformed(f"link {i}: {exc}") from None
        if trace_id is None or span_id is None:
            raise _Malformed(f"link {i} has no valid traceId / spanId")
        out.append((trace_id, span_id))
    return tuple(out)


def _parse_resource_metrics(rm: Any, out: Recording, prefix: str) -> None:
    resource = _resource(rm, out, prefix)
    if resource is None:
        return
    for metrics in _scope_lists(rm, "scopeMetrics", "metrics", out, prefix):
        for metric in metrics:
            if not isinstance(metric, Mapping) or not isinstance(metric.get("name"), str):
                out.problems.append(f"{prefix}metric without a name")
                continue
            name = metric["name"]
            data = metric.get("gauge") or metric.get("sum")
            if not isinstance(data, Mapping):
                continue  # histograms, summaries...: not used by the analysis
            # absent or empty: none declared (""), as the ClickHouse import writes MetricUnit
            unit = str(metric.get("unit") or "")
            scale = PERCENT_SCALE if unit == PERCENT_UNIT else 1.0
            for k, point in enumerate(_list(data.get("dataPoints"), out, prefix, "dataPoints")):
                if isinstance(point, Mapping) and _no_recorded_value(point):
                    continue  # explicitly missing data (a staleness marker): no reading, no fault
                try:
                    out.metrics.append(_parse_point(name, point, resource, scale, unit))
                except (_Malformed, ValueError, TypeError, AttributeError) as exc:
                    out.problems.append(f"{prefix}metric {name!r} point {k}: {exc}")


#: A metric whose ``unit`` is ``%`` (UCUM percent, as DCGM-style exporters declare GPU
#: utilization) is read as a ratio: its values times :data:`PERCENT_SCALE`, so ``hw.gpu.*``
#: ratios are in the semantic conventions' unit ``1`` whatever the producer declared.
PERCENT_UNIT = "%"
PERCENT_SCALE = 0.01


#: OTLP ``DataPointFlags.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK`` (opentelemetry-proto
#: ``opentelemetry/proto/metrics/v1/metrics.proto``): the point is valid but has no recorded
#: value, "an equivalent to the Prometheus staleness marker".
FLAG_NO_RECORDED_VALUE = 1


def point_flags(point: Mapping[str, Any]) -> int:
    """A data point's ``flags`` (a uint32: the proto3 JSON mapping writes it as a number or a
    decimal string); 0 when absent or not one."""
    flags = point.get("flags")
    if isinstance(flags, str) and flags.isdigit():
        flags = int(flags)
    return flags if isinstance(flags, int) and not isinstance(flags, bool) and 0 <= flags < 2**32 else 0


def _no_recorded_value(point: Mapping[str, Any]) -> bool:
    return bool(point_flags(point) & FLAG_NO_RECORDED_VALUE)


def _parse_point(name: str, raw: Any, resource: dict[str, AttributeValue],
                 scale: float = 1.0, unit: str = "") -> MetricPoint:
    if not isinstance(raw, Mapping):
        raise _Malformed("not an object")
    if "asDouble" in raw:
        value = float(raw["asDouble"])
    elif "asInt" in raw:
        value = float(int(raw["asInt"]))
    else:
        raise _Malformed("no asDouble/asInt value")
    if math.isnan(value):
        raise _Malformed("value is NaN")
    return MetricPoint(
        name=name,
        time_ns=_time_ns(raw.get("timeUnixNano"), "timeUnixNano"),
        value=value * scale,
        attributes=decode_attributes(raw.get("attributes")),
        resource=resource,
        unit=unit,
    )


# --- file I/O (moved to otel_stages.analysis.files; kept here for existing imports) -----------


def load_paths(paths: Iterable[str | os.PathLike[str]]) -> Recording:
    """See :func:`otel_stages.analysis.files.load_paths`."""
    from otel_stages.analysis import files

    return files.load_paths(paths)


def load_file(path: str | os.PathLike[str]) -> Recording:
    """See :func:`otel_stages.analysis.files.load_file`."""
    from otel_stages.analysis import files

    return files.load_file(path)


def load_bytes(data: bytes, name: str) -> Recording:
    """See :func:`otel_stages.analysis.files.load_bytes`."""
    from otel_stages.analysis import files

    return files.load_bytes(data, name)
