"""The fast path for OTLP/JSON lines: one ``ExportTraceServiceRequest`` line decoded by msgspec
straight into typed structs (only the fields the analysis uses; the rest is skipped in C), then
into compact :class:`~otel_stages.analysis.model.Span` records.

Why msgspec: on the library's own trace lines (``benchmarks/report_scale.py --parsers``: decode
every line and sum span durations by name), msgspec decoding into typed structs took 0.25x the
time of ``json.loads``, msgspec's untyped decode 0.90x and orjson 0.86x: typed structs skip the
dict a generic decode builds for every span, attribute and value, and fields nobody reads are
skipped without making objects (BENCHMARKS.md has the figures).

Exactness: :func:`read_line` takes a line only when it can give the very records and problems
the careful reader (:func:`otel_stages.analysis.otlp_json.parse_export_request`) would: ids of
exactly 32/16 lowercase hex digits, a name, both times, no end before start, attribute values of
one known kind. Anything else (base64 or upper-case ids, a malformed span, ``null`` where a value
belongs, an unknown value kind even in an attribute that is not kept, a document that is not
OTLP) makes it return ``False`` before keeping anything, and the caller reads that line with the
careful reader, which names every problem by file, line and span. Two leniencies, in fields no
OTLP writer gets wrong: integers written as ``"1e3"`` or ``"3.0"`` are read as the integers they
denote, and bytes that are not UTF-8 inside a field this reader skips (``scope``, ``traceState``)
are not noticed.

Events and links are rare (exceptions, batching) and go through the careful reader's own
functions, so they cannot differ. Metric lines (``resourceMetrics``) are read by the careful
reader too: a GPU sampler writes a few points a second, not spans' millions.
"""

from __future__ import annotations

import re
from operator import attrgetter
from typing import Any, Literal

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

from otel_stages.analysis.compact import (
    MAX_ATTRIBUTE_SETS,
    NO_ATTRIBUTES,
    SHARED_VALUE_MAX_CHARS,
    Compactor,
)
from otel_stages.analysis.model import AttributeValue, Span
from otel_stages.analysis.otlp_json import _events, _links, _Malformed, parse_export_request

# --- the wire shapes (OTLP/JSON, opentelemetry-proto trace/v1 and common/v1) --------------------
# Fields are the snake_case of the OTLP/JSON keys (rename="camel" maps them). Every field defaults
# to UNSET or to a value the checks below reject, so a missing field is told apart from an odd
# one; unknown fields (flags, kind, traceState, scope...) are skipped unread.


class _AnyValue(Struct, frozen=True, gc=False, forbid_unknown_fields=True, rename="camel"):
    # An unknown kind is a problem for the careful reader: forbidding unknown fields sends such a
    # line there even when the attribute would not be kept.
    string_value: str | UnsetType = UNSET
    bool_value: bool | str | UnsetType = UNSET
    int_value: int | UnsetType = UNSET
    double_value: float | Literal["NaN", "Infinity", "-Infinity"] | UnsetType = UNSET
    array_value: _ArrayValue | UnsetType = UNSET
    kvlist_value: _KeyValueList | UnsetType = UNSET
    bytes_value: str | UnsetType = UNSET


class _ArrayValue(Struct, frozen=True, gc=False, rename="camel"):
    values: list[_AnyValue] = []


class _KeyValue(Struct, gc=False, rename="camel"):
    key: str
    value: _AnyValue | UnsetType = UNSET


class _KeyValueList(Struct, gc=False, rename="camel"):
    values: list[_KeyValue] = []


class _Status(Struct, gc=False, rename="camel"):
    code: int | str | UnsetType = UNSET


class _Span(Struct, gc=False, rename="camel"):
    trace_id: str = ""
    span_id: str = ""
    parent_span_id: str = ""
    name: str = ""
    start_time_unix_nano: int | None = None
    end_time_unix_nano: int | None = None
    attributes: list[_KeyValue] | UnsetType = UNSET
    events: Raw | UnsetType = UNSET
    links: Raw | UnsetType = UNSET
    status: _Status | UnsetType = UNSET


class _ScopeSpans(Struct, gc=False, rename="camel"):
    spans: list[_Span] | UnsetType = UNSET


class _Resource(Struct, gc=False, rename="camel"):
    attributes: list[_KeyValue] | UnsetType = UNSET


class _ResourceSpans(Struct, gc=False, rename="camel"):
    resource: _Resource | UnsetType = UNSET
    scope_spans: list[_ScopeSpans] | UnsetType = UNSET
    instrumentation_library_spans: list[_ScopeSpans] | UnsetType = UNSET


class _ExportRequest(Struct, gc=False, rename="camel"):
    resource_spans: list[_ResourceSpans] | UnsetType = UNSET
    resource_metrics: Raw | UnsetType = UNSET
    resource_logs: Raw | UnsetType = UNSET


# strict=False: OTLP/JSON writes 64-bit integers (times, int_value) as decimal strings.
_DECODER = msgspec.json.Decoder(_ExportRequest, strict=False)
_RAW_DECODER = msgspec.json.Decoder()
_HEX = re.compile("[0-9a-f]*")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
_STATUS_ERROR = (2, "STATUS_CODE_ERROR")
_TRACE_ID, _SPAN_ID, _PARENT_SPAN_ID = (attrgetter(f) for f in ("trace_id", "span_id", "parent_span_id"))


class _Fallback(Exception):
    """This line needs the careful reader."""


def read_line(line: bytes, where: str, into: Compactor) -> bool:
    """Read one OTLP/JSON line into ``into``; ``False`` (nothing kept) when the careful reader
    must read it (see the module docstring). ``where`` (``"traces.jsonl:12"``) prefixes
    problems of the metric part."""
    try:
        doc = _DECODER.decode(line)
    except msgspec.DecodeError:  # not JSON, or not shaped as an export request
        return False
    if doc.resource_spans is UNSET and doc.resource_metrics is UNSET and doc.resource_logs is UNSET:
        return False  # another document (Jaeger, Tempo...): the careful reader names it
    spans: list[Span] = []
    if doc.resource_spans is not UNSET:
        try:
            _read_spans(doc.resource_spans, into, spans)
        except (_Fallback, _Malformed, ValueError, TypeError, KeyError, msgspec.DecodeError):
            return False
    if doc.resource_metrics is not UNSET:
        points = _RAW_DECODER.decode(doc.resource_metrics)
        into.add(parse_export_request({"resourceMetrics": points}, where=where))
    into.out.spans.extend(spans)
    return True


def _read_spans(blocks: list[_ResourceSpans], into: Compactor, out: list[Span]) -> None:
    """Every span of ``blocks`` into ``out``; raises :class:`_Fallback` (or the careful
    helpers' errors) at the first thing only the careful reader can report."""
    trace_ids, parent_ids, names, values = into.trace_ids, into.parent_ids, into.names, into.values
    keys, sets = into.keys, into.attribute_sets
    key_of = keys.get if into.selection.attributes is not None else keys.__getitem__
    new, append = Span, out.append
    for block in blocks:
        scopes = block.scope_spans
        if scopes is UNSET:
            scopes = block.instrumentation_library_spans
            if scopes is UNSET:
                scopes = []
        resource = into.resource(_resource(block.resource))
        for scope in scopes:
            spans = scope.spans
            if spans is UNSET:
                continue
            # ids are lowercase hex (lengths are checked below): one match over them all, the
            # joins run in C
            ids = "".join(map(_TRACE_ID, spans)) + "".join(map(_SPAN_ID, spans))
            if _HEX.fullmatch(ids + "".join(map(_PARENT_SPAN_ID, spans))) is None:
                raise _Fallback  # an upper-case or non-hex id: the careful reader
            for s in spans:
                trace_id, span_id, parent_id, name = s.trace_id, s.span_id, s.parent_span_id, s.name
                start, end = s.start_time_unix_nano, s.end_time_unix_nano
                if (len(trace_id) != 32 or len(span_id) != 16 or not name or start is None
                        or end is None or end < start or trace_id == _ZERO_TRACE
                        or span_id == _ZERO_SPAN):
                    raise _Fallback
                if parent_id:
                    if len(parent_id) != 16:
                        raise _Fallback
                    parent: str | None = (None if parent_id == _ZERO_SPAN
                                          else parent_ids.setdefault(parent_id, parent_id))
                else:
                    parent = None
                attrs: dict[str, AttributeValue] = NO_ATTRIBUTES
                if s.attributes:
                    items: list[Any] = []  # key, value, key, value...
                    shareable = True  # every value a str or an int: see Compactor.attribute_sets
                    for kv in s.attributes:
                        key = key_of(kv.key)
                        if key is None:
                            continue
                        v = kv.value
                        if v is UNSET:
                            x: AttributeValue = None
                            shareable = False
                        else:
                            x = v.string_value
                            if x is UNSET:
                                x = v.int_value
                                if x is UNSET or v.bool_value is not UNSET:
                                    x = _other_value(v)
                                    shareable = False
                            elif len(x) <= SHARED_VALUE_MAX_CHARS:
                                x = values.setdefault(x, x)
                        items += (key, x)
                    if items:
                        if shareable:
                            shape = tuple(items)
                            found = sets.get(shape)
                            if found is None:
                                found = _dict_of(items)
                                if len(sets) < MAX_ATTRIBUTE_SETS:
                                    sets[shape] = found
                            attrs = found
                        else:
                            attrs = _dict_of(items)
                status = s.status
                append(new(
                    trace_ids.setdefault(trace_id, trace_id),
                    span_id,
                    parent,
                    names.setdefault(name, name),
                    start,
                    end,
                    attrs,
                    resource,
                    status is not UNSET and status.code in _STATUS_ERROR,
                    () if s.events is UNSET else into.events(_events(_RAW_DECODER.decode(s.events))),
                    False,
                    () if s.links is UNSET else _links(_RAW_DECODER.decode(s.links)),
                ))


def _dict_of(items: list[Any]) -> dict[str, AttributeValue]:
    """``[k1, v1, k2, v2...]`` as a dict (a repeated key: the last value, as in the file)."""
    pairs = iter(items)
    return dict(zip(pairs, pairs))


def _resource(resource: _Resource | UnsetType) -> dict[str, AttributeValue]:
    if resource is UNSET or resource.attributes is UNSET:
        return {}
    out: dict[str, AttributeValue] = {}
    for kv in resource.attributes:
        out[kv.key] = None if kv.value is UNSET else _other_value(kv.value)
    return out


def _other_value(v: _AnyValue) -> AttributeValue:
    """An ``AnyValue`` in the careful reader's order of kinds (``decode_any_value``)."""
    if v.string_value is not UNSET:
        return v.string_value
    b = v.bool_value
    if b is not UNSET:
        return b if isinstance(b, bool) else b.lower() == "true"
    if v.int_value is not UNSET:
        return v.int_value
    d = v.double_value
    if d is not UNSET:
        return d if isinstance(d, float) else float(d)  # "NaN", "Infinity", "-Infinity"
    if v.array_value is not UNSET:
        return [_other_value(item) for item in v.array_value.values]
    if v.kvlist_value is not UNSET:
        return {kv.key: None if kv.value is UNSET else _other_value(kv.value)
                for kv in v.kvlist_value.values}
    if v.bytes_value is not UNSET:
        return v.bytes_value
    return None  # {}: unknown kinds never get here (forbid_unknown_fields)
