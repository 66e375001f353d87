"""Recognise what a trace file holds by its content (never its name) and parse it, streaming:
bytes in (:func:`read_chunks`, or all at once with :func:`decode`), records out into a
:class:`~otel_stages.analysis.compact.Compactor`. Memory follows the records kept, not the file:
JSON lines are read one at a time, and compressed input is decompressed as it is read.

Layers, outermost first:

1. **Compression**, by magic bytes: gzip (``1f 8b``; several members are read in turn, as
   ``gzip -d`` does) and zstd (``28 b5 2f fd``; several frames are read in turn). The
   OpenTelemetry Collector's ``file`` exporter writes zstd in two framings (contrib
   ``exporter/fileexporter``): by default each export is compressed on its own and written as a
   4-byte big-endian length followed by that zstd frame (``file_writer.go``:
   ``exportMessageAsBuffer``, chosen whenever ``compression`` is set); with the feature gate
   ``exporter.file.nativeCompression`` (v0.154+) the whole file is a zstd stream of JSON lines
   (``compression_writer.go``). Both are read. A file cut short (the collector still writing, or
   killed) keeps what decompressed, with a problem saying where it stopped. In the length-prefixed
   framing, a record of length 0 ends the reading with a problem.
2. **Framing**: JSON lines (one document per line), one pretty-printed document, several
   concatenated documents, or a JSON array of documents. The Collector's ``format: proto`` (4-byte
   length + OTLP protobuf) is recognised and named, not read. JSON lines (the first non-blank line
   is a JSON document) are streamed; the other framings are small documents and are read whole.
   Each OTLP line goes through the fast reader (:mod:`otel_stages.analysis.otlp_fast`) and, when
   it holds anything odd, the careful one.
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
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from otel_stages.analysis.chunks import MAX_NESTING as MAX_NESTING  # where layers come off
from otel_stages.analysis.chunks import (
    ZSTD_MAGIC,
    Tee,
    decompressed,
    length_prefixed_records,
    split_lines,
    strip_bom,
    unzstd,
)
from otel_stages.analysis.compact import Compactor
from otel_stages.analysis.model import Recording
from otel_stages.analysis.otlp_fast import read_line
from otel_stages.analysis.selection import ALL, Selection

#: Protobuf tag of field 1 (``resource_spans``/``resource_metrics``), wire type 2: the first byte
#: of an OTLP export request in protobuf.
_PROTO_FIELD1 = 0x0A
_OTLP_KEYS = ("resourceSpans", "resourceMetrics", "resourceLogs")
_CONSOLE_HINT = (
    "export with an OTLP exporter instead: otel_stages.configure() writes OTLP/JSON files, so does"
    " a Collector's file exporter, or send OTLP to Jaeger/Tempo and use --jaeger/--tempo"
)


def decode(data: bytes, name: str, *, selection: Selection = ALL) -> Recording:
    """Parse one file's (or stdin's) bytes, whatever the format above; ``name`` prefixes problems;
    ``selection`` says which span attributes to keep.

    Never raises for bad input. An empty file gives an empty :class:`Recording`.
    """
    into = Compactor(selection)
    read_chunks([data], name, into)
    return into.out


def read_chunks(chunks: Iterable[bytes], name: str, into: Compactor) -> None:
    """Parse a file given as successive byte chunks (any sizes) into ``into``; never raises for
    bad input. Chunks are pulled as reading goes, so a reader that reports progress per chunk
    reports it as the file is read."""
    _read(iter(chunks), name, into, depth=0)


def _read(chunks: Iterator[bytes], name: str, into: Compactor, depth: int) -> None:
    problems = into.out.problems
    at = len(problems)
    plain = decompressed(chunks, name, problems, depth)
    if not plain.too_deep:
        _read_plain(plain.head, plain.chunks, plain.name, into, plain.depth)
    # said before what the cut-short content gave, as it happened first
    problems[at:at] = plain.cut_problems()


def _read_plain(head: bytes, chunks: Iterator[bytes], name: str, into: Compactor, depth: int
                ) -> None:
    """Uncompressed bytes (``head``: the first of ``chunks``): framing, then documents."""
    problems = into.out.problems
    if len(head) >= 5 and head[4:8] == ZSTD_MAGIC:
        _read_zstd_records(chunks, name, into, depth)
        return
    if len(head) >= 5 and head[4] == _PROTO_FIELD1:  # OTLP protobuf records, or text after all
        data = b"".join(chunks)
        records = _length_prefixed(data)
        if records is not None:
            _decode_records(records, name, into, depth)
        else:
            _decode_text(data, name, into)
        return
    binary = _binary_kind(head)
    if binary is not None:
        problems.append(f"{name}: {binary}, not a trace file; not read")
        return
    _read_text(chunks, name, into)


#: Magic numbers of files people pass by mistake (the images the service serves, archives).
_BINARY_MAGIC = ((b"\xff\xd8\xff", "a JPEG image"), (b"\x89PNG\r\n\x1a\n", "a PNG image"),
                 (b"GIF8", "a GIF image"), (b"PK\x03\x04", "a zip archive"),
                 (b"%PDF", "a PDF document"), (b"\x7fELF", "an executable"))


def _binary_kind(head: bytes) -> str | None:
    """What the file is when its first bytes are binary rather than text, else ``None``."""
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "UTF-16 text (save it as UTF-8)"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    for magic, kind in _BINARY_MAGIC:
        if head.startswith(magic):
            return kind
    sample = head[:4096]
    if b"\x00" in sample:
        return "binary data"
    return None


# --- compression and framing -------------------------------------------------------------------


def _read_zstd_records(chunks: Iterator[bytes], name: str, into: Compactor, depth: int) -> None:
    """The Collector file exporter's default zstd framing, one record at a time (a 4-byte
    big-endian length, then one zstd frame per export); the last record may be cut short."""
    proto = 0
    for number, record in length_prefixed_records(chunks, name, into.out.problems):
        proto += _decode_record(record, f"{name} record {number}", into, depth)
    _proto_problem(proto, name, into)


def _length_prefixed(data: bytes) -> list[bytes] | None:
    """Records of the Collector file exporter's binary framing (4-byte big-endian length, then the
    record), or ``None`` when ``data`` is not that: the lengths must tile the file."""
    records, pos = [], 0
    while pos + 4 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        if size == 0:
            return None
        records.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    if pos != len(data):
        return None
    return records


def _decode_record(record: bytes, where: str, into: Compactor, depth: int) -> int:
    """One length-prefixed record; returns 1 when it is OTLP protobuf (counted, not read)."""
    if not record.startswith(ZSTD_MAGIC):
        return 1
    cut: list[str] = []
    inner = b"".join(unzstd(iter([record]), cut))
    if cut:
        into.out.problems.append(f"{where}: zstd frame cut short or damaged ({cut[0]})")
    if inner[:1] == bytes([_PROTO_FIELD1]):
        return 1
    _read(iter([inner]), where, into, depth + 1)
    return 0


def _decode_records(records: list[bytes], name: str, into: Compactor, depth: int) -> None:
    proto = sum(_decode_record(r, f"{name} record {i}", into, depth)
                for i, r in enumerate(records, start=1))
    _proto_problem(proto, name, into)


def _proto_problem(proto: int, name: str, into: Compactor) -> None:
    if proto:
        into.out.problems.append(
            f"{name}: {proto} record(s) of OTLP protobuf (the Collector file exporter's"
            " `format: proto`), which otel-stages does not read: set `format: json` on that exporter"
        )


# --- text: lines, documents, arrays -------------------------------------------------------------


def _read_text(chunks: Iterator[bytes], name: str, into: Compactor) -> None:
    """JSON lines streamed line by line; when the first non-blank line is no JSON document, the
    whole text is read at once (one pretty-printed document, concatenated ones, console output)."""
    tee = Tee(strip_bom(chunks))
    lines = enumerate(split_lines(iter(tee)), start=1)
    console = 0
    for number, raw in lines:
        if not raw.strip():
            continue
        where = f"{name}:{number}"
        if not read_line(raw, where, into):
            if json_or_bad(raw) is BAD:
                seen = tee.seen or []
                tee.forget()
                _decode_text(b"".join(seen) + b"".join(tee.chunks), name, into)
                return
            console += _careful_line(raw, where, into)
        break
    tee.forget()
    for number, raw in lines:
        if raw.strip():
            where = f"{name}:{number}"
            if not read_line(raw, where, into):
                console += _careful_line(raw, where, into)
    _console_problem(console, name, into)


def _careful_line(raw: bytes, where: str, into: Compactor) -> int:
    """One line through the careful reader; returns 1 for a console-exporter span."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        into.out.problems.append(f"{where}: not UTF-8 text")
        return 0
    except json.JSONDecodeError as exc:
        into.out.problems.append(f"{where}: not valid JSON ({_short(exc)})")
        return 0
    part = Recording()
    console = _dispatch(obj, where, part)
    into.add(part)
    return console


def _decode_text(data: bytes, name: str, into: Compactor) -> None:
    """Whole-text reading: when the first non-blank line is no JSON document and the text is
    whitespace-separated documents, those; else lines."""
    data = data.removeprefix(codecs.BOM_UTF8)
    first = next((line for line in data.splitlines() if line.strip()), None)
    if first is None:
        return
    docs = _concatenated(data) if json_or_bad(first) is BAD else None
    if docs is not None:
        console = 0
        for obj, line in docs:
            where = f"{name}:{line}" if len(docs) > 1 else name
            part = Recording()
            console += _dispatch(obj, where, part)
            into.add(part)
        _console_problem(console, name, into)
        return
    console = 0
    for number, raw in enumerate(data.splitlines(), start=1):
        if raw.strip():
            where = f"{name}:{number}"
            if not read_line(raw, where, into):
                console += _careful_line(raw, where, into)
    _console_problem(console, name, into)


class _Bad:
    pass


#: What :func:`json_or_bad` returns for a line that is no JSON document (``None`` is ``null``).
BAD: Any = _Bad()


def json_or_bad(line: bytes) -> Any:
    """The JSON document in ``line`` (UTF-8), or :data:`BAD`."""
    try:
        return json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return BAD


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
        zipkin = _zipkin_spans(obj)
        if zipkin:
            out.problems.append(
                f"{where}: Zipkin v2 JSON ({zipkin} spans), not read: otel-stages reads OTLP;"
                " send the spans through an OpenTelemetry Collector with the zipkin receiver and"
                " an OTLP or file exporter, or record them with otel_stages.configure()")
            return 0
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
    elif obj.keys() >= _REPORT_KEYS:  # before Tempo's: a report has a "batches" key too
        out.problems.append(f"{where}: an otel-stages report (report --json output), not traces;"
                            " give the trace files it was made from")
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


#: Keys every ``otel-stages report --json`` object has (DESIGN.md section 3).
_REPORT_KEYS = frozenset({"requests", "stages", "verdict"})


def _zipkin_spans(obj: list[Any]) -> int:
    """How many Zipkin v2 spans ``obj`` holds when it is Zipkin JSON (a list of spans, as
    ``POST /api/v2/spans`` takes, or a list of traces, as ``GET /api/v2/traces`` answers: spans
    with ``traceId``, ``id`` and ``timestamp`` / ``localEndpoint``; zipkin2-api.yaml), else 0."""
    spans = [s for item in obj for s in (item if isinstance(item, list) else [item])]

    def is_span(s: Any) -> bool:
        return (isinstance(s, Mapping) and "traceId" in s and "id" in s
                and ("timestamp" in s or "localEndpoint" in s) and not s.keys() & set(_OTLP_KEYS))

    return len(spans) if spans and all(map(is_span, spans)) else 0


def _console_problem(count: int, name: str, into: Compactor) -> None:
    if count:
        into.out.problems.append(
            f"{name}: this is the OpenTelemetry Python ConsoleSpanExporter's output ({count} spans"
            f" printed for reading, not an export format; its times are rounded text), so it is"
            f" not read: {_CONSOLE_HINT}"
        )



def binary_kind(head: bytes) -> str | None:
    """What a file is when its first bytes (a few KiB) are binary rather than text (``"a JPEG
    image"``, ``"binary data"``...), else ``None``."""
    return _binary_kind(head)


def concatenated_documents(data: bytes) -> list[tuple[Any, int]] | None:
    """Whitespace-separated JSON documents in ``data`` with the line each starts on; ``None``
    unless the whole text is such documents."""
    return _concatenated(data)
