"""The demo's faults (``otel-stages demo --fault``): each makes its mechanism happen for real, the
signals on the spans show it, and the scenario files recorded from the real demo with each fault
(tests/data/traces, see DEMO_FAULTS.md there) come out with their mechanism and its evidence."""

from __future__ import annotations

import gc
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import otel_stages as ots
from otel_stages import semconv
from otel_stages._runtime import RUNTIME
from otel_stages.analysis import diagnose, load_paths
from otel_stages.cli import main
from otel_stages.demo.asyncfront import AsyncFrontEnd
from otel_stages.demo.faults import FAULTS, CpuHog, GcStorm
from otel_stages.demo.images import jpeg_photo
from otel_stages.demo.pipeline import Job
from otel_stages.demo.server import ImageServer
from otel_stages.demo.worker import InferenceWorker
from otel_stages.signals import gcwatch
from otel_stages.testing import capture_spans

CASES = Path(__file__).parent / "data" / "traces"


@pytest.fixture
def recorded():
    was = gcwatch.installed()
    gcwatch.install()
    with capture_spans(signals_on=True) as cap:
        yield cap
    if not was:
        gcwatch.uninstall()


def test_cpu_hog_threads_burn_cpu_in_bursts_and_stop():
    before = threading.active_count()
    with CpuHog(threads=2, busy_ms=40, idle_ms=40, seed=1) as hog:
        time.sleep(0.3)
        assert threading.active_count() == before + 2
    assert threading.active_count() == before
    assert 0.1 < hog.busy_fraction < 0.95  # busy, then idle, in turn


def test_gc_storm_makes_full_collections_that_land_on_stages(recorded):
    storm = GcStorm(live_objects=100_000, ring_size=5_000, every_ms=5.0)
    with storm:
        deadline = time.monotonic() + 20
        while storm.collections < 2 and time.monotonic() < deadline:
            with ots.stage("decode"):
                time.sleep(0.2)  # long enough to hold whole collections
    assert storm.collections >= 2
    assert storm._count not in gc.callbacks  # its own counter is gone with it
    spans = recorded.by_name("decode")
    hit = [s for s in spans if s.attributes.get(semconv.GC_PAUSE_MS, 0) > 0]
    assert hit, "no decode overlapped a collection"
    assert any(e.attributes[semconv.CPYTHON_GC_GENERATION] == 2
               for s in hit for e in s.events if e.name == semconv.EVENT_GC_PAUSE)


def _front_end(blocking: bool, recorded) -> dict[str, list]:
    photo = jpeg_photo((3000, 2000), seed=3)  # 6 MP: ~50 ms to decode on a quiet core
    with ImageServer({"/img/p.jpg": photo}) as server, \
            InferenceWorker(lambda px, pr: px.reshape(len(px), -1)[:, :4], max_batch=4) as worker:
        front = AsyncFrontEnd(server, worker, image_size=32, prompt_len=8, blocking=blocking)
        outcomes = front.run([Job("fixed", "/img/p.jpg", "hi")] * 6, concurrency=3)
    assert all(o.ok for o in outcomes) and all(isinstance(o.embedding, np.ndarray) for o in outcomes)
    return {name: recorded.by_name(name) for name in ("download", "decode", "resize")}


def test_blocking_front_end_holds_the_loop_in_decode(recorded):
    spans = _front_end(True, recorded)
    held = [s for s in spans["decode"] if semconv.EVENT_LOOP_HELD_MS in s.attributes]
    assert len(held) >= 4  # each decode outlasts the monitor tick (HOLD_MIN_NS, 25 ms)
    assert any(semconv.EVENT_LOOP_LAG_MS in s.attributes for s in spans["download"])
    # the awaited download yields to the loop: never a holder, however starved the machine (the
    # loop's turns are counted, not its timer: signals.loop), and its CPU time is left out
    assert not any(semconv.EVENT_LOOP_HELD_MS in s.attributes for s in spans["download"])
    assert not any(semconv.THREAD_CPU_TIME_MS in s.attributes for s in spans["download"])


def test_front_end_in_threads_leaves_the_loop_free(recorded):
    spans = _front_end(False, recorded)
    assert not any(semconv.EVENT_LOOP_HELD_MS in s.attributes
                   for name in ("decode", "resize") for s in spans[name])
    assert all(semconv.EVENT_LOOP_LAG_MS not in s.attributes for s in spans["decode"])


def test_fault_option_is_validated(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--fault", "disk-full"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--fault" in err and all(f in err for f in FAULTS)


@pytest.mark.slow
def test_demo_blocking_loop_end_to_end(tmp_path, monkeypatch, capsys):
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_STAGES_ENABLED"):
        monkeypatch.delenv(var, raising=False)
    saved = (RUNTIME.tracer, RUNTIME.enabled, RUNTIME.clock)
    try:
        code = main(["demo", "--fault", "blocking-loop", "--requests", "7", "--concurrency", "3",
                     "--data-dir", str(tmp_path), "--json"])
    finally:
        RUNTIME.tracer, RUNTIME.enabled, RUNTIME.clock = saved
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "decodes and resizes 7 12 MP photos on its event loop" in err
    report = json.loads(out)
    assert report["requests"] == 7
    decode = report["signals"]["decode"]
    assert decode["cpu"]["requests"] == 6
    spans = load_paths(list(tmp_path.glob("traces-*.jsonl"))).spans
    assert sum(semconv.EVENT_LOOP_HELD_MS in s.attributes for s in spans if s.name == "decode") >= 5


# --- the recorded scenarios ----------------------------------------------------------------------


def _report(name: str):
    return diagnose(load_paths([CASES / f"{name}.otlp.jsonl"]))


def test_recorded_cpu_hog():
    report = _report("cpu_contention")
    verdict = report.verdict
    assert verdict.cause == "cpu_contention" and not verdict.tentative
    sig = report.signals[verdict.stage]
    assert sig.slowdown_explains >= 0.5 and sig.wait.explains > sig.cpu.explains
    assert sig.slow_cpu_utilization < sig.fast_cpu_utilization  # lined up: slow runs waited
    assert any(line.startswith("thread CPU time: in the slowest quarter") for line in verdict.evidence)
    assert any("give" in a and "a core" in a for a in verdict.advice)


def test_recorded_gc_storm():
    report = _report("gc_pause")
    verdict = report.verdict
    assert verdict.cause == "gc_pause"
    gc_part = report.signals[verdict.stage].gc
    assert gc_part.explains >= 0.5 and gc_part.slow_median_ms > 10 * (gc_part.fast_median_ms or 0.1)
    assert any("gc.freeze()" in a for a in verdict.advice)


def test_recorded_blocking_loop():
    report = _report("event_loop_blocked")
    verdict = report.verdict
    assert (verdict.cause, verdict.stage) == ("event_loop_blocked", "download")
    held = next(line for line in verdict.evidence if line.startswith("held the event loop"))
    assert held.split(": ", 1)[1].startswith("decode ")  # decode held it most
    assert verdict.advice[0].startswith("move decode off the event loop")


def test_recorded_plain_demo_one_at_a_time_names_no_mechanism():
    report = _report("demo_sequential")
    assert (report.verdict.cause, report.verdict.stage) == ("preprocess", "decode")
    assert report.signals["decode"].confirmed is None
