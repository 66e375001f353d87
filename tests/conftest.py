"""Shared fixtures: in-memory span capture with an injectable clock."""

from __future__ import annotations

from pathlib import Path

import pytest

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


