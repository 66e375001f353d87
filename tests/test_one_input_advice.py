"""Advice to check whether input shapes vary is never given where every warm request had one
input (a tester: forward slowing over the process's life on one 1024x768 image was told "check
whether input shapes (image tiles, prompt or output length) vary between calls")."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from otel_stages.analysis import advice, load_paths
from otel_stages.analysis.decision import decide, one_input
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.figures import CohortFigures, GpuEvidence
from otel_stages.analysis.gpu import JUDGED_SLOW, LEVEL_HIGH
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports  # noqa: F401 - the chDB fixture
from tests.test_decision import figures, stage


def _forward(cohorts: tuple[CohortFigures, ...], **extra: object):
    return figures(stage("forward", 40.0, explains=0.9), total_swing=40.0, cohorts=cohorts, **extra)


_ALL = (CohortFigures("1024x768", 30, 100.0, 120.0),)


@pytest.mark.parametrize("cohorts, known, key", [
    (_ALL, None, "1024x768"),
    (_ALL, 30, "1024x768"),
    ((CohortFigures("1024x768", 29, 100.0, 120.0),), None, None),  # one warm request elsewhere
    (_ALL, 31, None),  # (counts that disagree: no claim)
    ((CohortFigures("1024x768", 15, 100.0, 120.0), CohortFigures("640x480", 15, 90.0, 99.0)),
     None, None),
    ((), None, None),
])
def test_one_input_is_every_warm_request_in_one_cohort(cohorts, known, key) -> None:
    assert one_input(_forward(cohorts, known_input_requests=known)) == key


def test_a_forward_verdict_on_one_input_does_not_ask_about_shapes() -> None:
    one = decide(_forward(_ALL))
    assert advice.INPUTS_VARY not in one.advice
    assert advice.ONE_INPUT_VARY.format(key="1024x768") in one.advice
    two = decide(_forward((CohortFigures("1024x768", 15, 100.0, 120.0),
                           CohortFigures("640x480", 15, 90.0, 99.0))))
    assert advice.INPUTS_VARY in two.advice


def test_a_busy_gpu_on_one_input_is_not_told_shapes_vary() -> None:
    busy = GpuEvidence(level=LEVEL_HIGH, mean_utilization=0.95, samples=90, forwards_covered=30,
                       forwards=30, slow_mean_utilization=0.95, slow_forwards=10, slow_covered=10,
                       slow_samples=30, judged_on=JUDGED_SLOW)
    v = decide(_forward(_ALL, gpu=busy))
    assert v.cause == "gpu_busy"
    assert advice.OTHER_GPU_WORK in v.advice and advice.OTHER_WORK_OR_SHAPES not in v.advice
    v = decide(_forward((), gpu=busy))
    assert advice.OTHER_WORK_OR_SHAPES in v.advice


def _sized(n: int) -> list[list[dict[str, object]]]:
    """``n`` requests of one 1024x768 image, forward growing over the run (a leak)."""
    def fn(i: int, r: random.Random) -> odd_inputs.Stages:
        return [("download", 5 + r.random()), ("decode", 10 + r.random()), ("resize", 4 + r.random()),
                ("queue", 1 + r.random()), ("forward", 20 + i * 1.5 + r.random())]
    rows = odd_inputs.run(n, fn, seed=4)
    for spans in rows:
        for span in spans:
            if span["name"] == "decode":
                span["attributes"] = [odd_inputs._attr("image.width", 1024),
                                      odd_inputs._attr("image.height", 768)]
    return rows


def test_both_reports_leave_shapes_out_for_one_input(engine, tmp_path: Path) -> None:  # noqa: F811
    path = odd_inputs.write(tmp_path / "leak.jsonl", _sized(60))
    want = diagnose(load_paths([path])).verdict
    assert want.stage == "forward"
    assert advice.ONE_INPUT_VARY.format(key="1024x768") in want.advice
    got, wanted = reports(engine, path)
    assert got["verdict"] == wanted["verdict"]
