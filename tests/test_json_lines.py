"""The embedded span file writes exactly what the official OTLP/JSON file exporter writes."""

from __future__ import annotations

import json
import logging
import math

import pytest
from opentelemetry.exporter.otlp.json.file import FileSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from otel_stages.json_lines import JsonLinesSpanExporter, encode_line
from otel_stages.sampling import _sampled_copy

VALUES = {
    "s": "plain", "empty": "", "ctl": "tab\tnl\nbell\x07", "quote": 'say "hi" \\ there', "i": 42, "neg": -7, "big": 2**62, "t": True, "f": False,
    "x": 0.5, "tiny": 1e-05, "huge": 1e16, "exp": 1.5e300, "nan": math.nan, "inf": -math.inf,
    "ints": [1, 2, 3], "strs": ["a", "b"], "floats": [0.1, 1e-7], "bools": [True, False], "none": [],
}


def _spans() -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    spans: list[ReadableSpan] = []
    for service, schema in (("svc-a", "https://opentelemetry.io/schemas/1.21.0"), ("svc-b", "")):
        provider = TracerProvider(
            resource=Resource.create({"service.name": service, "service.instance.id": "i-1",
                                      **({"ün": "ï"} if schema else {})}, schema_url=schema),
            span_limits=SpanLimits(max_span_attributes=25, max_events=2, max_links=1))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracers = [provider.get_tracer("otel_stages", "0.1.0"),
                   provider.get_tracer("other.lib", None, schema_url="https://example.com/s",
                                       attributes={"scope.attr": 1})]
        for tracer in tracers:
            remote = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0x00F067AA0BA902B7, is_remote=True,
                                 trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", "v1"), ("k", "x")]))
            with tracer.start_as_current_span("POST /infer", context=set_span_in_context(_nonrecording(remote)),
                                              kind=SpanKind.SERVER) as server:
                tracer.start_span("größe", attributes={"unicode": "größe 画像 🐱", "strs": ["a", "é"]}).end()
                tracer.start_span("del", attributes={"del": "a\x7fb"}).end()
                with tracer.start_as_current_span("decode", attributes=VALUES,
                                                  links=[Link(remote, {"why": "retry"}), Link(remote)]) as span:
                    for n in range(3):  # one more than the limit: a dropped event
                        span.add_event(f"e{n}", {"n": n, "ratio": n / 3})
                    span.set_status(Status(StatusCode.ERROR, "kaput"))
                with tracer.start_as_current_span("", kind=SpanKind.CLIENT) as nameless:
                    nameless.set_status(StatusCode.OK)
                for kind in (SpanKind.PRODUCER, SpanKind.CONSUMER):
                    tracer.start_span("k", kind=kind).end()
                server.set_attribute("many", [str(i) for i in range(3)])
                for i in range(26):  # past max_span_attributes: dropped attributes
                    server.set_attribute(f"a{i}", i)
    spans = list(exporter.get_finished_spans())
    spans.append(_sampled_copy(spans[0]))  # sampling's copies carry plain mappings
    return spans


def _nonrecording(ctx: SpanContext):
    from opentelemetry.trace import NonRecordingSpan

    return NonRecordingSpan(ctx)


def test_output_is_the_official_exporters_byte_for_byte(tmp_path):
    spans = _spans()
    assert len(spans) == 29
    ours, theirs = JsonLinesSpanExporter(tmp_path / "ours.jsonl"), FileSpanExporter(tmp_path / "official.jsonl")
    ascii_only = [s for s in spans if s.name not in ("größe", "del") and "ün" not in s.resource.attributes]
    with_del = [*ascii_only, next(s for s in spans if s.name == "del" and "ün" not in s.resource.attributes)]
    batches = [ascii_only, with_del, spans, spans[:3], spans[5:6], spans[::-1]]
    assert encode_line(ascii_only).isascii()  # the orjson path, floats included
    for batch in batches:
        assert ours.export(batch) is SpanExportResult.SUCCESS
        assert theirs.export(batch) is SpanExportResult.SUCCESS
    ours.shutdown()
    theirs.shutdown()
    expected = (tmp_path / "official.jsonl").read_bytes()
    assert (tmp_path / "ours.jsonl").read_bytes() == expected
    # The cases covered (so the comparison is not vacuous): escapes, odd floats, both resources.
    assert b"\\u00f6" in expected and b"\\u007f" in expected and b'"doubleValue":1e-05' in expected
    assert b'"doubleValue":"NaN"' in expected and b'"droppedAttributesCount"' in expected
    assert b'"droppedEventsCount":1' in expected and b'"droppedLinksCount":1' in expected
    assert b'"traceState":"vendor=v1,k=x"' in expected and b'"flags":768' in expected
    assert len(json.loads(expected.splitlines()[2])["resourceSpans"]) == 2  # the batch of all


def test_ascii_batches_take_orjson_and_others_fall_back_to_json_dumps(monkeypatch):
    calls = []
    real = json.dumps

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(json, "dumps", spy)
    spans = _spans()
    plain = [s for s in spans if "ün" not in s.resource.attributes and s.name not in ("größe", "del")]
    assert encode_line(plain) is not None and calls == []
    line = encode_line(spans)
    assert calls == [1] and line is not None and line.endswith(b"\n")


def test_nothing_to_write_and_after_shutdown(tmp_path, caplog):
    path = tmp_path / "t.jsonl"
    exporter = JsonLinesSpanExporter(path)
    assert encode_line([]) is None
    assert exporter.export([]) is SpanExportResult.SUCCESS
    assert path.read_bytes() == b""
    exporter.shutdown()
    with caplog.at_level(logging.WARNING, logger="otel_stages"):
        assert exporter.export(_spans()[:1]) is SpanExportResult.FAILURE
    assert "already shut down" in caplog.text


def test_a_value_the_encoder_cannot_take_is_left_out_like_the_official_one(tmp_path, caplog):
    span = _spans()[0]
    odd = ReadableSpan(name="odd", context=span.context, resource=span.resource,
                       attributes={"ok": 1, "obj": object()}, instrumentation_scope=span.instrumentation_scope)
    ours, theirs = JsonLinesSpanExporter(tmp_path / "o"), FileSpanExporter(tmp_path / "t")
    with caplog.at_level(logging.ERROR):
        ours.export([odd])
        theirs.export([odd])
    ours.shutdown()
    theirs.shutdown()
    assert (tmp_path / "o").read_bytes() == (tmp_path / "t").read_bytes()
    assert b'"key":"ok"' in (tmp_path / "o").read_bytes() and b"obj" not in (tmp_path / "o").read_bytes()


@pytest.mark.parametrize("bad", ["\ud800"])
def test_lone_surrogates_are_escaped_as_json_dumps_does(tmp_path, bad):
    span = _spans()[0]
    odd = ReadableSpan(name=bad, context=span.context, resource=span.resource,
                       attributes={"s": bad}, instrumentation_scope=span.instrumentation_scope)
    line = encode_line([odd])
    assert line is not None and b"\\ud800" in line


def test_configure_sizes_the_file_batch_processor_unless_the_environment_does(tmp_path, monkeypatch):
    import otel_stages as ots
    from otel_stages import sdk
    from otel_stages.sampling import KeepProcessor

    def sizes(telemetry):
        processor = telemetry._span_processors[1]
        processor = processor.inner if isinstance(processor, KeepProcessor) else processor
        batch = processor._batch_processor
        return batch._max_queue_size, batch._max_export_batch_size

    for var in sdk._BSP_SIZE_ENV:
        monkeypatch.delenv(var, raising=False)
    telemetry = ots.configure(data_dir=tmp_path, gpu="off", set_global=False)
    try:
        assert sizes(telemetry) == (sdk.FILE_MAX_QUEUE_SIZE, sdk.FILE_MAX_EXPORT_BATCH_SIZE) == (8192, 1024)
        assert isinstance(telemetry._span_exporter.inner, JsonLinesSpanExporter)
    finally:
        telemetry.shutdown()
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "100")
    telemetry = ots.configure(data_dir=tmp_path, gpu="off", set_global=False)
    try:
        assert sizes(telemetry) == (2048, 100)  # the SDK's default queue, the environment's batch
    finally:
        telemetry.shutdown()


def test_orjson_writes_doubles_as_repr_from_1e_4_up_and_below_it_the_hook_does():
    """The fast path's premise, on random doubles of every magnitude and random bit patterns:
    orjson's text equals ``float.__repr__`` for zero and magnitudes of at least 1e-4; below that
    :func:`_double` hands the value to the ``float.__repr__`` hook (the output is json.dumps')."""
    import random
    import struct

    import orjson

    from otel_stages import json_lines

    rng = random.Random(7)
    values = [rng.random() * 10.0 ** e * rng.choice((1, -1)) for e in range(-12, 25) for _ in range(400)]
    values += [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(20000)]
    values += [1e-4, -1e-4, 0.0, -0.0, 9.999999999999999e-05, 1e16, 9999999999999998.0]
    finite = [v for v in values if math.isfinite(v)]
    assert json_lines._NATIVE_FLOATS
    for v in finite:
        encoded = orjson.dumps({"d": json_lines._double(v)}, default=json_lines._orjson_default)
        assert encoded == b'{"d":' + json.dumps(v).encode() + b"}", v
        native = v == 0.0 or abs(v) >= json_lines._REPR_FIXED_MIN
        assert (type(json_lines._double(v)) is float) is native, v
    assert orjson.dumps(9.99e-05) != json.dumps(9.99e-05).encode()  # why the hook exists below 1e-4


def test_an_orjson_that_formats_floats_otherwise_sends_every_double_through_the_hook(monkeypatch):
    from otel_stages import json_lines

    assert not json_lines._orjson_writes_repr([1e16, 2.5, 1e-05])  # 1e-05: orjson's own differs
    monkeypatch.setattr(json_lines, "_NATIVE_FLOATS", False)
    assert type(json_lines._double(0.5)) is json_lines._Double
