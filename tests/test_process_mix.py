"""A swing that lies between processes (replicas on other hardware, a node with co-tenants): the
process mix, its threshold pinned on both sides, the input mix taking precedence, and the figures
themselves from requests. The file report and the ClickHouse report agree on a fleet input in
tests/test_clickhouse_issues.py (``test_a_swing_between_replicas_is_said_and_tentative``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from otel_stages.analysis import load_paths
from otel_stages.analysis.decision import INPUT_MIX_DOMINATES, decide
from otel_stages.analysis.process_mix import (
    PROCESS_MIX_DOMINATES,
    ProcessMean,
    ProcessMix,
    process_mix,
)
from otel_stages.analysis.requests import find_requests
from tests import odd_inputs
from tests.test_decision import figures, stage


def _mix(explains: float) -> ProcessMix:
    return ProcessMix(explains=explains, processes=2,  # side by side
                      fastest=ProcessMean("service.name=svc,service.instance.id=b", 30, 93.0, 0, 100),
                      slowest=ProcessMean("service.name=svc,service.instance.id=a", 30, 183.0, 5, 95))


@pytest.mark.parametrize("explains, said", [
    (PROCESS_MIX_DOMINATES - 0.001, False), (PROCESS_MIX_DOMINATES, True), (0.99, True)])
def test_a_swing_between_processes_makes_the_verdict_tentative(explains: float, said: bool) -> None:
    assert PROCESS_MIX_DOMINATES == 0.5
    fig = figures(stage("forward", 40.0, explains=0.9), total_swing=40.0)
    assert decide(fig).tentative is False
    v = decide(replace(fig, process_mix=_mix(explains)))
    assert v.tentative is said
    assert v.evidence[0].startswith("the process explains") is said
    assert v.advice[0].startswith("compare service.name=svc,service.instance.id=a with") is said
    assert v.cause == "forward"


def test_the_input_mix_explains_it_first() -> None:
    # inputs routed per process: the input mix line says "compare like with like"
    fig = replace(figures(stage("forward", 40.0, explains=0.9), total_swing=40.0),
                  process_mix=_mix(0.9), input_mix_explains=INPUT_MIX_DOMINATES)
    v = decide(fig)
    assert not any(e.startswith("the process explains") for e in v.evidence)


def test_a_steady_run_gets_no_process_line() -> None:
    fig = replace(figures(stage("forward", 1.0, explains=0.9), total_swing=1.0), process_mix=_mix(0.9))
    v = decide(fig)
    assert v.cause == "stable" and not v.tentative


def test_the_figures_come_from_each_process_warm_requests(tmp_path) -> None:
    rows = odd_inputs.run(12)
    path = odd_inputs.write(tmp_path / "one.jsonl", rows)
    one = [r for r in find_requests(load_paths([path]).spans) if not r.cold]
    assert process_mix(one) is None  # one process: nothing to compare
    slow = odd_inputs.run(12, lambda i, r: [("forward", 300 + r.random())], seed=2)
    lines = path.read_text() + odd_inputs.write(tmp_path / "two.jsonl", slow).read_text().replace(
        '"i1"', '"i2"')
    (tmp_path / "both.jsonl").write_text(lines)
    warm = [r for r in find_requests(load_paths([tmp_path / "both.jsonl"]).spans) if not r.cold]
    mix = process_mix(warm)
    assert mix is not None and mix.processes == 2 and mix.explains > 0.99
    assert mix.slowest.key.endswith("service.instance.id=i2") and mix.slowest.requests == 11  # the first is cold
    assert mix.fastest.key.endswith("service.instance.id=i1")
    assert mix.slowest.mean_total_ms == pytest.approx(
        sum(r.total_ms for r in warm if r.resource.get("service.instance.id") == "i2") / 11)


def test_processes_that_ran_one_after_another_differ_by_time_not_place():
    # a tester's: six worker generations one after another (a recycled worker), queue rising with
    # the load over the recording: the process "explained" 96 % of the variance
    mix = _mix(0.96)
    apart = replace(mix, fastest=replace(mix.fastest, first_ns=0, last_ns=10),
                    slowest=replace(mix.slowest, first_ns=10, last_ns=20))
    together = replace(mix, fastest=replace(mix.fastest, first_ns=0, last_ns=11),
                       slowest=replace(mix.slowest, first_ns=10, last_ns=20))
    assert not apart.dominates and together.dominates
    fig = figures(stage("forward", 40.0, explains=0.9), total_swing=40.0)
    assert not decide(replace(fig, process_mix=apart)).tentative
    assert decide(replace(fig, process_mix=together)).tentative
