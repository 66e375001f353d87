"""The fast OTLP/JSON line reader (otel_stages.analysis.otlp_fast) gives exactly what the careful
reader gives, takes the library's own lines, and hands everything odd to the careful reader.

The library's lines are made for real here: otel_stages.configure() and its OTLP/JSON file
exporter in a child process, recording requests with Pillow decode/resize, the queue hand-off, a
batch with span links, and a failing stage (exception event, ERROR status).
"""

from __future__ import annotations

import base64
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from otel_stages import semconv
from otel_stages.analysis.compact import Compactor
from otel_stages.analysis.files import load_bytes
from otel_stages.analysis.otlp_fast import read_line
from otel_stages.analysis.otlp_json import parse_export_request
from otel_stages.analysis.selection import ALL, ANALYSIS_ATTRIBUTES, for_analysis

DATA = Path(__file__).parent / "data" / "traces"
T = "0af7651916cd43dd8448eb211c80319c"
R = "b7ad6b7169203331"
S = "00f067aa0ba902b7"

RECORD = textwrap.dedent("""
    import io, sys
    from PIL import Image
    import otel_stages as ots
    from otel_stages import handoff, imaging
    telemetry = ots.configure(service_name="fast-reader", data_dir=sys.argv[1], gpu="off")
    buffer = io.BytesIO()
    Image.new("RGB", (320, 240), (200, 10, 10)).save(buffer, "JPEG")
    tokens = []
    for i in range(4):
        with ots.request():
            imaging.resize(imaging.decode(buffer.getvalue()), (64, 64))
            tokens.append(handoff.enqueue_token(depth=i))
    batch = handoff.dequeue_batch(tokens)
    with batch.stage("forward"):
        pass
    try:
        with ots.request():
            with ots.stage("decode"):
                raise ValueError("truncated image")
    except ValueError:
        pass
    telemetry.shutdown()
""")


@pytest.fixture(scope="module")
def library_lines(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    folder = tmp_path_factory.mktemp("library")
    subprocess.run([sys.executable, "-c", RECORD, str(folder)], check=True, timeout=120,
                   capture_output=True)
    lines = [line for path in sorted(folder.glob("traces-*.jsonl"))
             for line in path.read_bytes().splitlines() if line.strip()]
    assert lines
    return lines


def _careful(line: bytes, where: str = "f:1", selection=ALL):
    """What the careful reader makes of one line, compacted the same way."""
    into = Compactor(selection)
    into.add(parse_export_request(json.loads(line), where=where))
    return into.out


def _fast(line: bytes, where: str = "f:1", selection=ALL):
    into = Compactor(selection)
    taken = read_line(line, where, into)
    return taken, into.out


def test_the_library_exporter_lines_take_the_fast_path_and_match_the_careful_reader(library_lines):
    spans = []
    for line in library_lines:
        taken, fast = _fast(line)
        assert taken
        careful = _careful(line)
        assert fast.spans == careful.spans and fast.problems == careful.problems == []
        spans += fast.spans
    by_name = {s.name: s for s in spans}
    assert {"request", "decode", "resize", "queue", "forward", "batch"} <= set(by_name)
    batch = by_name["batch"]
    assert len(batch.links) == 4 and batch.attributes[semconv.BATCH_SIZE] == 4
    failed = next(s for s in spans if s.name == "decode" and s.error)
    (event,) = failed.events
    assert event.name == "exception" and event.attributes["exception.message"] == "truncated image"


def test_every_recorded_scenario_reads_the_same_either_way():
    lines = [line for path in sorted(DATA.rglob("*.otlp.jsonl"))
             for line in path.read_bytes().splitlines() if line.strip()]
    assert len(lines) > 20
    for line in lines:
        taken, fast = _fast(line)
        assert taken
        careful = _careful(line)
        assert (fast.spans, fast.metrics, fast.problems) == (careful.spans, careful.metrics,
                                                             careful.problems)


def _span(**changes) -> dict:
    span = {"traceId": T, "spanId": S, "parentSpanId": R, "name": "decode", "kind": 1,
            "startTimeUnixNano": "1790000000000000000", "endTimeUnixNano": "1790000000005000000",
            "attributes": [{"key": "image.width", "value": {"intValue": "640"}}], "status": {}}
    span.update(changes)
    return {k: v for k, v in span.items() if v is not None}


def _line(*spans: dict) -> bytes:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]}
    return json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
        {"scope": {"name": "x"}, "spans": list(spans)}]}]}).encode()


def _b64(hex_id: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


ODD_SPANS = {
    "upper-case ids": _span(traceId=T.upper(), spanId=S.upper()),
    "base64 ids": _span(traceId=_b64(T), spanId=_b64(S), parentSpanId=_b64(R)),
    "a non-hex id": _span(spanId="00f067aa0ba9zzzz"),
    "an all-zero trace id": _span(traceId="0" * 32),
    "an all-zero parent id": _span(parentSpanId="0" * 16),
    "no name": _span(name=""),
    "no start": _span(startTimeUnixNano=None),
    "a null end": _span(endTimeUnixNano=None) | {"endTimeUnixNano": None},
    "an end before the start": _span(endTimeUnixNano="1789999999999999999"),
    "times as numbers": _span(startTimeUnixNano=1790000000000000000, endTimeUnixNano=1790000000000000001),
    "a time that is no integer": _span(startTimeUnixNano="soon"),
    "an error status by name": _span(status={"code": "STATUS_CODE_ERROR", "message": "x"}),
    "an error status by number": _span(status={"code": 2}),
    "a status that is a string": _span(status="bad"),
    "every attribute kind": _span(attributes=[
        {"key": "i", "value": {"intValue": "42"}},
        {"key": "d", "value": {"doubleValue": 0.5}},
        {"key": "inf", "value": {"doubleValue": "-Infinity"}},
        {"key": "b", "value": {"boolValue": True}},
        {"key": "bs", "value": {"boolValue": "true"}},
        {"key": "s", "value": {"stringValue": "JPEG"}},
        {"key": "a", "value": {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "x"}]}}},
        {"key": "kv", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"intValue": 2}}]}}},
        {"key": "bytes", "value": {"bytesValue": "AAE="}},
        {"key": "empty", "value": {}},
        {"key": "no value"},
    ]),
    "an unknown value kind": _span(attributes=[{"key": "x", "value": {"decimalValue": "1"}}]),
    "an attribute without a key": _span(attributes=[{"value": {"intValue": "1"}}]),
    "a null string": _span(attributes=[{"key": "x", "value": {"stringValue": None}}]),
    "a double that is no number": _span(attributes=[{"key": "x", "value": {"doubleValue": "much"}}]),
    "a repeated key": _span(attributes=[{"key": "x", "value": {"intValue": "1"}},
                                        {"key": "x", "value": {"intValue": "2"}}]),
    "events": _span(events=[{"timeUnixNano": "1790000000002000000", "name": "QUEUE_START"},
                            {"timeUnixNano": "1790000000001000000", "name": "RECV",
                             "attributes": [{"key": "k", "value": {"stringValue": "v"}}]}]),
    "an event without a time": _span(events=[{"name": "x"}]),
    "links": _span(links=[{"traceId": T, "spanId": R, "attributes": []}]),
    "a link without ids": _span(links=[{"attributes": []}]),
}


@pytest.mark.parametrize("what", ODD_SPANS)
def test_odd_spans_read_exactly_as_the_careful_reader_reads_them(what):
    good = _span(spanId=R, parentSpanId=None, name="request")
    line = _line(ODD_SPANS[what], good)
    assert load_bytes(line, "f").spans == _careful(line, "f:1").spans
    assert load_bytes(line, "f").problems == _careful(line, "f:1").problems
    # and with only the analysis's attributes kept
    kept = for_analysis()
    assert load_bytes(line, "f", selection=kept).spans == _careful(line, "f:1", kept).spans


def test_nan_doubles_as_the_careful_reader_reads_them():
    line = _line(_span(attributes=[{"key": "x", "value": {"doubleValue": "NaN"}}]))
    assert math.isnan(_fast(line)[1].spans[0].attributes["x"])
    assert math.isnan(_careful(line).spans[0].attributes["x"])


def test_odd_spans_go_to_the_careful_reader_and_plain_ones_do_not():
    assert _fast(_line(_span()))[0]
    assert not _fast(_line(ODD_SPANS["upper-case ids"]))[0]
    assert not _fast(_line(ODD_SPANS["an end before the start"]))[0]
    assert not _fast(_line(ODD_SPANS["an unknown value kind"]))[0]
    taken, out = _fast(_line(ODD_SPANS["no name"], _span(spanId=R)))
    assert not taken and out.spans == []  # nothing kept from a line handed on


def test_legacy_keys_metrics_and_other_documents():
    legacy = _line(_span()).replace(b'"scopeSpans"', b'"instrumentationLibrarySpans"')
    assert _fast(legacy)[1].spans == _careful(legacy).spans and len(_careful(legacy).spans) == 1
    metrics = json.dumps({"resourceMetrics": [{"resource": {}, "scopeMetrics": [{"metrics": [
        {"name": semconv.HW_GPU_UTILIZATION, "gauge": {"dataPoints": [
            {"timeUnixNano": "1790000000000000000", "asDouble": 0.5}, {"asDouble": 0.1}]}}]}]}]}).encode()
    taken, out = _fast(metrics, "m:3")
    assert taken and out.metrics == _careful(metrics, "m:3").metrics
    assert out.problems == _careful(metrics, "m:3").problems and out.problems[0].startswith("m:3: ")
    for other in (b'{"data": []}', b'{"batches": []}', b"[1, 2]", b"not json", b'{"resourceSpans": 3}'):
        assert not _fast(other)[0]


def test_selection_keeps_what_the_analysis_reads_and_drops_the_rest(library_lines):
    kept = for_analysis()
    spans = [s for line in library_lines for s in _fast(line, selection=kept)[1].spans]
    everything = [s for line in library_lines for s in _fast(line)[1].spans]
    assert [(s.span_id, s.start_ns, s.end_ns, s.resource) for s in spans] == [
        (s.span_id, s.start_ns, s.end_ns, s.resource) for s in everything]
    decode = next(s for s in spans if s.name == "decode" and not s.error)
    full = next(s for s in everything if s.span_id == decode.span_id)
    assert set(decode.attributes) == set(full.attributes) & ANALYSIS_ATTRIBUTES
    assert {semconv.IMAGE_WIDTH, semconv.IMAGE_HEIGHT, semconv.IMAGE_SIZE, semconv.IMAGE_FORMAT,
            semconv.THREAD_CPU_TIME_MS, semconv.THREAD_NAME} <= set(decode.attributes)
    assert semconv.IMAGE_MODE in full.attributes and semconv.IMAGE_MODE not in decode.attributes
    request = next(s for s in spans if s.name == "request")
    assert {semconv.REQUEST_SEQ, semconv.REQUEST_COLD_START} <= set(request.attributes) <= ANALYSIS_ATTRIBUTES
    failed = next(s for s in spans if s.name == "decode" and s.error)
    # the failure kind is kept (caveats: failures first); message and stack trace are dropped
    assert failed.events[0].name == "exception"
    assert failed.events[0].attributes == {semconv.EXCEPTION_TYPE: "ValueError"}
    assert semconv.ERROR_TYPE in failed.attributes


def test_equal_attribute_sets_share_one_dict_and_keep_their_value_types():
    spans = [_span(spanId=f"{i:016x}", attributes=attrs) for i, attrs in enumerate([
        [{"key": "batch.size", "value": {"intValue": "1"}}],
        [{"key": "batch.size", "value": {"intValue": "1"}}],
        [{"key": "batch.size", "value": {"boolValue": True}}],
        [{"key": "batch.size", "value": {"doubleValue": 1.0}}],
    ], start=1)]
    a, b, c, d = load_bytes(_line(*spans), "f").spans
    assert a.attributes is b.attributes  # shared
    assert [type(s.attributes["batch.size"]) for s in (a, c, d)] == [int, bool, float]
    assert c.attributes is not d.attributes
    # strings, trace ids and names are shared too
    assert a.trace_id is b.trace_id and a.name is b.name and a.parent_span_id is b.parent_span_id
