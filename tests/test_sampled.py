"""A sampled recording read as if every request were in it (tester A F5: otel-stages' own sampler
at ratio 0.1 kept every slow, failed and cold request and a tenth of the rest; both reports said
"request total median 1114 ms" of a service whose median request took 170 ms, and nothing said
the data was sampled). The ``request.seq`` gaps make the verdict tentative, the reason first and
the advice leading with unbiased figures; each threshold pinned on both sides, restarts and a
window starting mid-process read as no gap, and the file and ClickHouse reports agree."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from otel_stages import semconv
from otel_stages.analysis import advice, load_paths
from otel_stages.analysis.decision import decide
from otel_stages.analysis.requests import find_requests
from otel_stages.analysis.sampled import (
    SAMPLED_MIN_MISSING_FRACTION,
    SAMPLED_MIN_MISSING_REQUESTS,
    SEQ_RESTART_MIN_DROP,
    UNBIASED_MIN_REQUESTS,
    SeqCoverage,
    is_sampled,
    seq_coverage,
    seq_runs,
)
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports
from tests.test_decision import figures, stage

__all__ = ["engine"]  # the module's chDB fixture

SAMPLED = "the recording is sampled: "


def test_thresholds_are_what_the_docs_say() -> None:
    assert (SAMPLED_MIN_MISSING_FRACTION, SAMPLED_MIN_MISSING_REQUESTS, SEQ_RESTART_MIN_DROP,
            UNBIASED_MIN_REQUESTS) == (0.2, 5, 16, 5)


@pytest.mark.parametrize(("kept", "numbered", "sampled"), [
    (80, 100, True),    # 20 of 100 missing: the share at the threshold
    (81, 100, False),   # 19 of 100: under it (lost spans, requests still running at the end)
    (15, 20, True),     # 5 missing (25 %): the count at its floor
    (16, 20, False),    # 4 missing (20 %): the share is reached, the count not
    (130, 600, True),   # the tester's
    (0, 0, False),      # no request.seq: nothing to read
])
def test_seq_gaps_on_both_sides_of_each_threshold(kept: int, numbered: int, sampled: bool) -> None:
    assert is_sampled(SeqCoverage(kept, numbered)) is sampled


def _rows(seqs: list[int], proc: str = "p") -> list[tuple[str, int, str, int]]:
    return [(proc, i * 1000, f"t{i}", seq) for i, seq in enumerate(seqs)]


def test_a_restart_that_kept_the_instance_id_is_no_gap() -> None:
    # the window starts mid-process (seq 30..60), the process restarts with the same id (1..10):
    # read as one range 1..60 it would miss 19 numbers (32 %)
    before, after = list(range(30, 61)), list(range(1, 11))
    assert seq_runs(_rows(before + after)) == (41, 41)
    assert not is_sampled(SeqCoverage(*seq_runs(_rows(before + after))))
    # two processes are two ranges whatever their numbers
    assert seq_runs(_rows(before, "a") + _rows(after, "b")) == (41, 41)


@pytest.mark.parametrize(("drop", "runs"), [(SEQ_RESTART_MIN_DROP, (31, 31)),
                                            (SEQ_RESTART_MIN_DROP - 1, (24, 24))])
def test_a_drop_starts_a_new_run_at_the_threshold_not_below(drop: int, runs: tuple[int, int]) -> None:
    first = list(range(17, 41))  # 24 numbers
    second = list(range(40 - drop, 40 - drop + 7))  # 7 numbers, overlapping the first run's
    assert seq_runs(_rows(first + second)) == runs


def test_concurrent_requests_numbered_out_of_start_order_are_no_restart() -> None:
    seqs = [1, 2, 4, 3, 5, 7, 6, 8]
    assert seq_runs(_rows(seqs)) == (8, 8)
    assert seq_runs(_rows(list(range(301, 401)))) == (100, 100)  # a window starting mid-process


def test_the_caveat_is_first_and_the_verdict_tentative() -> None:
    fig = figures(stage("forward", 40.0, explains=0.9), total_swing=40.0)
    plain = decide(fig)
    assert plain.cause == "forward" and not plain.tentative
    assert decide(replace(fig, sampling=SeqCoverage(100, 100))) == plain  # every number read
    v = decide(replace(fig, sampling=SeqCoverage(130, 600)))
    assert v.cause == plain.cause and v.tentative
    assert v.evidence[0].startswith(f"{SAMPLED}130 of the 600 requests numbered by request.seq were"
                                    " kept (78% missing)"), v.evidence
    assert v.evidence[1:] == plain.evidence
    assert v.advice[0] == advice.SAMPLED and v.advice[1:] == plain.advice
    said = decide(replace(fig, sampling=SeqCoverage(130, 600, {"ratio": 47, "slow": 82, "cold": 1})))
    assert "47 kept at the head by the ratio" in said.evidence[0]
    assert "(cold 1, slow 82)" in said.evidence[0]


@pytest.mark.parametrize(("head_warm", "said"), [(5, True), (4, False)])
def test_the_ratios_own_median_from_five_warm_requests(head_warm: int, said: bool) -> None:
    fig = figures(stage("forward", 40.0, explains=0.9), total_swing=40.0)
    coverage = SeqCoverage(130, 600, {"ratio": 47, "slow": 83}, head_warm, 170.25)
    first = decide(replace(fig, sampling=coverage)).evidence[0]
    assert (f"the {head_warm} warm requests kept by the ratio have a median total of 170.2 ms,"
            " against 100.0 ms over every warm request read" in first) is said, first


def test_a_steady_or_cold_start_verdict_is_hedged_too() -> None:
    # the cold-start ratio is against a median the sampler pushed up
    fig = figures(stage("forward", 1.0), total_swing=1.0, sampling=SeqCoverage(40, 300))
    v = decide(fig)
    assert v.cause == "stable" and v.tentative and v.evidence[0].startswith(SAMPLED)


# --- recordings -----------------------------------------------------------------------------


def _service(path: Path, *, n: int = 300, ratio: float = 0.1, slow_ms: float = 1000.0,
             restart_at: int | None = None, first: int = 0, seed: int = 19,
             attributes: bool = True) -> tuple[Path, int, int]:
    """The tester's service as otel-stages' own sampler exports it: 15 % of forwards 1100 ms, the
    rest 150 ms, the first request 2.4 s; kept: the cold one, those of ``slow_ms`` or more and
    ``ratio`` of the rest, each saying why (``attributes``). ``restart_at``: the process restarts
    (same instance id, seq from 1) at that request; ``first``: the window starts at that request.
    Returns the path, the requests kept and the numbers in the kept runs' ranges."""
    r = random.Random(seed)
    rows, t, seqs = [], odd_inputs.BASE_NS, []
    seq = 0
    for i in range(n):
        seq = 1 if i in (0, restart_at) else seq + 1
        cold = seq == 1
        slow = not cold and r.random() < 0.15
        forward = (1100 if slow else 150) + r.gauss(0, 5) + (2250 if cold else 0)
        stages = [("download", 6 + r.random()), ("decode", 9 + r.random()), ("resize", 3.0),
                  ("queue", 1.0), ("forward", forward)]
        total = sum(ms for _, ms in stages)
        head = r.random() < ratio
        why = (semconv.KEPT_COLD if cold else semconv.KEPT_RATIO if head
               else semconv.KEPT_SLOW if total >= slow_ms else "")
        spans, end = odd_inputs.request(r, t, stages, seq, req_attrs={
            "request.cold_start": cold,
            **({semconv.SAMPLING_KEPT: why, semconv.SAMPLING_RATIO: ratio} if attributes else {})})
        if why and i >= first:
            rows.append(spans)
            seqs.append(seq)
        t = end + 40 * 10**6
    kept, numbered = seq_runs(_rows(seqs))
    return odd_inputs.write(path, rows), kept, numbered


def test_the_reports_agree_on_the_testers_recording(engine, tmp_path: Path) -> None:
    path, kept, numbered = _service(tmp_path / "own_sampler.jsonl")
    assert numbered == 300 and kept < 100  # the shape: most numbers missing
    got, want = reports(engine, path)
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    assert v["tentative"] and v["cause"] in ("forward", "gpu_busy", "gpu_starved")
    assert v["evidence"][0].startswith(f"{SAMPLED}{kept} of the {numbered} requests"), v["evidence"]
    by = seq_coverage(find_requests(load_paths([path]).spans)).kept_by
    assert by[semconv.KEPT_COLD] == 1 and by[semconv.KEPT_SLOW] > by[semconv.KEPT_RATIO] > 0
    assert f"{by[semconv.KEPT_RATIO]} kept at the head by the ratio" in v["evidence"][0]
    # the unbiased median: the service's typical request (about 170 ms), not the slow mode
    unbiased = seq_coverage(find_requests(load_paths([path]).spans), [
        r for r in find_requests(load_paths([path]).spans) if not r.cold and not r.error])
    assert unbiased.unbiased_median_ms is not None and 160 < unbiased.unbiased_median_ms < 185
    assert f"kept by the ratio have a median total of {unbiased.unbiased_median_ms:.1f} ms" in v["evidence"][0]
    assert want["total"]["median_ms"] > 1000  # what every warm request read says
    sampling = want["sampling"]
    assert {k: v for k, v in got["sampling"].items() if k != "unbiased_median_ms"} == {
        k: v for k, v in sampling.items() if k != "unbiased_median_ms"}
    assert got["sampling"]["unbiased_median_ms"] == pytest.approx(sampling["unbiased_median_ms"], abs=1e-3)
    assert sampling == {"kept": kept, "numbered": numbered, "missing": numbered - kept, "sampled": True,
                        "kept_by": dict(sorted(by.items())), "unbiased_warm": unbiased.unbiased_warm,
                        "unbiased_median_ms": round(unbiased.unbiased_median_ms, 3)}
    assert v["advice"][0] == advice.SAMPLED


def test_a_restart_in_a_window_started_mid_process_is_read_alike_as_no_sample(
        engine, tmp_path: Path) -> None:
    # every request kept; the window starts at request 101, the process restarts at 151 (seq 1
    # again): read as one range 1..150, 50 of 150 numbers would be missing
    path, kept, numbered = _service(tmp_path / "restart.jsonl", n=200, ratio=1.0, restart_at=150,
                                    first=100, attributes=False)
    assert (kept, numbered) == (100, 100)
    got, want = reports(engine, path)
    assert got["verdict"] == want["verdict"]
    assert got["sampling"] == want["sampling"] == {
        "kept": 100, "numbered": 100, "missing": 0, "sampled": False, "kept_by": {},
        "unbiased_warm": 0, "unbiased_median_ms": None}
    assert not any(e.startswith(SAMPLED) for e in want["verdict"]["evidence"])


def test_a_collectors_tail_sampling_without_the_attribute_is_read_from_the_gaps(
        engine, tmp_path: Path) -> None:
    path, kept, numbered = _service(tmp_path / "tail.jsonl", n=200, attributes=False, seed=4)
    got, want = reports(engine, path)
    assert got["verdict"] == want["verdict"]
    assert got["sampling"] == want["sampling"] and want["sampling"]["kept_by"] == {}
    first = want["verdict"]["evidence"][0]
    assert first.startswith(f"{SAMPLED}{kept} of the {numbered} requests") and "the sampler says" not in first


def test_the_cli_keeps_the_samplers_attribute(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # otel-stages report loads only the attributes the analysis reads (selection.py)
    import json

    from otel_stages.cli import main

    path, kept, numbered = _service(tmp_path / "own_sampler.jsonl")
    assert main(["report", str(path), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["verdict"]["evidence"][0]
    assert first.startswith(f"{SAMPLED}{kept} of the {numbered} requests")
    assert "kept at the head by the ratio" in first and "warm requests kept by the ratio have" in first


@pytest.mark.parametrize(("shared", "one"), [(9, True), (10, False)])
def test_one_counter_shared_by_the_processes_is_no_sample(shared: int, one: bool) -> None:
    # a gateway numbering requests across two replicas: each sees every other number (the
    # services caveat's test data read as "91% missing"); per-process counters all start at 1
    from otel_stages.analysis.sampled import SHARED_SEQ_MAX_SHARE, seq_runs, shared_counter

    assert SHARED_SEQ_MAX_SHARE == 0.1
    rows = [(f"p{n % 2}", n, f"t{n}", n) for n in range(1, 101)]  # 100 numbers, 2 owners
    # ``shared`` of them seen in the other process too (9 of 100: under a tenth)
    rows += [(f"p{(n + 1) % 2}", 1000 + n, f"u{n}", n) for n in range(1, shared + 1)]
    assert shared_counter(rows) is one
    kept, numbered = seq_runs(rows)
    assert (kept == numbered) is one  # per process: each sees about every other number
    assert not shared_counter(_rows(list(range(1, 50))) + _rows(list(range(1, 50)), "q"))


def test_a_counter_shared_by_two_services_reads_alike_in_both_reports(engine, tmp_path: Path) -> None:
    from tests.test_services_caveat import two_services

    got, want = reports(engine, two_services(tmp_path / "two.jsonl", 30))
    assert got["sampling"] == want["sampling"]
    assert want["sampling"]["sampled"] is False and want["sampling"]["missing"] == 0
