"""GPU telemetry logic with the pure-Python fake backend and injected clocks (no NVML, no threads
except where the behaviour under test is a thread)."""

from __future__ import annotations

import io
import itertools
import json
import logging
import threading

import pytest
from opentelemetry.exporter.otlp.json.file import FileMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource

import otel_stages as ots
from otel_stages import semconv
from otel_stages.clock import Clock
from otel_stages.config import ConfigurationError, resolve
from otel_stages.gpu import attribution as attribution_module
from otel_stages.gpu import cuda, metrics, session
from otel_stages.gpu.attribution import Attribution, match_uuid, set_model_device
from otel_stages.gpu.backend import Device, GpuUnavailable
from otel_stages.gpu.reader import GpuMetricReader, SerializedExporter, to_metrics_data
from otel_stages.gpu.sampler import RUNNING, UNAVAILABLE, Sampler
from otel_stages.gpu.store import PendingPoint, Point, SampleStore
from otel_stages.gpu.timebase import BOOTTIME, MONOTONIC, RELATIVE, UNIX, Timebase
from otel_stages.testing import capture_spans
from tests.fakegpu import FakeBackend, FakeDevice, square_wave

S = 1_000_000_000
GPU0 = Device("GPU-aaaa-0000", "NVIDIA Test", 0)
GPU1 = Device("GPU-bbbb-1111", "NVIDIA Test", 1)


class FakeTime:
    """Wall, monotonic and boot clocks that advance together; boot = monotonic + suspended."""

    def __init__(self, suspended_s: float = 0.0) -> None:
        self.mono = 5_000 * S
        self.wall = 1_800_000_000 * S
        self.suspended = int(suspended_s * S)

    def advance(self, seconds: float) -> None:
        self.mono += int(seconds * S)
        self.wall += int(seconds * S)

    def clock(self) -> Clock:
        return Clock(monotonic_ns=lambda: self.mono, wall_ns=lambda: self.wall)

    def timebase(self, clock: Clock) -> Timebase:
        return Timebase(clock, wall_ns=lambda: self.wall, monotonic_ns=lambda: self.mono,
                        boottime_ns=lambda: self.mono + self.suspended)

    def us(self, domain: str) -> int:
        return {UNIX: self.wall, MONOTONIC: self.mono, BOOTTIME: self.mono + self.suspended}[domain] // 1000


def make_sampler(fake: FakeTime, devices: list[FakeDevice], domain: str = UNIX,
                 sample_period_us: int = 100_000, **kwargs) -> Sampler:
    clock = fake.clock()
    backend = FakeBackend(devices, now_us=lambda: fake.us(domain), sample_period_us=sample_period_us)
    sampler = Sampler(backend, clock=clock, timebase=fake.timebase(clock), **kwargs)
    assert sampler.open()
    return sampler


def util_points(sampler: Sampler, device: Device = GPU0) -> list[Point]:
    return sampler.store.window(device.uuid, semconv.HW_GPU_UTILIZATION, 0, 2**63)


# --- clock domains --------------------------------------------------------------------------------

@pytest.mark.parametrize("domain", [UNIX, MONOTONIC, BOOTTIME])
def test_timebase_detects_each_domain(domain: str) -> None:
    fake = FakeTime(suspended_s=3600)  # boot time and monotonic differ by an hour of suspend
    tb = fake.timebase(fake.clock())
    assert tb.detect(fake.us(domain) - 300_000) == domain


def test_timebase_prefers_monotonic_when_boot_time_is_the_same() -> None:
    fake = FakeTime()
    assert fake.timebase(fake.clock()).detect(fake.us(MONOTONIC) - 10) == MONOTONIC


def test_timebase_falls_back_to_relative_for_implausible_stamps() -> None:
    fake = FakeTime()
    tb = fake.timebase(fake.clock())
    assert tb.detect(fake.us(UNIX) * 10) == RELATIVE  # far in every clock's future
    newest = 123_456_789
    assert newest * 1000 + tb.offset_ns(RELATIVE, newest) == fake.clock().now_ns()


@pytest.mark.parametrize("domain", [UNIX, BOOTTIME])
def test_ring_samples_are_converted_exactly_onto_the_span_clock(domain: str) -> None:
    fake = FakeTime(suspended_s=60)
    sampler = make_sampler(fake, [FakeDevice(GPU0, square_wave(0.5))], domain=domain)
    start_span_ns = sampler.clock.now_ns()
    fake.advance(2.0)
    sampler.run_once()
    times = [p.time_ns for p in util_points(sampler)]
    assert sampler.stats()["devices"][0]["clock_domain"] == domain
    assert times[-1] == sampler.clock.now_ns()  # the fake ring's newest sample is "now"
    assert times[0] == start_span_ns  # backlog before start dropped (newest kept)
    assert [b - a for a, b in itertools.pairwise(times)] == [100_000_000] * 20


# --- sampling -----------------------------------------------------------------------------------

def test_successive_passes_neither_repeat_nor_skip_ring_samples() -> None:
    fake = FakeTime()
    sampler = make_sampler(fake, [FakeDevice(GPU0, square_wave(0.25))])
    for _ in range(7):
        fake.advance(0.2)  # sampler interval 0.2 s, driver ring every 0.1 s
        sampler.run_once()
    times = [p.time_ns for p in util_points(sampler)]
    assert len(times) == len(set(times)) == 15
    assert all(b - a == 100_000_000 for a, b in itertools.pairwise(times))
    drained = sampler.store.drain()
    assert len([p for p in drained if p.metric == semconv.HW_GPU_UTILIZATION]) == 15
    assert sampler.store.drain() == []


def test_not_supported_readings_emit_no_points() -> None:
    fake = FakeTime()
    mig = Device("MIG-cccc", "NVIDIA Test MIG", 0, parent_uuid=GPU0.uuid)
    sampler = make_sampler(fake, [FakeDevice(mig, utilization=None,
                                             values={semconv.HW_GPU_MEMORY_USAGE: 1024})])
    for _ in range(3):
        fake.advance(1.0)
        sampler.run_once()
    names = {p.metric for p in sampler.store.drain()}
    assert names == {semconv.HW_GPU_MEMORY_USAGE}
    device = sampler.stats()["devices"][0]
    assert device["utilization"] == "not_supported"
    assert set(device["unsupported"]) == {semconv.HW_POWER, semconv.HW_TEMPERATURE,
                                          semconv.HW_GPU_MEMORY_LIMIT, metrics.GPU_SM_ACTIVITY}


def test_instant_reading_only_when_the_ring_is_silent_for_a_second() -> None:
    fake = FakeTime()
    sampler = make_sampler(fake, [FakeDevice(GPU0, lambda t_us: 30.0)])
    fake.advance(0.5)
    sampler.run_once()
    before = len(util_points(sampler))
    assert before == 6  # ring entries only (newest backlog entry + 5), no instant reading
    # from here on the ring answers NOT_FOUND (nothing new), as on an idle GPU
    sampler.backend.utilization_samples = lambda d, since: []  # type: ignore[method-assign]
    fake.advance(0.5)
    sampler.run_once()
    assert len(util_points(sampler)) == before  # 0.5 s of silence: still trusted
    fake.advance(0.6)
    sampler.run_once()
    newest = util_points(sampler)[-1]
    assert newest.time_ns == sampler.clock.now_ns() and newest.value == pytest.approx(0.30)


def test_init_timeout_gives_up_and_closes_a_late_backend() -> None:
    release = threading.Event()

    class SlowBackend(FakeBackend):
        def open(self) -> list[Device]:
            release.wait(5)
            return super().open()

    backend = SlowBackend([FakeDevice(GPU0, square_wave(1))])
    sampler = Sampler(backend, init_timeout_s=0.1)
    sampler.log_unavailable = False
    assert sampler.open() is False
    assert sampler.status == UNAVAILABLE and "did not return within" in sampler.reason
    release.set()
    for _ in range(100):
        if "close" in backend.calls:
            break
        threading.Event().wait(0.01)  # the abandoned init thread, not telemetry
    assert backend.calls == ["open", "close"]


def test_thread_flush_waits_for_init_and_one_pass_then_stop_closes_after_join() -> None:
    backend = FakeBackend([FakeDevice(GPU0, square_wave(1), values={semconv.HW_POWER: 100_000})])
    sampler = Sampler(backend, interval_s=60).start()
    assert sampler.flush(5)
    assert sampler.status == RUNNING
    assert sampler.store.latest(GPU0.uuid, semconv.HW_POWER).value == 100.0  # 100000 mW
    sampler.stop()
    assert backend.calls[-1] == "close" and not sampler._thread.is_alive()


def test_store_merges_late_points_in_time_order_and_exports_each_once() -> None:
    store = SampleStore(capacity=10)
    store.add("g", "m", [Point(10, 1), Point(30, 3)])
    store.add("g", "m", [Point(20, 2)])
    assert [p.time_ns for p in store.window("g", "m", 0, 100)] == [10, 20, 30]
    assert [p.point.time_ns for p in store.drain()] == [10, 30, 20]
    store.add("g", "m", [Point(40 + i, i) for i in range(20)])
    assert len(store.window("g", "m", 0, 10**9)) == 10


# --- attribution ----------------------------------------------------------------------------------

def filled_store(values: list[tuple[int, float]]) -> SampleStore:
    store = SampleStore()
    store.add(GPU0.uuid, semconv.HW_GPU_UTILIZATION, [Point(t, v) for t, v in values])
    return store


def attribution_for(store: SampleStore, devices: list[Device] | None = None) -> Attribution:
    sampler = Sampler(FakeBackend([FakeDevice(d) for d in devices or [GPU0]]), store=store)
    sampler.open()
    return Attribution(sampler, catch_up=False)


def test_summary_uses_only_samples_inside_the_window() -> None:
    store = filled_store([(9 * S, 0.9), (10 * S, 0.2), (11 * S, 0.4), (12 * S, 0.6), (13 * S, 1.0)])
    store.add(GPU0.uuid, semconv.HW_GPU_MEMORY_USAGE, [Point(11 * S, 5), Point(14 * S, 99)])
    summary = attribution_for(store).summarize(GPU0.uuid, 10 * S, 12 * S)
    assert summary == {
        semconv.GPU_SAMPLE_COUNT: 3, semconv.GPU_UTILIZATION_MEAN: 0.4,
        semconv.GPU_UTILIZATION_MAX: 0.6, semconv.GPU_BUSY_AT_START: False,  # 0.2 at start
        semconv.GPU_MEMORY_USAGE_MAX: 5,
    }


def test_busy_at_start_reads_the_last_sample_before_start_and_only_if_recent() -> None:
    store = filled_store([(10 * S, 0.95), (20 * S, 0.1)])
    attribution = attribution_for(store)
    assert attribution.summarize(GPU0.uuid, 11 * S, 12 * S)[semconv.GPU_BUSY_AT_START] is True
    far = attribution.summarize(GPU0.uuid, 15 * S, 16 * S)
    assert semconv.GPU_BUSY_AT_START not in far  # 5 s old: unknown, not False
    assert far[semconv.GPU_SAMPLE_COUNT] == 0 and semconv.GPU_UTILIZATION_MEAN not in far


def test_hook_sets_attributes_on_forward_spans_only_and_once_per_batch_window() -> None:
    fake = FakeTime()
    clock = fake.clock()
    store = filled_store([])
    attribution = attribution_for(store)
    calls = []
    attribution.sampler.refresh_utilization = lambda uuid, wait_s=0.0: calls.append(uuid)  # type: ignore[method-assign]
    attribution.catch_up = True
    with capture_spans(clock=clock) as captured:
        ots._runtime.RUNTIME.add_stage_end_hook(attribution)  # type: ignore[attr-defined]
        try:
            tokens = []
            for _ in range(3):
                with ots.request():
                    tokens.append(ots.enqueue_token())
            batch = ots.dequeue_batch(tokens)
            with batch.stage("forward"):
                store.add(GPU0.uuid, semconv.HW_GPU_UTILIZATION, [Point(clock.now_ns(), 0.75)])
            with ots.request(), ots.stage("decode"):
                pass
        finally:
            ots._runtime.RUNTIME.remove_stage_end_hook(attribution)  # type: ignore[attr-defined]
    forwards = captured.by_name("forward")
    assert len(forwards) == 3 and calls == [GPU0.uuid]
    assert all(f.attributes[semconv.GPU_UTILIZATION_MEAN] == 0.75 for f in forwards)
    assert not any(k.startswith("gpu.") for k in captured.one("decode").attributes)


def test_model_device_needs_a_hint_when_there_are_several_gpus(monkeypatch, caplog) -> None:
    attribution = attribution_for(SampleStore(), [GPU0, GPU1])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with caplog.at_level(logging.INFO, logger="otel_stages.gpu"):
        assert attribution.model_device() is None
        assert attribution.model_device() is None
    assert len([r for r in caplog.records if "no hint" in r.getMessage()]) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb")
    assert attribution.model_device() == GPU1.uuid
    set_model_device("aaaa-0000")  # as PyTorch prints UUIDs, without the prefix
    try:
        assert attribution.model_device() == GPU0.uuid
    finally:
        set_model_device(None)
    assert attribution_module._model_device is None


def test_mig_instances_replace_their_parent_as_the_only_candidate() -> None:
    mig = Device("MIG-dddd", "NVIDIA Test MIG", 0, parent_uuid=GPU0.uuid)
    assert attribution_for(SampleStore(), [GPU0, mig]).model_device() == mig.uuid
    assert match_uuid("mig-dd", [GPU0, mig]) is mig and match_uuid("", [GPU0]) is None


# --- metric table and export ------------------------------------------------------------------------

def test_metric_table_names_units_and_conversions() -> None:
    assert [s.name for s in metrics.SPECS[:5]] == [
        semconv.HW_GPU_UTILIZATION, semconv.HW_GPU_MEMORY_USAGE, semconv.HW_GPU_MEMORY_LIMIT,
        semconv.HW_POWER, semconv.HW_TEMPERATURE]
    units = {s.name: s.unit for s in metrics.SPECS}
    assert units[semconv.HW_GPU_UTILIZATION] == "1" and units[semconv.HW_POWER] == "W"
    assert units[semconv.HW_GPU_MEMORY_USAGE] == "By" and units[semconv.HW_TEMPERATURE] == "Cel"
    assert metrics.BY_NAME[semconv.HW_GPU_UTILIZATION].convert(37) == pytest.approx(0.37)
    assert metrics.BY_NAME[semconv.HW_POWER].convert(251_500) == pytest.approx(251.5)
    assert metrics.BY_NAME[semconv.HW_GPU_MEMORY_USAGE].convert(2**40) == 2**40
    assert all(s.instrument == "gauge" for s in metrics.SPECS)


def test_every_sample_becomes_one_otlp_json_point_at_its_own_time() -> None:
    points = [PendingPoint(GPU0.uuid, semconv.HW_GPU_UTILIZATION, Point(1_000 + i * 200, i / 10))
              for i in range(50)]  # same attributes, 50 samples in one export
    points.append(PendingPoint(GPU0.uuid, semconv.HW_GPU_MEMORY_USAGE, Point(5_000, 123)))
    stream = io.StringIO()
    data = to_metrics_data(points, {GPU0.uuid: GPU0}, Resource.create({"service.name": "t"}))
    FileMetricExporter(stream=stream).export(data)
    doc = json.loads(stream.getvalue())
    by_name = {m["name"]: m for m in doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]}
    util = by_name[semconv.HW_GPU_UTILIZATION]["gauge"]["dataPoints"]
    assert [int(p["timeUnixNano"]) for p in util] == [1_000 + i * 200 for i in range(50)]
    assert util[7]["asDouble"] == pytest.approx(0.7)
    assert by_name[semconv.HW_GPU_MEMORY_USAGE]["gauge"]["dataPoints"][0]["asInt"] == "123"
    attrs = {a["key"]: a["value"]["stringValue"] for a in util[0]["attributes"]}
    assert attrs == {semconv.HW_ID: GPU0.uuid, semconv.HW_TYPE: "gpu", semconv.HW_VENDOR: "NVIDIA",
                     semconv.HW_MODEL: "NVIDIA Test"}


class CapturingExporter(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[MetricsData] = []

    def export(self, metrics_data, timeout_millis=10_000, **kwargs):  # type: ignore[no-untyped-def]
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis=10_000):  # type: ignore[no-untyped-def]
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):  # type: ignore[no-untyped-def]
        pass


def test_reader_on_a_meter_provider_flushes_samples_and_ignores_sdk_instruments() -> None:
    backend = FakeBackend([FakeDevice(GPU0, square_wave(1), values={semconv.HW_POWER: 90_000})])
    holder = type("Session", (), {})()
    holder.sampler = Sampler(backend, interval_s=60).start()
    holder.stop = holder.sampler.stop
    inner = CapturingExporter()
    reader = GpuMetricReader(holder, SerializedExporter(inner), Resource.create({}), 3600)
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("x").create_counter("requests").add(1)
    provider.force_flush()
    names = [m.name for b in inner.batches for rm in b.resource_metrics
             for sm in rm.scope_metrics for m in sm.metrics]
    assert semconv.HW_POWER in names and "requests" not in names
    provider.shutdown()
    assert backend.calls[-1] == "close"


# --- settings and wiring --------------------------------------------------------------------------

def test_gpu_settings_rows() -> None:
    assert resolve(environ={}).gpu == "auto" and resolve(environ={}).gpu_interval_s == 1.0
    assert resolve(environ={"OTEL_STAGES_GPU": "OFF", "OTEL_STAGES_GPU_INTERVAL_S": "0.2"}).gpu_interval_s == 0.2
    with pytest.raises(ConfigurationError, match=r"OTEL_STAGES_GPU='maybe' \(setting gpu\)"):
        resolve(environ={"OTEL_STAGES_GPU": "maybe"})
    with pytest.raises(ConfigurationError, match="OTEL_STAGES_GPU_INTERVAL_S"):
        resolve(environ={"OTEL_STAGES_GPU_INTERVAL_S": "0"})


def test_session_modes(monkeypatch) -> None:
    settings = resolve({"gpu": "off"}, environ={})
    exporter = CapturingExporter()
    assert session.start(settings, Resource.create({}), exporter) == (exporter, [])

    def broken() -> FakeBackend:
        return FakeBackend([], unavailable="no driver here")

    with pytest.raises(ConfigurationError, match="gpu='on'.*no driver here"):
        session.start(resolve({"gpu": "on"}, environ={}), Resource.create({}), exporter, broken)
    assert session.current() is None
    shared, readers = session.start(resolve({"gpu": True}, environ={}), Resource.create({}), exporter,
                                    lambda: FakeBackend([FakeDevice(GPU0, square_wave(1))]))
    try:
        assert isinstance(shared, SerializedExporter) and len(readers) == 1
        assert session.current().sampler.status == RUNNING
    finally:
        session.current().stop()
    assert session.current().attribution not in ots._runtime.RUNTIME.stage_end_hooks  # type: ignore[attr-defined]


# --- CUDA timing ------------------------------------------------------------------------------------

class FakeEvent:
    """Stands in for torch.cuda.Event: device time is scripted, completion is controllable."""

    def __init__(self, done: threading.Event, device_ms: float) -> None:
        self.done, self.device_ms, self.recorded = done, device_ms, False

    def record(self, stream=None) -> None:  # type: ignore[no-untyped-def]
        self.recorded = True

    def synchronize(self) -> None:
        self.done.wait(5)

    def elapsed_time(self, other: FakeEvent) -> float:
        return other.device_ms


def test_cuda_stage_events_mode_ends_span_at_host_time_after_the_gpu_finishes() -> None:
    fake = FakeTime()
    done = threading.Event()
    with capture_spans(clock=fake.clock()) as captured:
        with ots.request():
            with cuda.cuda_stage("forward", event_factory=lambda: FakeEvent(done, 42.5)):
                fake.advance(0.010)  # 10 ms on the host; the GPU needs 42.5 ms
            fake.advance(1.0)
        assert captured.by_name("forward") == []  # not ended until the GPU is done
        done.set()
        assert cuda.flush(5)
        forward = captured.one("forward")
    assert forward.attributes[semconv.GPU_DEVICE_TIME_MS] == 42.5
    assert forward.end_time - forward.start_time == 10_000_000


def test_cuda_stage_sync_mode_and_without_cuda() -> None:
    done = threading.Event()
    done.set()
    with capture_spans() as captured:
        with cuda.cuda_stage("forward", mode="sync", event_factory=lambda: FakeEvent(done, 3.0)):
            pass
        with cuda.cuda_stage("forward"):  # no PyTorch imported here: a plain stage
            pass
        with pytest.raises(ValueError, match="mode='async'"):
            with cuda.cuda_stage("forward", mode="async"):
                pass
    first, second = captured.by_name("forward")
    assert first.attributes[semconv.GPU_DEVICE_TIME_MS] == 3.0
    assert semconv.GPU_DEVICE_TIME_MS not in second.attributes
    assert cuda.torch_current_uuid() is None


def test_fake_backend_unavailable_raises() -> None:
    with pytest.raises(GpuUnavailable, match="nope"):
        FakeBackend([], unavailable="nope").open()


def test_a_process_unit_is_percent_until_fractions_reach_the_mixed_share() -> None:
    from otel_stages.analysis.gpu import MIXED_UNIT_MIN_SHARE, unit_divisor

    assert MIXED_UNIT_MIN_SHARE == 0.5
    assert unit_divisor(0, 40) == 1.0            # ratios only
    assert unit_divisor(40, 0) == 100.0          # percent only
    assert unit_divisor(11, 9) == 100.0          # fractions 45 %: percent of a GPU near idle
    assert unit_divisor(10, 10) is None          # at the share: mixed
    assert unit_divisor(9, 11) is None           # above it
    assert unit_divisor(1, 28) is None           # a ratio sampler's stray percent value
