"""Per-stage signals on real spans: thread CPU time, GC pauses (gc.callbacks), event-loop lag and
the stage that held the loop; the thresholds of the capture; the setting that turns them off."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest

import otel_stages as ots
from otel_stages import semconv, signals
from otel_stages.clock import Clock
from otel_stages.config import resolve
from otel_stages.signals import capture, gcwatch, loop
from otel_stages.testing import capture_spans


def _spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def test_cpu_time_tells_computing_from_waiting(recorded):
    with ots.stage("decode"):
        _spin(0.03)
    with ots.stage("download"):
        time.sleep(0.05)
    decode, download = recorded.one("decode"), recorded.one("download")
    busy, idle = decode.attributes, download.attributes
    duration_ms = (decode.end_time - decode.start_time) / 1e6
    assert 0 < busy[semconv.THREAD_CPU_TIME_MS] <= duration_ms + 1
    assert busy[semconv.THREAD_CPU_UTILIZATION] == pytest.approx(
        busy[semconv.THREAD_CPU_TIME_MS] / duration_ms, rel=0.01)
    assert idle[semconv.THREAD_CPU_UTILIZATION] < 0.3  # asleep: not on a core
    assert idle[semconv.THREAD_CPU_TIME_MS] < 15
    assert busy[semconv.THREAD_CPU_TIME_MS] > 3 * idle[semconv.THREAD_CPU_TIME_MS]


def test_off_by_default_in_capture_and_off_by_setting():
    with capture_spans() as cap:
        with ots.stage("decode"):
            _spin(0.001)
    assert semconv.THREAD_CPU_TIME_MS not in cap.one("decode").attributes
    assert resolve().signals is True
    assert resolve(environ={"OTEL_STAGES_SIGNALS": "false"}).signals is False
    assert resolve({"signals": False}).signals is False
    with pytest.raises(ots.ConfigurationError, match="OTEL_STAGES_SIGNALS='maybe'"):
        resolve(environ={"OTEL_STAGES_SIGNALS": "maybe"})


def test_configure_signals_false_turns_everything_off(tmp_path):
    was = gcwatch.installed()
    telemetry = ots.configure(data_dir=tmp_path, gpu="off", set_global=False, signals=False)
    try:
        assert not signals.is_enabled() and not gcwatch.installed()
        assert signals.on_start() is None
    finally:
        telemetry.shutdown()
        signals.enable(True)
        if was:
            gcwatch.install()


def test_stage_ended_on_another_thread_gets_no_cpu_time():
    state = capture.on_start()
    box: list[object] = []
    thread = threading.Thread(target=lambda: box.append(capture.finish_fields(state, 0, 10**9)))
    _spin(0.02)  # this thread's CPU clock moves on; the other thread's is unrelated
    thread.start()
    thread.join()
    fields = box[0]
    assert fields is not None
    attributes, _ = fields  # type: ignore[misc]
    assert semconv.THREAD_CPU_TIME_MS not in attributes


def test_gc_collection_inside_a_stage_becomes_an_event(recorded):
    junk = [[i] for i in range(200_000)]  # enough tracked objects for a collection over 1 ms
    with ots.stage("resize"):
        gc.collect()
    del junk
    span = recorded.one("resize")
    assert span.attributes[semconv.GC_COLLECTIONS] >= 1
    assert span.attributes[semconv.GC_PAUSE_MS] >= 1.0
    events = [e for e in span.events if e.name == semconv.EVENT_GC_PAUSE]
    assert events and events[-1].attributes[semconv.CPYTHON_GC_GENERATION] == 2
    assert events[-1].attributes[semconv.GC_DURATION_MS] >= capture.GC_EVENT_MIN_MS
    assert span.start_time <= events[-1].timestamp <= span.end_time


def test_no_collection_no_gc_attributes(recorded):
    gc.disable()
    try:
        with ots.stage("resize"):
            pass
    finally:
        gc.enable()
    attributes = recorded.one("resize").attributes
    assert semconv.GC_PAUSE_MS not in attributes and semconv.GC_COLLECTIONS not in attributes


def test_collection_on_another_thread_counts_for_the_waiting_stage(recorded):
    junk = [[i] for i in range(200_000)]
    with ots.stage("forward"):
        worker = threading.Thread(target=gc.collect)
        worker.start()
        worker.join()
    del junk
    assert recorded.one("forward").attributes[semconv.GC_PAUSE_MS] >= 1.0


# --- capture thresholds, on a GC log with known times -----------------------------------------


def _log_with(*pauses: tuple[int, int, int, int]) -> tuple[gcwatch.GcLog, int]:
    log = gcwatch.GcLog()
    for i, pause in enumerate(pauses, start=1):
        log.ring[i & (gcwatch.RING - 1)] = pause
    log.seq = len(pauses)
    return log, 0


@pytest.mark.parametrize("duration_ms, evented", [(0.99, False), (1.01, True)])
def test_gc_event_threshold(monkeypatch, duration_ms, evented):
    assert capture.GC_EVENT_MIN_MS == 1.0
    start = 10_000_000
    log, seq = _log_with((start, start + int(duration_ms * 1e6), 0, -1))
    monkeypatch.setattr(capture, "GC_LOG", log)
    attributes, events = capture.finish_fields((seq, None, 0, 0, time.thread_time_ns(), None), 0, 10**9) or ({}, [])
    assert attributes[semconv.GC_PAUSE_MS] == pytest.approx(duration_ms)
    assert bool(events) is evented


def test_gc_pauses_are_clipped_to_the_stage_and_events_capped(monkeypatch):
    assert capture.MAX_GC_EVENTS == 16
    pauses = [(i * 10_000_000, i * 10_000_000 + 2_000_000, 1, -1) for i in range(20)]
    log, seq = _log_with(*pauses)
    monkeypatch.setattr(capture, "GC_LOG", log)
    start_ns, end_ns = 1_000_000, pauses[-1][0] + 1_000_000  # cuts the first and the last in half
    attributes, events = capture.finish_fields((seq, None, 0, 0, time.thread_time_ns(), None), start_ns, end_ns) or ({}, [])
    assert attributes[semconv.GC_COLLECTIONS] == len(pauses)
    assert attributes[semconv.GC_PAUSE_MS] == pytest.approx(2.0 * (len(pauses) - 2) + 1.0 + 1.0)
    assert len(events) == 16


@pytest.mark.parametrize("collected, pause_ms", [(True, 4.0), (False, 0.0)])
def test_a_collection_still_open_at_the_stage_end(monkeypatch, collected, pause_ms):
    """The collector handed the GIL over in a callback: after collecting (the stage waited for
    it: counted up to the stage's end) or before (the stage ran freely: not counted)."""
    done = gc.get_stats()[2]["collections"] - (1 if collected else 0)
    log, seq = _log_with((5_000_000, -1, 2, done))
    monkeypatch.setattr(capture, "GC_LOG", log)
    attributes, events = capture.finish_fields((seq, None, 0, 0, time.thread_time_ns(), None), 0, 9_000_000) or ({}, [])
    assert attributes[semconv.GC_PAUSE_MS] == pytest.approx(pause_ms)
    assert attributes[semconv.GC_COLLECTIONS] == 1
    if collected:  # an event all the same, its duration up to the stage's end: an upper bound
        (name, event, time_ns), = events
        assert name == semconv.EVENT_GC_PAUSE
        assert (time_ns, event[semconv.GC_DURATION_MS], event[semconv.GC_IN_PROGRESS]) == (
            5_000_000, pytest.approx(4.0), True)
    else:
        assert events == []


def test_gc_log_callback_marks_start_then_end(monkeypatch):
    log = gcwatch.GcLog()
    log.callback("start", {"generation": 1})
    assert log.seq == 1 and log.since(0)[0][1] == -1
    log.callback("stop", {"generation": 1, "collected": 0, "uncollectable": 0})
    (start_ns, end_ns, generation, done), = log.since(0)
    assert 0 < start_ns <= end_ns and generation == 1 and done == gc.get_stats()[1]["collections"]
    assert log.since(1) == []


# --- event loop -------------------------------------------------------------------------------


class _FakeMonitor:
    def __init__(self, turns: int = 0, lag_ns: int = 0, due_ns: int = 1 << 62) -> None:
        self.turns, self.lag_ns, self.due_ns = turns, lag_ns, due_ns

    def lag_base_ns(self, now_ns: int) -> int:  # as LoopMonitor's: the pending tick's lateness too
        return self.lag_ns + max(0, now_ns - self.due_ns)


@pytest.mark.parametrize("wall_ns, held", [(loop.HOLD_MIN_NS - 1, False), (loop.HOLD_MIN_NS, True)])
def test_hold_threshold(wall_ns, held):
    assert loop.HOLD_MIN_NS == 25_000_000
    monitor = _FakeMonitor(turns=3)
    state = (gcwatch.GC_LOG.seq, monitor, 3, 0, time.thread_time_ns(), None)
    attributes, _ = capture.finish_fields(state, 0, wall_ns) or ({}, [])
    assert (semconv.EVENT_LOOP_HELD_MS in attributes) is held
    monitor.turns = 4  # the loop turned meanwhile: it was free at some point
    attributes, _ = capture.finish_fields(state, 0, wall_ns) or ({}, [])
    assert semconv.EVENT_LOOP_HELD_MS not in attributes


@pytest.mark.parametrize("lag_ns, counted", [(loop.LAG_MIN_NS - 1, False), (loop.LAG_MIN_NS, True)])
def test_lag_threshold(monkeypatch, lag_ns, counted):
    assert loop.LAG_MIN_NS == 2_000_000

    class _Loop:
        def is_closed(self) -> bool:
            return False

        def call_later(self, delay: float, fn: object) -> None:
            pass

    fake = _Loop()
    monitor = loop.LoopMonitor.__new__(loop.LoopMonitor)
    monitor._loop = lambda: fake
    monitor.ticks = monitor.turns = monitor.lag_ns = 0
    monitor.exact = False
    clock = Clock(monotonic_ns=lambda: 7_000_000_000, wall_ns=lambda: 7_000_000_000)
    monkeypatch.setattr(loop.RUNTIME, "clock", clock)  # Clock has slots: replace it whole
    now = clock.now_ns()
    monitor._due_ns = now - lag_ns
    monitor._tick()
    assert monitor.ticks == 1
    assert monitor.lag_ns == (lag_ns if counted else 0)


def test_blocking_stage_holds_the_loop_and_others_see_the_lag(recorded):
    async def blocker() -> None:
        await asyncio.sleep(0.03)  # let the waiter start first
        with ots.stage("decode"):
            time.sleep(0.12)  # synchronous work on the loop's thread: nothing else runs

    async def waiter() -> None:
        async with ots.stage("download"):
            await asyncio.sleep(0.08)  # due while decode holds the loop

    async def main() -> None:
        await asyncio.gather(blocker(), waiter())

    asyncio.run(main())
    decode, download = recorded.one("decode"), recorded.one("download")
    assert decode.attributes[semconv.EVENT_LOOP_HELD_MS] >= 100
    assert semconv.EVENT_LOOP_HELD_MS not in download.attributes  # it awaited: the loop ran
    assert download.attributes[semconv.EVENT_LOOP_LAG_MS] >= 50
    assert semconv.EVENT_LOOP_LAG_MS not in decode.attributes  # it was not kept waiting


def test_a_stage_starting_behind_a_blocked_loop_is_not_charged_for_the_block(recorded):
    """The tester's aioread case: lag above the span's own duration. The loop is held 120 ms
    outside any stage; a stage that starts right after and awaits 10 ms sees the overdue tick run,
    but the lateness it had built before the stage began is not the stage's."""
    async def main() -> None:
        with ots.stage("queue"):  # the first stage on the loop starts its monitor
            pass
        await asyncio.sleep(0.03)  # the monitor is running, its next tick pending
        time.sleep(0.12)  # the loop is held, no stage open
        async with ots.stage("download"):
            await asyncio.sleep(0.01)

    asyncio.run(main())
    download = recorded.one("download")
    wall_ms = (download.end_time - download.start_time) / 1e6
    lag_ms = download.attributes.get(semconv.EVENT_LOOP_LAG_MS, 0.0)
    assert lag_ms <= wall_ms and lag_ms < 20, (lag_ms, wall_ms)  # was ~100 ms before the fix


def test_lag_is_never_more_than_the_stage_lasted():
    monitor = _FakeMonitor(turns=3, lag_ns=0)
    state = (gcwatch.GC_LOG.seq, monitor, 3, 0, time.thread_time_ns(), None)
    monitor.turns, monitor.lag_ns = 4, 300_000_000  # a tick ran, 300 ms late
    attributes, _ = capture.finish_fields(state, 0, 70_000_000) or ({}, [])
    assert attributes[semconv.EVENT_LOOP_LAG_MS] == 70.0


def test_an_awaiting_stage_leaves_out_the_loop_threads_cpu_time(recorded):
    """A stage that awaits while another task computes on the loop's thread: the thread's CPU time
    over the stage is mostly the other task's (the tester saw 729 ms "cpu" on a download), so it
    is left out; a stage that runs synchronously on the loop keeps its own."""
    async def busy() -> None:
        await asyncio.sleep(0.005)
        end = time.perf_counter() + 0.06
        while time.perf_counter() < end:  # CPU work on the loop's thread, outside any stage
            pass

    async def awaiting() -> None:
        async with ots.stage("download"):
            await asyncio.sleep(0.1)  # the loop runs busy() and its timer meanwhile

    async def main() -> None:
        with ots.stage("queue"):  # starts the monitor
            pass
        await asyncio.gather(awaiting(), busy())
        with ots.stage("decode"):
            sum(range(200_000))

    asyncio.run(main())
    assert semconv.THREAD_CPU_TIME_MS not in recorded.one("download").attributes
    assert recorded.one("decode").attributes[semconv.THREAD_CPU_TIME_MS] > 0


def test_a_stage_ending_before_the_late_tick_runs_still_sees_the_lag():
    """The tester's asleep case: a download whose own wake-up runs before the overdue monitor tick
    (both due at the end of a block) ended with no lag at all; the pending tick's lateness inside
    the stage's window counts."""
    monitor = _FakeMonitor(turns=3, lag_ns=0, due_ns=0)
    state = (gcwatch.GC_LOG.seq, monitor, 3, monitor.lag_base_ns(0), time.thread_time_ns(), None)
    monitor.turns, monitor.due_ns = 4, 20_000_000  # a tick ran on time; the next, due at 20 ms,
    attributes, _ = capture.finish_fields(state, 0, 170_000_000) or ({}, [])  # has not run yet
    assert attributes[semconv.EVENT_LOOP_LAG_MS] == 150.0
    later = (gcwatch.GC_LOG.seq, monitor, 4, monitor.lag_base_ns(150_000_000), time.thread_time_ns(), None)
    monitor.turns = 5  # (not a holder: the loop turned meanwhile)
    attributes, _ = capture.finish_fields(later, 150_000_000, 170_000_000) or ({}, [])
    assert attributes[semconv.EVENT_LOOP_LAG_MS] == 20.0  # only the part after it started
    held = (gcwatch.GC_LOG.seq, monitor, 5, monitor.lag_base_ns(0), time.thread_time_ns(), None)
    attributes, _ = capture.finish_fields(held, 0, 170_000_000) or ({}, [])  # no tick ran: it held
    assert semconv.EVENT_LOOP_LAG_MS not in attributes and semconv.EVENT_LOOP_HELD_MS in attributes


def test_stages_off_the_loop_carry_no_loop_attributes(recorded):
    with ots.stage("decode"):
        time.sleep(0.03)
    attributes = recorded.one("decode").attributes
    assert semconv.EVENT_LOOP_HELD_MS not in attributes and semconv.EVENT_LOOP_LAG_MS not in attributes


def test_monitor_follows_its_loop_and_goes_with_it():
    async def probe() -> loop.LoopMonitor:
        running = asyncio.get_running_loop()
        first = loop.monitor_for(running)
        assert loop.monitor_for(running) is first
        await asyncio.sleep(loop.INTERVAL_S * 3)
        assert first.ticks >= 1
        return first

    monitor = asyncio.run(probe())
    assert monitor.loop is None or monitor.loop.is_closed()


def test_cpu_only_fast_path_gives_what_finish_fields_gives(monkeypatch):
    # deferred span mode reads only the CPU clock when that is all there is to report
    cpu = iter([1_000, 4_000, 4_000])
    monkeypatch.setattr(capture, "thread_time_ns", lambda: next(cpu))
    state = capture.on_start()
    assert state is not None
    cpu_ns = capture.cpu_only_ns(state)
    assert cpu_ns == 3_000
    assert capture.cpu_fields(cpu_ns, 0, 6_000) == capture.finish_fields(state, 0, 6_000)
    gcwatch.GC_LOG.callback("start", {"generation": 0})  # a collection since: not CPU only
    gcwatch.GC_LOG.callback("stop", {"generation": 0})
    assert capture.cpu_only_ns(state) is None


def test_cpu_only_fast_path_not_on_an_event_loop():
    async def stage_state() -> object:
        return capture.on_start()

    state = asyncio.run(stage_state())
    assert capture.cpu_only_ns(state) is None  # type: ignore[arg-type]
