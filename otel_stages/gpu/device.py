"""One device's readings: what the sampler does for a GPU on each pass, each reading on its own.

Per pass (:meth:`DeviceReader.sample`):

- utilization: drain the driver's timestamped ring (``GpuBackend.utilization_samples`` with the
  last timestamp seen, so nothing is read twice or skipped); each ring entry becomes one point
  at its own time, converted to the span clock (:mod:`otel_stages.gpu.timebase`). Without a ring,
  or when the ring has been silent for a while (NVML returns NOT_FOUND on an idle GPU), one
  instant reading stamped at read time. Neither: no points.
- memory (used and total in one call), power, temperature, SM activity: one call each, stamped
  at the middle of the call. A reading the device does not support is dropped for good (no
  point, never 0).

Isolation: every reading is its own backend call. One that raises :class:`GpuReadError` is
logged once and retried next pass; the others go on. A call still running after the sampler's
read timeout is *abandoned* by the sampler (:meth:`DeviceReader.abandon`): that reading is
skipped until the call returns, a fresh thread takes over the device, and the stuck thread,
when its call finally returns, discards the result and ends.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from otel_stages import semconv
from otel_stages.clock import Clock
from otel_stages.gpu import metrics
from otel_stages.gpu.backend import NOT_SUPPORTED, Device, GpuBackend, GpuReadError
from otel_stages.gpu.store import Point, SampleStore
from otel_stages.gpu.timebase import Timebase

logger = logging.getLogger("otel_stages.gpu")

RING = "utilization_samples"  #: name of the ring drain among a device's readings
#: Ring silent this long (or twice its sample period, if longer): take an instant reading.
RING_STALE_NS = 1_000_000_000
#: Readings of one pass, each one backend call (memory usage and limit come from one NVML call).
READ_GROUPS: tuple[tuple[str, ...], ...] = (
    (semconv.HW_GPU_MEMORY_USAGE, semconv.HW_GPU_MEMORY_LIMIT),
    (semconv.HW_POWER,), (semconv.HW_TEMPERATURE,), (metrics.GPU_SM_ACTIVITY,),
)
#: ``log_once(device, kind, message, *args, level=...)``
LogOnce = Callable[..., None]
#: ``timed(kind, fn, *args)``: call and record its duration
Timed = Callable[..., Any]


class Abandoned(Exception):
    """Raised inside a thread whose device was handed to a fresh thread meanwhile."""


class DeviceReader:
    """Sampling state of one device; its methods run on one thread at a time (the device's
    current thread, or the caller of :meth:`Sampler.run_once`)."""

    def __init__(self, device: Device, backend: GpuBackend, store: SampleStore, clock: Clock,
                 timebase: Timebase, started_ns: int, log_once: LogOnce, timed: Timed) -> None:
        self.device = device
        self.backend = backend
        self.store = store
        self.clock = clock
        self.timebase = timebase
        self.started_ns = started_ns
        self.log_once = log_once
        self.timed = timed
        self.last_seen_us = 0  # newest ring timestamp drained, in the driver's clock
        self.domain: str | None = None
        self.ring: bool | None = None  # None: not tried yet
        self.utilization = True  # False once ring and instant readings are both unsupported
        self.last_ring_ns: int | None = None  # span time of the newest ring sample
        self.period_ns: float | None = None  # observed spacing of ring samples
        self.primed = False  # first drain done (it returns the whole ring: older samples dropped)
        self.unsupported: set[str] = set()
        #: reading -> monotonic time its abandoned call started (skipped until it returns)
        self.hung: dict[str, float] = {}
        #: (reading, generation, monotonic start) of the backend call running now, if any
        self.current: tuple[str, int, float] | None = None
        self.generation = 0  # bumped when the device's thread is abandoned
        self.passes = 0
        self.lock = threading.Lock()  # guards hung / current / generation

    # -- isolation ---------------------------------------------------------------------------
    def _call(self, reading: str, generation: int, kind: str, fn: Any, *args: Any) -> Any:
        """Run one backend call as ``reading``; raises :class:`Abandoned` when this thread was
        replaced while the call ran (its result would be stale and is dropped)."""
        with self.lock:
            if generation != self.generation:
                raise Abandoned()
            self.current = (reading, generation, time.monotonic())
        try:
            return self.timed(kind, fn, *args)
        finally:
            with self.lock:
                if self.current is not None and self.current[1] == generation:
                    self.current = None
                stale = generation != self.generation
                if stale and self.hung.pop(reading, None) is not None:
                    logger.info("GPU %s: %s returned after being abandoned; reading it again",
                                self.device.uuid, reading)
            if stale:
                raise Abandoned()

    def stuck(self, now: float, timeout_s: float) -> str | None:
        """The reading whose call has run longer than ``timeout_s``, or ``None``."""
        with self.lock:
            current = self.current
            if current is None or current[1] != self.generation or now - current[2] < timeout_s:
                return None
            return current[0]

    def abandon(self, reading: str) -> int:
        """Give up on the thread stuck in ``reading``: skip that reading until its call returns;
        returns the new generation for the thread that takes over."""
        with self.lock:
            self.hung[reading] = self.current[2] if self.current is not None else time.monotonic()
            self.generation += 1
            self.current = None
            return self.generation

    def skipped(self) -> set[str]:
        with self.lock:
            return set(self.hung)

    # -- one pass ------------------------------------------------------------------------------
    def sample(self, generation: int) -> None:
        """One pass: ring (or instant utilization), then each other reading on its own."""
        skip = self.skipped()
        want_instant = False
        if self.utilization and RING not in skip:
            try:
                fresh = self.drain_ring(generation)
            except GpuReadError as exc:
                self._failed(RING, exc)
                fresh = None
            stale_ns = max(RING_STALE_NS, 2 * (self.period_ns or 0))
            want_instant = fresh is None or (fresh == 0 and (
                self.last_ring_ns is None or self.clock.now_ns() - self.last_ring_ns > stale_ns))
        groups = [tuple(n for n in group if n not in self.unsupported) for group in READ_GROUPS]
        if want_instant:
            groups.insert(0, (semconv.HW_GPU_UTILIZATION,))
        for group in groups:
            if group and group[0] not in skip:
                self._read(group, generation)
        self.passes += 1

    def _read(self, names: tuple[str, ...], generation: int) -> None:
        t0 = self.clock.now_ns()
        try:
            values = self._call(names[0], generation, "read", self.backend.read, self.device, names)
        except GpuReadError as exc:
            self._failed(names[0], exc)
            return
        t_ns = t0 + (self.clock.now_ns() - t0) // 2
        for name in names:
            if name in values:
                value = metrics.BY_NAME[name].convert(values[name])
                self.store.add(self.device.uuid, name, [Point(t_ns, value)])
            elif name == semconv.HW_GPU_UTILIZATION:
                self.utilization = False
                self.log_once(self.device, name, "GPU %s (%s) reports no utilization (MIG "
                              "instance or unsupported): no %s points for it", name)
            else:
                self.unsupported.add(name)
                self.log_once(self.device, name, "GPU %s (%s): %s not supported, not exported", name)

    def _failed(self, reading: str, exc: GpuReadError) -> None:
        self.log_once(self.device, f"read {reading}", "GPU %s (%s): reading %s failed, will "
                      "retry (other readings go on): %s", reading, exc, level=logging.WARNING)

    def drain_ring(self, generation: int) -> int | None:
        """New ring entries -> store; number added, or ``None`` when there is no ring."""
        if self.ring is False:
            return None
        raw = self._call(RING, generation, RING, self.backend.utilization_samples, self.device,
                         self.last_seen_us)
        if raw is NOT_SUPPORTED:
            self.ring = False
            return None
        self.ring = True
        raw = [s for s in raw if s.timestamp_us > self.last_seen_us]
        if not raw:
            return 0
        newest = raw[-1].timestamp_us
        if self.domain is None:
            self.domain = self.timebase.detect(newest)
            logger.debug("GPU %s sample timestamps: %s clock", self.device.uuid, self.domain)
        offset = self.timebase.offset_ns(self.domain, newest)
        if len(raw) > 1:
            gaps = [b.timestamp_us - a.timestamp_us for a, b in itertools.pairwise(raw)]
            self.period_ns = statistics.median(gaps) * 1000
        self.last_seen_us = newest
        self.last_ring_ns = newest * 1000 + offset
        points = [Point(s.timestamp_us * 1000 + offset, metrics.UTILIZATION.convert(s.percent))
                  for s in raw]
        if not self.primed:  # the first drain returns the ring's backlog from before we started:
            self.primed = True  # keep only its newest entry (the state at start)
            points = [p for p in points if p.time_ns >= self.started_ns] or points[-1:]
        self.store.add(self.device.uuid, semconv.HW_GPU_UTILIZATION, points)
        return len(points)

    def utilization_source(self) -> str | None:
        """``"ring"``, ``"instant"``, ``"not_supported"`` or ``None`` (not yet known)."""
        if not self.utilization:
            return "not_supported"
        return {True: "ring", False: "instant"}.get(self.ring)  # type: ignore[arg-type]
