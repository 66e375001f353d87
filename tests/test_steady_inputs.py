"""A swing that is the input mix while each input is steady (testers' inputs: forward following
the output length, text-only requests beside image requests, every cohort stable, the GPU equally
busy in every forward): a confident ``gpu_busy`` / ``forward`` with "add GPU capacity" or "check
whether output lengths vary" was the verdict over all inputs. Now it is tentative, says each input
is steady, and the advice leads with comparing like with like. Thresholds pinned on both sides;
the file report and the ClickHouse report agree on an edited scenario."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from otel_stages.analysis import advice
from otel_stages.analysis.decision import INPUT_MIX_DOMINATES, STEADY_INPUTS_MIN_SHARE, decide
from otel_stages.analysis.figures import CohortFigures, CohortVerdict, Figures
from tests.test_clickhouse_issues import MS, STABLE, Spans, edited, engine, named, reports  # noqa: F401
from tests.test_decision import figures, stage

_STEADY = CohortVerdict("stable", None)


def _cohorts(*rows: tuple[int, CohortVerdict | None]) -> list[CohortFigures]:
    return [CohortFigures(f"{640 + 64 * i}x480", n, 100.0 + 50 * i, 110.0 + 50 * i, v)
            for i, (n, v) in enumerate(rows)]


def _fig(mix: float, cohorts: list[CohortFigures], cause_stage: str = "forward") -> Figures:
    return replace(figures(stage(cause_stage, 40.0, explains=0.9), total_swing=40.0),
                   input_mix_explains=mix, cohorts=cohorts)


@pytest.mark.parametrize(("mix", "said"), [
    (INPUT_MIX_DOMINATES - 0.001, False), (INPUT_MIX_DOMINATES, True), (1.0, True)])
def test_a_mix_of_steady_inputs_makes_the_verdict_tentative(mix: float, said: bool) -> None:
    assert INPUT_MIX_DOMINATES == 0.5
    v = decide(_fig(mix, _cohorts((30, _STEADY), (20, _STEADY))))
    assert v.cause == "forward"
    assert v.tentative is said
    assert any(e.startswith("each input is steady: the 2 input cohorts") for e in v.evidence) is said
    assert (v.advice[0] == advice.STEADY_INPUTS) is said
    # the question the mix line has answered is not asked again
    assert (advice.INPUTS_VARY in v.advice) is not said
    if said:
        assert v.evidence[0].startswith("the input mix explains")
        assert v.evidence[1].startswith("each input is steady")
        assert "(50 of the 50 warm requests with a known input)" in v.evidence[1]


@pytest.mark.parametrize(("steady", "unjudged", "said"), [(80, 20, True), (79, 21, False)])
def test_the_steady_inputs_hold_most_requests(steady: int, unjudged: int, said: bool) -> None:
    assert STEADY_INPUTS_MIN_SHARE == 0.8
    # one judged, steady cohort; the rest in cohorts too small for a verdict of their own
    small = [(4, None)] * (unjudged // 4) + [(unjudged % 4, None)] * bool(unjudged % 4)
    v = decide(_fig(0.9, _cohorts((steady, _STEADY), *small)))
    assert v.tentative is said
    assert (v.advice[0] == advice.STEADY_INPUTS) is said


def test_an_input_that_swings_on_its_own_keeps_the_verdict() -> None:
    v = decide(_fig(0.9, _cohorts((30, _STEADY), (20, CohortVerdict("forward", "forward")))))
    assert not v.tentative and v.advice[0] != advice.STEADY_INPUTS
    assert not any(e.startswith("each input is steady") for e in v.evidence)


def test_a_cold_start_over_steady_warm_runs_is_a_steady_input() -> None:
    v = decide(_fig(0.9, _cohorts((30, _STEADY), (20, CohortVerdict("cold_start", "forward")))))
    assert v.tentative and v.advice[0] == advice.STEADY_INPUTS


def test_no_judged_cohort_or_one_cohort_is_no_claim() -> None:
    assert not decide(_fig(0.9, _cohorts((4, None), (4, None)))).tentative
    assert not decide(_fig(0.9, _cohorts((30, _STEADY)))).tentative


def test_a_steady_run_is_left_alone() -> None:
    fig = replace(figures(stage("forward", 1.0, explains=0.9), total_swing=1.0),
                  input_mix_explains=0.9, cohorts=_cohorts((30, _STEADY), (20, _STEADY)))
    v = decide(fig)
    assert v.cause == "stable" and not v.tentative


def _sizes_that_cost(i: int, spans: Spans) -> None:
    """Every second request sends a 2560-pixel-wide image whose forward takes 60 ms more, as steady
    as the others: the input mix explains the swing, each input is stable."""
    if i % 2:
        for a in named(spans, "decode")["attributes"]:
            if a["key"] == "image.width":
                a["value"] = {"intValue": "2560"}
        forward, request = named(spans, "forward"), named(spans, "request")
        forward["endTimeUnixNano"] = str(int(forward["endTimeUnixNano"]) + 60 * MS)
        request["endTimeUnixNano"] = str(int(request["endTimeUnixNano"]) + 60 * MS)


def test_steady_inputs_read_alike_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    got, want = reports(engine, edited(STABLE, tmp_path / "sizes.jsonl", _sizes_that_cost))
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    # the scenario's GPU is busy in every forward: "add GPU capacity" no longer leads
    assert (v["cause"], v["stage"], v["tentative"]) == ("gpu_busy", "forward", True), v
    assert v["evidence"][0].startswith("the input mix explains"), v
    assert v["evidence"][1].startswith("each input is steady: the 2 input cohorts"), v
    assert v["advice"][0] == advice.STEADY_INPUTS
    assert advice.INPUTS_VARY not in v["advice"]


def test_a_stage_whose_cost_follows_size_already_says_so() -> None:
    # "preprocessing cost follows image size ... cap them" is the input's own explanation
    from otel_stages.analysis.figures import StageEvidence

    fig = _fig(0.9, _cohorts((30, _STEADY), (20, _STEADY)), "decode")
    said = decide(replace(fig, stage_evidence={"decode": StageEvidence(follows_size=True)}))
    assert said.cause == "preprocess" and not said.tentative
    assert said.advice[0] != advice.STEADY_INPUTS
    assert decide(replace(fig, stage_evidence={"decode": StageEvidence(follows_size=False)})).tentative


def test_the_share_is_of_every_known_input_not_the_listed_cohorts() -> None:
    # a tester's: the ClickHouse report lists the 20 largest cohorts; over those the steady share
    # read 48 of 67, over every request with a known input 48 of 112 (the file report's)
    fig = _fig(0.9, _cohorts((48, _STEADY), (19, None)))
    assert decide(fig).tentative is False  # 48 of 67: under 0.8
    assert decide(replace(_fig(0.9, _cohorts((80, _STEADY), (19, None))),
                          known_input_requests=100)).tentative
    assert not decide(replace(_fig(0.9, _cohorts((80, _STEADY), (19, None))),
                              known_input_requests=101)).tentative
