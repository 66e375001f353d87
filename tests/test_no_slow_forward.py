"""A GPU verdict with no slow forward (a third tester's healthy fleet: three workers, lognormal
jitter, the total 0.3 ms past the noise band, the GPU 90-95 % busy in every forward: a firm
``gpu_busy``, "the GPU is saturated: add GPU capacity", while the same report said no forward was
slow). Judged on all forwards because none stands out, the GPU's level is how the model runs, not
why requests swing: tentative, said first. ``tests/data/traces/healthy_fleet.otlp.jsonl`` is that
tester's generated recording (seed 1: 300 requests of three gunicorn-like workers on one host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_stages.analysis.decision import NO_SLOW_FORWARD, decide
from otel_stages.analysis.gpu import JUDGED_ALL, JUDGED_SLOW, GpuEvidence
from tests.test_clickhouse_issues import engine, reports  # noqa: F401
from tests.test_decision import figures, stage

TRACE = Path(__file__).parent / "data" / "traces" / "healthy_fleet.otlp.jsonl"


def _gpu(level: str, slow_forwards: int, judged_on: str = JUDGED_ALL,
         slow_min_ms: float | None = 120.0) -> GpuEvidence:
    return GpuEvidence(level=level, mean_utilization=0.93 if level == "high" else 0.1, samples=150,
                       forwards=100, forwards_covered=100, source="metrics", slow_min_ms=slow_min_ms,
                       slow_forwards=slow_forwards, slow_covered=slow_forwards,
                       slow_samples=3 * slow_forwards, judged_on=judged_on,
                       slow_mean_utilization=(0.93 if level == "high" else 0.1) if slow_forwards else None)


@pytest.mark.parametrize(("level", "cause"), [("high", "gpu_busy"), ("low", "gpu_starved")])
@pytest.mark.parametrize(("slow", "judged_on", "slow_min_ms", "said"), [
    (0, JUDGED_ALL, 120.0, True), (1, JUDGED_ALL, 120.0, False), (5, JUDGED_SLOW, 120.0, False),
    (0, JUDGED_ALL, None, False)])
def test_a_gpu_verdict_without_a_slow_forward_is_tentative(level: str, cause: str, slow: int,
                                                           judged_on: str, slow_min_ms: float | None,
                                                           said: bool) -> None:
    fig = figures(stage("forward", 40.0, explains=0.9), total_swing=40.0,
                  gpu=_gpu(level, slow, judged_on, slow_min_ms))
    v = decide(fig)
    assert v.cause == cause
    assert v.tentative is said
    assert v.evidence[0].startswith("no forward is longer than 120.0 ms") is said
    assert (v.advice[0] == NO_SLOW_FORWARD) is said


def test_a_forward_verdict_without_gpu_data_is_left_alone() -> None:
    v = decide(figures(stage("forward", 40.0, explains=0.9), total_swing=40.0))
    assert v.cause == "forward" and NO_SLOW_FORWARD not in v.advice


def test_the_healthy_fleet_reads_alike_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    got, want = reports(engine, TRACE)
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    assert (v["cause"], v["tentative"]) == ("gpu_busy", True), v
    assert v["advice"][0] == NO_SLOW_FORWARD


def test_the_input_mix_explaining_the_swing_says_so_alone() -> None:
    from otel_stages.analysis import advice
    from otel_stages.analysis.figures import CohortFigures, CohortVerdict

    steady = CohortVerdict("stable", None)
    cohorts = [CohortFigures("640x480", 30, 100.0, 110.0, steady),
               CohortFigures("1280x960", 20, 160.0, 170.0, steady)]
    fig = figures(stage("forward", 40.0, explains=0.9), total_swing=40.0, gpu=_gpu("high", 0),
                  input_mix_explains=0.9, cohorts=cohorts)
    v = decide(fig)
    assert v.tentative and v.advice[0] == advice.STEADY_INPUTS
    assert NO_SLOW_FORWARD not in v.advice
