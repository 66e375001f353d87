"""The sampler thread: reads every GPU each ``interval_s`` into a :class:`SampleStore`.

Per device and pass:

- utilization: drain the driver's timestamped ring (``GpuBackend.utilization_samples`` with the
  last timestamp seen, so nothing is read twice or skipped); each ring entry becomes one point
  at its own time, converted to the span clock (:mod:`otel_stages.gpu.timebase`). Without a ring,
  or when the ring has been silent for a while (NVML returns NOT_FOUND on an idle GPU), one
  instant reading (``nvmlDeviceGetUtilizationRates``) stamped at read time. Neither: no points.
- memory, power, temperature, SM activity: one instant reading each, stamped at the middle of
  the call. A reading the device does not support is dropped for good (no point, never 0).

NVML is initialised on the sampler's own thread (off the request path) through a helper thread
with a timeout, so a hung ``nvmlInit`` never blocks the service. :meth:`Sampler.stop` joins the
thread before ``close()`` (``nvmlShutdown``).
"""

from __future__ import annotations

import itertools
import logging
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from otel_stages import semconv
from otel_stages._runtime import RUNTIME, guard
from otel_stages.clock import Clock
from otel_stages.gpu import metrics
from otel_stages.gpu.backend import NOT_SUPPORTED, Device, GpuBackend, GpuReadError, GpuUnavailable
from otel_stages.gpu.store import Point, SampleStore
from otel_stages.gpu.timebase import Timebase

logger = logging.getLogger("otel_stages.gpu")
_REPORTED_UNAVAILABLE: set[str] = set()  # reasons already logged in this process

STARTING, RUNNING, UNAVAILABLE, STOPPED = "starting", "running", "unavailable", "stopped"
DEFAULT_INIT_TIMEOUT_S = 10.0
#: Ring silent this long (or twice its sample period, if longer): take an instant reading.
_RING_STALE_NS = 1_000_000_000
_GUARD_PASS = guard("gpu sampler")


@dataclass
class _DeviceState:
    device: Device
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_seen_us: int = 0  # newest ring timestamp drained, in the driver's clock
    domain: str | None = None
    ring: bool | None = None  # None: not tried yet
    utilization: bool = True  # False once ring and instant readings are both unsupported
    last_ring_ns: int | None = None  # span time of the newest ring sample
    period_ns: float | None = None  # observed spacing of ring samples
    primed: bool = False  # first drain done (it returns the whole ring: older samples dropped)
    unsupported: set[str] = field(default_factory=set)


class Sampler:
    """Samples every device of ``backend`` into ``store`` on a daemon thread.

    ``interval_s``: seconds between passes (0.2 works: ring entries are drained, not polled, so
    none is lost or merged); ``clock``: the span clock (default: the one stages use);
    ``init_timeout_s``: give up on a ``backend.open()`` that has not returned by then.
    :attr:`status` is ``starting`` / ``running`` / ``unavailable`` (:attr:`reason` says why) /
    ``stopped``. Thread-safe.
    """

    def __init__(self, backend: GpuBackend, *, interval_s: float = 1.0, clock: Clock | None = None,
                 timebase: Timebase | None = None, store: SampleStore | None = None,
                 init_timeout_s: float = DEFAULT_INIT_TIMEOUT_S) -> None:
        self.backend = backend
        self.interval_s = interval_s
        self.clock = clock or RUNTIME.clock
        self.timebase = timebase or Timebase(self.clock)
        self.store = store or SampleStore()
        self.init_timeout_s = init_timeout_s
        #: False: the caller reports unavailability itself (e.g. raises for OTEL_STAGES_GPU=on).
        self.log_unavailable = True
        self.status = STARTING
        self.reason: str | None = None
        self.init_s: float | None = None
        self._states: dict[str, _DeviceState] = {}
        self._started_ns = self.clock.now_ns()
        self._thread: threading.Thread | None = None
        self._opened = False
        self._stopping = False
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._cond = threading.Condition()
        self._passes = 0
        self._pass_ns: list[int] = []
        self._call_ns: dict[str, list[int]] = {"utilization_samples": [], "read": []}
        self._logged: set[tuple[str, str]] = set()

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def devices(self) -> list[Device]:
        """Devices being sampled (empty until :attr:`status` is ``running``)."""
        return [s.device for s in self._states.values()]

    def start(self) -> Sampler:
        """Start the thread (init happens there); returns at once."""
        self._thread = threading.Thread(target=self._run, name="otel-stages-gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait until init finished either way; ``True`` when sampling (status ``running``)."""
        self._ready.wait(timeout_s)
        return self.status == RUNNING

    def open(self) -> bool:
        """Initialise the backend here (helper thread + timeout); ``True`` when devices were found.

        Called by the thread; call it directly to sample synchronously with :meth:`run_once`.
        """
        t0 = time.perf_counter()
        outcome: dict[str, Any] = {}
        done = threading.Event()
        abandon = threading.Lock()  # held by whoever decides first: the helper or the timeout

        def init() -> None:
            try:
                outcome["devices"] = self.backend.open()
            except BaseException as exc:  # noqa: BLE001 - reported as the reason below
                outcome["error"] = exc
            if not abandon.acquire(blocking=False) and "devices" in outcome:
                try:  # too late: we already gave up, release what it opened
                    self.backend.close()
                except Exception:  # noqa: BLE001 - nobody is left to tell
                    pass
            done.set()

        threading.Thread(target=init, name="otel-stages-nvml-init", daemon=True).start()
        deadline = t0 + self.init_timeout_s
        while not done.wait(min(0.05, max(0.0, deadline - time.perf_counter()))):
            if self._stopping or time.perf_counter() >= deadline:
                if abandon.acquire(blocking=False):
                    if self._stopping:  # shutting down before init finished: nothing to say
                        self.status = STOPPED
                        self._ready.set()
                        return False
                    return self._unavailable(
                        f"nvmlInit did not return within {time.perf_counter() - t0:.1f} s "
                        "(driver busy or hung? check nvidia-smi)")
                done.wait()  # the helper finished at the same moment: use its outcome
                break
        self.init_s = time.perf_counter() - t0
        if "error" in outcome:
            error = outcome["error"]
            reason = str(error) if isinstance(error, GpuUnavailable) else f"NVML init failed: {error!r}"
            return self._unavailable(reason)
        self._opened = True
        devices: list[Device] = outcome["devices"]
        if not devices:
            return self._unavailable("NVML found no GPUs (none visible to this process)")
        self._states = {d.uuid: _DeviceState(d) for d in devices}
        self.status = RUNNING
        self._ready.set()
        logger.debug("GPU sampling %d device(s) every %.3g s (init %.3f s): %s", len(devices),
                     self.interval_s, self.init_s, ", ".join(f"{d.uuid} {d.name}" for d in devices))
        return True

    def _unavailable(self, reason: str) -> bool:
        self.status, self.reason = UNAVAILABLE, reason
        self._ready.set()
        if self.log_unavailable and reason not in _REPORTED_UNAVAILABLE:
            # Once per reason and process: a re-configure() on the same host would only repeat it.
            _REPORTED_UNAVAILABLE.add(reason)
            logger.warning("NVML unavailable: %s; continuing without GPU data "
                           "(set OTEL_STAGES_GPU=off to skip GPU sampling)", reason)
        return False

    def _run(self) -> None:
        if not self.open():
            return
        next_at = time.monotonic()
        while True:
            woken = self._wake.wait(max(0.0, next_at - time.monotonic()))
            if self._stopping:
                break
            self._wake.clear()
            self.run_once()
            if not woken:
                next_at += self.interval_s
                now = time.monotonic()
                if next_at <= now:  # fell behind (slow NVML call): skip, do not burst
                    next_at = now + self.interval_s

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Run one pass now (waiting for init first) and wait for it; ``False`` when not sampling
        or it did not finish within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        if not self.wait_ready(timeout_s) or self._thread is None or not self._thread.is_alive():
            return False
        with self._cond:
            target = self._passes + 1
            self._wake.set()
            return self._cond.wait_for(lambda: self._passes >= target or self._stopping,
                                       max(0.0, deadline - time.monotonic())) and not self._stopping

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop and join the thread, then ``close()`` the backend (never while the thread may
        still be inside it). Idempotent."""
        if self.status == STOPPED:
            return
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                logger.warning("GPU sampler did not stop within %.1f s; leaving NVML initialised",
                               timeout_s)
                return
        self.status = STOPPED
        with self._cond:
            self._cond.notify_all()
        self._close_backend()

    def _close_backend(self) -> None:
        if self._opened:
            self._opened = False
            try:
                self.backend.close()
            except Exception as exc:  # noqa: BLE001 - shutdown must not raise
                logger.debug("GPU backend close failed: %r", exc)

    # -- sampling ------------------------------------------------------------------------------
    def run_once(self) -> None:
        """One pass over every device (the thread calls this; tests may call it directly)."""
        t0 = time.perf_counter_ns()
        for state in list(self._states.values()):
            with _GUARD_PASS:  # a bug here must not stop the sampler or the service
                try:
                    self._sample(state)
                except GpuReadError as exc:
                    self._log_once(state.device, "read",
                                   "GPU %s (%s): reading failed, will retry: %s", exc,
                                   level=logging.WARNING)
        with self._cond:
            self._passes += 1
            self._pass_ns.append(time.perf_counter_ns() - t0)
            del self._pass_ns[:-1000]
            self._cond.notify_all()

    def refresh_utilization(self, uuid: str, wait_s: float = 0.002) -> None:
        """Drain ``uuid``'s ring now (called when a forward ends, so its window is complete up to
        the driver's last sample). Skipped when the device is busy for longer than ``wait_s``."""
        state = self._states.get(uuid)
        if state is None or state.ring is not True or self.status != RUNNING:
            return
        if state.lock.acquire(timeout=wait_s):
            try:
                self._drain_ring(state)
            except GpuReadError:
                pass  # the sampler thread reports read errors
            finally:
                state.lock.release()

    def _timed(self, kind: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return fn(*args)
        finally:
            calls = self._call_ns[kind]
            calls.append(time.perf_counter_ns() - t0)
            del calls[:-1000]

    def _sample(self, state: _DeviceState) -> None:
        wanted = [m for m in metrics.POINT_METRICS if m not in state.unsupported]
        if state.utilization:
            with state.lock:
                fresh = self._drain_ring(state)
            stale_ns = max(_RING_STALE_NS, 2 * (state.period_ns or 0))
            if fresh is None or (fresh == 0 and (state.last_ring_ns is None
                                                 or self.clock.now_ns() - state.last_ring_ns > stale_ns)):
                wanted.append(semconv.HW_GPU_UTILIZATION)
        if not wanted:
            return
        t0 = self.clock.now_ns()
        values = self._timed("read", self.backend.read, state.device, wanted)
        t_ns = t0 + (self.clock.now_ns() - t0) // 2
        for name in wanted:
            if name in values:
                value = metrics.BY_NAME[name].convert(values[name])
                self.store.add(state.device.uuid, name, [Point(t_ns, value)])
            elif name == semconv.HW_GPU_UTILIZATION:
                state.utilization = False
                self._log_once(state.device, name, "GPU %s (%s) reports no utilization (MIG "
                               "instance or unsupported): no %s points for it", name)
            else:
                state.unsupported.add(name)
                self._log_once(state.device, name, "GPU %s (%s): %s not supported, not exported", name)

    def _drain_ring(self, state: _DeviceState) -> int | None:
        """New ring entries -> store; number added, or ``None`` when there is no ring."""
        if state.ring is False:
            return None
        raw = self._timed("utilization_samples", self.backend.utilization_samples, state.device,
                          state.last_seen_us)
        if raw is NOT_SUPPORTED:
            state.ring = False
            return None
        state.ring = True
        raw = [s for s in raw if s.timestamp_us > state.last_seen_us]
        if not raw:
            return 0
        newest = raw[-1].timestamp_us
        if state.domain is None:
            state.domain = self.timebase.detect(newest)
            logger.debug("GPU %s sample timestamps: %s clock", state.device.uuid, state.domain)
        offset = self.timebase.offset_ns(state.domain, newest)
        if len(raw) > 1:
            gaps = [b.timestamp_us - a.timestamp_us for a, b in itertools.pairwise(raw)]
            state.period_ns = statistics.median(gaps) * 1000
        state.last_seen_us = newest
        state.last_ring_ns = newest * 1000 + offset
        points = [Point(s.timestamp_us * 1000 + offset, metrics.UTILIZATION.convert(s.percent)) for s in raw]
        if not state.primed:  # the first drain returns the ring's backlog from before we started:
            state.primed = True  # keep only its newest entry (the state at start)
            points = [p for p in points if p.time_ns >= self._started_ns] or points[-1:]
        self.store.add(state.device.uuid, semconv.HW_GPU_UTILIZATION, points)
        return len(points)

    def _log_once(self, device: Device, kind: str, message: str, *extra: Any,
                  level: int = logging.INFO) -> None:
        if (device.uuid, kind) not in self._logged:
            self._logged.add((device.uuid, kind))
            logger.log(level, message, device.uuid, device.name, *extra)

    # -- introspection -------------------------------------------------------------------------
    def utilization_source(self, uuid: str) -> str | None:
        """``"ring"``, ``"instant"``, ``"not_supported"`` or ``None`` (unknown device / not yet)."""
        state = self._states.get(uuid)
        if state is None:
            return None
        if not state.utilization:
            return "not_supported"
        return {True: "ring", False: "instant"}.get(state.ring)  # type: ignore[arg-type]

    def stats(self) -> dict[str, Any]:
        """Status, init time, pass and per-call cost (ms), and per device: clock domain, ring
        sample period (ms), utilization source and unsupported readings. JSON-ready."""
        with self._cond:
            passes = list(self._pass_ns)
            calls = {k: list(v) for k, v in self._call_ns.items()}

        def ms(values: list[int]) -> float | None:
            return round(statistics.fmean(values) / 1e6, 4) if values else None

        return {
            "status": self.status, "reason": self.reason, "interval_s": self.interval_s,
            "init_s": None if self.init_s is None else round(self.init_s, 4),
            "passes": self._passes, "mean_pass_ms": ms(passes),
            "max_pass_ms": round(max(passes) / 1e6, 4) if passes else None,
            "mean_call_ms": {k: ms(v) for k, v in calls.items()},
            "points": self.store.total, "points_dropped": self.store.dropped,
            "devices": [{
                "uuid": s.device.uuid, "name": s.device.name, "mig": s.device.is_mig,
                "clock_domain": s.domain,
                "sample_period_ms": None if s.period_ns is None else round(s.period_ns / 1e6, 3),
                "utilization": self.utilization_source(s.device.uuid),
                "unsupported": sorted(s.unsupported),
            } for s in self._states.values()],
        }
