"""OTLP/JSON reading: lines, documents, folders, base64 ids, metric points, and problems."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from otel_stages import semconv
from otel_stages.analysis import diagnose, load_paths
from otel_stages.analysis.otlp_json import (
    decode_any_value,
    decode_attributes,
    load_file,
    normalize_id,
    parse_export_request,
)
from otel_stages.analysis.requests import find_requests

CASES = Path(__file__).parent / "data" / "traces"
TRACE_HEX = "0af7651916cd43dd8448eb211c80319c"
REQUEST_HEX = "b7ad6b7169203331"
STAGE_HEX = "00f067aa0ba902b7"


def _span(trace: str, span: str, name: str, start: int, end: int, parent: str | None = None) -> dict:
    out = {
        "traceId": trace,
        "spanId": span,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [{"key": "image.width", "value": {"intValue": "640"}}],
        "status": {},
    }
    if parent:
        out["parentSpanId"] = parent
    return out


def _traces(*spans: dict) -> dict:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]}
    scope_spans = [{"scope": {"name": "x"}, "spans": list(spans)}]
    return {"resourceSpans": [{"resource": resource, "scopeSpans": scope_spans}]}


def _b64(hex_id: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


def test_hex_and_base64_ids_are_normalized():
    assert normalize_id(TRACE_HEX.upper(), 16) == TRACE_HEX
    assert normalize_id(_b64(TRACE_HEX), 16) == TRACE_HEX
    assert normalize_id(_b64(STAGE_HEX), 8) == STAGE_HEX
    assert normalize_id("", 8) is None
    assert normalize_id("0" * 16, 8) is None
    with pytest.raises(ValueError):
        normalize_id("not-an-id", 8)


def test_base64_ids_link_stage_spans_to_their_request():
    obj = _traces(
        _span(_b64(TRACE_HEX), _b64(REQUEST_HEX), "request", 1_000, 9_000_000),
        _span(_b64(TRACE_HEX), _b64(STAGE_HEX), "decode", 2_000, 5_000_000, parent=_b64(REQUEST_HEX)),
    )
    telemetry = parse_export_request(obj, where="x.json:1")
    assert telemetry.problems == []
    decode = next(s for s in telemetry.spans if s.name == "decode")
    assert (decode.trace_id, decode.span_id, decode.parent_span_id) == (TRACE_HEX, STAGE_HEX, REQUEST_HEX)
    (request,) = find_requests(telemetry.spans)
    assert request.span_id == REQUEST_HEX and request.image_width == 640


def test_attribute_values_decode_to_python_types():
    attrs = decode_attributes(
        [
            {"key": "i", "value": {"intValue": "42"}},
            {"key": "d", "value": {"doubleValue": 0.5}},
            {"key": "b", "value": {"boolValue": True}},
            {"key": "s", "value": {"stringValue": "JPEG"}},
            {"key": "a", "value": {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "x"}]}}},
            {"key": "kv", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"intValue": 2}}]}}},
            {"key": "empty", "value": {}},
        ]
    )
    assert attrs == {"i": 42, "d": 0.5, "b": True, "s": "JPEG", "a": [1, "x"], "kv": {"k": 2}, "empty": None}
    assert decode_any_value({"doubleValue": "NaN"}) != decode_any_value({"doubleValue": "NaN"})  # NaN


def test_gauge_and_sum_points_are_read_histograms_skipped():
    obj = {
        "resourceMetrics": [
            {
                "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "h1"}}]},
                "scopeMetrics": [
                    {
                        "metrics": [
                            {"name": semconv.HW_GPU_UTILIZATION, "unit": "1", "gauge": {"dataPoints": [
                                {"attributes": [{"key": "hw.id", "value": {"stringValue": "GPU-0"}}],
                                 "timeUnixNano": "1790000000000000000", "asDouble": 0.75}]}},
                            {"name": semconv.HW_GPU_MEMORY_USAGE, "unit": "By", "sum": {"dataPoints": [
                                {"timeUnixNano": "1790000000100000000", "asInt": "29850122098"}],
                                "aggregationTemporality": 2}},
                            {"name": "lat", "histogram": {"dataPoints": [{"count": "3"}]}},
                        ]
                    }
                ],
            }
        ]
    }
    telemetry = parse_export_request(obj)
    assert telemetry.problems == []
    util, memory = telemetry.metrics
    assert (util.name, util.value, util.time_ns) == (semconv.HW_GPU_UTILIZATION, 0.75, 1790000000000000000)
    assert util.attributes == {semconv.HW_ID: "GPU-0"} and util.resource == {"host.name": "h1"}
    assert memory.value == 29850122098.0


def test_error_status_marks_the_span():
    span = _span(TRACE_HEX, STAGE_HEX, "download", 1, 2, parent=REQUEST_HEX)
    span["status"] = {"code": 2, "message": "timeout"}
    (parsed,) = parse_export_request(_traces(span)).spans
    assert parsed.error is True


def test_bad_span_is_skipped_with_a_problem_and_siblings_kept():
    bad = _span(TRACE_HEX, STAGE_HEX, "decode", 1, 2, parent=REQUEST_HEX)
    del bad["startTimeUnixNano"]
    good = _span(TRACE_HEX, REQUEST_HEX, "request", 1, 5)
    telemetry = parse_export_request(_traces(bad, good), where="t.jsonl:7")
    assert [s.name for s in telemetry.spans] == ["request"]
    assert len(telemetry.problems) == 1
    assert telemetry.problems[0].startswith("t.jsonl:7: ")
    assert "missing startTimeUnixNano" in telemetry.problems[0]


def test_wrong_shape_object_is_a_problem():
    telemetry = parse_export_request({"hello": 1}, where="f.jsonl:2")
    assert telemetry.spans == [] and telemetry.problems
    assert telemetry.problems[0].startswith("f.jsonl:2: not an OTLP export request")


def test_malformed_lines_named_by_file_and_line_rest_still_analysed(tmp_path: Path):
    lines = (CASES / "gpu_busy.otlp.jsonl").read_text().splitlines()
    lines.insert(2, "this is not json")  # becomes line 3
    lines.insert(4, '{"unexpected": true}')  # becomes line 5
    lines.insert(6, '[1, 2, 3]')  # becomes line 7
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(lines) + "\n")
    telemetry = load_paths([path])
    bad_json = f"{path}:3: not valid JSON (Expecting value: line 1 column 1"
    assert any(p.startswith(bad_json) for p in telemetry.problems)
    assert any(p.startswith(f"{path}:5: not an OTLP export request") for p in telemetry.problems)
    assert any(p.startswith(f"{path}:7: expected a JSON object") for p in telemetry.problems)
    assert len(telemetry.problems) == 3
    report = diagnose(telemetry)
    assert report.requests == 30  # every valid line still loaded
    assert report.verdict.cause == "gpu_busy"
    assert report.problems == telemetry.problems


def test_non_utf8_line_and_missing_path_are_problems(tmp_path: Path):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b'{"resourceSpans": []}\n\xff\xfe\n')
    telemetry = load_paths([path, tmp_path / "nope.jsonl"])
    assert f"{path}:2: not UTF-8 text" in telemetry.problems
    assert any(p.startswith(f"{tmp_path / 'nope.jsonl'}: no such file") for p in telemetry.problems)


def test_unreadable_file_is_a_problem(tmp_path: Path):
    path = tmp_path / "dir.jsonl"
    path.mkdir()
    telemetry = load_file(path)
    assert telemetry.problems and telemetry.problems[0].startswith(f"{path}: cannot read")


def test_folders_are_searched_recursively_and_files_read_once(tmp_path: Path):
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    source = (CASES / "stable.otlp.jsonl").read_text().splitlines()
    (tmp_path / "a" / "traces.jsonl").write_text("\n".join(source[:3]) + "\n")
    (nested / "more.json").write_text("\n".join(source[3:]) + "\n")
    (nested / "notes.txt").write_text("not telemetry")
    telemetry = load_paths([tmp_path, tmp_path / "a" / "traces.jsonl"])
    assert telemetry.problems == []
    assert diagnose(telemetry).requests == 30
    assert len(telemetry.metrics) > 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert load_paths([empty]).problems == [
        f"{empty}: no trace files (*.jsonl, *.json, *.ndjson, *.gz, *.zst, *.zstd) in this folder;"
        " a file named otherwise is read when given by name"
    ]


def test_pretty_printed_document_and_array_files(tmp_path: Path):
    first = json.loads((CASES / "stable.otlp.jsonl").read_text().splitlines()[0])
    doc = tmp_path / "one.json"
    doc.write_text(json.dumps(first, indent=2))
    array = tmp_path / "many.json"
    array.write_text(json.dumps([first, {"bogus": 1}], indent=2))
    one = load_file(doc)
    assert one.problems == [] and len(one.spans) == 50
    many = load_file(array)
    assert len(many.spans) == 50
    assert many.problems and many.problems[0].startswith(f"{array}[1]: not an OTLP export request")


def test_duplicate_spans_count_once():
    obj = _traces(
        _span(TRACE_HEX, REQUEST_HEX, "request", 1_000, 9_000_000),
        _span(TRACE_HEX, STAGE_HEX, "decode", 2_000, 5_000_000, parent=REQUEST_HEX),
    )
    telemetry = parse_export_request(obj)
    telemetry.extend(parse_export_request(obj))
    (request,) = find_requests(telemetry.spans)
    assert request.stages_ms == {"decode": pytest.approx(4.998)}


@pytest.mark.parametrize("pretty", [False, True])
def test_a_utf8_byte_order_mark_does_not_cost_the_first_line(tmp_path: Path, pretty: bool):
    lines = (CASES / "stable.otlp.jsonl").read_text().splitlines()
    path = tmp_path / "bom.jsonl"
    if pretty:  # one pretty-printed document: the BOM sits before its "{"
        path.write_bytes(b"\xef\xbb\xbf" + json.dumps(json.loads(lines[0]), indent=2).encode())
        assert load_paths([path]).problems == [] and load_paths([path]).spans
        return
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    telemetry = load_paths([path])
    assert telemetry.problems == []
    plain = load_paths([CASES / "stable.otlp.jsonl"])
    assert len(telemetry.spans) == len(plain.spans)
    assert diagnose(telemetry).requests == 30
