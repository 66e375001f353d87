"""Recognise what a trace file holds by its content (never its name) and parse it. Pure: bytes in,
:class:`~otel_stages.analysis.model.Recording` out.

Layers, outermost first (:func:`decode`):

1. **Compression**, by magic bytes: gzip (``1f 8b``; several members are read in turn, as
   ``gzip -d`` does) and zstd (``28 b5 2f fd``; several frames are read in turn). The
   OpenTelemetry Collector's ``file`` exporter writes zstd in two framings (contrib
   ``exporter/fileexporter``): by default each export is compressed on its own and written as a
   4-byte big-endian length followed by that zstd frame (``file_writer.go``:
   ``exportMessageAsBuffer``, chosen whenever ``compression`` is set); with the feature gate
   ``exporter.file.nativeCompression`` (v0.154+) the whole file is a zstd stream of JSON lines
   (``compression_writer.go``). Both are read. A file cut short (the collector still writing, or
   killed) keeps what decompressed, with a problem saying where it stopped.
2. **Framing**: JSON lines (one document per line), one pretty-printed document, several
   concatenated documents, or a JSON array of documents. The Collector's ``format: proto`` (4-byte
   length + OTLP protobuf) is recognised and named, not read.
3. **Document shape**:

   - OTLP/JSON export request ``{"resourceSpans"|"resourceMetrics": [...]}`` (also OTLP before
     1.0, ``instrumentationLibrarySpans``): :func:`otlp_json.parse_export_request`;
   - Jaeger query API / UI download ``{"data": [trace...]}`` (or one trace ``{"traceID",
     "spans", "processes"}``): :func:`jaeger.parse_jaeger_response`;
   - Jaeger api/v3 ``{"result": {"resourceSpans": [...]}}`` (its HTTP gateway wraps each OTLP
     ``TracesData`` so; ``{"error": {...}}`` is its error body): the OTLP parser;
   - Tempo trace by id ``{"batches": [...]}`` (v1) or ``{"trace": {...}, "status"}`` (v2):
     :func:`tempo.parse_tempo_trace`;
   - the OpenTelemetry Python SDK's ``ConsoleSpanExporter`` output (indented span objects with
     ``"context": {"trace_id": "0x..."}``): recognised, and named in one problem that says how to
     write a file this tool reads instead (its times are text, rounded to microseconds, and it
     has no export structure).

Every malformed part becomes a ``Recording.problems`` message naming the file and line (or record);
the rest still loads.
"""

from __future__ import annotations

import codecs
import json
import zlib
from collections.abc import Mapping
from typing import Any

from otel_stages.analysis.model import Recording

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: Compressed inside compressed inside ...: deeper than this is not a trace file.
MAX_NESTING = 3
#: Protobuf tag of field 1 (``resource_spans``/``resource_metrics``), wire type 2: the first byte
#: of an OTLP export request in protobuf.
_PROTO_FIELD1 = 0x0A
_CHUNK = 1 << 20
_OTLP_KEYS = ("resourceSpans", "resourceMetrics", "resourceLogs")
_CONSOLE_HINT = (
    "export with an OTLP exporter instead: otel_stages.configure() writes OTLP/JSON files, so does"
    " a Collector's file exporter, or send OTLP to Jaeger/Tempo and use --jaeger/--tempo"
)


def decode(data: bytes, name: str) -> Recording:
    """Parse one file's (or stdin's) bytes, whatever the format above; ``name`` prefixes problems.

    Never raises for bad input. An empty file gives an empty :class:`Recording`.
    """
    out = Recording()
    _decode(data, name, out, depth=0)
    return out


def _decode(data: bytes, name: str, out: Recording, depth: int) -> None:
    if depth > MAX_NESTING:
        out.problems.append(f"{name}: compressed more than {MAX_NESTING} times over; not read")
        return
    if data.startswith(GZIP_MAGIC):
        inner, cut = _gunzip(data)
        if cut:
            out.problems.append(f"{name}: gzip data cut short or damaged ({cut}); read what came before")
        _decode(inner, f"{name} (gzip)", out, depth + 1)
        return
    if data.startswith(ZSTD_MAGIC):
        inner, cut = _unzstd(data)
        if cut:
            out.problems.append(f"{name}: zstd data cut short or damaged ({cut}); read what came before")
        _decode(inner, f"{name} (zstd)", out, depth + 1)
        return
    records = _length_prefixed(data)
    if records is not None:
        _decode_records(records, name, out, depth)
        return
    _decode_text(data, name, out)


# --- compression and framing -------------------------------------------------------------------


def _gunzip(data: bytes) -> tuple[bytes, str]:
    """Every gzip member in turn; returns (what decompressed, why it stopped early or "")."""
    parts: list[bytes] = []
    rest = data
    while rest.startswith(GZIP_MAGIC):
        d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            parts.append(d.decompress(rest))
        except zlib.error as exc:
            return b"".join(parts), str(exc)
        if not d.eof:
            parts.append(d.flush())
            return b"".join(parts), "the last member has no end"
        rest = d.unused_data.lstrip(b"\0")  # gzip allows zero padding between members
    return b"".join(parts), ""


def _unzstd(data: bytes) -> tuple[bytes, str]:
    """Every zstd frame in turn (streamed frames without a content size too); returns (what
    decompressed, why it stopped early or "")."""
    import zstandard  # a dependency; imported here so plain JSON files never load it

    dctx = zstandard.ZstdDecompressor()
    parts: list[bytes] = []
    rest = data
    while rest.startswith(ZSTD_MAGIC):
        d = dctx.decompressobj()
        try:
            parts.append(d.decompress(rest))
        except zstandard.ZstdError as exc:
            return b"".join(parts), str(exc)
        if not d.eof:
            return b"".join(parts), "the last frame has no end"
        rest = d.unused_data
    return b"".join(parts), ""


def _length_prefixed(data: bytes) -> list[bytes] | None:
    """Records of the Collector file exporter's binary framing (4-byte big-endian length, then the
    record), or ``None`` when ``data`` is not that: the first record must be a zstd frame or an
    OTLP protobuf message, and the lengths must tile the file (only a zstd file may end in a
    record cut short: the collector was still writing)."""
    if len(data) < 5 or not (data[4:8] == ZSTD_MAGIC or data[4] == _PROTO_FIELD1):
        return None
    records, pos = [], 0
    while pos + 4 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        if size == 0:
            return None
        records.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    if pos != len(data) and data[4:8] != ZSTD_MAGIC:
        return None
    return records


def _decode_records(records: list[bytes], name: str, out: Recording, depth: int) -> None:
    proto = 0
    for i, record in enumerate(records, start=1):
        where = f"{name} record {i}"
        if record.startswith(ZSTD_MAGIC):
            inner, cut = _unzstd(record)
            if cut:
                out.problems.append(f"{where}: zstd frame cut short or damaged ({cut})")
            if inner[:1] == bytes([_PROTO_FIELD1]):
                proto += 1
                continue
            _decode(inner, where, out, depth + 1)
        else:
            proto += 1
    if proto:
        out.problems.append(
            f"{name}: {proto} record(s) of OTLP protobuf (the Collector file exporter's"
            " `format: proto`), which otel-stages does not read: set `format: json` on that exporter"
        )


# --- text: lines, documents, arrays -------------------------------------------------------------


def _decode_text(data: bytes, name: str, out: Recording) -> None:
    if data.startswith(codecs.BOM_UTF8):  # Windows editors and PowerShell write one
        data = data[len(codecs.BOM_UTF8) :]
    lines = data.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return
    console = 0
    if _loads(lines[first]) is _BAD:
        docs = _concatenated(data)
        if docs is not None:
            for obj, line in docs:
                where = f"{name}:{line}" if len(docs) > 1 else name
                console += _dispatch(obj, where, out)
            _console_problem(console, name, out)
            return
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
        console += _dispatch(obj, where, out)
    _console_problem(console, name, out)


class _Bad:
    pass


_BAD = _Bad()


def _loads(line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return _BAD


def _concatenated(data: bytes) -> list[tuple[Any, int]] | None:
    """Whitespace-separated JSON documents (one pretty-printed document, or several in a row, as
    the console exporter prints them) with the line each starts on; ``None`` unless the whole
    text is such documents."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    decoder = json.JSONDecoder()
    docs: list[tuple[Any, int]] = []
    pos, line = 0, 1
    while True:
        start = pos
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        line += text.count("\n", start, pos)
        if pos == len(text):
            return docs
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return None
        docs.append((obj, line))
        line += text.count("\n", pos, end)
        pos = end


def _short(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg}: line {exc.lineno} column {exc.colno}"


# --- document shapes ----------------------------------------------------------------------------


def is_console_span(obj: Any) -> bool:
    """A span as the OpenTelemetry Python SDK's ``ConsoleSpanExporter`` prints it
    (``ReadableSpan.to_json()``: ``name``, ``context.trace_id`` as ``0x...`` hex, ISO times)."""
    if not isinstance(obj, Mapping) or not isinstance(obj.get("context"), Mapping):
        return False
    trace_id = obj["context"].get("trace_id")
    return "name" in obj and isinstance(trace_id, str) and trace_id.startswith("0x")


def _dispatch(obj: Any, where: str, out: Recording) -> int:
    """Parse one decoded document into ``out``; returns 1 for a console-exporter span (counted
    and named once per file by the caller), else 0."""
    from otel_stages.analysis.jaeger import parse_jaeger_response
    from otel_stages.analysis.otlp_json import parse_export_request
    from otel_stages.analysis.tempo import parse_tempo_trace

    if isinstance(obj, list):
        if not all(isinstance(item, Mapping) for item in obj):
            kinds = sorted({type(item).__name__ for item in obj if not isinstance(item, Mapping)})
            out.problems.append(f"{where}: expected a JSON object, got an array of {', '.join(kinds)}")
            return 0
        return sum(_dispatch(item, f"{where}[{i}]", out) for i, item in enumerate(obj))
    if not isinstance(obj, Mapping):
        out.problems.append(f"{where}: expected a JSON object, got {type(obj).__name__}")
        return 0
    if any(k in obj for k in _OTLP_KEYS):
        out.extend(parse_export_request(obj, where=where))
    elif "result" in obj and isinstance(obj["result"], Mapping):  # Jaeger api/v3
        out.extend(parse_export_request(obj["result"], where=f"{where}: result"))
    elif "error" in obj and isinstance(obj["error"], Mapping) and len(obj) == 1:
        err = obj["error"]
        out.problems.append(
            f"{where}: a Jaeger api/v3 error answer, not traces: HTTP {err.get('httpCode', '?')}"
            f" {err.get('message', '')}".rstrip()
        )
    elif isinstance(obj.get("data"), list) or obj.get("data", 0) is None:  # Jaeger query API
        out.extend(parse_jaeger_response(obj, where=where))
    elif "traceID" in obj and isinstance(obj.get("spans"), list):  # one Jaeger trace
        out.extend(parse_jaeger_response({"data": [obj]}, where=where))
    elif "batches" in obj or isinstance(obj.get("trace"), Mapping):  # Tempo trace by id
        out.extend(parse_tempo_trace(obj, where=where))
    elif is_console_span(obj):
        return 1
    else:
        keys = ", ".join(sorted(map(str, obj))[:6]) or "none"
        out.problems.append(
            f"{where}: not an OTLP export request, nor Jaeger or Tempo trace JSON (keys: {keys});"
            " otel-stages reads OTLP/JSON (resourceSpans), Jaeger ({\"data\": [...]}, api/v3"
            " {\"result\": ...}) and Tempo ({\"batches\": [...]}) JSON"
        )
    return 0


def _console_problem(count: int, name: str, out: Recording) -> None:
    if count:
        out.problems.append(
            f"{name}: this is the OpenTelemetry Python ConsoleSpanExporter's output ({count} spans"
            f" printed for reading, not an export format; its times are rounded text), so it is"
            f" not read: {_CONSOLE_HINT}"
        )

