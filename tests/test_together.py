"""Stages that slow together (``caveats.together_caveat``): a cause that slows the whole process
(threads holding the GIL, another process burning the CPU) read as one stage's.

A tester ran the real library's pipeline one request at a time with two Python threads holding
the GIL 0.6 s of every 1.2 s: every stage slowed in the same windows, and four runs of it got four
firm verdicts on four stages (transfer on download with network advice, preprocess on decode,
cpu_contention on resize). The part of the total's variance the stages' covariances make
(``1 - sum(alone)``) was 0.53 .. 0.71 there, against -0.08 .. 0.30 for single-stage causes.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from otel_stages.analysis import advice, load_paths
from otel_stages.analysis.caveats import TOGETHER_MIN_SHARE, together_share
from otel_stages.analysis.decision import decide
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.figures import CohortFigures, Mechanism, StageEvidence, UnaccountedFigures
from otel_stages.analysis.stats import alone_fraction, stage_stats
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports  # noqa: F401 - the chDB fixture
from tests.test_decision import figures, stage

_LINE = "the stages slow together"


# --- the measure ---------------------------------------------------------------------------------


def test_alone_is_the_variance_ratio_with_missing_stages_as_zero() -> None:
    rows = [{"a": 1.0, "b": 2.0}, {"a": 3.0}, {"a": 2.0, "b": 6.0}]
    totals = [3.0, 3.0, 8.0]
    stats = stage_stats(rows, totals)
    # b filled with 0 where it did not run: var([2, 0, 6]) / var([3, 3, 8])
    assert stats["b"].alone == pytest.approx(alone_fraction([2.0, 0.0, 6.0], totals))
    assert alone_fraction([2.0, 0.0, 6.0], totals) == pytest.approx(
        (56 / 3) / (50 / 3))  # sums of squares about the means: 18.67 / 16.67
    assert alone_fraction([1.0, 2.0], [5.0, 5.0]) == 0.0  # a constant total


def test_independent_stages_leave_no_share_together() -> None:
    r = random.Random(3)
    rows = [{"a": r.gauss(10, 2), "b": r.gauss(20, 3)} for _ in range(4000)]
    totals = [row["a"] + row["b"] for row in rows]
    stats = stage_stats(rows, totals)
    assert 1 - stats["a"].alone - stats["b"].alone == pytest.approx(0.0, abs=0.05)
    # the same stages scaled by one factor per request: they move together
    f = [r.choice([1.0, 3.0]) for _ in rows]
    moved = [{k: v * x for k, v in row.items()} for row, x in zip(rows, f, strict=True)]
    stats = stage_stats(moved, [row["a"] + row["b"] for row in moved])
    assert 1 - stats["a"].alone - stats["b"].alone > 0.4


# --- the rule's thresholds on figures ------------------------------------------------------------


def _fig(together: float, explains: float = 0.3, **extra: object):
    """A verdict on download (explains ``explains``); the stages' ``alone`` sum to ``1 -
    together`` (download's 0.2, the rest spread over the others and the untraced time)."""
    rest = (1 - together - 0.2) / 5
    stages = [stage("download", 40.0, explains=explains)]
    stages[0] = replace(stages[0], alone=0.2)
    for name in ("decode", "resize", "queue", "forward"):
        stages.append(replace(stage(name, explains=(1 - explains) / 4), alone=rest))
    gap = UnaccountedFigures(median_ms=1.0, swing_ms=0.5, share=0.01, explains=0.0, alone=rest)
    extra.setdefault("cohorts", (CohortFigures("1024x768", 30, 100.0, 120.0),))  # one known input
    return figures(*stages, total_swing=60.0, unaccounted=gap, **extra)


def test_the_share_together_is_one_minus_the_parts_alone() -> None:
    assert together_share(_fig(0.5)) == pytest.approx(0.5)
    assert together_share(figures(stage("forward", 40.0, explains=0.9), total_swing=60.0)) is None


@pytest.mark.parametrize("together, said", [
    (TOGETHER_MIN_SHARE - 0.01, False), (TOGETHER_MIN_SHARE + 0.01, True),
    (0.4 - 0.01, False), (0.4 + 0.01, True),  # literal: a changed threshold must fail
])
def test_the_rule_fires_from_the_share_together(together: float, said: bool) -> None:
    v = decide(_fig(together))
    assert v.stage == "download"
    assert v.tentative is said
    assert v.evidence[0].startswith(_LINE) is said
    assert (v.advice[0] == advice.TOGETHER) is said


@pytest.mark.parametrize("explains, said", [(0.61, False), (0.59, True)])
def test_the_share_together_must_exceed_what_the_stage_explains(explains: float, said: bool) -> None:
    v = decide(_fig(0.6, explains=explains))
    assert v.stage == "download"
    assert v.evidence[0].startswith(_LINE) is said


@pytest.mark.parametrize("stage_name", ["download", "decode"])
def test_a_stage_whose_cost_follows_size_keeps_the_verdict(stage_name: str) -> None:
    # the named stage, or another that moves with it (larger images: every stage slower)
    sized = StageEvidence(follows_size=True)
    v = decide(_fig(0.6, stage_evidence={stage_name: sized}))
    assert not any(_LINE in e for e in v.evidence)


_TWO = (CohortFigures("1024x768", 15, 100.0, 120.0), CohortFigures("4032x3024", 15, 400.0, 420.0))


@pytest.mark.parametrize("mix, said", [(0.49, True), (0.51, False)])  # INPUT_MIX_DOMINATES 0.5
def test_an_input_mix_that_dominates_moves_the_stages(mix: float, said: bool) -> None:
    # a tester's: large images make every stage slower; "each input is steady" beside "a cause
    # that slows the whole process" contradicted each other
    v = decide(_fig(0.6, cohorts=_TWO, input_mix_explains=mix))
    assert any(e.startswith(_LINE) for e in v.evidence) is said


def test_unknown_inputs_are_named_as_the_other_reading() -> None:
    v = decide(_fig(0.6, cohorts=()))  # no input size or prompt length recorded
    assert "or the inputs differ in size (none is recorded to tell)" in v.evidence[0]
    assert v.advice[:2] == [advice.SIZE_UNKNOWN, advice.TOGETHER]
    assert v.advice.count(advice.SIZE_UNKNOWN) == 1
    known = decide(_fig(0.6, cohorts=(CohortFigures("1024x768", 30, 100.0, 120.0),)))
    assert "inputs differ" not in known.evidence[0] and known.advice[0] == advice.TOGETHER


@pytest.mark.parametrize("cause, firm", [("cpu_contention", True), ("gc_pause", True),
                                         ("cpu_throttled", True), ("transfer", False)])
def test_a_process_wide_mechanism_is_backed_not_doubted(cause: str, firm: bool) -> None:
    held = StageEvidence(mechanisms=(Mechanism(cause, True, ("held",), ("free a core",)),))
    v = decide(_fig(0.6, stage_evidence={"download": held}))
    assert v.cause == cause
    assert v.tentative is not firm
    said = [e for e in v.evidence if e.startswith(_LINE)]
    assert len(said) == 1
    assert (f"{cause} slows the whole process" in said[0]) is firm
    assert (advice.TOGETHER in v.advice) is not firm


def test_no_rule_without_the_parts_alone() -> None:
    fig = _fig(0.6)
    fig = replace(fig, stages={n: replace(s, alone=None) for n, s in fig.stages.items()})
    assert not any(_LINE in e for e in decide(fig).evidence)


# --- from spans, both reports --------------------------------------------------------------------


def _process_wide(i: int, r: random.Random) -> odd_inputs.Stages:
    """A third of the requests run while the process is held: every stage about 3x slower."""
    f = 3.0 if r.random() < 0.33 else 1.0
    return [("download", (8 + 2 * r.random()) * f), ("decode", (10 + 2 * r.random()) * f),
            ("resize", (6 + 2 * r.random()) * f), ("queue", 1 + r.random()),
            ("forward", (12 + 2 * r.random()) * f)]


def _one_stage(i: int, r: random.Random) -> odd_inputs.Stages:
    """Only download slows (a slow origin for a third of the requests)."""
    slow = 60.0 if r.random() < 0.33 else 0.0
    return [("download", 8 + 2 * r.random() + slow), ("decode", 10 + 2 * r.random()),
            ("resize", 6 + 2 * r.random()), ("queue", 1 + r.random()),
            ("forward", 12 + 2 * r.random())]


def test_a_process_wide_slowdown_is_no_firm_stage_verdict(tmp_path: Path) -> None:
    path = odd_inputs.write(tmp_path / "held.jsonl", odd_inputs.run(120, _process_wide, seed=2))
    v = diagnose(load_paths([path])).verdict
    assert v.tentative
    assert v.evidence[0].startswith(_LINE)
    assert v.advice[:2] == [advice.SIZE_UNKNOWN, advice.TOGETHER]  # no input size recorded


def test_one_slow_stage_keeps_a_firm_verdict(tmp_path: Path) -> None:
    path = odd_inputs.write(tmp_path / "origin.jsonl", odd_inputs.run(120, _one_stage, seed=2))
    v = diagnose(load_paths([path])).verdict
    assert (v.cause, v.stage, v.tentative) == ("transfer", "download", False)
    assert not any(_LINE in e for e in v.evidence)


@pytest.mark.parametrize("fn", [_process_wide, _one_stage])
def test_both_reports_read_the_stages_alike(engine, tmp_path: Path, fn) -> None:  # noqa: F811
    path = odd_inputs.write(tmp_path / "run.jsonl", odd_inputs.run(120, fn, seed=2))
    got, want = reports(engine, path)
    assert got["verdict"] == want["verdict"]
    assert (_LINE in got["verdict"]["evidence"][0]) is (fn is _process_wide)


def test_the_line_prints_the_two_shares_apart() -> None:
    v = decide(_fig(0.452, explains=0.448))
    assert v.evidence[0].startswith("the stages slow together: 45.2% of")
    assert "more than download explains (44.8%;" in v.evidence[0]
