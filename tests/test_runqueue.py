"""Run-queue wait (issue 13): the per-thread reader of Linux ``/proc/thread-self/schedstat``
(kernel Documentation/scheduler/sched-stats.rst: ``run_delay``, the second field), its opt-in
setting, the span attribute live and deferred, and the ``cpu_contention`` rule where it is known
(it decides: a wait for a core against a blocked thread), plus the pressure's scope (host-wide
pressure may refute, never confirm) on hand-built and recorded data
(tests/data/traces/runqueue, README there)."""

from __future__ import annotations

import gc
import logging
import math
import os
import threading
import time
from pathlib import Path

import pytest

import otel_stages as ots
from otel_stages import semconv
from otel_stages.analysis import contention, diagnose, load_paths
from otel_stages.analysis import mechanisms as mech
from otel_stages.analysis.model import MetricPoint
from otel_stages.config import ConfigurationError, resolve
from otel_stages.signals import capture, pressure, runqueue
from tests.test_mechanisms import RESOURCE, X, Y, recording

RUNQ = Path(__file__).parent / "data" / "traces" / "runqueue"
LINUX = Path("/proc/thread-self/schedstat").exists()
SOME = {semconv.SYSTEM_LINUX_PRESSURE_STALL_TYPE: semconv.PRESSURE_STALL_SOME}
#: orthogonal to X and Y (and zero-mean): a third, independent spread
Z = [1.0, -1.0, -1.0, 1.0] * (len(X) // 4)


# --- the reader ---------------------------------------------------------------------------------


@pytest.mark.skipif(not LINUX, reason="Linux /proc/thread-self/schedstat")
def test_the_reader_reads_this_thread_run_delay_from_one_cached_fd():
    first = runqueue.read()
    assert first is not None
    fd, delay = first
    # the kernel's own line: three numbers, the second is run_delay (ns)
    with open("/proc/thread-self/schedstat") as f:
        fields = f.read().split()
    assert len(fields) == 3 and int(fields[1]) >= delay
    again = runqueue.read()
    assert again is not None and again[0] == fd and again[1] >= delay  # same fd, never goes back


@pytest.mark.skipif(not LINUX, reason="Linux /proc/thread-self/schedstat")
def test_each_thread_reads_its_own_file_and_closes_it_when_it_ends():
    mine = runqueue.read()
    seen: list[tuple[int, int] | None] = []
    thread = threading.Thread(target=lambda: seen.append(runqueue.read()))
    thread.start()
    thread.join()
    assert mine is not None and seen[0] is not None
    other_fd = seen[0][0]
    assert other_fd != mine[0]
    gc.collect()
    # the thread's fd was closed with its thread-local value (or reused by another open file,
    # which then is not the thread's schedstat any more)
    try:
        target = os.readlink(f"/proc/self/fd/{other_fd}")
    except OSError:
        target = None
    assert target is None or "schedstat" not in target or other_fd == runqueue.read()[0]


def test_a_missing_file_turns_it_off_said_once(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(runqueue, "SCHEDSTAT_PATH", str(tmp_path / "no" / "schedstat"))
    runqueue._reset()
    try:
        with caplog.at_level(logging.INFO, logger="otel_stages.signals"):
            assert runqueue.read() is None
            assert runqueue.read() is None
            threading.Thread(target=runqueue.read).start()
        said = [r for r in caplog.records if "run-queue wait not recorded" in r.getMessage()]
        assert len(said) == 1 and "CONFIG_SCHED_INFO" in said[0].getMessage()
        assert not runqueue.available()
    finally:
        monkeypatch.undo()
        runqueue._reset()


@pytest.mark.skipif(not LINUX or not hasattr(os, "fork"), reason="Linux fork")
def test_a_forked_child_reads_its_own_thread_not_the_parent():
    parent = runqueue.read()
    assert parent is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the inherited fd was closed at fork; a new one is opened
        ok = 0
        try:
            mine = runqueue.read()
            with open("/proc/thread-self/schedstat") as f:
                own = int(f.read().split()[1])
            ok = int(mine is not None and abs(mine[1] - own) < 50_000_000
                     and os.readlink(f"/proc/self/fd/{mine[0]}").endswith("schedstat"))
        finally:
            os.write(w, bytes([ok]))
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"\x01"


# --- the setting and the attribute ----------------------------------------------------------------


def test_the_setting_is_off_by_default_and_validated():
    assert resolve({}, {}).run_queue is False
    assert resolve({}, {"OTEL_STAGES_RUN_QUEUE": "true"}).run_queue is True
    assert resolve({"run_queue": True}, {"OTEL_STAGES_RUN_QUEUE": "false"}).run_queue is True
    with pytest.raises(ConfigurationError) as info:
        resolve({}, {"OTEL_STAGES_RUN_QUEUE": "sometimes"})
    assert str(info.value) == ("OTEL_STAGES_RUN_QUEUE='sometimes' (setting run_queue): expected"
                               " true or false")
    with pytest.raises(ConfigurationError, match=r"argument run_queue=1 \(setting run_queue,"
                                                 r" OTEL_STAGES_RUN_QUEUE\)"):
        resolve({"run_queue": 1}, {})


def _spans(data: Path) -> list[dict]:
    import json

    out = []
    for path in data.glob("traces-*.jsonl"):
        for line in path.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        out.append({"name": span["name"], **{
                            a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}})
    return out


@pytest.mark.skipif(not LINUX, reason="Linux /proc/thread-self/schedstat")
@pytest.mark.parametrize("span_mode", ["live", "deferred"])
@pytest.mark.parametrize("run_queue", [False, True])
def test_the_attribute_is_on_stage_spans_only_when_asked(tmp_path, span_mode, run_queue):
    telemetry = ots.configure(data_dir=tmp_path, gpu="off", set_global=False, service_name="rq",
                              span_mode=span_mode, run_queue=run_queue)
    try:
        for _ in range(3):
            with ots.request():
                with ots.stage("decode"):
                    sum(range(20_000))
                with ots.stage("download"):
                    time.sleep(0.002)
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
        capture.enable_run_queue(False)
    stages = [s for s in _spans(tmp_path) if s["name"] in ("decode", "download")]
    assert len(stages) == 6 and all(semconv.THREAD_CPU_TIME_MS in s for s in stages)
    carried = [s for s in stages if semconv.THREAD_RUN_QUEUE_WAIT_MS in s]
    if not run_queue:
        assert not carried
        return
    # a preemption between the span's end time and the reading can push one past the span
    # (then it is left out): on a loaded host a rare span lacks it
    assert len(carried) >= 4
    for span in carried:
        assert 0.0 <= float(span[semconv.THREAD_RUN_QUEUE_WAIT_MS]) <= 1e3


@pytest.mark.skipif(not LINUX, reason="Linux /proc/thread-self/schedstat")
def test_a_stage_that_ends_on_another_thread_has_no_run_queue_wait():
    """The reading at the end is another thread's file (another fd): left out, as CPU time would
    be when the two clocks differ."""
    capture.enable_run_queue(True)
    try:
        state = capture.on_start()
        assert state is not None and state[5] is not None
        got: list = []
        end = time.monotonic_ns()
        thread = threading.Thread(
            target=lambda: got.append(capture.finish_fields(state, 0, 10**9)))
        thread.start()
        thread.join()
        same = capture.finish_fields(state, 0, 10**9)
    finally:
        capture.enable_run_queue(False)
    assert end
    (attributes, _), (own, _) = got[0], same
    assert semconv.THREAD_RUN_QUEUE_WAIT_MS not in attributes
    assert semconv.THREAD_RUN_QUEUE_WAIT_MS in own
    # deferred mode asks finish_fields (same attributes) whenever the run-queue reading is there
    assert capture.cpu_only_ns(state) is None


def test_off_the_state_has_no_reading_and_deferred_keeps_its_fast_path():
    state = capture.on_start()
    assert state is not None and state[5] is None
    assert capture.cpu_only_ns(state) is not None or state[1] is not None


# --- the pressure's scope -------------------------------------------------------------------------


def test_the_scope_is_cgroup_only_for_a_non_root_cgroup(tmp_path):
    host = tmp_path / "proc/pressure/cpu"
    root_cgroup = tmp_path / "sys/fs/cgroup/cpu.pressure"
    own = tmp_path / "sys/fs/cgroup/ctr/cpu.pressure"
    for path in (host, root_cgroup, own):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n")
    (own.parent / "cgroup.type").write_text("domain\n")  # only non-root cgroups have it
    assert pressure.scope_of(host, tmp_path) == "host"
    assert pressure.scope_of(root_cgroup, tmp_path) == "host"
    assert pressure.scope_of(own, tmp_path) == "cgroup"


# --- the rule -------------------------------------------------------------------------------------


def _rows(runq_share: float, cpu: float = 20.0, a: float = 70.0, base: float = 100.0,
          known: int | None = None) -> list[dict]:
    """Fixed CPU work; waiting = run-queue wait (spread ``a`` along X) + blocked time (along Y),
    the run-queue part explaining ``runq_share`` of the stage's variance; only the first
    ``known`` rows carry the run-queue wait (``None``: all)."""
    b = a * math.sqrt((1 - runq_share) / runq_share)
    rows = []
    for i, (x, y) in enumerate(zip(X, Y)):
        runq, blocked = base + a * x, base + b * y
        row = {"wall": cpu + runq + blocked, "cpu": cpu}
        if known is None or i < known:
            row["runq"] = runq
        rows.append(row)
    return rows


def _pressure(rows: list[dict], share: float, scope: str | None) -> list[MetricPoint]:
    """Pressure rising during each stage by ``share`` of its waiting (wall - cpu), ``scope`` on
    the points (``None``: no scope attribute, an older file)."""
    attributes = dict(SOME) if scope is None else {**SOME, semconv.PRESSURE_SCOPE: scope}
    points, state = [], {"total": 1.0}
    waits = [None, *(r["wall"] - r["cpu"] for r in rows)]

    def hook(i: int, start: int, end: int) -> None:
        points.append(MetricPoint(semconv.SYSTEM_CPU_PRESSURE_TOTAL, start, state["total"],
                                  attributes, RESOURCE))
        if i:
            state["total"] += share * waits[i] / 1e3
        points.append(MetricPoint(semconv.SYSTEM_CPU_PRESSURE_TOTAL, end, state["total"],
                                  attributes, RESOURCE))

    recording(rows, hook=hook)
    return points


def _diagnose(rows: list[dict], share: float | None = None, scope: str | None = "cgroup"):
    points = [] if share is None else _pressure(rows, share, scope)
    return diagnose(recording(rows, metrics=points))


@pytest.mark.parametrize("share, cause", [(0.49, "preprocess"), (0.51, "cpu_contention")])
def test_the_run_queue_part_decides_at_the_shared_threshold(share, cause):
    """MECHANISM_MIN_EXPLAINS 0.5 on the run-queue part: just below, the blocked part (0.51)
    drives the swing (not contention, the blocked advice); just above, confirmed."""
    assert mech.MECHANISM_MIN_EXPLAINS == 0.5
    report = _diagnose(_rows(share))
    sig = report.signals["decode"]
    figure = (f"{sig.runq.slow_median_ms:.1f} ms median, vs {sig.runq.fast_median_ms:.1f} ms in"
              " the faster half")
    assert sig.runq is not None and sig.runq.explains == pytest.approx(share, abs=0.005)
    assert sig.blocked is not None and sig.blocked.explains == pytest.approx(1 - share, abs=0.005)
    verdict = report.verdict
    assert (verdict.cause, verdict.stage) == (cause, "decode"), verdict.evidence
    (line,) = [e for e in verdict.evidence if e.startswith("thread CPU time")]
    assert "run-queue wait (Linux schedstat run_delay" in line
    assert figure in line  # the run-queue figure: slow vs fast medians
    if cause == "cpu_contention":
        assert "waiting in the run queue for a core (the thread's own wait, measured)" in line
        assert verdict.advice[0].startswith("give decode a core")
    else:
        assert "the slow decode runs were blocked, off the CPU and not waiting for one" in line
        assert verdict.advice[0].startswith("find what the slow decode runs wait on")
        assert any("py-spy record --gil" in a and "counts as blocked" in a for a in verdict.advice)
        assert not any("give decode a core" in a for a in verdict.advice)


def test_neither_part_driving_is_not_confirmed_and_says_both():
    rows = []
    for x, y, z in zip(X, Y, Z):
        runq, blocked, cpu = 100 + 70 * x, 100 + 70 * y, 30 + 25 * z
        rows.append({"wall": cpu + runq + blocked, "cpu": cpu, "runq": runq})
    report = _diagnose(rows)
    sig = report.signals["decode"]
    assert sig.runq.explains < 0.5 and sig.blocked.explains < 0.5
    verdict = report.verdict
    assert verdict.cause == "preprocess"
    assert any("neither the wait for a core nor the blocked time drives the swing alone" in e
               for e in verdict.evidence), verdict.evidence


def test_run_queue_wait_overrides_the_blocked_guard_and_the_pressure():
    """Tester fault 2: slow runs far below CONTENTION_MIN_SLOW_UTILIZATION of a core and CPU
    pressure low, yet the thread's own run-queue wait drives the swing: contention."""
    # 20 ms of CPU work; 5 ms in the run queue in the fast runs, 400 ms in the slow ones
    rows = [{"wall": 20 + (400 if y > 0 else 5) + 2 + x, "cpu": 20.0,
             "runq": 400 if y > 0 else 5} for x, y in zip(X, Y)]
    report = _diagnose(rows, share=0.1)  # cgroup pressure at a tenth of the waiting
    sig = report.signals["decode"]
    assert sig.slow_cpu_utilization < mech.CONTENTION_MIN_SLOW_UTILIZATION
    assert sig.pressure_of_wait == pytest.approx(0.1, abs=0.01)
    assert report.verdict.cause == "cpu_contention", report.verdict.evidence
    # without the run-queue wait the same stage is the blocked guard's
    for row in rows:
        del row["runq"]
    verdict = _diagnose(rows, share=0.1).verdict
    assert verdict.cause == "preprocess"
    assert any("most likely blocked: on a lock, I/O" in e for e in verdict.evidence)


@pytest.mark.parametrize("known, decided", [
    (4, False),   # MIN_SIGNAL_REQUESTS 5: 4 runs with run-queue wait are too few
    (11, False),  # MIN_SIGNAL_COVERAGE 0.5: 11 of 24
    (12, True),   # 12 of 24: it decides (the blocked part drives: refuted)
])
def test_run_queue_wait_on_too_few_runs_does_not_decide(known, decided):
    assert (mech.MIN_SIGNAL_REQUESTS, mech.MIN_SIGNAL_COVERAGE) == (5, 0.5)
    report = _diagnose(_rows(0.2, cpu=100.0, known=known))
    assert report.signals["decode"].runq.requests == known
    verdict = report.verdict
    if decided:
        assert verdict.cause == "preprocess"
        assert any("the slow decode runs were blocked" in e for e in verdict.evidence)
    else:  # thread CPU time alone (no pressure): the hedged contention
        assert verdict.cause == "cpu_contention"
        assert any("rests on thread CPU time alone" in e for e in verdict.evidence)


@pytest.mark.parametrize("scope", ["host", None])
@pytest.mark.parametrize("share", [0.49, 0.51])
def test_host_pressure_refutes_but_cannot_confirm(scope, share):
    """Without run-queue wait: host-scope pressure (or points without a scope: older files)
    below CONTENTION_MIN_PRESSURE_OF_WAIT refutes as before; above it, not confirmed: the
    evidence says why and the advice asks for the run-queue wait first."""
    rows = [{"wall": 20 / (0.8 if y > 0 else 0.2), "cpu": 20.0} for y in Y]
    report = _diagnose(rows, share=share, scope=scope)
    assert report.signals["decode"].pressure_scope == "host"
    verdict = report.verdict
    assert verdict.cause == "preprocess", verdict.evidence
    if share < mech.CONTENTION_MIN_PRESSURE_OF_WAIT:
        assert any("waited on something else" in e for e in verdict.evidence)
    else:
        assert any("whether for a core cannot be told: the host's CPU pressure counts every task"
                   in e and "a task anywhere on the host" in e for e in verdict.evidence)
        assert verdict.advice[0].startswith("record each stage thread's run-queue wait:"
                                            " configure(run_queue=True) or"
                                            " OTEL_STAGES_RUN_QUEUE=true")
        assert not any("give decode a core" in a for a in verdict.advice)
    # the same points marked as the cgroup's: confirmed above the threshold
    cgroup = _diagnose(rows, share=share, scope="cgroup").verdict
    assert cgroup.cause == ("cpu_contention" if share > 0.5 else "preprocess")


@pytest.mark.parametrize("share, blocked", [(0.49, True), (0.51, False)])
def test_the_blocked_guard_gives_way_when_pressure_covered_the_waiting(share, blocked):
    """Slow runs at 5 % of a core: "most likely blocked" only when the pressure (either scope)
    did not cover CONTENTION_MIN_PRESSURE_OF_WAIT of their waiting; else it cannot be told, and
    the run-queue wait is the advice."""
    rows = [{"wall": 20 / (0.9 if y > 0 else 0.05), "cpu": 20.0} for y in Y]
    verdict = _diagnose(rows, share=share, scope="host").verdict
    assert verdict.cause == "preprocess"
    said_blocked = any("most likely blocked: on a lock, I/O" in e for e in verdict.evidence)
    assert said_blocked is blocked, verdict.evidence
    if not blocked:
        assert any("cannot be told from thread CPU time and pressure" in e
                   for e in verdict.evidence)
        assert verdict.advice[0].startswith("record each stage thread's run-queue wait")


# --- recorded with the library (tests/data/traces/runqueue/README.md) -----------------------------


def _report(name: str):
    return diagnose(load_paths([RUNQ / f"{name}.otlp.jsonl"]))


def test_recorded_sleep_beside_idle_priority_loops_is_not_contention():
    """Tester fault 1: 20 ms of Pillow work + a 0-80 ms sleep beside two SCHED_IDLE busy loops.
    The host's pressure covers the waiting; the thread's own run-queue wait is nil: blocked."""
    report = _report("idle_loops")
    sig = report.signals["decode"]
    assert sig.runq is not None and sig.runq.requests == sig.requests
    assert sig.pressure_scope == "host" and (sig.pressure_of_wait or 0) >= 1.0
    assert sig.runq.slow_median_ms is not None and sig.runq.slow_median_ms < 1.0
    verdict = report.verdict
    assert (verdict.cause, verdict.stage) == ("preprocess", "decode"), verdict.evidence
    (line,) = [e for e in verdict.evidence if e.startswith("thread CPU time")]
    assert "run-queue wait (Linux schedstat run_delay" in line and "0.0 ms median" in line
    assert "the slow decode runs were blocked" in line
    assert verdict.advice[0].startswith("find what the slow decode runs wait on")


def test_recorded_hashing_threads_are_contention_from_the_run_queue():
    """Tester fault 2: twelve hashing threads beside two decode threads; the slow runs get under
    a tenth of a core (the blocked guard's ground) and the run-queue part confirms."""
    report = _report("hash_threads")
    sig = report.signals["decode"]
    assert sig.slow_cpu_utilization is not None
    assert sig.slow_cpu_utilization < mech.CONTENTION_MIN_SLOW_UTILIZATION
    assert sig.runq is not None and sig.runq.explains is not None
    assert sig.runq.explains >= mech.MECHANISM_MIN_EXPLAINS
    verdict = report.verdict
    assert (verdict.cause, verdict.stage) == ("cpu_contention", "decode"), verdict.evidence
    assert any("waiting in the run queue for a core" in e for e in verdict.evidence)
    assert verdict.advice[0].startswith("give decode a core")
    assert report.to_dict()["signals"]["decode"]["run_queue_wait"]["requests"] == sig.runq.requests


@pytest.mark.parametrize("name, said", [
    ("idle_loops_no_runq", "whether for a core cannot be told"),
    ("hash_threads_no_runq", "cannot be told from thread CPU time and pressure"),
])
def test_the_recordings_without_run_queue_wait_cannot_tell(name, said):
    """The same spans without the attribute and the host's pressure: not confirmed either way,
    and the advice is to record the run-queue wait."""
    report = _report(name)
    assert report.signals["decode"].runq is None
    verdict = report.verdict
    assert verdict.cause != "cpu_contention"
    assert any(said in e for e in verdict.evidence), verdict.evidence
    assert verdict.advice[0].startswith("record each stage thread's run-queue wait")


def test_deleting_the_run_queue_rule_changes_the_recorded_verdicts(monkeypatch):
    """Break the rule on purpose: without it, fault 1 is host-pressure contention no more (the
    scope rule holds it), but fault 2 falls to the blocked guard's "cannot be told"."""
    monkeypatch.setattr(contention, "_run_queue_check", lambda *a: None)
    assert _report("hash_threads").verdict.cause != "cpu_contention"
    assert not any("the slow decode runs were blocked" in e
                   for e in _report("idle_loops").verdict.evidence)


@pytest.mark.skipif(not LINUX, reason="Linux /proc/thread-self/schedstat")
def test_a_stage_that_awaited_on_an_event_loop_has_no_run_queue_wait():
    """On an event loop that turned during the stage (it awaited, the loop's thread ran other
    tasks), CPU time and run-queue wait are the thread's, not the stage's: both left out."""
    from otel_stages.signals import gcwatch
    from tests.test_signals import _FakeMonitor

    monitor = _FakeMonitor(turns=3)
    reading = runqueue.read()
    assert reading is not None
    state = (gcwatch.GC_LOG.seq, monitor, 3, 0, time.thread_time_ns(), reading)
    attributes, _ = capture.finish_fields(state, 0, 10**9) or ({}, [])
    assert semconv.THREAD_RUN_QUEUE_WAIT_MS in attributes  # held the loop: its own
    monitor.turns = 4
    attributes, _ = capture.finish_fields(state, 0, 10**9) or ({}, [])
    assert semconv.THREAD_CPU_TIME_MS not in attributes
    assert semconv.THREAD_RUN_QUEUE_WAIT_MS not in attributes
