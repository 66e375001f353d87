"""The sampler: reads every GPU each ``interval_s`` into a :class:`SampleStore`.

What one pass reads from one device, and how each reading is isolated, is in
:mod:`otel_stages.gpu.device`. Threads: the sampler thread initialises NVML (through a helper
thread with a timeout, so a hung ``nvmlInit`` never blocks the service), then starts one thread
per device, each on its own cadence, and watches them: a backend call still running after
``read_timeout_s`` is abandoned (logged once per device and reading), that reading is skipped
until the call returns, and a fresh thread takes the device over. So one slow or hung GPU, or one
hung reading, never delays the other GPUs or readings. Request threads never call NVML: a
forward's catch-up drain (:meth:`Sampler.refresh_utilization`) is handed to the device's thread
and waited for briefly. :meth:`Sampler.stop` ends the threads before ``close()`` (``nvmlShutdown``),
which is skipped while an abandoned call is still inside NVML.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from typing import Any

from otel_stages._runtime import RUNTIME, guard
from otel_stages.clock import Clock
from otel_stages.gpu.backend import Device, GpuBackend, GpuReadError, GpuUnavailable
from otel_stages.gpu.device import RING, Abandoned, DeviceReader
from otel_stages.gpu.store import SampleStore
from otel_stages.gpu.timebase import Timebase

logger = logging.getLogger("otel_stages.gpu")
_REPORTED_UNAVAILABLE: set[str] = set()  # reasons already logged in this process

STARTING, RUNNING, UNAVAILABLE, STOPPED = "starting", "running", "unavailable", "stopped"
DEFAULT_INIT_TIMEOUT_S = 10.0
DEFAULT_READ_TIMEOUT_S = 2.0
_GUARD_PASS = guard("gpu sampler")


class Sampler:
    """Samples every device of ``backend`` into ``store`` on daemon threads.

    ``interval_s``: seconds between passes (0.2 works: ring entries are drained, not polled, so
    none is lost or merged); ``clock``: the span clock (default: the one stages use);
    ``init_timeout_s``: give up on a ``backend.open()`` that has not returned by then;
    ``read_timeout_s``: abandon a backend call still running after this long (see the module
    docstring). :attr:`status` is ``starting`` / ``running`` / ``unavailable`` (:attr:`reason`
    says why) / ``stopped``. Thread-safe.
    """

    def __init__(self, backend: GpuBackend, *, interval_s: float = 1.0, clock: Clock | None = None,
                 timebase: Timebase | None = None, store: SampleStore | None = None,
                 init_timeout_s: float = DEFAULT_INIT_TIMEOUT_S,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S) -> None:
        self.backend = backend
        self.interval_s = interval_s
        self.clock = clock or RUNTIME.clock
        self.timebase = timebase or Timebase(self.clock)
        self.store = store or SampleStore()
        self.init_timeout_s = init_timeout_s
        self.read_timeout_s = read_timeout_s
        #: False: the caller reports unavailability itself (e.g. raises for OTEL_STAGES_GPU=on).
        self.log_unavailable = True
        self.status = STARTING
        self.reason: str | None = None
        self.init_s: float | None = None
        self._states: dict[str, DeviceReader] = {}
        self._started_ns = self.clock.now_ns()
        self._thread: threading.Thread | None = None
        self._device_threads: dict[str, threading.Thread] = {}
        self._wakes: dict[str, threading.Event] = {}
        self._jobs: dict[str, list[tuple[str, threading.Event]]] = {}
        self._opened = False
        self._stopping = False
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._cond = threading.Condition()
        self._passes = 0
        self._pass_ns: list[int] = []
        self._call_ns: dict[str, list[int]] = {RING: [], "read": []}
        self._timing_lock = threading.Lock()
        self._logged: set[tuple[str, str]] = set()
        self.abandoned_calls = 0  #: backend calls given up on (each logged once per reading)

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

    def open(self, announce: bool = True) -> bool:
        """Initialise the backend here (helper thread + timeout); ``True`` when devices were found.

        Called by the thread; call it directly to sample synchronously with :meth:`run_once`.
        ``announce=False`` leaves :meth:`wait_ready` waiting on success (the thread announces
        once the device threads run).
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
        self._states = {d.uuid: DeviceReader(d, self.backend, self.store, self.clock, self.timebase,
                                            self._started_ns, self._log_once, self._timed)
                        for d in devices}
        self.status = RUNNING
        if announce:
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
        """The sampler thread: init, one thread per device, then watch for stuck calls."""
        if not self.open(announce=False):
            return
        for uuid in self._states:
            self._wakes[uuid] = threading.Event()
            self._jobs[uuid] = []
            self._spawn(uuid, 0)
        self._ready.set()
        tick = max(0.01, min(self.read_timeout_s / 4, self.interval_s, 0.5))
        while True:
            self._wake.wait(tick)
            if self._stopping:
                break
            self._wake.clear()
            with _GUARD_PASS:
                self._watch()

    def _spawn(self, uuid: str, generation: int) -> None:
        thread = threading.Thread(target=self._device_loop, args=(uuid, generation),
                                  name=f"otel-stages-gpu-{self._states[uuid].device.index}", daemon=True)
        self._device_threads[uuid] = thread
        thread.start()

    def _watch(self) -> None:
        """Abandon any device thread stuck in one call for longer than ``read_timeout_s``."""
        now = time.monotonic()
        for uuid, reader in self._states.items():
            reading = reader.stuck(now, self.read_timeout_s)
            if reading is None:
                continue
            generation = reader.abandon(reading)
            self.abandoned_calls += 1
            self._log_once(reader.device, f"hung {reading}",
                           "GPU %s (%s): %s did not return within %.3g s; abandoned (its thread is "
                           "left waiting in NVML), skipped until it returns; other readings and "
                           "GPUs go on", reading, self.read_timeout_s, level=logging.WARNING)
            self._spawn(uuid, generation)
            with self._cond:
                self._cond.notify_all()  # a flush waiting on this device can count it as done

    def _device_loop(self, uuid: str, generation: int) -> None:
        """One device's cadence: a pass every ``interval_s``, and jobs (catch-up drains,
        flushes) as they come. Ends when stopping or when replaced (abandoned)."""
        reader, wake = self._states[uuid], self._wakes[uuid]
        next_at = time.monotonic()
        try:
            while not self._stopping and generation == reader.generation:
                woken = wake.wait(max(0.0, next_at - time.monotonic()))
                if self._stopping or generation != reader.generation:
                    return
                wake.clear()
                with self._cond:
                    jobs, self._jobs[uuid] = self._jobs[uuid], []
                due = not woken or any(kind == "pass" for kind, _done in jobs)
                if due:
                    self._pass(reader, generation)
                    next_at += self.interval_s
                    now = time.monotonic()
                    if next_at <= now:  # fell behind (slow NVML call): skip, do not burst
                        next_at = now + self.interval_s
                elif RING not in reader.skipped():
                    with _GUARD_PASS:
                        try:
                            reader.drain_ring(generation)
                        except GpuReadError:
                            pass  # the next pass reports read errors
                for _kind, done in jobs:
                    done.set()
        except Abandoned:
            return

    def _pass(self, reader: DeviceReader, generation: int) -> None:
        t0 = time.perf_counter_ns()
        with _GUARD_PASS:  # a bug here must not stop the sampler or the service
            reader.sample(generation)
        with self._cond:
            self._passes += 1
            self._pass_ns.append(time.perf_counter_ns() - t0)
            del self._pass_ns[:-1000]
            self._cond.notify_all()

    def _submit(self, uuid: str, kind: str) -> threading.Event | None:
        """Hand ``kind`` ("pass" or "drain") to the device's thread; ``None`` if it has none."""
        wake = self._wakes.get(uuid)
        thread = self._device_threads.get(uuid)
        if wake is None or thread is None or not thread.is_alive() or self._stopping:
            return None
        done = threading.Event()
        with self._cond:
            self._jobs[uuid].append((kind, done))
        wake.set()
        return done

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Run one pass on every device now (waiting for init first) and wait for them;
        ``False`` when not sampling, or some device did not finish within ``timeout_s`` (a
        device whose call is abandoned meanwhile finishes its pass on its fresh thread)."""
        deadline = time.monotonic() + timeout_s
        if not self.wait_ready(timeout_s) or self._thread is None or not self._thread.is_alive():
            return False
        pending = [self._submit(uuid, "pass") for uuid in list(self._states)]
        ok = True
        for done in pending:
            if done is None or not done.wait(max(0.0, deadline - time.monotonic())):
                ok = False
        if ok:
            return not self._stopping
        # a device thread abandoned mid-pass never sets its event: retry on the fresh threads
        retry = [self._submit(uuid, "pass") for uuid in list(self._states)]
        return all(d is not None and d.wait(max(0.0, deadline - time.monotonic())) for d in retry)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop and join the threads, then ``close()`` the backend (never while a thread may
        still be inside it: with an abandoned call still in NVML, NVML stays initialised).
        Idempotent."""
        if self.status == STOPPED:
            return
        self._stopping = True
        self._wake.set()
        for wake in self._wakes.values():
            wake.set()
        deadline = time.monotonic() + timeout_s
        threads = [t for t in (self._thread, *self._device_threads.values()) if t is not None]
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        self.status = STOPPED
        with self._cond:
            self._cond.notify_all()
        busy = [t.name for t in threads if t.is_alive()] + [
            f"{r.device.uuid} {name}" for r in self._states.values() for name in r.skipped()]
        if busy:
            logger.warning("GPU sampler: %s still inside NVML at stop; leaving NVML initialised",
                           ", ".join(busy))
            return
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
        """One pass over every device on the calling thread, without the read timeout (tests
        and the ``otel-stages gpu`` live view call this; the threads use their own cadence)."""
        for reader in list(self._states.values()):
            self._pass(reader, reader.generation)

    def refresh_utilization(self, uuid: str, wait_s: float = 0.005) -> None:
        """Drain ``uuid``'s ring now (called when a forward ends, so its window is complete up to
        the driver's last sample). Runs on the device's thread; waits at most ``wait_s`` for it,
        so a request thread never waits on NVML."""
        reader = self._states.get(uuid)
        if reader is None or reader.ring is not True or self.status != RUNNING:
            return
        if RING in reader.skipped():
            return
        done = self._submit(uuid, "drain")
        if done is not None:
            done.wait(wait_s)

    def _timed(self, kind: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return fn(*args)
        finally:
            elapsed = time.perf_counter_ns() - t0
            with self._timing_lock:
                calls = self._call_ns[kind]
                calls.append(elapsed)
                del calls[:-1000]

    def _log_once(self, device: Device, kind: str, message: str, *extra: Any,
                  level: int = logging.INFO) -> None:
        if (device.uuid, kind) not in self._logged:
            self._logged.add((device.uuid, kind))
            logger.log(level, message, device.uuid, device.name, *extra)

    # -- introspection -------------------------------------------------------------------------
    def utilization_source(self, uuid: str) -> str | None:
        """``"ring"``, ``"instant"``, ``"not_supported"`` or ``None`` (unknown device / not yet)."""
        reader = self._states.get(uuid)
        return None if reader is None else reader.utilization_source()

    def stats(self) -> dict[str, Any]:
        """Status, init time, passes (one device read once; summed over devices) and their cost and
        per-call cost (ms), and per device: clock domain, ring
        sample period (ms), utilization source, unsupported and abandoned (skipped) readings.
        JSON-ready."""
        with self._cond, self._timing_lock:
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
            "abandoned_calls": self.abandoned_calls,
            "devices": [{
                "uuid": r.device.uuid, "name": r.device.name, "mig": r.device.is_mig,
                "clock_domain": r.domain,
                "sample_period_ms": None if r.period_ns is None else round(r.period_ns / 1e6, 3),
                "utilization": r.utilization_source(), "passes": r.passes,
                "unsupported": sorted(r.unsupported), "hung": sorted(r.skipped()),
            } for r in self._states.values()],
        }
