"""A pure-Python :class:`~otel_stages.gpu.backend.GpuBackend` for fast sampler logic tests.

(The end-to-end GPU tests load the real nvidia-ml-py bindings against a stand-in
``libnvidia-ml.so.1``, ``tests/fakenvml/``; this fake is for the sampler's pure logic.)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_stages import semconv
from otel_stages.gpu.backend import NOT_SUPPORTED, Device, GpuUnavailable, RawSample

#: ``utilization(t_us) -> percent`` over the instant ``t_us`` (a step function is fine).
UtilizationFn = Callable[[int], float]


@dataclass
class FakeDevice:
    """Script for one fake device. ``utilization`` is ``None`` for "not supported" (MIG).

    ``ring``: whether the device has a sample ring (else only instant readings). ``values``:
    other readings in raw units keyed by metric name; absent means not supported.
    """

    device: Device
    utilization: UtilizationFn | None = None
    ring: bool = True
    values: dict[str, float] = field(default_factory=dict)


def square_wave(busy_s: float, idle_s: float | None = None) -> UtilizationFn:
    """100 % for ``busy_s``, 0 % for ``idle_s`` (default the same), repeating from t=0."""
    period_us = (busy_s + (busy_s if idle_s is None else idle_s)) * 1e6

    def utilization(t_us: int) -> float:
        return 100.0 if math.fmod(t_us, period_us) < busy_s * 1e6 else 0.0

    return utilization


class FakeBackend:
    """:class:`GpuBackend` for tests: ring samples every ``sample_period_us`` on a clock given by
    ``now_us`` (e.g. a fake Unix or boot-time clock), value = mean of ``utilization`` over the
    sample period (evaluated at 10 points). ``calls`` records method names for assertions."""

    def __init__(self, devices: Sequence[FakeDevice], now_us: Callable[[], int] | None = None,
                 sample_period_us: int = 166_667, ring_size: int = 100,
                 unavailable: str | None = None) -> None:
        self.devices = {d.device.uuid: d for d in devices}
        self.now_us = now_us or (lambda: time.time_ns() // 1000)
        self.sample_period_us = sample_period_us
        self.ring_size = ring_size
        self.unavailable = unavailable
        self.calls: list[str] = []

    def open(self) -> list[Device]:
        self.calls.append("open")
        if self.unavailable:
            raise GpuUnavailable(self.unavailable)
        return [d.device for d in self.devices.values()]

    def _mean(self, fn: UtilizationFn, end_us: int) -> float:
        step = self.sample_period_us / 10
        return sum(fn(int(end_us - self.sample_period_us + (i + 0.5) * step)) for i in range(10)) / 10

    def utilization_samples(self, device: Device, since_us: int) -> list[RawSample] | Any:
        self.calls.append("utilization_samples")
        fake = self.devices[device.uuid]
        if fake.utilization is None or not fake.ring:
            return NOT_SUPPORTED
        period = self.sample_period_us
        newest = self.now_us() // period
        first = max(newest - self.ring_size + 1, since_us // period + 1)
        return [RawSample(k * period, self._mean(fake.utilization, k * period))
                for k in range(first, newest + 1)]

    def read(self, device: Device, metrics: Collection[str]) -> dict[str, float]:
        self.calls.append("read")
        fake = self.devices[device.uuid]
        out = {m: v for m, v in fake.values.items() if m in metrics}
        if semconv.HW_GPU_UTILIZATION in metrics and fake.utilization is not None:
            out[semconv.HW_GPU_UTILIZATION] = self._mean(fake.utilization, self.now_us())
        return out

    def close(self) -> None:
        self.calls.append("close")
