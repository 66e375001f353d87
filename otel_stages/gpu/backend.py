"""The small interface the sampler reads GPUs through.

:class:`GpuBackend` has four methods; :class:`~otel_stages.gpu.nvml.NvmlBackend` implements it
over NVML (the tests hold a pure-Python fake, ``tests/fakegpu.py``). Units at this level are the
raw NVML ones (percent, bytes, milliwatts, degrees C, microsecond timestamps); the metric table
(:mod:`otel_stages.gpu.metrics`) converts them to exported units.

"Not supported" is a value (:data:`NOT_SUPPORTED`, or a missing key in :meth:`GpuBackend.read`),
never an exception and never 0.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol


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
