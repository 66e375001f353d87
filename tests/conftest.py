"""Shared fixtures: in-memory span capture with an injectable clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry import trace

from otel_stages import signals
from otel_stages._runtime import RUNTIME
from otel_stages.clock import Clock
from otel_stages.testing import capture_spans

DATA = Path(__file__).parent / "data"


class FakeTime:
    """Monotonic time source advanced by hand (ns)."""

    def __init__(self, start_ns: int = 5_000_000_000) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += int(ms * 1e6)


@pytest.fixture
def recorded():
    """Spans with signals on, GC recording installed (as configure() does), restored after
    (tests/test_signals.py, tests/test_loop_turns.py)."""
    from otel_stages.signals import gcwatch
    from otel_stages.testing import capture_spans

    was_installed = gcwatch.installed()
    gcwatch.install()
    with capture_spans(signals_on=True) as cap:
        yield cap
    if not was_installed:
        gcwatch.uninstall()


@pytest.fixture
def gc_off():
    """No garbage collection during the test: the GC watch (otel_stages.signals.gcwatch) reads
    RUNTIME.clock in its callback, and a test that replaces that clock with a scripted sequence
    must not have a collection take one of its values."""
    import gc

    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def captured():
    with capture_spans() as cap:
        yield cap


@pytest.fixture
def captured_fake_clock(fake_time):
    clock = Clock(monotonic_ns=fake_time, wall_ns=lambda: 1_700_000_000_000_000_000)
    with capture_spans(clock=clock) as cap:
        yield cap, fake_time




def _runtime_state() -> tuple[object, ...]:
    return (RUNTIME.enabled, RUNTIME.tracer, RUNTIME.clock, RUNTIME.stage_end_hooks, RUNTIME.reraise,
            RUNTIME.deferred, signals.is_enabled())


@pytest.fixture(autouse=True)
def _leaves_no_state_behind(request: pytest.FixtureRequest):
    """Every test starts and ends with no active span and the library's runtime state as it was
    (tracer, enabled flag, span clock, stage-end hooks, error policy): a test that changes them
    must restore them, so no test passes or fails because of the one before it."""
    assert not trace.get_current_span().get_span_context().is_valid, "a span is active at test start"
    before = _runtime_state()
    yield
    assert not trace.get_current_span().get_span_context().is_valid, (
        f"{request.node.nodeid} left a span active")
    after = _runtime_state()
    names = ("enabled", "tracer", "clock", "stage_end_hooks", "reraise", "deferred", "signals")
    changed = [n for n, b, a in zip(names, before, after) if b is not a and b != a]
    assert not changed, f"{request.node.nodeid} left otel_stages runtime state changed: {changed}"
