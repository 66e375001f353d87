"""Every file format ``otel-stages report`` reads, recognised by content, each built the way its
producer writes it:

- Collector ``file`` exporter with ``compression: zstd``: by default each export request is one
  zstd frame (klauspost ``EncodeAll``: content size in the header) behind a 4-byte big-endian
  length (contrib ``exporter/fileexporter/file_writer.go`` ``exportMessageAsBuffer``, chosen in
  ``buildExportFunc`` whenever compression is set); with the gate
  ``exporter.file.nativeCompression`` one zstd stream of JSON lines, a frame closed at each flush
  (``compression_writer.go``). ``format: proto`` is the same 4-byte framing around OTLP protobuf.
- gzip: what ``gzip`` / logrotate make of a JSON lines file (several members when appended).
- Jaeger query API / UI download ``{"data": [...]}`` and Tempo's ``{"batches": [...]}``: the
  recorded answers in tests/data/sources, saved to files.
- Jaeger api/v3 ``{"result": {"resourceSpans": [...]}}``: its HTTP gateway's ``GRPCGatewayWrapper``
  with pdata JSON inside (hex ids, enums as numbers; jaeger ``cmd/jaeger/internal/extension/
  jaegerquery/internal/apiv3/snapshots/GetTrace.json``).
- OTLP before 1.0 (``instrumentationLibrarySpans``).
- The OpenTelemetry Python SDK's ``ConsoleSpanExporter`` (run for real here).
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import zstandard

from otel_stages.analysis import diagnose, load_paths
from otel_stages.analysis.files import load_bytes
from otel_stages.analysis.formats import is_console_span
from otel_stages.cli import main

DATA = Path(__file__).parent / "data"
TRACES = DATA / "traces"
SOURCES = DATA / "sources"
SCENARIO = TRACES / "queue_batching.otlp.jsonl"


def _lines(path: Path = SCENARIO) -> list[bytes]:
    """The scenario as one export request per trace (plus its metrics lines), the way a
    collector's batches often arrive: enough records for compression framing to matter."""
    out: list[bytes] = []
    for line in path.read_bytes().splitlines():
        doc = json.loads(line)
        if "resourceSpans" not in doc:
            out.append(line)
            continue
        by_trace: dict[str, list] = defaultdict(list)
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    by_trace[span["traceId"]].append((rs["resource"], ss.get("scope", {}), span))
        for spans in by_trace.values():
            out.append(json.dumps({"resourceSpans": [
                {"resource": r, "scopeSpans": [{"scope": sc, "spans": [sp]}]} for r, sc, sp in spans
            ]}, separators=(",", ":")).encode())
    return out


def _reference() -> tuple[int, str | None, list]:
    recording = load_paths([SCENARIO])
    report = diagnose(recording)
    return report.requests, report.verdict.cause, sorted(recording.spans, key=_key)


def _key(span):
    return (span.trace_id, span.span_id)


def _assert_same_as_plain(recording, problems: list[str] | None = None) -> None:
    requests, cause, spans = _reference()
    assert recording.problems == (problems or [])
    assert sorted(recording.spans, key=_key) == spans
    report = diagnose(recording)
    assert (report.requests, report.verdict.cause) == (requests, cause) == (30, "queue")


# --- compression --------------------------------------------------------------------------------


def _collector_legacy_zstd(lines: list[bytes]) -> bytes:
    """exportMessageAsBuffer: 4-byte big-endian length + one zstd frame per export request."""
    cctx = zstandard.ZstdCompressor(write_content_size=True)
    out = b""
    for line in lines:
        frame = cctx.compress(line)
        out += len(frame).to_bytes(4, "big") + frame
    return out


def _collector_native_zstd(lines: list[bytes], flush_every: int = 7) -> bytes:
    """nativeCompression: one stream of JSON lines, a frame finished at each flush; streamed
    frames carry no content size."""
    cctx = zstandard.ZstdCompressor()
    out = b""
    for start in range(0, len(lines), flush_every):
        stream = cctx.compressobj()
        for line in lines[start : start + flush_every]:
            out += stream.compress(line + b"\n")
        out += stream.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
    return out


def test_collector_file_exporter_zstd_default_framing(tmp_path: Path):
    path = tmp_path / "traces.log"  # the name says nothing: content decides
    path.write_bytes(_collector_legacy_zstd(_lines()))
    assert path.read_bytes()[4:8] == b"\x28\xb5\x2f\xfd"
    _assert_same_as_plain(load_paths([path]))


def test_collector_file_exporter_native_zstd_stream(tmp_path: Path):
    data = _collector_native_zstd(_lines())
    assert data.count(b"\x28\xb5\x2f\xfd") > 1  # several frames, as each flush closes one
    path = tmp_path / "traces.zst"
    path.write_bytes(data)
    _assert_same_as_plain(load_paths([path]))


def test_gzip_files_and_appended_members(tmp_path: Path):
    lines = _lines()
    half = len(lines) // 2
    data = gzip.compress(b"\n".join(lines[:half]) + b"\n") + gzip.compress(
        b"\n".join(lines[half:]) + b"\n"
    )
    (tmp_path / "a.jsonl.gz").write_bytes(data)
    (tmp_path / "notes.txt.gz").write_bytes(gzip.compress(b"not telemetry"))  # not searched
    _assert_same_as_plain(load_paths([tmp_path]))


def test_folder_search_picks_compressed_endings(tmp_path: Path):
    lines = _lines()
    (tmp_path / "one.json.zst").write_bytes(_collector_native_zstd(lines[:5]))
    (tmp_path / "two.zst").write_bytes(_collector_legacy_zstd(lines[5:10]))
    (tmp_path / "three.ndjson").write_bytes(b"\n".join(lines[10:]) + b"\n")
    _assert_same_as_plain(load_paths([tmp_path]))


@pytest.mark.parametrize("kind", ["gzip", "zstd-native", "zstd-framed"])
def test_a_compressed_file_cut_short_keeps_what_came_before(kind, tmp_path: Path):
    lines = _lines()
    if kind == "gzip":
        data = gzip.compress(b"\n".join(lines) + b"\n")
    elif kind == "zstd-native":
        data = _collector_native_zstd(lines, flush_every=3)
    else:
        data = _collector_legacy_zstd(lines)
    cut = data[: int(len(data) * 0.6)]
    out = load_bytes(cut, "t")
    assert out.spans and len(out.spans) < len(load_paths([SCENARIO]).spans)
    assert any("cut short" in p for p in out.problems), out.problems
    assert len(out.problems) <= 2  # the cut, and at most the one line it split


def test_collector_proto_format_is_named_not_misread(tmp_path: Path):
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    records = b""
    for line in _lines()[:3]:
        msg = json_format.Parse(line, ExportTraceServiceRequest())
        body = msg.SerializeToString()
        records += len(body).to_bytes(4, "big") + body
    out = load_bytes(records, "traces.proto")
    assert out.spans == []
    assert len(out.problems) == 1 and "3 record(s) of OTLP protobuf" in out.problems[0]
    assert "format: json" in out.problems[0]
    framed_zstd = b"".join(
        len(f).to_bytes(4, "big") + f
        for f in [zstandard.ZstdCompressor().compress(records[4 : 4 + int.from_bytes(records[:4], "big")])]
    )
    assert "OTLP protobuf" in load_bytes(framed_zstd, "p").problems[0]


# --- document shapes ------------------------------------------------------------------------------


def _cassette(name: str) -> dict:
    return json.loads((SOURCES / f"{name}.json").read_text())


def test_jaeger_and_tempo_json_saved_to_files(tmp_path: Path):
    jaeger = _cassette("jaeger_queue_batching")
    tempo = _cassette("tempo_queue_batching")  # Tempo 1.x field names in this one
    (tmp_path / "jaeger").mkdir()
    (tmp_path / "tempo").mkdir()
    for i, body in enumerate(jaeger["traces"].values()):
        (tmp_path / "jaeger" / f"trace-{i}.json").write_text(json.dumps(body, indent=2))
    for i, body in enumerate(tempo["traces"].values()):
        (tmp_path / "tempo" / f"trace-{i}.json").write_text(json.dumps(body))
    from_jaeger = load_paths([tmp_path / "jaeger"])
    from_tempo = load_paths([tmp_path / "tempo"])
    assert from_jaeger.problems == [] and from_tempo.problems == []
    _assert_same_as_plain(from_tempo)
    j, t = diagnose(from_jaeger), diagnose(from_tempo)
    assert (j.requests, j.verdict.cause, j.verdict.stage) == (t.requests, t.verdict.cause, t.verdict.stage)
    # the search answer (all traces in one {"data": [...]}) and a bare trace object read alike
    (tmp_path / "search.json").write_text(json.dumps(jaeger["search"]))
    one = next(iter(jaeger["traces"].values()))["data"][0]
    (tmp_path / "one.json").write_text(json.dumps(one))
    assert diagnose(load_paths([tmp_path / "search.json"])).requests == 30
    assert len(load_paths([tmp_path / "one.json"]).spans) == len(one["spans"])


def _jaeger_v3_bodies() -> list[str]:
    """One GET /api/v3/traces/{id} answer per trace: {"result": TracesData}, pdata JSON inside."""
    by_trace: dict[str, list] = defaultdict(list)
    for line in _lines():
        doc = json.loads(line)
        for rs in doc.get("resourceSpans", []):
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    span = dict(span, kind=int(span.get("kind", 1)))
                    by_trace[span["traceId"]].append((rs["resource"], ss.get("scope", {}), span))
    bodies = []
    for spans in by_trace.values():
        resource_spans = [
            {"resource": res, "scopeSpans": [{"scope": scope, "spans": [span]}]}
            for res, scope, span in spans
        ]
        bodies.append(json.dumps({"result": {"resourceSpans": resource_spans}}, separators=(",", ":")))
    return bodies


def test_jaeger_api_v3_answers(tmp_path: Path):
    bodies = _jaeger_v3_bodies()
    assert len(bodies) == 30
    (tmp_path / "v3.json").write_text("\n".join(bodies) + "\n")  # several answers, one per line
    recording = load_paths([tmp_path / "v3.json"])
    _, cause, spans = _reference()
    assert recording.problems == []
    assert sorted(recording.spans, key=_key) == spans
    assert diagnose(recording).verdict.cause == cause
    error = {"error": {"httpCode": 404, "message": "No traces found"}}
    out = load_bytes(json.dumps(error).encode(), "v3-err.json")
    assert out.problems == [
        "v3-err.json:1: a Jaeger api/v3 error answer, not traces: HTTP 404 No traces found"
    ]


def test_legacy_otlp_instrumentation_library_names(tmp_path: Path):
    text = SCENARIO.read_text()
    legacy = text.replace('"scopeSpans"', '"instrumentationLibrarySpans"').replace(
        '"scope"', '"instrumentationLibrary"'
    ).replace('"scopeMetrics"', '"instrumentationLibraryMetrics"')
    assert "scopeSpans" not in legacy
    path = tmp_path / "old.jsonl"
    path.write_text(legacy)
    recording = load_paths([path])
    _assert_same_as_plain(recording)
    assert len(recording.metrics) == len(load_paths([SCENARIO]).metrics)


def _console_exporter_output(n: int) -> str:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    out = io.StringIO()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out)))
    tracer = provider.get_tracer("t")
    for _ in range(n):
        with tracer.start_as_current_span("request"):
            with tracer.start_as_current_span("decode"):
                pass
    provider.shutdown()
    return out.getvalue()


def test_console_exporter_output_is_named_in_one_sentence(tmp_path: Path):
    text = _console_exporter_output(4)
    assert text.count('"trace_id": "0x') == 8 and text.lstrip().startswith("{")
    path = tmp_path / "console.txt"
    path.write_text(text)
    recording = load_paths([path])
    assert recording.spans == []
    assert len(recording.problems) == 1
    problem = recording.problems[0]
    assert problem.startswith(f"{path}: this is the OpenTelemetry Python ConsoleSpanExporter's output (8 spans")
    assert "OTLP" in problem
    assert is_console_span(json.loads(text[: text.index("\n}") + 2]))


def test_pretty_printed_documents_in_a_row():
    lines = [json.loads(line) for line in _lines()]
    text = "\n".join(json.dumps(doc, indent=2) for doc in lines)
    recording = load_bytes(text.encode(), "pretty.json")
    _assert_same_as_plain(recording)


def test_garbage_lines_still_named_by_line():
    data = b"\n".join(_lines()[:3]) + b"\nnot json\n{\"what\": 1}\n"
    out = load_bytes(data, "f")
    assert out.problems[0].startswith("f:4: not valid JSON")
    assert out.problems[1].startswith("f:5: not an OTLP export request, nor Jaeger or Tempo")
    assert len(out.problems) == 2


# --- events ---------------------------------------------------------------------------------------


def test_otlp_and_jaeger_events_are_read():
    from otel_stages.analysis.jaeger import parse_jaeger_span
    from otel_stages.analysis.otlp_json import parse_export_request

    span = {
        "traceId": "0" * 31 + "1",
        "spanId": "0" * 15 + "2",
        "name": "simple",
        "startTimeUnixNano": "100",
        "endTimeUnixNano": "900",
        "events": [
            {"timeUnixNano": "300", "name": "QUEUE_START"},
            {"timeUnixNano": "200", "name": "REQUEST_START", "attributes": [
                {"key": "k", "value": {"intValue": "7"}}]},
        ],
    }
    rec = parse_export_request({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    (s,) = rec.spans
    assert [(e.name, e.time_ns, e.attributes) for e in s.events] == [
        ("REQUEST_START", 200, {"k": 7}),
        ("QUEUE_START", 300, {}),
    ]
    j = parse_jaeger_span(
        {
            "traceID": "1", "spanID": "2", "operationName": "simple", "startTime": 1, "duration": 5,
            "logs": [{"timestamp": 3, "fields": [
                {"key": "event", "type": "string", "value": "QUEUE_START"},
                {"key": "depth", "type": "int64", "value": 2}]}],
        }
    )
    assert [(e.name, e.time_ns, e.attributes) for e in j.events] == [("QUEUE_START", 3000, {"depth": 2})]


# --- the CLI on a terminal that is not UTF-8 -------------------------------------------------------


@pytest.mark.parametrize("encoding", ["cp1252", "ascii"])
def test_text_report_on_a_non_utf8_stdout(encoding):
    env = dict(os.environ, PYTHONIOENCODING=encoding, COLUMNS="100")
    result = subprocess.run(
        [sys.executable, "-m", "otel_stages.cli", "report", str(TRACES / "gpu_busy.otlp.jsonl")],
        capture_output=True, env=env, check=False,
    )
    err = result.stderr.decode(encoding, "replace")
    assert result.returncode == 0, err
    assert "Traceback" not in err
    text = result.stdout.decode(encoding)
    assert "Warm-run stages" in text and "Verdict:" in text
    assert "-----" in text and "\u2500" not in text  # ASCII table rules


def test_microseconds_stay_readable_on_an_ascii_stdout():
    """``µs`` is written ``us`` where the terminal cannot hold ``µ`` (not ``?s``); the fallback
    also takes arrows and signs, anything else becomes ``?``."""
    from otel_stages.terminal import FALLBACK_ERRORS

    assert "560 µs → 1.2 ms ≥ 2× …".encode("ascii", FALLBACK_ERRORS) == b"560 us -> 1.2 ms >= 2x ..."
    assert "decode 解码".encode("ascii", FALLBACK_ERRORS) == b"decode ??"
    assert "µs".encode("cp1252", FALLBACK_ERRORS) == "µs".encode("cp1252")  # held: kept
    env = dict(os.environ, PYTHONIOENCODING="ascii", COLUMNS="100")
    result = subprocess.run(
        [sys.executable, "-m", "otel_stages.cli", "report",
         str(TRACES / "demo_sequential.otlp.jsonl")], capture_output=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    text = result.stdout.decode("ascii")
    assert re.search(r"\d us\b", text) and not re.search(r"\d \?s\b", text)


@pytest.mark.parametrize("argv", [
    ["collector-config"],
    ["decode-bench", "--repeat", "2"],  # the image is added below
    ["--help"],
])
def test_every_command_survives_an_ascii_stdout(argv, tmp_path):
    if argv[0] == "decode-bench":
        from PIL import Image

        image = tmp_path / "photo.jpg"
        Image.new("RGB", (320, 240), (200, 120, 40)).save(image, quality=90)
        argv = [*argv, str(image)]
    env = dict(os.environ, PYTHONIOENCODING="ascii", COLUMNS="100")
    result = subprocess.run([sys.executable, "-m", "otel_stages.cli", *argv], capture_output=True,
                            env=env, check=False)
    err = result.stderr.decode("ascii", "replace")
    assert result.returncode == 0 and "Traceback" not in err, err
    out = result.stdout.decode("utf-8")
    assert out.strip()
    if argv[0] == "decode-bench":
        assert "\u2500" not in out and "-----" in out  # ASCII table rules


def test_ctrl_c_while_the_commands_load_is_a_quiet_exit(monkeypatch):
    import otel_stages.cli as cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["report", "x"]) == 130


def test_text_report_on_utf8_keeps_box_rules(capsys):
    assert main(["report", str(TRACES / "gpu_busy.otlp.jsonl")]) == 0
    assert "\u2500\u2500\u2500" in capsys.readouterr().out


# --- what is not traces: one clear line, nothing read ------------------------------------------


def _problems(tmp_path: Path, name: str, data: bytes) -> list[str]:
    from otel_stages.analysis import load_paths

    path = tmp_path / name
    path.write_bytes(data)
    recording = load_paths([path])
    assert recording.spans == []
    return recording.problems


def test_zipkin_json_is_named_once_not_per_span(tmp_path):
    # Zipkin v2 spans as POST /api/v2/spans takes them and GET /api/v2/traces answers (a list of
    # traces): openzipkin/zipkin-api zipkin2-api.yaml (Span: traceId, id, parentId, name,
    # timestamp and duration in µs, localEndpoint, tags)
    spans = [{"traceId": "efc63f0cd0e873a0000c6d07ef7b77e9", "id": f"{i:016x}", "name": "decode",
              "timestamp": 1790000000000000 + i, "duration": 5134, "kind": "SERVER",
              "localEndpoint": {"serviceName": "svc"}, "tags": {"stage": "decode"}}
             for i in range(1, 31)]
    for doc in (spans, [spans[:10], spans[10:]]):
        problems = _problems(tmp_path, "zipkin.json", json.dumps(doc).encode())
        assert len(problems) == 1 and "Zipkin v2 JSON (30 spans)" in problems[0], problems


def test_a_report_fed_back_is_named(tmp_path, capsys):
    assert main(["report", str(TRACES / "gpu_busy.otlp.jsonl"), "--json"]) == 0
    problems = _problems(tmp_path, "report.json", capsys.readouterr().out.encode())
    assert len(problems) == 1 and "an otel-stages report (report --json output)" in problems[0]


@pytest.mark.parametrize("fmt, kind", [("JPEG", "a JPEG image"), ("PNG", "a PNG image"),
                                       ("WEBP", "a WebP image")])
def test_an_image_given_as_traces_is_one_problem(tmp_path, fmt, kind):
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 200, 30)).save(out, fmt)
    problems = _problems(tmp_path, "photo.bin", out.getvalue())
    assert problems == [f"{tmp_path / 'photo.bin'}: {kind}, not a trace file; not read"]


def test_utf16_text_is_named(tmp_path):
    text = (TRACES / "gpu_busy.otlp.jsonl").read_text()
    problems = _problems(tmp_path, "t.jsonl", codecs.BOM_UTF16_LE + text.encode("utf-16-le"))
    assert len(problems) == 1 and "UTF-16 text (save it as UTF-8)" in problems[0]


def test_a_missing_path_on_the_command_line_is_a_usage_error(tmp_path, capsys):
    good = str(TRACES / "gpu_busy.otlp.jsonl")
    assert main(["report", good, str(tmp_path / "typo.jsonl")]) == 2
    assert "no such file or folder: " in capsys.readouterr().err
    assert main(["report", good, "--baseline", str(tmp_path / "nope")]) == 2
    assert main(["report", good]) == 0


def test_a_folder_without_trace_names_says_how_to_read_its_files(tmp_path):
    from otel_stages.analysis import load_paths

    (tmp_path / "traces").write_text((TRACES / "gpu_busy.otlp.jsonl").read_text())
    folder = load_paths([tmp_path])
    assert folder.spans == [] and "a file named otherwise is read when given by name" in folder.problems[0]
    assert load_paths([tmp_path / "traces"]).spans  # the same file by name: read by content
