"""OTLP/JSON export requests as rows of the Collector ``clickhouse`` exporter's tables. Pure.

Source read (opentelemetry-collector-contrib, ``exporter/clickhouseexporter``): ``exporter_traces.go``
(``pushTraceData``) @ the snapshot holding ``internal/sqltemplates/traces_table.sql`` 2bf6b9e1,
``internal/metrics/gauge_metrics.go`` (``insert``) @ 200fe05594781a4c42e025e8cde50c067cbc5e15,
``internal/metrics/sum_metrics.go`` (``insert``) @ 1c7d775d570f02d91bf4a0689f5f65d93ec2a11b,
``internal/metrics_model.go`` (``AttributesToMap``: ``v.AsString()`` for every value), and pdata's
``pcommon.Value.AsString`` / ``float64AsString``.

How the exporter writes a span (one row per span):

- ``Timestamp DateTime64(9)``: span start; ``Duration UInt64``: ``end - start`` in **nanoseconds**
  (``pcommon.Timestamp`` subtraction, so an end before the start wraps around modulo 2**64).
- ``TraceId`` / ``SpanId`` / ``ParentSpanId``: lowercase hex, ``""`` when absent.
- ``SpanKind``: ``ptrace.SpanKind.String()`` (``"Server"``, ``"Internal"``...); ``StatusCode``:
  ``"Unset"`` / ``"Ok"`` / ``"Error"`` (exporters before the ``sqltemplates`` rewrite wrote
  ``"STATUS_CODE_ERROR"``; readers accept both).
- ``ServiceName``: the resource's ``service.name``; ``ResourceAttributes`` / ``SpanAttributes``:
  ``Map(LowCardinality(String), String)`` where every value is ``pcommon.Value.AsString()``: ints
  in decimal, bools ``true``/``false``, doubles in Go's shortest ES6-style form, arrays and maps as
  compact JSON. Types are lost: readers cast (``toInt64OrNull``).
- ``ScopeName`` / ``ScopeVersion``: the instrumentation scope; ``Events.*`` / ``Links.*``:
  ``Nested`` columns, i.e. parallel arrays.

A gauge data point becomes one gauge-table row: ``TimeUnix`` (sample time) and ``StartTimeUnix``
as ``DateTime64(9)``, ``Value Float64`` (``asInt`` converted), ``Attributes`` (``hw.id``...) as
the same string map, plus resource, scope and exemplar columns.

A sum data point becomes one sum-table row: the gauge row's columns plus
``AggregationTemporality`` (``int32`` of the OTLP enum: 1 delta, 2 cumulative) and
``IsMonotonic`` (cgroup throttled time: a cumulative monotonic sum).

Deviations, on purpose: a point with no value is skipped with a problem (the exporter would write
``0.0``, which reads as an idle GPU), and so is a NaN value; histogram and summary metrics are not
imported (the report does not read them; they are counted). Spans are otherwise written as the exporter
would, odd ones included, so readers meet what a real Collector leaves in the table.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.otlp_json import FLAG_NO_RECORDED_VALUE, decode_any_value, normalize_id, point_flags

_SPAN_KINDS = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
_STATUS_CODES = ("Unset", "Ok", "Error")
_U64 = 2**64


# --- pcommon.Value.AsString() -----------------------------------------------------------------


def go_float(value: float) -> str:
    """A double as pdata's ``float64AsString`` writes it (ES6 number formatting: shortest
    round-trip digits, fixed notation for 1e-6 <= |x| < 1e21, else ``1e-7`` / ``1.5e+21``)."""
    if math.isnan(value) or math.isinf(value):
        name = "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
        return f"json: unsupported value: {name}"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    exact = Decimal(repr(value))
    if 1e-6 <= abs(value) < 1e21:
        text = format(exact, "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    sign, digits, exponent = exact.as_tuple()
    assert isinstance(exponent, int)
    text_digits = "".join(map(str, digits)).rstrip("0") or "0"
    exp10 = exponent + len(digits) - 1
    mantissa = text_digits[0] + ("." + text_digits[1:] if len(text_digits) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10)}"


_GO_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                    "\u2029": "\\u2029"}


def _go_json(value: Any) -> str:
    """``json.Marshal`` of ``AsRaw()``: compact, map keys sorted, HTML characters escaped."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError("NaN or Inf inside an array/map attribute")  # Marshal fails
        return go_float(value)
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        for char, escaped in _GO_JSON_ESCAPES.items():
            text = text.replace(char, escaped)
        return text
    if isinstance(value, list):
        return "[" + ",".join(_go_json(v) for v in value) + "]"
    return "{" + ",".join(f"{_go_json(k)}:{_go_json(value[k])}" for k in sorted(value)) + "}"


def as_string(value: Any) -> str:
    """One OTLP/JSON ``AnyValue`` as ``pcommon.Value.AsString()`` renders it (what the exporter
    stores in its attribute maps). Raises ``ValueError`` for a malformed value."""
    raw = decode_any_value(value)  # pdata AsRaw(): bytes stay base64 text
    if raw is None:
        return ""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, (int, str)):
        return str(raw)
    if isinstance(raw, float):
        return go_float(raw)
    try:
        return _go_json(raw)
    except ValueError:
        return ""  # json.Marshal failed; AsString ignores the error


def attributes_map(items: Any) -> dict[str, str]:
    """An OTLP/JSON ``KeyValue`` list as the exporter's ``Map(String, String)`` value."""
    if items is None:
        return {}
    if not isinstance(items, list):
        raise ValueError("attributes is not a list")
    out: dict[str, str] = {}
    for item in items:
        if not isinstance(item, Mapping) or "key" not in item:
            raise ValueError(f"attribute without a key: {item!r}")
        out[str(item["key"])] = as_string(item.get("value", {}))
    return out


# --- rows -------------------------------------------------------------------------------------


def datetime64_text(ns: int) -> str:
    """Unix nanoseconds as the JSON number ClickHouse reads into ``DateTime64(9)`` exactly and
    independent of any time zone: ``<seconds>.<9 digits>`` (unquoted: quoted text of a small
    number would be read as a date)."""
    seconds, frac = divmod(ns, 10**9)
    return f"{seconds}.{frac:09d}"


#: Columns holding ``DateTime64(9)`` values (or arrays of them); rows keep them as int ns.
DATETIME64_COLUMNS = frozenset(
    {"Timestamp", "Events.Timestamp", "StartTimeUnix", "TimeUnix", "Exemplars.TimeUnix"})


def _ns(raw: Any, name: str, *, default: int | None = None) -> int:
    if raw is None and default is not None:
        return default
    if raw is None or isinstance(raw, bool):
        raise ValueError(f"missing {name}")
    value = int(raw)
    if not 0 <= value < _U64:
        raise ValueError(f"{name} out of range ({value})")
    return value


def _hex_id(raw: Any, n_bytes: int) -> str:
    return normalize_id(raw, n_bytes) or ""


def _enum(raw: Any, names: tuple[str, ...], prefix: str) -> str:
    """An OTLP enum given as number or as its proto name -> pdata's ``String()`` form."""
    if isinstance(raw, str) and not raw.lstrip("-").isdigit():
        tail = raw.removeprefix(prefix).replace("_", "").lower()
        return next((n for n in names if n.lower() == tail), "")
    index = int(raw or 0)
    return names[index] if 0 <= index < len(names) else ""


@dataclass
class Rows:
    """Rows for the exporter's tables from one or more OTLP/JSON export requests.

    ``spans`` / ``gauge_points`` / ``sum_points``: dicts keyed by column name (``JSONEachRow``
    ready). ``skipped_points``: points of metric kinds the report does not read (histogram...).
    ``problems``: ``"<where>: <what>"`` for each span or point left out.
    """

    spans: list[dict[str, Any]] = field(default_factory=list)
    gauge_points: list[dict[str, Any]] = field(default_factory=list)
    sum_points: list[dict[str, Any]] = field(default_factory=list)
    skipped_points: int = 0
    problems: list[str] = field(default_factory=list)


def export_request_rows(obj: Any, *, where: str = "") -> Rows:
    """One decoded ``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest`` (either or both
    keys) -> :class:`Rows`, as the exporter would write them. Pure; never raises: a malformed
    span or point is a problem and the rest still converts."""
    out = Rows()
    prefix = f"{where}: " if where else ""
    if not isinstance(obj, Mapping) or not {"resourceSpans", "resourceMetrics",
                                             "resourceLogs"} & set(obj):
        out.problems.append(f"{prefix}not an OTLP export request (no resourceSpans/resourceMetrics)")
        return out
    for i, rs in enumerate(_items(obj.get("resourceSpans"))):
        _span_rows(rs, out, f"{prefix}resourceSpans[{i}]")
    for i, rm in enumerate(_items(obj.get("resourceMetrics"))):
        _gauge_rows(rm, out, f"{prefix}resourceMetrics[{i}]")
    return out


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _resource(block: Any) -> dict[str, str]:
    if not isinstance(block, Mapping):
        raise ValueError("not an object")
    return attributes_map((block.get("resource") or {}).get("attributes"))


def _span_rows(rs: Any, out: Rows, where: str) -> None:
    try:
        resource = _resource(rs)
    except (ValueError, TypeError, AttributeError) as exc:
        out.problems.append(f"{where}: bad resource ({exc})")
        return
    service = resource.get(semconv.SERVICE_NAME, "")
    for scope_spans in _items(rs.get("scopeSpans")):
        if not isinstance(scope_spans, Mapping):
            out.problems.append(f"{where}: scopeSpans entry is not an object")
            continue
        scope = scope_spans.get("scope") or {}
        for j, raw in enumerate(_items(scope_spans.get("spans"))):
            try:
                out.spans.append(_span_row(raw, resource, service, scope))
            except (ValueError, TypeError, AttributeError, KeyError) as exc:
                name = raw.get("name") if isinstance(raw, Mapping) else None
                label = f"span {j}" + (f" ({name!r})" if isinstance(name, str) else "")
                out.problems.append(f"{where}: {label}: {exc}")


def _span_row(raw: Any, resource: dict[str, str], service: str, scope: Mapping[str, Any]
              ) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ValueError("not an object")
    start = _ns(raw.get("startTimeUnixNano"), "startTimeUnixNano")
    end = _ns(raw.get("endTimeUnixNano"), "endTimeUnixNano")
    status = raw.get("status") or {}
    events = _items(raw.get("events"))
    links = _items(raw.get("links"))
    return {
        "Timestamp": start,
        "TraceId": _hex_id(raw.get("traceId"), 16),
        "SpanId": _hex_id(raw.get("spanId"), 8),
        "ParentSpanId": _hex_id(raw.get("parentSpanId"), 8),
        "TraceState": str(raw.get("traceState") or ""),
        "SpanName": str(raw.get("name") or ""),
        "SpanKind": _enum(raw.get("kind"), _SPAN_KINDS, "SPAN_KIND_"),
        "ServiceName": service,
        "ResourceAttributes": resource,
        "ScopeName": str(scope.get("name") or ""),
        "ScopeVersion": str(scope.get("version") or ""),
        "SpanAttributes": attributes_map(raw.get("attributes")),
        "Duration": (end - start) % _U64,  # what Go's uint64 subtraction leaves
        "StatusCode": _enum(status.get("code"), _STATUS_CODES, "STATUS_CODE_"),
        "StatusMessage": str(status.get("message") or ""),
        "Events.Timestamp": [_ns(e.get("timeUnixNano"), "event time", default=0) for e in events],
        "Events.Name": [str(e.get("name") or "") for e in events],
        "Events.Attributes": [attributes_map(e.get("attributes")) for e in events],
        "Links.TraceId": [_hex_id(k.get("traceId"), 16) for k in links],
        "Links.SpanId": [_hex_id(k.get("spanId"), 8) for k in links],
        "Links.TraceState": [str(k.get("traceState") or "") for k in links],
        "Links.Attributes": [attributes_map(k.get("attributes")) for k in links],
    }


def _gauge_rows(rm: Any, out: Rows, where: str) -> None:
    try:
        resource = _resource(rm)
    except (ValueError, TypeError, AttributeError) as exc:
        out.problems.append(f"{where}: bad resource ({exc})")
        return
    service = resource.get(semconv.SERVICE_NAME, "")
    for scope_metrics in _items(rm.get("scopeMetrics")):
        if not isinstance(scope_metrics, Mapping):
            continue
        scope = scope_metrics.get("scope") or {}
        base = {
            "ResourceAttributes": resource,
            "ResourceSchemaUrl": str(rm.get("schemaUrl") or ""),
            "ScopeName": str(scope.get("name") or ""),
            "ScopeVersion": str(scope.get("version") or ""),
            "ScopeAttributes": attributes_map(scope.get("attributes")),
            "ScopeDroppedAttrCount": int(scope.get("droppedAttributesCount") or 0),
            "ScopeSchemaUrl": str(scope_metrics.get("schemaUrl") or ""),
            "ServiceName": service,
        }
        for metric in _items(scope_metrics.get("metrics")):
            if not isinstance(metric, Mapping):
                continue
            name = str(metric.get("name") or "")
            gauge, total = metric.get("gauge"), metric.get("sum")
            if isinstance(total, Mapping):
                extra = {"AggregationTemporality": _temporality(total.get("aggregationTemporality")),
                         "IsMonotonic": bool(total.get("isMonotonic"))}
                for k, point in enumerate(_items(total.get("dataPoints"))):
                    try:
                        out.sum_points.append({**base, **_point_row(metric, name, point), **extra})
                    except (ValueError, TypeError, AttributeError) as exc:
                        out.problems.append(f"{where}: metric {name!r} point {k}: {exc}")
                continue
            if not isinstance(gauge, Mapping):
                out.skipped_points += sum(
                    len(_items((metric.get(kind) or {}).get("dataPoints")))
                    for kind in ("histogram", "exponentialHistogram", "summary")
                    if isinstance(metric.get(kind), Mapping))
                continue
            for k, point in enumerate(_items(gauge.get("dataPoints"))):
                try:
                    out.gauge_points.append({**base, **_point_row(metric, name, point)})
                except (ValueError, TypeError, AttributeError) as exc:
                    out.problems.append(f"{where}: metric {name!r} point {k}: {exc}")


#: OTLP/JSON writes enums as numbers or as their names (protobuf JSON mapping).
_TEMPORALITY = {"AGGREGATION_TEMPORALITY_UNSPECIFIED": 0, "AGGREGATION_TEMPORALITY_DELTA": 1,
                "AGGREGATION_TEMPORALITY_CUMULATIVE": 2}


def _temporality(raw: Any) -> int:
    if isinstance(raw, str):
        return _TEMPORALITY.get(raw, int(raw) if raw.isdigit() else 0)
    return int(raw) if isinstance(raw, int) and not isinstance(raw, bool) else 0


def _number(raw: Mapping[str, Any]) -> float:
    if "asDouble" in raw:
        value = float(raw["asDouble"])
    elif "asInt" in raw:
        value = float(int(raw["asInt"]))
    else:
        raise ValueError("no asDouble/asInt value (the exporter would store 0.0)")
    if math.isnan(value):
        raise ValueError("value is NaN")
    return value


def _point_row(metric: Mapping[str, Any], name: str, point: Any) -> dict[str, Any]:
    if not isinstance(point, Mapping):
        raise ValueError("not an object")
    exemplars = _items(point.get("exemplars"))
    return {
        "MetricName": name,
        "MetricDescription": str(metric.get("description") or ""),
        "MetricUnit": str(metric.get("unit") or ""),
        "Attributes": attributes_map(point.get("attributes")),
        "StartTimeUnix": _ns(point.get("startTimeUnixNano"), "startTimeUnixNano", default=0),
        "TimeUnix": _ns(point.get("timeUnixNano"), "timeUnixNano"),
        # a point flagged "no recorded value" is stored as the exporter stores it: Value 0, its
        # Flags (the report's SQL leaves it out: clickhouse_sql.NO_RECORDED_VALUE_SQL)
        "Value": 0.0 if point_flags(point) & FLAG_NO_RECORDED_VALUE else _number(point),
        "Flags": point_flags(point),
        "Exemplars.FilteredAttributes": [attributes_map(e.get("filteredAttributes"))
                                         for e in exemplars],
        "Exemplars.TimeUnix": [_ns(e.get("timeUnixNano"), "exemplar time", default=0)
                               for e in exemplars],
        "Exemplars.Value": [_number(e) if ("asDouble" in e or "asInt" in e) else 0.0
                            for e in exemplars],
        "Exemplars.SpanId": [_hex_id(e.get("spanId"), 8) for e in exemplars],
        "Exemplars.TraceId": [_hex_id(e.get("traceId"), 16) for e in exemplars],
    }


def _json_value(key: str, value: Any) -> str:
    if key in DATETIME64_COLUMNS:
        if isinstance(value, list):
            return "[" + ",".join(datetime64_text(v) for v in value) + "]"
        return datetime64_text(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


#: A UTF-16 surrogate left alone in a decoded string (JSON allows ``"\\ud800"``; a pair is one
#: code point once decoded): the Collector's Go ``encoding/json`` decodes it as U+FFFD
#: (``decode.go`` ``unquoteBytes``: "Invalid surrogate; fall back to replacement rune"), and UTF-8
#: cannot hold it.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def json_each_row(rows: list[dict[str, Any]]) -> Iterator[bytes]:
    """Rows as ``JSONEachRow`` lines (UTF-8, one object per line, ``\\n``-terminated);
    :data:`DATETIME64_COLUMNS` (int ns in the rows) are written with :func:`datetime64_text`.
    A lone surrogate in a string becomes U+FFFD, as the Collector stores it."""
    for row in rows:
        line = "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{_json_value(k, v)}"
                              for k, v in row.items()) + "}\n"
        try:
            yield line.encode("utf-8")
        except UnicodeEncodeError:
            yield _LONE_SURROGATE.sub("\ufffd", line).encode("utf-8")
