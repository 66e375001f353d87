"""Head sampling that keeps cold, failed and slow requests (otel_stages.sampling), on both sides of
each threshold, through a real SDK provider and through configure() into the OTLP/JSON file."""

from __future__ import annotations

import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags

import otel_stages as ots
from otel_stages import semconv, sequence
from otel_stages._runtime import RUNTIME, scoped_tracer
from otel_stages.clock import Clock
from otel_stages.config import resolve
from otel_stages.sampling import KeepProcessor, RequestSampler, processor_for, sampler_for

SLOW_MS = 100.0


class Pipeline:
    def __init__(self, fake_time, ratio: float = 0.0, max_pending_spans: int = 10_000) -> None:
        self.exporter = InMemorySpanExporter()
        self.keep = KeepProcessor(SimpleSpanProcessor(self.exporter), SLOW_MS, max_pending_spans)
        self.provider = TracerProvider(sampler=RequestSampler(ratio))
        self.provider.add_span_processor(self.keep)
        self.time = fake_time

    def names(self) -> list[str]:
        return sorted(s.name for s in self.exporter.get_finished_spans())

    def request(self, ms: float = 1.0, fail: bool = False, cold: bool = False) -> None:
        with ots.request(cold_start=cold):
            with ots.stage("decode"):
                self.time.advance_ms(ms)
                if fail:
                    raise ValueError("truncated JPEG")
            with ots.stage("forward"):
                pass


@pytest.fixture
def pipeline(fake_time, monkeypatch):
    monkeypatch.setattr(sequence, "_SEQUENCE", sequence._Sequence())
    p = Pipeline(fake_time)
    saved = RUNTIME.tracer, RUNTIME.enabled, RUNTIME.clock
    RUNTIME.tracer, RUNTIME.enabled = scoped_tracer(p.provider), True
    RUNTIME.clock = Clock(monotonic_ns=fake_time, wall_ns=lambda: 1_700_000_000_000_000_000)
    yield p
    RUNTIME.tracer, RUNTIME.enabled, RUNTIME.clock = saved
    p.provider.shutdown()


def test_fast_warm_requests_are_recorded_but_not_exported(pipeline):
    pipeline.request(cold=False)
    assert pipeline.names() == []
    assert not pipeline.keep._pending  # decided and freed when the request (local root) ended


def test_first_request_of_the_process_is_kept_at_the_head(pipeline):
    with ots.request() as span:  # seq 1: cold
        assert span.get_span_context().trace_flags.sampled  # downstream calls see "sampled"
    pipeline.request()  # seq 2: warm, fast
    assert pipeline.names() == ["request"]


@pytest.mark.parametrize(("ms", "kept"), [(SLOW_MS - 0.001, False), (SLOW_MS, True)])
def test_slow_request_kept_at_the_threshold_not_below(pipeline, ms, kept):
    pipeline.request(ms=ms)
    assert pipeline.names() == (["decode", "forward", "request"] if kept else [])
    if kept:
        assert all(s.context.trace_flags.sampled for s in pipeline.exporter.get_finished_spans())


def test_failed_request_is_kept_whole(pipeline):
    with pytest.raises(ValueError):
        pipeline.request(fail=True)
    assert pipeline.names() == ["decode", "request"]


def test_error_caught_inside_the_request_still_keeps_it(pipeline):
    with ots.request(cold_start=False):
        with ots.stage("forward"):
            pass
        try:
            with ots.stage("download"):
                raise TimeoutError("image store")
        except TimeoutError:
            pass  # retried, say
    assert pipeline.names() == ["download", "forward", "request"]


def test_unsampled_http_parent_follows_a_kept_request(pipeline):
    tracer = RUNTIME.tracer
    with tracer.start_as_current_span("POST /v1/describe", kind=trace.SpanKind.SERVER):
        pipeline.request(ms=SLOW_MS + 1)
    assert pipeline.names() == ["POST /v1/describe", "decode", "forward", "request"]
    with tracer.start_as_current_span("GET /healthz", kind=trace.SpanKind.SERVER):
        pass
    with tracer.start_as_current_span("POST /v1/describe", kind=trace.SpanKind.SERVER):
        pipeline.request(ms=1)
    assert len(pipeline.exporter.get_finished_spans()) == 4  # nothing more
    assert not pipeline.keep._pending


def test_cold_request_under_an_unsampled_http_span_keeps_the_http_span_too(pipeline):
    with RUNTIME.tracer.start_as_current_span("POST /v1/describe") as server:
        assert not server.get_span_context().trace_flags.sampled
        pipeline.request(cold=True)
    assert pipeline.names() == ["POST /v1/describe", "decode", "forward", "request"]


def test_batch_goes_along_with_its_kept_member_only(pipeline):
    tokens = []
    for ms in (SLOW_MS + 5, 1.0):
        scope = ots.request(cold_start=False)  # two requests open at once, side by side
        scope.__enter__()
        tokens.append((scope, ms, ots.enqueue_token()))
        scope._detach()
    batch = ots.dequeue_batch([t for _, _, t in tokens])
    with batch.stage("forward"):
        pass
    for scope, ms, _ in tokens:
        pipeline.time.advance_ms(ms)
        scope._close(None)
        pipeline.time.advance_ms(-ms)
    spans = pipeline.exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["batch", "forward", "queue", "request"]
    slow = next(s for s in spans if s.name == "request")
    assert (slow.end_time - slow.start_time) / 1e6 >= SLOW_MS
    assert {s.context.trace_id for s in spans if s.name != "batch"} == {slow.context.trace_id}


def test_head_ratio_and_sampled_parents_are_followed(fake_time):
    sampler = RequestSampler(1.0)
    assert sampler.should_sample(None, 1, "request").decision is Decision.RECORD_AND_SAMPLE
    sampler = RequestSampler(0.0)
    assert sampler.should_sample(None, 1, "request").decision is Decision.RECORD_ONLY
    remote = SpanContext(5, 6, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    parent = trace.set_span_in_context(NonRecordingSpan(remote))
    assert sampler.should_sample(parent, 5, "request").decision is Decision.RECORD_AND_SAMPLE
    local_dead = trace.set_span_in_context(NonRecordingSpan(SpanContext(5, 7, is_remote=False)))
    assert sampler.should_sample(local_dead, 5, "decode").decision is Decision.DROP
    root = trace.set_span_in_context(trace.INVALID_SPAN)
    kept = Link(SpanContext(9, 10, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)))
    dropped = Link(SpanContext(9, 11, is_remote=False))
    assert sampler.should_sample(root, 12, "batch", links=[dropped, kept]).decision is Decision.RECORD_AND_SAMPLE
    assert sampler.should_sample(root, 12, "batch", links=[dropped]).decision is Decision.RECORD_ONLY


def test_overflow_gives_up_oldest_waiting_traces_and_counts_them(fake_time, monkeypatch, caplog):
    p = Pipeline(fake_time, max_pending_spans=3)
    tracer = p.provider.get_tracer("t")
    roots = [tracer.start_span(f"server {i}") for i in range(2)]
    for root in roots:  # children of still-open roots wait for a decision
        with trace.use_span(root):
            for _ in range(2):
                tracer.start_span("decode").end()
    with caplog.at_level(logging.WARNING, logger="otel_stages"):
        for root in roots:
            root.end()
    assert p.keep.overflow_traces == 1
    assert "giving up the oldest waiting traces" in caplog.text
    leaked = [tracer.start_span(f"never ends {i}") for i in range(5)]  # roots that never end
    assert len(p.keep._pending) == 3 and p.keep.overflow_traces == 3
    assert leaked
    p.provider.shutdown()


def test_configure_wiring_and_conflict_with_otel_traces_sampler(monkeypatch):
    assert sampler_for(resolve({})) is None  # ratio 1: the SDK default, OTEL_TRACES_SAMPLER honoured
    inner = SimpleSpanProcessor(InMemorySpanExporter())
    assert processor_for(resolve({}), inner) is inner
    settings = resolve({"sample_ratio": 0.1, "slow_request_ms": 250})
    assert isinstance(sampler_for(settings, environ={}), RequestSampler)
    assert processor_for(settings, inner).slow_ns == 250_000_000
    with pytest.raises(ots.ConfigurationError, match="OTEL_TRACES_SAMPLER='always_on'"):
        sampler_for(settings, environ={"OTEL_TRACES_SAMPLER": "always_on"})
    for bad, var in (("1.5", "OTEL_STAGES_SAMPLE_RATIO"), ("0", "OTEL_STAGES_SLOW_REQUEST_MS")):
        with pytest.raises(ots.ConfigurationError, match=f"{var}='{bad}'"):
            resolve(environ={var: bad})


def test_configure_sample_ratio_zero_writes_only_what_matters(tmp_path, monkeypatch):
    from otel_stages.analysis import load_paths
    from otel_stages.sdk import configure

    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    monkeypatch.setattr(sequence, "_SEQUENCE", sequence._Sequence())
    telemetry = configure(data_dir=tmp_path, gpu="off", set_global=False, sample_ratio=0,
                          slow_request_ms=10_000)
    try:
        for _ in range(3):  # cold, then two fast warm ones
            with ots.request():
                with ots.stage("decode"):
                    pass
        with pytest.raises(KeyError):
            with ots.request():
                with ots.stage("forward"):
                    raise KeyError("model")
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    spans = load_paths([telemetry.trace_path]).spans
    seqs = sorted(s.attributes[semconv.REQUEST_SEQ] for s in spans if s.name == "request")
    assert seqs == [1, 4]  # the cold one and the failed one
    why = {s.attributes[semconv.REQUEST_SEQ]: (s.attributes.get(semconv.SAMPLING_KEPT),
                                               s.attributes.get(semconv.SAMPLING_RATIO))
           for s in spans if s.name == "request"}
    assert why == {1: (semconv.KEPT_COLD, 0.0), 4: (semconv.KEPT_ERROR, 0.0)}  # as written to the file
    assert sorted(s.name for s in spans) == ["decode", "forward", "request", "request"]


def _kept(pipeline: Pipeline) -> dict[str, tuple[object, object]]:
    """Per exported span name: (why kept, ratio) as the span says."""
    return {s.name: (s.attributes.get(semconv.SAMPLING_KEPT), s.attributes.get(semconv.SAMPLING_RATIO))
            for s in pipeline.exporter.get_finished_spans()}


@pytest.mark.parametrize(("ms", "fail", "why"), [
    (SLOW_MS, False, semconv.KEPT_SLOW), (1.0, True, semconv.KEPT_ERROR)])
def test_a_request_kept_late_says_why_on_its_request_span_only(fake_time, monkeypatch, ms, fail, why):
    # the report reads these to tell requests kept for what they were from the ratio's sample
    monkeypatch.setattr(sequence, "_SEQUENCE", sequence._Sequence())
    p = Pipeline(fake_time)
    p.keep.ratio = 0.0
    saved = RUNTIME.tracer, RUNTIME.enabled, RUNTIME.clock
    RUNTIME.tracer, RUNTIME.enabled = scoped_tracer(p.provider), True
    RUNTIME.clock = Clock(monotonic_ns=fake_time, wall_ns=lambda: 1_700_000_000_000_000_000)
    try:
        if fail:
            with pytest.raises(ValueError):
                p.request(ms=ms, fail=True)
        else:
            p.request(ms=ms)
    finally:
        RUNTIME.tracer, RUNTIME.enabled, RUNTIME.clock = saved
        p.provider.shutdown()
    kept = _kept(p)
    assert kept["request"] == (why, 0.0)
    assert kept["decode"] == (None, None)  # stage spans carry nothing more


def test_head_keeps_say_ratio_cold_or_parent(pipeline):
    pipeline.request(cold=True)
    assert _kept(pipeline)["request"] == (semconv.KEPT_COLD, 0.0)
    sampler = RequestSampler(1.0)  # every trace kept by the ratio at the head
    seq = {semconv.REQUEST_SEQ: 2}
    root = sampler.should_sample(None, 1, "request", attributes=seq)
    assert root.attributes == {**seq, semconv.SAMPLING_KEPT: semconv.KEPT_RATIO,
                               semconv.SAMPLING_RATIO: 1.0}
    assert seq == {semconv.REQUEST_SEQ: 2}  # the caller's dict is left alone
    stage_span = sampler.should_sample(None, 1, "decode", attributes={})
    assert semconv.SAMPLING_KEPT in stage_span.attributes  # a local root kept by the ratio
    remote = SpanContext(5, 6, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    parent = trace.set_span_in_context(NonRecordingSpan(remote))
    under = RequestSampler(0.0).should_sample(parent, 5, "request", attributes=seq)
    assert under.attributes[semconv.SAMPLING_KEPT] == semconv.KEPT_PARENT
    child = RequestSampler(0.0).should_sample(parent, 5, "decode", attributes={})
    assert semconv.SAMPLING_KEPT not in (child.attributes or {})


def test_a_request_under_a_local_root_kept_by_the_ratio_says_ratio(fake_time, monkeypatch):
    monkeypatch.setattr(sequence, "_SEQUENCE", sequence._Sequence())
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=RequestSampler(1.0))
    provider.add_span_processor(KeepProcessor(SimpleSpanProcessor(exporter), SLOW_MS, ratio=1.0))
    saved = RUNTIME.tracer, RUNTIME.enabled, RUNTIME.clock
    RUNTIME.tracer, RUNTIME.enabled = scoped_tracer(provider), True
    RUNTIME.clock = Clock(monotonic_ns=fake_time, wall_ns=lambda: 1_700_000_000_000_000_000)
    try:
        with RUNTIME.tracer.start_as_current_span("POST /v1/describe", kind=trace.SpanKind.SERVER):
            with ots.request(cold_start=False):
                pass
    finally:
        RUNTIME.tracer, RUNTIME.enabled, RUNTIME.clock = saved
        provider.shutdown()
    kept = {s.name: s.attributes.get(semconv.SAMPLING_KEPT) for s in exporter.get_finished_spans()}
    assert kept == {"POST /v1/describe": semconv.KEPT_RATIO, "request": semconv.KEPT_RATIO}


def test_the_report_reads_what_the_sampler_kept_as_sampled(tmp_path, monkeypatch, fake_time):
    """End to end (tester A F5): configure() at ratio 0, a third of the requests slow; the file holds
    the cold and the slow ones only, and the report says so first instead of reading them as every
    request."""
    from otel_stages.analysis import load_paths
    from otel_stages.analysis.diagnosis import diagnose
    from otel_stages.sdk import configure

    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    monkeypatch.setattr(sequence, "_SEQUENCE", sequence._Sequence())
    telemetry = configure(data_dir=tmp_path, gpu="off", set_global=False, sample_ratio=0,
                          slow_request_ms=SLOW_MS)
    saved = RUNTIME.clock
    RUNTIME.clock = Clock(monotonic_ns=fake_time, wall_ns=lambda: 1_700_000_000_000_000_000)
    try:
        for i in range(60):
            with ots.request():
                with ots.stage("decode"):
                    fake_time.advance_ms(5)
                with ots.stage("forward"):
                    fake_time.advance_ms(SLOW_MS if i % 3 == 1 else 20)
            fake_time.advance_ms(10)
        assert telemetry.force_flush()
    finally:
        RUNTIME.clock = saved
        telemetry.shutdown()
    report = diagnose(load_paths([telemetry.trace_path]))
    assert report.requests == 21  # the cold one and the 20 slow ones
    first = report.verdict.evidence[0]
    assert first.startswith("the recording is sampled: 21 of the 59 requests numbered by request.seq")
    assert "0 kept at the head by the ratio" in first and "(cold 1, slow 20)" in first
    assert report.verdict.tentative
