"""Read OTLP/JSON: the Collector ``file`` exporter format and the OTLP JSON file exporter's.

Each line of a ``*.jsonl`` file is one ``ExportTraceServiceRequest`` (``{"resourceSpans": [...]}``)
or ``ExportMetricsServiceRequest`` (``{"resourceMetrics": [...]}``) JSON object. A ``*.json`` file
may also hold one pretty-printed request object, or a JSON array of them.

Two layers:

- :func:`parse_export_request` turns one decoded JSON object into a :class:`Recording` (pure; no
  I/O). :func:`decode_any_value` / :func:`decode_attributes` / :func:`normalize_id` are reusable by
  other loaders.
- :func:`load_paths` / :func:`load_file` / :func:`load_bytes` (stdin) read files and folders
  (a leading UTF-8 BOM is skipped). Nothing raises for bad input:
  every malformed line, span, point or unreadable path becomes a ``Recording.problems`` message
  that names the file and line (``traces.jsonl:12: not valid JSON (...)``); the rest still loads.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from otel_stages.analysis.model import AttributeValue, MetricPoint, Recording, Span

#: File name endings picked up when a folder is given.
FILE_SUFFIXES: tuple[str, ...] = (".jsonl", ".json")

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
        return [decode_any_value(v) for v in (value["arrayValue"] or {}).get("values", [])]
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


def _parse_resource_spans(rs: Any, out: Recording, prefix: str) -> None:
    resource = _resource(rs, out, prefix)
    if resource is None:
        return
    for scope in _list(rs.get("scopeSpans"), out, prefix, "scopeSpans"):
        if not isinstance(scope, Mapping):
            out.problems.append(f"{prefix}scopeSpans entry is not an object")
            continue
        for j, raw in enumerate(_list(scope.get("spans"), out, prefix, "spans")):
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
        links=_links(raw.get("links")),
    )


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
    for scope in _list(rm.get("scopeMetrics"), out, prefix, "scopeMetrics"):
        if not isinstance(scope, Mapping):
            out.problems.append(f"{prefix}scopeMetrics entry is not an object")
            continue
        for metric in _list(scope.get("metrics"), out, prefix, "metrics"):
            if not isinstance(metric, Mapping) or not isinstance(metric.get("name"), str):
                out.problems.append(f"{prefix}metric without a name")
                continue
            name = metric["name"]
            data = metric.get("gauge") or metric.get("sum")
            if not isinstance(data, Mapping):
                continue  # histograms, summaries...: not used by the analysis
            for k, point in enumerate(_list(data.get("dataPoints"), out, prefix, "dataPoints")):
                try:
                    out.metrics.append(_parse_point(name, point, resource))
                except (_Malformed, ValueError, TypeError, AttributeError) as exc:
                    out.problems.append(f"{prefix}metric {name!r} point {k}: {exc}")


def _parse_point(name: str, raw: Any, resource: dict[str, AttributeValue]) -> MetricPoint:
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
        value=value,
        attributes=decode_attributes(raw.get("attributes")),
        resource=resource,
    )


# --- file I/O --------------------------------------------------------------------------------


def load_paths(paths: Iterable[str | os.PathLike[str]]) -> Recording:
    """Load every given file, and every ``*.jsonl``/``*.json`` under given folders (recursively).

    Returns one :class:`Recording` holding all spans and points; problems name the file (as given
    or as found under the folder) and line. A missing path, an empty folder, or an unreadable file
    is a problem, never an exception. A file reached twice is read once.
    """
    out = Recording()
    seen: set[str] = set()
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and p.name.endswith(FILE_SUFFIXES)
            )
            if not found:
                out.problems.append(f"{path}: no *.jsonl or *.json files in this folder")
            files = found
        elif path.exists():
            files = [path]
        else:
            out.problems.append(f"{path}: no such file or folder")
            continue
        for file in files:
            key = os.path.realpath(file)
            if key not in seen:
                seen.add(key)
                out.extend(load_file(file))
    return out


def load_file(path: str | os.PathLike[str]) -> Recording:
    """Read one OTLP/JSON lines file (or a single JSON document / array of requests).

    Blank lines are skipped. Problems are ``"<path>:<line>: <what>"``; see :func:`load_paths`.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return Recording(problems=[f"{path}: cannot read ({exc.strerror or exc})"])
    return load_bytes(data, str(path))


def load_bytes(data: bytes, name: str) -> Recording:
    """Parse the contents of one file (or of stdin) named ``name`` in problem messages. A UTF-8
    byte order mark at the start is skipped (Windows editors and PowerShell write one)."""
    out = Recording()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    lines = data.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return out
    if not _parses(lines[first]) and _load_document(data, name, out):
        return out
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        where = f"{name}:{number}"
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            out.problems.append(f"{where}: not UTF-8 text")
            continue
        except json.JSONDecodeError as exc:
            out.problems.append(f"{where}: not valid JSON ({_short(exc)})")
            continue
        out.extend(parse_export_request(obj, where=where))
    return out


def _parses(line: bytes) -> bool:
    try:
        json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return True


def _load_document(data: bytes, name: str, out: Recording) -> bool:
    """Whole-file JSON (pretty-printed request or array of requests); False if it isn't one."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    items = doc if isinstance(doc, list) else [doc]
    for i, item in enumerate(items):
        where = f"{name}[{i}]" if isinstance(doc, list) else name
        out.extend(parse_export_request(item, where=where))
    return True


def _short(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg}: line {exc.lineno} column {exc.colno}"
