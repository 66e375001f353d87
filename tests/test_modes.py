"""The switch between span modes, the shared no-op of telemetry off, stage-end hooks keyed by stage
name, and the per-stage probe slot (what per-stage CPU time plugs into)."""

from __future__ import annotations

import asyncio
import time

import pytest
from opentelemetry import context as otel_context
from opentelemetry.trace import INVALID_SPAN

import otel_stages as ots
from otel_stages import semconv, stages
from otel_stages._runtime import DEFERRED, LIVE, OFF, RECORD_KEY, RUNTIME, StageProbe
from otel_stages.builder import SpanBuilder
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
def test_the_probe_starts_inside_the_span_and_finishes_before_it_ends(span_mode, fake_time):
    from otel_stages.clock import Clock

    calls: list[tuple[str, int]] = []

    def start() -> int:
        calls.append(("start", fake_time.now))
        return 7

    def stop() -> int:
        calls.append(("stop", fake_time.now))
        return 12

    def finish(span, name, started, stopped):
        span.set_attribute("probe.delta", stopped - started)

    RUNTIME.stage_probe = StageProbe(start=start, stop=stop, finish=finish)
    try:
        with capture_spans(clock=Clock(monotonic_ns=fake_time), span_mode=span_mode) as captured:
            with ots.stage("decode"):
                fake_time.advance_ms(3)
            decode = captured.one("decode")
    finally:
        RUNTIME.stage_probe = None
    assert [c[0] for c in calls] == ["start", "stop"]
    assert decode.attributes["probe.delta"] == 5
    assert decode.end_time - decode.start_time == 3_000_000


@pytest.mark.parametrize("span_mode", ["live", "deferred"])
def test_a_failing_probe_or_hook_is_logged_once_and_the_stage_goes_on(span_mode, monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("probe bug")

    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    monkeypatch.setattr(RUNTIME, "_reported", set())  # "logged once" per process: start afresh
    RUNTIME.stage_probe = StageProbe(start=broken, stop=broken, finish=broken)
    try:
        with capture_spans(span_mode=span_mode) as captured:
            for _ in range(2):
                with ots.stage("decode"):
                    pass
            assert captured.names() == ["decode", "decode"]
    finally:
        RUNTIME.stage_probe = None
    assert sum("probe bug" in r.getMessage() for r in caplog.records) == 1


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
