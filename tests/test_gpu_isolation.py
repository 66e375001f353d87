"""GPU sampler isolation with the pure-Python fake backend: a failing reading stops only itself,
a hung reading is abandoned after the read timeout (logged once) while the other readings and the
other GPUs keep their cadence, and comes back when the call returns."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection

from otel_stages import semconv
from otel_stages.gpu.backend import Device, GpuReadError
from otel_stages.gpu.device import RING
from otel_stages.gpu.sampler import Sampler
from tests.fakegpu import FakeBackend, FakeDevice

GPU0 = Device("GPU-aaaa-0000", "NVIDIA Test", 0)
GPU1 = Device("GPU-bbbb-1111", "NVIDIA Test", 1)
VALUES = {semconv.HW_GPU_MEMORY_USAGE: 2**30, semconv.HW_GPU_MEMORY_LIMIT: 2**34,
          semconv.HW_POWER: 150_000, semconv.HW_TEMPERATURE: 60}


class TroubledBackend(FakeBackend):
    """``fail``: (uuid, metric) reads that raise; ``hang``: (uuid, metric) reads that block until
    ``release`` is set."""

    def __init__(self, *args, fail=(), hang=(), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail = set(fail)
        self.hang = set(hang)
        self.release = threading.Event()
        self.entered = threading.Event()

    def read(self, device: Device, metrics: Collection[str]) -> dict[str, float]:
        for metric in metrics:
            if (device.uuid, metric) in self.fail:
                raise GpuReadError(f"{metric}: Unknown Error")
            if (device.uuid, metric) in self.hang and not self.release.is_set():
                self.entered.set()
                self.release.wait(30)
        return super().read(device, metrics)


def _devices() -> list[FakeDevice]:
    return [FakeDevice(GPU0, lambda t: 50.0, values=dict(VALUES)),
            FakeDevice(GPU1, lambda t: 50.0, values=dict(VALUES))]


def _latest(sampler: Sampler, device: Device) -> dict[str, float]:
    names = (semconv.HW_GPU_MEMORY_USAGE, semconv.HW_GPU_MEMORY_LIMIT, semconv.HW_POWER,
             semconv.HW_TEMPERATURE, semconv.HW_GPU_UTILIZATION)
    out = {}
    for name in names:
        point = sampler.store.latest(device.uuid, name)
        if point is not None:
            out[name] = point.value
    return out


def test_a_failing_reading_stops_only_that_reading(caplog):
    backend = TroubledBackend(_devices(), fail={(GPU1.uuid, semconv.HW_POWER)})
    sampler = Sampler(backend)
    assert sampler.open()
    with caplog.at_level(logging.WARNING, logger="otel_stages.gpu"):
        for _ in range(3):
            sampler.run_once()
    assert set(_latest(sampler, GPU1)) == {semconv.HW_GPU_MEMORY_USAGE, semconv.HW_GPU_MEMORY_LIMIT,
                                           semconv.HW_TEMPERATURE, semconv.HW_GPU_UTILIZATION}
    assert semconv.HW_POWER in _latest(sampler, GPU0)
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1 and GPU1.uuid in failed[0] and "hw.power" in failed[0]
    backend.fail.clear()  # the reading recovers on the next pass: it was never dropped for good
    sampler.run_once()
    assert _latest(sampler, GPU1)[semconv.HW_POWER] == 150.0


def test_a_hung_reading_is_abandoned_and_the_rest_keep_their_cadence(caplog):
    backend = TroubledBackend(_devices(), hang={(GPU1.uuid, semconv.HW_POWER)})
    sampler = Sampler(backend, interval_s=0.05, read_timeout_s=0.3)
    with caplog.at_level(logging.INFO, logger="otel_stages.gpu"):
        sampler.start()
        assert backend.entered.wait(10)
        # while GPU1's power call hangs, GPU0 keeps being sampled on its own thread
        passes_before = sampler._states[GPU0.uuid].passes
        assert sampler.flush(10)  # GPU1's fresh thread finishes a pass without the hung reading
        assert sampler._states[GPU0.uuid].passes > passes_before
        stats = sampler.stats()
        assert stats["abandoned_calls"] == 1
        assert {d["uuid"]: d["hung"] for d in stats["devices"]} == {GPU0.uuid: [], GPU1.uuid: [semconv.HW_POWER]}
        gpu1 = _latest(sampler, GPU1)
        assert semconv.HW_TEMPERATURE in gpu1 and semconv.HW_POWER not in gpu1
        for _ in range(3):  # it stays abandoned: no second stuck thread, no second warning
            assert sampler.flush(10)
        stuck = [t for t in threading.enumerate() if t.name == "otel-stages-gpu-1"]
        assert len(stuck) == 2  # the abandoned one (still in the call) and its replacement
        backend.release.set()  # the call returns: the reading resumes
        deadline = time.monotonic() + 10
        while sampler.stats()["devices"][1]["hung"] and time.monotonic() < deadline:
            sampler.flush(1)
        assert sampler.flush(10)
        assert _latest(sampler, GPU1)[semconv.HW_POWER] == 150.0
        sampler.stop()
    hung = [r.getMessage() for r in caplog.records if "did not return within" in r.getMessage()]
    assert len(hung) == 1 and GPU1.uuid in hung[0] and "hw.power" in hung[0]
    assert any("returned after being abandoned" in r.getMessage() for r in caplog.records)
    assert backend.calls[-1] == "close"  # nothing was left inside the backend at stop


def test_stop_leaves_the_backend_open_while_a_call_is_still_stuck(caplog):
    backend = TroubledBackend(_devices(), hang={(GPU0.uuid, semconv.HW_TEMPERATURE)})
    sampler = Sampler(backend, interval_s=0.05, read_timeout_s=0.2).start()
    assert backend.entered.wait(10)
    assert sampler.flush(10)
    with caplog.at_level(logging.WARNING, logger="otel_stages.gpu"):
        started = time.monotonic()
        sampler.stop(timeout_s=1)
        assert time.monotonic() - started < 3  # stop does not wait for the stuck call
    assert "close" not in backend.calls  # nvmlShutdown under a thread still inside NVML: no
    assert any("leaving NVML initialised" in r.getMessage() for r in caplog.records)
    backend.release.set()


def test_a_hung_ring_is_never_waited_for_on_the_request_thread():
    class HungRing(FakeBackend):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.release = threading.Event()
            self.hang = False

        def utilization_samples(self, device, since_us):
            if self.hang:
                self.release.wait(30)
            return super().utilization_samples(device, since_us)

    backend = HungRing([FakeDevice(GPU0, lambda t: 50.0)])
    sampler = Sampler(backend, interval_s=60, read_timeout_s=0.2).start()
    assert sampler.flush(10)
    backend.hang = True
    started = time.monotonic()
    for _ in range(5):
        sampler.refresh_utilization(GPU0.uuid, wait_s=0.01)  # what a forward's end calls
    assert time.monotonic() - started < 1.0  # each waits at most 10 ms, never on NVML itself
    deadline = time.monotonic() + 10
    while RING not in sampler.stats()["devices"][0]["hung"] and time.monotonic() < deadline:
        time.sleep(0.02)  # the watchdog's cadence, nothing to flush
    assert sampler.stats()["devices"][0]["hung"] == [RING]
    started = time.monotonic()
    sampler.refresh_utilization(GPU0.uuid, wait_s=5)
    assert time.monotonic() - started < 0.5  # a hung ring is not even asked
    backend.release.set()
    sampler.stop()
