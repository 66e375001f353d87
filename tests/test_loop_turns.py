"""Whether a stage on an asyncio loop yielded to it, counted exactly from the loop's iterations
(:mod:`otel_stages.signals.loop`: the ``select`` of a selector loop's ``_selector``, counted); the timer-tick
heuristic where a loop has no selector to count; and the fresh-eyes tester's service (issue 13),
where the heuristic called an awaited download a holder of the loop."""

from __future__ import annotations

import asyncio
import io
import selectors
import socket
import time

import pytest
from PIL import Image

import otel_stages as ots
from otel_stages import semconv
from otel_stages.analysis import diagnose, load_paths
from otel_stages.demo.images import jpeg_photo
from otel_stages.signals import capture, gcwatch, loop


def test_a_selector_loop_counts_its_turns_and_still_works():
    async def probe() -> tuple[loop.LoopMonitor, object]:
        running = asyncio.get_running_loop()
        selector = running._selector  # type: ignore[attr-defined]
        monitor = loop.monitor_for(running)
        assert monitor.exact and running._selector is selector  # type: ignore[attr-defined]
        assert "select" in vars(selector)  # its own select, shadowed on the instance
        before = monitor.turns
        sum(range(100_000))  # synchronous: the loop cannot turn
        assert monitor.turns == before
        await asyncio.sleep(0)  # one yield: the task resumes on a later iteration
        assert monitor.turns > before
        # add_reader / remove_reader and the transports' get_key use the selector as before
        left, right = socket.socketpair()
        with left, right:
            left.setblocking(False)
            right.sendall(b"ping")
            assert await running.sock_recv(left, 4) == b"ping"
        assert loop.monitor_for(running) is monitor
        return monitor, selector

    runner = asyncio.new_event_loop()
    monitor, selector = runner.run_until_complete(probe())
    runner.close()  # closes the selector as usual
    assert selector.get_map() is None  # type: ignore[attr-defined]  # a closed selector has no map
    assert runner._selector is None  # type: ignore[attr-defined]
    assert monitor.loop is None or monitor.loop.is_closed()


def test_the_selector_is_wrapped_once_and_counts_for_the_newest_monitor():
    runner = asyncio.new_event_loop()
    try:
        selector = runner._selector  # type: ignore[attr-defined]
        original = selector.select
        first = loop.LoopMonitor(runner)
        second = loop.LoopMonitor(runner)  # e.g. the first was replaced
        assert selector.select.__wrapped__ == original  # one layer, around the original
        runner.run_until_complete(asyncio.sleep(0))
        assert second.turns >= 1 and first.turns == 0
    finally:
        runner.close()


class _SlottedSelector:
    """A selector whose type has ``__slots__``: its ``select`` cannot be shadowed."""

    __slots__ = ("inner",)

    def __init__(self) -> None:
        self.inner = selectors.DefaultSelector()

    def select(self, timeout: float | None = None) -> list:
        return self.inner.select(timeout)

    def register(self, *args: object) -> object:
        return self.inner.register(*args)  # type: ignore[arg-type]

    def unregister(self, fileobj: object) -> object:
        return self.inner.unregister(fileobj)  # type: ignore[arg-type]

    def modify(self, *args: object) -> object:
        return self.inner.modify(*args)  # type: ignore[arg-type]

    def get_key(self, fileobj: object) -> object:
        return self.inner.get_key(fileobj)  # type: ignore[arg-type]

    def get_map(self) -> object:
        return self.inner.get_map()

    def close(self) -> None:
        self.inner.close()


class _Monitor:
    def __init__(self, turns: int) -> None:
        self.turns, self.lag_ns = turns, 0

    def lag_base_ns(self, now_ns: int) -> int:
        return self.lag_ns


@pytest.mark.parametrize("turned", [False, True])
def test_a_stage_that_yielded_says_its_lag_even_when_none(turned):
    """Its CPU time is left out, so the lag of 0 is written: the analysis takes a missing lag as 0
    only on a span with CPU time (stage_signals, clickhouse_signals)."""
    monitor = _Monitor(turns=7)
    state = (gcwatch.GC_LOG.seq, monitor, 7, 0, time.thread_time_ns(), None)
    monitor.turns += turned
    attributes, _ = capture.finish_fields(state, 0, 3_000_000) or ({}, [])
    if turned:
        assert attributes == {semconv.EVENT_LOOP_LAG_MS: 0.0}
    else:  # synchronous: its CPU time is there, no lag attribute needed
        assert semconv.EVENT_LOOP_LAG_MS not in attributes and semconv.THREAD_CPU_TIME_MS in attributes


class _LoopWithoutSelector:
    """What the monitor sees of uvloop or the Windows proactor loop: timers, no ``_selector``."""

    def __init__(self) -> None:
        self.timers: list[object] = []

    def is_closed(self) -> bool:
        return False

    def call_later(self, delay: float, fn: object) -> None:
        self.timers.append(fn)


class _OwnIterationLoop(asyncio.SelectorEventLoop):
    def _run_once(self) -> None:  # an iteration other than asyncio's: its selects prove nothing
        super()._run_once()  # type: ignore[misc]


def test_a_loop_without_a_selector_falls_back_to_timer_ticks():
    fake = _LoopWithoutSelector()
    monitor = loop.LoopMonitor(fake)  # type: ignore[arg-type]
    assert not monitor.exact and monitor.turns == 0
    monitor._tick()
    assert monitor.ticks == monitor.turns == 1  # a tick is a turn here
    state = (gcwatch.GC_LOG.seq, monitor, monitor.turns, monitor.lag_base_ns(0), time.thread_time_ns(),
             None)
    attributes, _ = capture.finish_fields(state, 0, loop.HOLD_MIN_NS) or ({}, [])
    assert semconv.EVENT_LOOP_HELD_MS in attributes  # no tick for a whole interval: held
    monitor._tick()
    attributes, _ = capture.finish_fields(state, 0, loop.HOLD_MIN_NS) or ({}, [])
    assert semconv.EVENT_LOOP_HELD_MS not in attributes
    assert semconv.THREAD_CPU_TIME_MS not in attributes  # the loop ran a tick: shared thread

    own = _OwnIterationLoop()
    try:
        assert not loop.LoopMonitor(own).exact
        assert "select" not in vars(own._selector)  # type: ignore[attr-defined]  # left alone
    finally:
        own.close()


def test_a_selector_that_takes_no_attribute_falls_back_to_timer_ticks():
    async def probe() -> bool:
        monitor = loop.monitor_for(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return monitor.exact

    runner = asyncio.SelectorEventLoop(_SlottedSelector())  # type: ignore[arg-type]
    try:
        assert runner.run_until_complete(probe()) is False
    finally:
        runner.close()


def test_without_turns_the_tick_heuristic_still_tells_a_plain_hold(recorded, monkeypatch):
    monkeypatch.setattr(loop, "_count_turns", lambda running, monitor: False)

    async def blocker() -> None:
        await asyncio.sleep(0.03)  # the waiter's stage starts first
        with ots.stage("decode"):
            time.sleep(0.06)

    async def waiter() -> None:
        async with ots.stage("download"):
            await asyncio.sleep(0.15)  # ticks run before and after decode's hold

    async def main() -> None:
        assert not loop.monitor_for(asyncio.get_running_loop()).exact
        await asyncio.gather(blocker(), waiter())

    asyncio.run(main())
    assert semconv.EVENT_LOOP_HELD_MS in recorded.one("decode").attributes
    assert semconv.EVENT_LOOP_HELD_MS not in recorded.one("download").attributes


# --- the tester's service (issue 13) -------------------------------------------------------------

_DECODE_MIN_S = 0.035  # a decode holds the loop longer than HOLD_MIN_NS (25 ms) on any machine


def _decode(data: bytes) -> Image.Image:
    until = time.perf_counter() + _DECODE_MIN_S
    while True:  # a real Pillow decode on the loop's thread, repeated to a known minimum
        image = Image.open(io.BytesIO(data))
        image.load()
        if time.perf_counter() >= until:
            return image


def _serve_on_the_loop(requests: int, concurrency: int) -> None:
    """The tester's asvc.py onloop: download awaits 2 ms, decode blocks the loop, resize and
    forward await (a thread and a 5 ms sleep); ``concurrency`` requests at a time."""
    data = jpeg_photo((800, 600), seed=5)

    async def handle() -> None:
        with ots.request():
            with ots.stage("download"):
                await asyncio.sleep(0.002)
            with ots.stage("decode"):
                image = _decode(data)
            with ots.stage("resize"):
                await asyncio.to_thread(image.resize, (224, 224))
            with ots.stage("forward"):
                await asyncio.sleep(0.005)

    async def main() -> None:
        gate = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with gate:
                await handle()

        await asyncio.gather(*(one() for _ in range(requests)))

    asyncio.run(main())


@pytest.mark.parametrize("span_mode", ["live", "deferred"])
def test_an_awaiting_stage_behind_a_blocking_decode_did_not_hold_the_loop(tmp_path, span_mode):
    """download awaited 2 ms and resumed behind other requests' decodes: the loop did not turn
    its timer meanwhile, and the tick heuristic called it a holder (27 of 80) and kept other
    tasks' decode CPU time as its own; the report said transfer (download), with network advice.
    It yielded: not held, no CPU time; decode held; the loop blocked by decode."""
    telemetry = ots.configure(service_name="onloop", data_dir=tmp_path, gpu="off",
                              set_global=False, span_mode=span_mode)
    try:
        _serve_on_the_loop(requests=32, concurrency=4)
    finally:
        telemetry.shutdown()
    recording = load_paths([telemetry.trace_path])
    by_name: dict[str, list] = {}
    for span in recording.spans:
        by_name.setdefault(span.name, []).append(span)
    assert len(by_name["download"]) == len(by_name["decode"]) == 32
    for name in ("download", "resize", "forward"):  # each awaited: the loop turned
        for span in by_name[name]:
            assert semconv.EVENT_LOOP_HELD_MS not in span.attributes, (name, span.attributes)
            assert semconv.THREAD_CPU_TIME_MS not in span.attributes, (name, span.attributes)
    # every awaiting stage says its lag, 0 included: without CPU time a missing lag would read as
    # unknown, and the lag's coverage of download's runs would decide the verdict by chance
    assert all(semconv.EVENT_LOOP_LAG_MS in s.attributes for s in by_name["download"])
    assert any(s.attributes[semconv.EVENT_LOOP_LAG_MS] == 0.0 for s in by_name["download"])
    assert any(s.attributes[semconv.EVENT_LOOP_LAG_MS] > 10 for s in by_name["download"])
    for span in by_name["decode"]:  # never yielded: its CPU time is its own
        assert span.attributes[semconv.EVENT_LOOP_HELD_MS] >= _DECODE_MIN_S * 1e3
        assert span.attributes[semconv.THREAD_CPU_TIME_MS] > 0

    verdict = diagnose(recording).verdict
    assert verdict.cause == "event_loop_blocked", "\n".join(verdict.evidence)
    held = next(line for line in verdict.evidence if line.startswith("held the event loop"))
    assert held.split(": ", 1)[1].startswith("decode ") and ";" not in held, held  # decode alone
    assert "move decode off the event loop" in verdict.advice[0], verdict.advice
    assert not any("network" in a or "transfer" in a for a in verdict.advice), verdict.advice


def test_the_loop_benchmark_runs_in_smoke_mode():
    """benchmarks/loop_turns.py (BENCHMARKS.md has the figures): every set-up measured, and the
    counting proxy saw the loop's iterations (about one per ``sleep(0)``). No timed assertion."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTEST_"))}
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "loop_turns.py"), "--smoke"],
                          env=env, cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    for workload in ("yield", "echo"):
        figures = report["workloads"][workload]
        assert set(figures["cpu_ns_per_op"]) == {"plain", "ticks", "turns"}
        assert all(v > 0 for v in figures["cpu_ns_per_op"].values())
    assert 1.0 <= report["workloads"]["yield"]["loop_iterations_per_op"] < 1.1
    assert report["workloads"]["echo"]["loop_iterations_per_op"] >= 1.0
    assert set(report["designs"]["added_ns_per_call"]) == {"shadowed_select", "proxy_getattr", "proxy_listed"}


def test_the_evidence_names_the_recording_hold_minimum():
    """The sentence for a blocked loop with no named holder quotes the recording's minimum hold."""
    import inspect

    from otel_stages.analysis import mechanisms
    from otel_stages.signals.loop import HOLD_MIN_NS

    assert f"({HOLD_MIN_NS / 1e6:g} ms: otel_stages.signals.loop.HOLD_MIN_NS)" in inspect.getsource(
        mechanisms)
