"""Clocks that do not line up, the file report and the ClickHouse report alike.

1. Stage spans recorded on a clock behind the request's (a GPU worker on another host, its clock
   200 ms behind the gateway's: a tester's input, read as a confident ``forward`` on a forward
   clipped to a median of 0 ms): when the p95 (:data:`~otel_stages.analysis.caveats.BEFORE_PERCENTILE`)
   over the warm requests of the time a standard stage span starts before its request reaches the
   noise band, the verdict is tentative, the reason first in the evidence and the advice
   (:func:`~otel_stages.analysis.caveats.before_caveat`), as for a clock ahead (test_outlived.py).
2. GPU readings stamped on a clock 2 s off the spans' (a tester's input: a GPU 95 % busy in every
   forward and 2 % between read as a confident ``gpu_starved``): a model GPU less busy during the
   forwards than between them (:func:`~otel_stages.analysis.gpu.falls`) gives no busy or starved
   call; the evidence says the readings do not line up, the advice is to check the sampler's clock,
   and the verdict is tentative. A GPU low during the forwards and as low between them is still
   starved.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import advice, gpu
from otel_stages.analysis.caveats import BEFORE_PERCENTILE, before_caveat, misaligned_gpu_caveat
from otel_stages.analysis.decision import decide
from otel_stages.analysis.gpu import (
    LEVEL_LOW,
    LEVEL_THIN,
    MIN_MISALIGNED_FALL,
    MIN_MISALIGNED_READINGS,
    MIN_RISE_STANDARD_ERRORS,
    GpuEvidence,
    evidence_of,
)
from otel_stages.analysis.model import Span
from otel_stages.analysis.requests import _build
from otel_stages.analysis.span_issues import StageIssues
from otel_stages.analysis.verdict import Verdict
from tests.test_clickhouse_issues import (
    MS,
    STABLE,
    Spans,
    _gpu_sender,
    _host_run,
    _span_range,
    _two_slow_in_six,
    _utilization_line,
    edited,
    engine,
    named,
    reports,
    shift,
)
from tests.test_decision import figures, stage
from tests.test_gpu_choice import _forwards

__all__ = ["engine"]  # the module's chDB fixture


# --- 1. stage spans before their request span (a clock behind) ------------------------------------


def _span(name: str, start_ms: float, end_ms: float, span_id: str) -> Span:
    return Span(trace_id="t1", span_id=span_id, parent_span_id="r", name=name,
                start_ns=round(start_ms * MS), end_ns=round(end_ms * MS))


def test_before_ms_is_the_most_a_standard_stage_span_starts_before_its_request() -> None:
    request = Span(trace_id="t1", span_id="r", parent_span_id=None, name="request",
                   start_ns=1000 * MS, end_ns=1300 * MS)
    leaves = [_span("queue", 900, 910, "a"),       # wholly before: 100 ms
              _span("forward", 960, 1200, "b"),    # partly before: 40 ms
              _span("auth", 700, 720, "c")]        # a custom stage: work before the request
    r = _build(request, leaves, [], StageIssues())
    assert r.before_ms == pytest.approx(100.0)
    assert r.stages_ms["queue"] == 0.0 and r.stages_ms["forward"] == pytest.approx(200.0)
    inside = _build(request, [_span("forward", 1000, 1200, "b")], [], StageIssues())
    assert inside.before_ms == 0.0


@pytest.mark.parametrize(("before", "p95_ms", "caveat"), [
    (5, 3.0, True),      # the p95 at the band
    (5, 2.999, False),   # under the band: a skew too small to hide a swing
    (0, 3.0, False),     # none starts before (a p95 without them is no reading)
    (100, 166.0, True),  # the tester's 200 ms behind
])
def test_stage_spans_before_their_request_make_the_verdict_tentative(
        before: int, p95_ms: float, caveat: bool) -> None:
    assert BEFORE_PERCENTILE == 95
    fig = replace(figures(stage("forward", 40.0, explains=0.9), total_swing=40.0, n=100),
                  before_requests=before, before_p95_ms=p95_ms)
    v = Verdict("forward", "forward", ["forward swings"], ["fix forward"])
    before_caveat(v, fig, band_ms=3.0)
    assert v.tentative is caveat
    assert (v.advice[0] == advice.SYNC_CLOCKS_BEHIND) is caveat
    assert ("starts before the request span" in v.evidence[0]) is caveat
    if caveat:
        assert v.evidence[0].startswith(f"in {before} of 100 warm requests a stage span starts before")
        assert "clipped" in v.evidence[0] and "clock is behind" in v.evidence[0]


def test_the_rules_apply_the_before_caveat() -> None:
    """Through :func:`decide`: a confident forward verdict becomes tentative, the reason first."""
    fig = replace(figures(stage("forward", 400.0, explains=0.95), total_swing=400.0),
                  before_requests=30, before_p95_ms=166.0)
    v = decide(fig)
    assert v.cause == "forward" and v.tentative
    assert v.advice[0] == advice.SYNC_CLOCKS_BEHIND
    assert "starts before the request span" in v.evidence[0]
    assert decide(replace(fig, before_requests=0, before_p95_ms=None)).tentative is False


def _behind(count: int, skew_ms: float) -> Callable[[int, Spans], None]:
    """In the first ``count`` of every 30 requests queue and forward are recorded on a clock
    ``skew_ms`` behind the request's (the tester's gateway + GPU worker layout)."""
    def edit(i: int, spans: Spans) -> None:
        if i % 30 >= count:
            return
        for name in ("queue", "forward"):
            shift(named(spans, name), -round(skew_ms * MS))
    return edit


@pytest.mark.parametrize(("count", "caveat"), [(30, True), (3, True), (2, False)])  # 29 warm: 2 or 1
def test_a_worker_clock_behind_reads_alike_in_both_reports(engine, tmp_path: Path, count: int,
                                                           caveat: bool) -> None:
    got, want = reports(engine, edited(STABLE, tmp_path / f"behind{count}.jsonl", _behind(count, 200.0)))
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    assert v["tentative"] is caveat, v
    assert (v["advice"][0] == advice.SYNC_CLOCKS_BEHIND) is caveat
    if caveat:
        warm = count - 1  # the first request is cold
        assert v["evidence"][0].startswith(f"in {warm} of 29 warm requests a stage span starts before"), v


def test_a_clock_behind_by_less_than_the_band_is_no_caveat(engine, tmp_path: Path) -> None:
    """Every request's queue and forward 1 ms early: named in the problems, too short to hide a
    swing the verdict could see."""
    got, want = reports(engine, edited(STABLE, tmp_path / "early.jsonl", _behind(30, 1.0)))
    assert got["verdict"] == want["verdict"] and not want["verdict"]["tentative"]
    assert want["noise"]["band_ms"] > 1.0


def _auth_before(i: int, spans: Spans) -> None:
    """A custom ``auth`` span from 60 ms to 20 ms before the request span starts."""
    start = int(named(spans, "request")["startTimeUnixNano"])
    spans.append({**named(spans, "download"), "spanId": f"{i:08x}0000a0a0", "name": "auth",
                  "startTimeUnixNano": str(start - 60 * MS), "endTimeUnixNano": str(start - 20 * MS)})


def test_a_custom_stage_before_the_request_is_work_before_it(engine, tmp_path: Path) -> None:
    got, want = reports(engine, edited(STABLE, tmp_path / "auth.jsonl", _auth_before))
    assert got["verdict"] == want["verdict"]
    assert not want["verdict"]["tentative"]
    assert advice.SYNC_CLOCKS_BEHIND not in want["verdict"]["advice"]


# --- 2. GPU readings that do not line up with the forwards --------------------------------------


#: Where 8 readings between the forwards, 0.5 and ``low`` alternating, over 5 at 0 inside them,
#: fall by exactly MIN_RISE_STANDARD_ERRORS (3) standard errors: the fall is the mean between,
#: (0.5 + low) / 2, its standard error (0.5 - low) / 2 / sqrt(8).
_K = 3.0 / 8 ** 0.5
_LOW_AT_3_SE = 0.5 * (_K - 1) / (_K + 1)


@pytest.mark.parametrize("low, falls", [(_LOW_AT_3_SE + 1e-6, True), (_LOW_AT_3_SE - 1e-6, False)])
def test_a_fall_of_three_standard_errors(low: float, falls: bool) -> None:
    assert MIN_RISE_STANDARD_ERRORS == 3.0
    samples = [(t, 0.0) for t in range(0, 50, 10)] + [
        (100 + 10 * i, 0.5 if i % 2 == 0 else low) for i in range(8)]
    aligned = gpu._align("0", samples, [(0, 50)], None)
    assert gpu.falls(aligned) is falls
    assert not gpu.rises(aligned)


@pytest.mark.parametrize("during, between, falls", [
    (10, 5, True), (10, 4, False),   # MIN_MISALIGNED_READINGS between the forwards
    (5, 10, True), (4, 10, False),   # ... and during them
])
def test_a_fall_needs_readings_on_both_sides(during: int, between: int, falls: bool) -> None:
    # a tester's: one reading between the forwards (its variance 0: no standard error) made a
    # 3-standard-error fall by itself; 0.1 during and 0.9 between, no spread at all
    assert MIN_MISALIGNED_READINGS == 5
    samples = [(t, 0.1) for t in range(during)] + [(100 + t, 0.9) for t in range(between)]
    aligned = gpu._align("0", samples, [(0, 50)], None)
    assert (aligned.samples, aligned.between) == (during, between)
    assert gpu.falls(aligned) is falls


def test_readings_inside_another_forward_are_not_between_the_warm_ones() -> None:
    # the cold request's forward (aside) holds 6 busy readings, the warm forwards 10 at 0.72:
    # nothing was read between the forwards, so nothing falls; counted as between, 18 points
    samples = [(t, 0.72) for t in range(10)] + [(200 + t, 0.9) for t in range(6)]
    inside = gpu._align("0", samples, [(0, 50)], None, aside=[(150, 300)])
    assert inside.between == 0 and not gpu.falls(inside)
    assert gpu.falls(gpu._align("0", samples, [(0, 50)], None))  # as it was read before
    # readings between the forwards as well: only those are compared
    more = samples + [(400 + t, 0.73) for t in range(5)]
    assert not gpu.falls(gpu._align("0", more, [(0, 50)], None, aside=[(150, 300)]))


@pytest.mark.parametrize("outside, falls", [
    (0.15, True),      # 5 points more between the forwards: MIN_MISALIGNED_FALL
    (0.1499, False),   # just under it
    (0.02, False),     # a starved GPU: low during, lower between (a rise)
])
def test_the_least_fall_that_says_the_readings_do_not_line_up(outside: float, falls: bool) -> None:
    assert MIN_MISALIGNED_FALL == 0.05
    samples = [(t, 0.1 if t < 50 else outside) for t in range(0, 100, 5)]
    assert gpu.falls(gpu._align("0", samples, [(0, 49)], None)) is falls


def test_misaligned_readings_give_no_level() -> None:
    ev = evidence_of(source="metrics", forwards=30, covered=30, samples=300, total=60.0, split=None,
                     slow_min_ms=None, misaligned_processes=1, misaligned_means=(0.2, 0.34))
    assert ev.level == LEVEL_THIN
    assert "do not line up" in ev.describe() and "20% mean during, 34% between" in ev.describe()
    assert evidence_of(source="metrics", forwards=30, covered=30, samples=300, total=60.0,
                       split=None, slow_min_ms=None).level == LEVEL_LOW


def test_the_rules_make_a_misaligned_forward_tentative() -> None:
    """Through :func:`decide`: forward (no busy / starved call), tentative, the GPU line and the
    clock advice first; without the flag the same readings say gpu_starved."""
    misaligned = GpuEvidence(level=LEVEL_THIN, mean_utilization=0.2, samples=300, forwards=30,
                             forwards_covered=30, source="metrics", misaligned_processes=1,
                             misaligned_means=(0.2, 0.34))
    fig = figures(stage("forward", 400.0, explains=0.95), total_swing=400.0, gpu=misaligned)
    v = decide(fig)
    assert v.cause == "forward" and v.tentative
    assert "do not line up" in v.evidence[0]
    assert v.advice[0] == advice.GPU_MISALIGNED
    assert not any("too few GPU samples" in a for a in v.advice)
    plain = replace(misaligned, level=LEVEL_LOW, misaligned_processes=0, misaligned_means=None)
    assert decide(replace(fig, gpu=plain)).cause == "gpu_starved"


def test_the_caveat_leaves_other_stages_alone() -> None:
    misaligned = GpuEvidence(level=LEVEL_THIN, samples=300, forwards=30, forwards_covered=30,
                             source="metrics", misaligned_processes=2)
    fig = figures(stage("forward"), total_swing=40.0, gpu=misaligned)
    v = Verdict("preprocess", "decode", ["decode swings"], ["fix decode"])
    misaligned_gpu_caveat(v, fig)
    assert not v.tentative and v.advice == ["fix decode"]


def _sampled(engine: Any, path: Path, level: Callable[[bool], float], offset_ms: float) -> dict[str, Any]:
    """30 requests on node-a (every seventh forward slow) and a node exporter reading one GPU
    every 20 ms, ``level(inside a forward)`` at the true time, stamped ``offset_ms`` early (the
    tester's sampler on a clock behind); the file report after checking the ClickHouse one."""
    _, first, last = _host_run(path, "i1", "node-a")
    warm = _forwards(path)[1:]  # the first request is the process's cold one
    off = round(offset_ms * MS)
    _gpu_sender(path, [("service.name", "dcgm"), ("host.name", "node-a")], "0",
                range(first - 2000 * MS, last + 2000 * MS, 20 * MS),
                lambda t: level(any(s <= t + off <= e for s, e in warm)))
    got, want = reports(engine, path)
    assert got["verdict"] == want["verdict"]
    assert got["gpu"] == want["gpu"]
    return want


def _busy(inside: bool) -> float:
    return 0.95 if inside else 0.02


def test_a_busy_gpu_read_two_seconds_off_is_no_starved_gpu(engine, tmp_path: Path) -> None:
    want = _sampled(engine, tmp_path / "skew.jsonl", _busy, 2000.0)
    v = want["verdict"]
    assert v["cause"] == "forward" and v["tentative"], v
    assert want["gpu"]["level"] == "thin" and want["gpu"]["misaligned_processes"] == 1
    assert "do not line up with the forward spans" in v["evidence"][0]
    assert v["advice"][0] == advice.GPU_MISALIGNED
    assert not any("pinned memory" in a for a in v["advice"])


def test_the_same_gpu_on_time_is_busy(engine, tmp_path: Path) -> None:
    want = _sampled(engine, tmp_path / "on_time.jsonl", _busy, 0.0)
    assert want["verdict"]["cause"] == "gpu_busy" and not want["verdict"]["tentative"]
    assert want["gpu"]["misaligned_processes"] == 0


@pytest.mark.parametrize("between, cause", [
    (0.02, "gpu_starved"),   # starved: low during the forwards, idle between
    (0.12, "gpu_starved"),   # as low between: no fall
    (0.1499, "gpu_starved"),  # just under MIN_MISALIGNED_FALL
    (0.15, "forward"),       # at it: the readings do not line up
])
def test_a_starved_gpu_stays_starved(engine, tmp_path: Path, between: float, cause: str) -> None:
    want = _sampled(engine, tmp_path / f"starved_{between}.jsonl", lambda inside: 0.10 if inside else between, 0.0)
    assert want["verdict"]["cause"] == cause
    assert (want["gpu"]["misaligned_processes"] == 1) is (cause == "forward")


def _cohorts_read_off(path: Path, offset_ms: float) -> Path:
    """Two inputs in one process (60 requests, two slow forwards in every six), the GPU 95 %
    busy in every forward and 2 % between, its readings stamped ``offset_ms`` early. Each cohort
    against the other's forwards would fall by the other's load; the whole window's fall is what
    it reads (``gpu.misaligned_processes``)."""
    from tests import odd_inputs

    r, gaps = random.Random(1), random.Random(7)
    t, rows = odd_inputs.BASE_NS, []
    for i in range(60):  # gaps of 150-400 ms, as the tester's: readings 2 s off miss the forwards
        spans, end = odd_inputs.request(r, t, _two_slow_in_six(i, r), i + 1)
        rows.append(spans)
        t = end + round(gaps.uniform(150, 400) * MS)
    for i, spans in enumerate(rows):
        size = (640, 480) if i % 2 == 0 else (1280, 960)
        for s in spans:
            if s["name"] == "decode":
                s["attributes"] += [odd_inputs._attr("image.width", size[0]),
                                    odd_inputs._attr("image.height", size[1])]
    windows = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))
               for spans in rows for s in spans if s["name"] == "forward"]
    odd_inputs.write(path, rows)
    first, last = _span_range(rows)
    off = round(offset_ms * MS)
    points = [{"timeUnixNano": str(t), "attributes": [odd_inputs._attr("hw.id", "GPU-0")],
               "asDouble": 0.95 if any(s <= t + off <= e for s, e in windows) else 0.02}
              for t in range(first - 2000 * MS, last + 2000 * MS, 20 * MS)]
    with path.open("a") as f:
        f.write(_utilization_line(points) + "\n")
    return path


@pytest.mark.parametrize("offset_ms, cause", [
    (250.0, "forward"),   # these gaps put the readings' busy times between the forwards
    (0.0, "gpu_busy"),
])
def test_each_cohort_reads_the_whole_windows_misalignment(engine, tmp_path: Path, offset_ms: float,
                                                          cause: str) -> None:
    got, want = reports(engine, _cohorts_read_off(tmp_path / f"cohorts_{offset_ms}.jsonl", offset_ms))
    assert got["verdict"] == want["verdict"]
    assert {c["key"]: c["verdict"] for c in got["cohorts"]} == {
        c["key"]: c["verdict"] for c in want["cohorts"]}
    assert want["verdict"]["cause"] == cause
    verdicts = [c["verdict"] for c in want["cohorts"]]
    assert len(verdicts) == 2
    assert all(v["cause"] == cause and v["tentative"] is (cause == "forward") for v in verdicts), verdicts


def _read_in_forwards(engine: Any, path: Path, cold_readings: int, between: int) -> dict[str, Any]:
    """30 requests on node-a (every seventh forward slow), the process's own GPU read 3 times in
    every warm forward at 0.72, ``cold_readings`` times in the cold request's forward at 0.9 and
    ``between`` times at 0.9 between warm forwards (one gap each), nowhere else (the tester's
    sampler); the file report after checking the ClickHouse one."""
    from tests import odd_inputs

    _host_run(path, "i1", "node-a")
    cold, *warm = _forwards(path)
    points = [(s + (e - s) * k // 4, 0.72) for s, e in warm for k in (1, 2, 3)]
    points += [(cold[0] + (cold[1] - cold[0]) * (k + 1) // (cold_readings + 1), 0.9)
               for k in range(cold_readings)]
    points += [((a[1] + b[0]) // 2, 0.9) for a, b in itertools.pairwise(warm[:between + 1])]
    resource = [odd_inputs._attr("service.name", "svc"), odd_inputs._attr("service.instance.id", "i1"),
                odd_inputs._attr("host.name", "node-a")]
    with path.open("a") as f:
        f.write(_utilization_line([{"timeUnixNano": str(t), "asDouble": v,
                                    "attributes": [odd_inputs._attr("hw.id", "GPU-0")]}
                                   for t, v in sorted(points)], resource=resource) + "\n")
    got, want = reports(engine, path)
    assert got["verdict"] == want["verdict"]
    assert got["gpu"] == want["gpu"]
    return want


@pytest.mark.parametrize("cold_readings, between, misaligned", [
    (1, 0, False),   # the tester's: one 0.9 reading, in the cold request's forward
    (6, 0, False),   # however many: inside a forward, not between the warm ones
    (0, 4, False),   # between the warm forwards, one short of MIN_MISALIGNED_READINGS
    (0, 5, True),    # at it: 18 points less busy during the forwards than between them
])
def test_a_reading_outside_the_warm_forwards_is_no_misalignment(
        engine, tmp_path: Path, cold_readings: int, between: int, misaligned: bool) -> None:
    want = _read_in_forwards(engine, tmp_path / f"in_{cold_readings}_{between}.jsonl",
                             cold_readings, between)
    assert want["gpu"]["misaligned_processes"] == int(misaligned)
    said = any("do not line up" in e for e in want["verdict"]["evidence"])
    assert said is misaligned, want["verdict"]["evidence"]
    if misaligned:
        assert "72% mean during, 90% between" in want["verdict"]["evidence"][0]
