"""The small interface the sampler reads GPUs through, and a pure-Python fake of it.

:class:`GpuBackend` has four methods; :class:`~otel_stages.gpu.nvml.NvmlBackend` implements it
over NVML, :class:`FakeBackend` in plain Python for fast logic tests. Units at this level are the
raw NVML ones (percent, bytes, milliwatts, degrees C, microsecond timestamps); the metric table
(:mod:`otel_stages.gpu.metrics`) converts them to exported units.

"Not supported" is a value (:data:`NOT_SUPPORTED`, or a missing key in :meth:`GpuBackend.read`),
never an exception and never 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from otel_stages import semconv


class _NotSupported:
    """Sentinel type: the device cannot report this reading (MIG slice, old driver, vGPU...)."""

    _instance: _NotSupported | None = None

    def __new__(cls) -> _NotSupported:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NOT_SUPPORTED"


#: Returned instead of a value when NVML answers NOT_SUPPORTED / FUNCTION_NOT_FOUND.
NOT_SUPPORTED: Any = _NotSupported()


class GpuUnavailable(Exception):
    """No GPU data for this process; ``str(exc)`` is the actionable reason (one line)."""


class GpuReadError(Exception):
    """One reading failed for a reason other than "not supported" (GPU lost, driver error)."""


@dataclass(frozen=True)
class Device:
    """One GPU or MIG instance, keyed by its NVML UUID (NVML ignores ``CUDA_VISIBLE_DEVICES``).

    ``uuid``: ``"GPU-..."`` or ``"MIG-..."``; ``index``: NVML index of the physical GPU (not the
    CUDA ordinal); ``parent_uuid``: the physical GPU of a MIG instance, else ``None``;
    ``handle``: backend-private (an NVML handle for the real backend).
    """

    uuid: str
    name: str
    index: int
    parent_uuid: str | None = None
    handle: Any = field(default=None, compare=False, repr=False)

    @property
    def is_mig(self) -> bool:
        """True for a MIG instance (its parent GPU is listed separately)."""
        return self.parent_uuid is not None


@dataclass(frozen=True, slots=True)
class RawSample:
    """One entry of the driver's utilization ring: ``timestamp_us`` in the driver's clock domain
    (Unix epoch or boot time, detected by :mod:`otel_stages.gpu.timebase`), ``percent`` 0..100
    over the driver's sample period ending at that time."""

    timestamp_us: int
    percent: float


class GpuBackend(Protocol):
    """Read-only access to the GPUs of this host.

    Threading: :meth:`open` and :meth:`close` are called once each, from one thread, never
    concurrently with anything else. :meth:`utilization_samples` and :meth:`read` may run on
    the sampler thread and on a request thread at once, for the same device only under the
    sampler's per-device lock.
    """

    def open(self) -> list[Device]:
        """Initialise and list the devices. Blocking (may take seconds; the sampler runs it in a
        helper thread with a timeout). Raises :class:`GpuUnavailable` with an actionable reason."""
        ...

    def utilization_samples(self, device: Device, since_us: int) -> list[RawSample] | Any:
        """Drain ring entries newer than ``since_us`` (0 = all), oldest first; ``[]`` when there
        is nothing new; :data:`NOT_SUPPORTED` when the device has no utilization ring.
        Raises :class:`GpuReadError` for other failures."""
        ...

    def read(self, device: Device, metrics: Collection[str]) -> dict[str, float]:
        """Read the current value of each metric in ``metrics`` (``semconv.HW_*`` names, plus
        :data:`~otel_stages.gpu.metrics.GPU_SM_ACTIVITY`), in raw NVML units. A metric the device
        does not support is absent from the result. Raises :class:`GpuReadError`."""
        ...

    def close(self) -> None:
        """Release the library (``nvmlShutdown``); called after the sampler thread has joined."""
        ...


# --- Pure-Python fake ---------------------------------------------------------------------------

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
