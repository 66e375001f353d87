"""The switch between span modes, the shared no-op of telemetry off, stage-end hooks keyed by stage
name, and where the per-stage signals (otel_stages.signals) are read in each mode."""

from __future__ import annotations

import asyncio
import time

import pytest
from opentelemetry import context as otel_context
from opentelemetry.trace import INVALID_SPAN

import otel_stages as ots
from otel_stages import semconv, stages
from otel_stages._runtime import DEFERRED, LIVE, OFF, RECORD_KEY, RUNTIME
from otel_stages.builder import SpanBuilder
from otel_stages.clock import Clock
from otel_stages.signals import capture
from otel_stages.testing import capture_spans


@pytest.fixture
def off():
    RUNTIME.enabled = False
    try:
        yield
    finally:
        RUNTIME.enabled = True


def test_mode_follows_the_switch_and_the_builder(captured):
    assert RUNTIME.mode == LIVE and isinstance(ots.stage("decode"), stages.StageScope)
    builder = SpanBuilder(RUNTIME.tracer)
    RUNTIME.deferred = builder
    try:
        assert RUNTIME.mode == DEFERRED and isinstance(ots.stage("decode"), stages.DeferredScope)
        RUNTIME.enabled = False
        assert RUNTIME.mode == OFF
        RUNTIME.enabled = True
        assert RUNTIME.mode == DEFERRED
    finally:
        RUNTIME.deferred = None
        builder.shutdown(time.monotonic() + 5)
    assert RUNTIME.mode == LIVE


def test_off_stages_are_one_shared_object_per_name_and_let_exceptions_through(off):
    assert ots.stage("decode") is ots.stage("decode") is ots.request("decode")
    assert ots.stage("decode") is not ots.stage("resize")
    assert ots.stage("decode", x=1) is not ots.stage("decode", x=1)  # kept for a decorator
    error = KeyError("missing")
    with pytest.raises(KeyError) as info:
        with ots.stage("decode") as span:
            assert span is INVALID_SPAN
            raise error
    assert info.value is error

    async def run() -> object:
        async with ots.stage("forward") as span:
            return span

    assert asyncio.run(run()) is INVALID_SPAN


def test_a_function_decorated_while_off_is_traced_once_telemetry_is_on(captured):
    RUNTIME.enabled = False
    try:
        @ots.stage("forward")
        def forward() -> int:
            return 3

        @ots.request(cold_start=False)
        def handle() -> int:
            return forward()

        assert handle() == 3
    finally:
        RUNTIME.enabled = True
    assert captured.spans == []
    assert handle() == 3
    assert captured.names() == ["forward", "request"]
    assert captured.one("request").attributes[semconv.REQUEST_COLD_START] is False


@pytest.mark.parametrize("span_mode", ["live", "deferred"])
def test_hooks_run_only_for_their_stage_name_and_every_stage_hooks_for_all(span_mode):
    seen: list[tuple[str, str]] = []

    def forward_only(span, name, start_ns, end_ns):
        seen.append(("forward_only", name))

    def every(span, name, start_ns, end_ns):
        seen.append(("every", name))

    RUNTIME.add_stage_end_hook(forward_only, semconv.STAGE_FORWARD)
    RUNTIME.add_stage_end_hook(every)
    RUNTIME.add_stage_end_hook(forward_only, semconv.STAGE_FORWARD)  # idempotent
    try:
        with capture_spans(span_mode=span_mode):
            with ots.stage("decode"):
                pass
            with ots.stage("forward"):
                pass
    finally:
        RUNTIME.remove_stage_end_hook(forward_only)
        RUNTIME.remove_stage_end_hook(every)
    assert seen == [("every", "decode"), ("forward_only", "forward"), ("every", "forward")]
    assert RUNTIME.stage_end_hooks == {}


@pytest.mark.parametrize("span_mode", ["live", "deferred"])
def test_signals_are_read_right_after_each_timestamp_on_the_stage_thread(span_mode, monkeypatch):
    calls: list[str] = []
    now = [5_000_000_000]
    cpu = iter(range(1_000_000, 100_000_000, 2_000_000))  # 2 ms of CPU between reads

    def monotonic_ns() -> int:
        calls.append("clock")
        now[0] += 4_000_000
        return now[0]

    def thread_time_ns() -> int:
        calls.append("cpu")
        return next(cpu)

    clock = Clock(monotonic_ns=monotonic_ns, wall_ns=lambda: 10**18)
    monkeypatch.setattr(capture, "thread_time_ns", thread_time_ns)
    with capture_spans(clock=clock, span_mode=span_mode, signals_on=True) as captured:
        calls.clear()
        with ots.stage("decode"):
            calls.append("block")
        recorded = list(calls)
        decode = captured.one("decode")
    # the CPU window is the span's window: read right after the start and the end time
    assert recorded == ["clock", "cpu", "block", "clock", "cpu"]
    assert decode.end_time - decode.start_time == 4_000_000
    assert decode.attributes[semconv.THREAD_CPU_TIME_MS] == 2.0
    assert decode.attributes[semconv.THREAD_CPU_UTILIZATION] == 0.5


@pytest.mark.parametrize("span_mode", ["live", "deferred"])
def test_signals_off_reads_nothing(span_mode, monkeypatch):
    def thread_time_ns() -> int:
        raise AssertionError("signals are off: no CPU clock read")

    monkeypatch.setattr(capture, "thread_time_ns", thread_time_ns)
    with capture_spans(span_mode=span_mode, signals_on=False) as captured:
        with ots.stage("decode"):
            pass
        decode = captured.one("decode")
    assert not any(key.startswith(("thread.", "otel_stages.gc", "otel_stages.event_loop"))
                   for key in decode.attributes)


@pytest.mark.parametrize("span_mode", ["live", "deferred"])
def test_failing_signals_or_hook_are_logged_once_and_the_stage_goes_on(span_mode, monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("signals bug")

    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    monkeypatch.setattr(RUNTIME, "_reported", set())  # "logged once" per process: start afresh
    monkeypatch.setattr(capture, "thread_time_ns", broken)
    RUNTIME.add_stage_end_hook(broken)
    try:
        with capture_spans(span_mode=span_mode, signals_on=True) as captured:
            for _ in range(2):
                with ots.stage("decode"):
                    pass
            assert captured.names() == ["decode", "decode"]
    finally:
        RUNTIME.remove_stage_end_hook(broken)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("signals bug" in m and "stage signals" in m for m in messages) == 1
    assert sum("signals bug" in m and "stage end hook" in m for m in messages) == 1


@pytest.mark.parametrize("span_mode", ["live", "deferred"])
def test_a_failing_start_is_logged_and_the_block_still_runs(span_mode, monkeypatch, caplog):
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    monkeypatch.setattr(RUNTIME, "_reported", set())
    with capture_spans(span_mode=span_mode) as captured:
        monkeypatch.setattr(RUNTIME, "clock", None)  # every timestamp fails
        ran = []
        with ots.stage("decode"):
            ran.append(1)
        monkeypatch.undo()
        assert ran == [1]
        assert otel_context.get_value(RECORD_KEY) is None  # nothing left current
        assert captured.names() == []
        assert captured.builder is None or not captured.builder.open
    assert any("stage start" in r.getMessage() or "stage end" in r.getMessage() for r in caplog.records)
