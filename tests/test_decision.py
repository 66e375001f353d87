"""The one rule set (otel_stages.analysis.decision) on aggregates built by hand: every threshold
just below and just above, the ranking, mechanism refinement, and evidence that never contradicts
the advice. The trace report and the Prometheus report both call these rules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from otel_stages.analysis import advice, aggregate, decision, noise
from otel_stages.analysis.aggregate import StageSummary, decide_aggregate, gpu_from_window
from otel_stages.analysis.decision import decide
from otel_stages.analysis.figures import (
    ALL_WARM,
    SAME_INPUT,
    CohortFigures,
    CohortVerdict,
    ColdFigures,
    Figures,
    Mechanism,
    StageEvidence,
    StageFigures,
    TotalFigures,
    UnaccountedFigures,
)
from otel_stages.analysis.gpu import GpuEvidence, utilization_level

REF = 100.0  # median request, ms
NO_GPU = GpuEvidence(level="none")
#: stage -> median ms of a 100 ms request; every stage jitters 5 % of its median unless told
MEDIANS = {"download": 5.0, "decode": 10.0, "resize": 5.0, "queue": 5.0, "forward": 75.0}


def stage(name: str, swing: float | None = None, *, median: float | None = None,
          spike: float | None = None, explains: float | None = 0.0) -> StageFigures:
    median = MEDIANS[name] if median is None else median
    swing = 0.05 * median if swing is None else swing
    return StageFigures(
        name=name, count=30, median_ms=median, swing_ms=swing, share=median / REF,
        p5_ms=median - swing / 2, p95_ms=median + swing / 2, min_ms=median - swing / 2,
        max_ms=median + swing / 2 + (spike or 0.0), mean_ms=median,
        spike_ms=swing / 2 if spike is None else spike, explains=explains,
    )


def figures(*stages: StageFigures, total_swing: float, total_spike: float | None = None,
            n: int = 30, ref: float = REF, **extra: object) -> Figures:
    given = {s.name: s for s in stages}
    every = {name: given.get(name, stage(name)) for name in MEDIANS} if ref == REF else given
    total = TotalFigures(count=n, median_ms=ref, swing_ms=total_swing, p5_ms=ref - total_swing / 2,
                         p95_ms=ref + total_swing / 2, min_ms=ref - total_swing / 2,
                         max_ms=ref + total_swing / 2,
                         spike_ms=total_swing / 2 if total_spike is None else total_spike)
    return Figures(warm_requests=n, stages=every, total=total, gpu=extra.pop("gpu", NO_GPU),
                   **extra)  # type: ignore[arg-type]


def verdict_of(fig: Figures) -> tuple[str | None, str | None]:
    v = decide(fig)
    return v.cause, v.stage


# --- the request total against the noise band ----------------------------------------------------


def test_swing_min_fraction_for_the_total():
    at = 15.0  # SWING_MIN_FRACTION 0.15 of the 100 ms request (literal: a changed threshold must fail)
    below = figures(stage("forward", at - 0.1, explains=0.9), total_swing=at - 0.1)
    above = figures(stage("forward", at + 0.1, explains=0.9), total_swing=at + 0.1)
    assert verdict_of(below) == ("stable", None)
    assert verdict_of(above) == ("forward", "forward")


def test_swing_min_fraction_for_a_stage():
    # the total swings well beyond the band; the stage itself is just under / over 15 % of it
    at = 15.0
    below = figures(stage("forward", at - 0.1, explains=0.9), total_swing=40.0)
    above = figures(stage("forward", at + 0.1, explains=0.9), total_swing=40.0)
    assert verdict_of(below) == (None, None)  # spread: no single stage swings materially
    assert "no single stage swings materially" in decide(below).evidence[1]
    assert decide(below).advice == [advice.SPREAD]
    assert verdict_of(above) == ("forward", "forward")


def test_spike_min_fraction():
    at = 50.0  # SPIKE_MIN_FRACTION 0.5 of the 100 ms request
    below = figures(stage("forward", 2.0, spike=at - 0.5, explains=0.9), total_swing=2.0,
                    total_spike=at - 0.5)
    above = figures(stage("forward", 2.0, spike=at + 0.5, explains=0.9), total_swing=2.0,
                    total_spike=at + 0.5)
    assert verdict_of(below) == ("stable", None)
    v = decide(above)
    assert (v.cause, v.stage) == ("forward", "forward")
    assert v.evidence[0].startswith("forward spikes: its farthest run lies 50.5 ms from its median")


def test_min_swing_ms_in_a_tiny_service():
    # a 5 ms service: 15 % is 0.75 ms, so the absolute floor of 1 ms decides
    small = {"decode": 1.0, "forward": 4.0}

    def fig(swing: float) -> Figures:
        stages = [stage("decode", 0.01, median=small["decode"]),
                  stage("forward", swing, median=small["forward"], explains=0.9)]
        return figures(*stages, total_swing=swing, ref=5.0)

    assert verdict_of(fig(0.99)) == ("stable", None)  # MIN_SWING_MS 1 ms
    assert verdict_of(fig(1.01)) == ("forward", "forward")


def test_stage_min_part_of_the_total_swing():
    part = 25.0  # STAGE_MIN_PART_OF_SWING 0.25 of the total's 100 ms swing

    def fig(forward_swing: float) -> Figures:
        return figures(stage("decode", 70.0, spike=1.0, explains=0.3),
                       stage("forward", forward_swing, spike=1.0, explains=0.6), total_swing=100.0)

    assert verdict_of(fig(part - 0.5)) == ("preprocess", "decode")  # forward not material
    assert verdict_of(fig(part + 0.5)) == ("forward", "forward")  # material, and explains more


def test_ranking_is_by_explained_variance_not_by_swing():
    fig = figures(stage("decode", 25.0, explains=0.2), stage("forward", 30.0, explains=0.7),
                  total_swing=70.0)
    v = decide(fig)
    assert (v.cause, v.stage) == ("forward", "forward")
    assert "next: decode swings 25.0 ms and explains 20%" in v.evidence
    # decode swinging more than forward while explaining less: the two readings name two places
    # (DESIGN: "the one that swings more comes first"), both are named, tentatively
    wider = decide(figures(stage("decode", 60.0, explains=0.2), stage("forward", 30.0, explains=0.7),
                           total_swing=70.0))
    assert (wider.cause, wider.stage, wider.tentative) == ("forward", "forward", True)
    assert any(e.startswith("decode makes the body of the swing") for e in wider.evidence)
    # a source that cannot know explains (histograms) ranks by swing
    blind = figures(stage("decode", 60.0, explains=None), stage("forward", 30.0, explains=None),
                    total_swing=70.0)
    assert verdict_of(blind) == ("preprocess", "decode")


@pytest.mark.parametrize("decode_explains, co", [(0.8 * 0.5 - 0.01, False), (0.8 * 0.5 + 0.01, True)])
def test_a_stage_explaining_nearly_as_much_is_a_co_suspect(decode_explains, co):
    """CO_SUSPECT_MIN_RATIO 0.8 (literal): decode explaining 39 % against forward's 50 % is "next";
    at 41 % the two are within what another run could reverse, so the advice covers both."""
    fig = figures(stage("decode", 60.0, explains=decode_explains), stage("forward", 60.0, explains=0.5),
                  total_swing=80.0)
    v = decide(fig)
    assert (v.cause, v.stage) == ("forward", "forward")
    assert any(line.startswith("next: decode") for line in v.evidence) is not co
    assert any(line.startswith("decode swings about as much") for line in v.evidence) is co
    forward_only = advice.for_cause("forward", gpu_level="none")
    if co:
        assert [a for a in v.advice if a.startswith("forward: ")] == [f"forward: {a}" for a in forward_only]
        assert any(a.startswith("decode: ") for a in v.advice)
    else:
        assert v.advice[:len(forward_only)] == forward_only
        assert not any(a.startswith("decode: ") for a in v.advice)


@pytest.mark.parametrize("decode_swing, co", [(0.8 * 60.0 - 0.5, False), (0.8 * 60.0 + 0.5, True)])
def test_without_explains_the_co_suspect_is_by_swing(decode_swing, co):
    fig = figures(stage("decode", decode_swing, explains=None), stage("forward", 60.0, explains=None),
                  total_swing=80.0)
    v = decide(fig)
    assert v.stage == "forward"
    assert any(a.startswith("decode: ") for a in v.advice) is co


def test_co_suspect_advice_follows_its_own_evidence():
    """The second stage's advice is the one its own cause gives (preprocess for decode), never the
    suspect's advice repeated under its name."""
    fig = figures(stage("decode", 60.0, explains=0.45), stage("forward", 60.0, explains=0.5),
                  total_swing=80.0)
    v = decide(fig)
    decode_advice = [a.removeprefix("decode: ") for a in v.advice if a.startswith("decode: ")]
    assert decode_advice == advice.for_cause("preprocess")


@pytest.mark.parametrize("lag_ms, loop", [(0.5 * 75.0 - 0.1, False), (0.5 * 75.0 + 0.1, True)])
def test_a_steady_stage_that_mostly_waits_for_the_loop_points_at_the_holder(lag_ms, loop):
    """LAG_DOMINATES_FRACTION 0.5 (literal): forward (75 ms median, the largest share) with 37.4 ms
    of event-loop lag is where to start; with 37.6 ms it mostly waits for the loop, and the advice
    is to move the stage that holds the loop off it."""
    evidence = {"forward": StageEvidence(lag_median_ms=lag_ms, loop_holder="resize")}
    v = decide(figures(total_swing=2.0, stage_evidence=evidence))
    assert v.cause == "stable"
    said = any("forward is mostly waiting for the event loop" in e and "held most by resize" in e
               for e in v.evidence)
    assert said is loop
    assert any("move resize off the event loop" in a for a in v.advice) is loop
    assert any("start with forward" in a for a in v.advice) is not loop


@pytest.mark.parametrize("failed, first_advice", [
    (0, advice.STEADY),
    (1, advice.steady_but_failed(1)),   # any failure: "steady" is of the requests that succeeded
    (7, advice.steady_but_failed(7)),   # 7 of 30 = 23 %, below FAILED_MIN_FRACTION
    (8, advice.FIX_FAILURES),           # 8 of 30 = 27 %: the failures lead
])
def test_a_steady_verdict_never_hides_failed_requests(failed, first_advice):
    """The tester's gen2_failed: 8 of 40 requests timed out in forward after 300 ms, and the
    report said "latency is steady: no per-stage fix is needed"."""
    v = decide(figures(total_swing=2.0, failed_requests=failed, requests=30))
    assert v.cause == "stable"
    assert v.advice[0] == first_advice


def test_jitter_sets_the_band_from_the_data():
    rel = {"download": 0.1, "decode": 0.2, "resize": 0.3, "queue": 0.4, "forward": 0.5}

    def fig(total_swing: float) -> Figures:
        stages = [stage(n, r * MEDIANS[n], explains=0.9 if n == "forward" else 0.0)
                  for n, r in rel.items()]
        return figures(*stages, total_swing=total_swing)

    band = noise.noise_band(fig(0).stages.values(), REF)
    assert band.jitter == pytest.approx(0.2)  # the lower quartile of 0.1 .. 0.5
    assert band.source == "jitter" and band.band_ms == pytest.approx(20.0)
    assert verdict_of(fig(19.9)) == ("stable", None)
    assert verdict_of(fig(20.1)) == ("forward", "forward")
    stable = decide(fig(19.9))
    assert "within this run's noise band 20.0 ms" in stable.evidence[0]
    assert "stages jitter by 20% of their own medians" in stable.evidence[0]


def test_jitter_is_capped():
    cap = 25.0  # NOISE_MAX_FRACTION 0.25 of the 100 ms request

    def fig(total_swing: float) -> Figures:
        stages = [stage(n, 0.6 * m, explains=0.9 if n == "forward" else 0.0)
                  for n, m in MEDIANS.items()]
        return figures(*stages, total_swing=total_swing)

    assert noise.noise_band(fig(0).stages.values(), REF).source == "jitter_cap"
    assert verdict_of(fig(cap - 0.1)) == ("stable", None)
    assert verdict_of(fig(cap + 0.1)) == ("forward", "forward")


@pytest.mark.parametrize("stages, measured", [(2, False), (3, True)])  # NOISE_MIN_STAGES 3
def test_jitter_needs_enough_stages(stages, measured):
    names = ["forward", "decode", "resize"][:stages]
    fig_stages = [stage(n, (0.22 if n == "forward" else 0.2) * MEDIANS[n],
                        explains=0.9 if n == "forward" else 0.0) for n in names]
    fig = figures(*fig_stages, total_swing=18.0, ref=REF + 1e-9)  # only these stages
    band = noise.noise_band(fig.stages.values(), fig.reference_ms)
    assert (band.jitter is not None) is measured
    assert verdict_of(fig) == (("stable", None) if measured else ("forward", "forward"))


@pytest.mark.parametrize("median, included", [(1.9, False), (2.1, True)])  # 2 % of 100 ms
def test_tiny_stages_do_not_set_the_jitter(median, included):
    stages = [stage("decode", 3.0, median=10.0), stage("resize", 3.0, median=10.0),
              stage("forward", 0.3 * 78.0, median=78.0, explains=0.9),
              stage("queue", 0.0, median=median)]
    fig = figures(*stages, total_swing=23.5, ref=REF + 1e-9)
    band = noise.noise_band(fig.stages.values(), fig.reference_ms)
    assert band.stages == (4 if included else 3)
    # with the steady tiny stage the lower quartile drops to 0.225, and 23.5 ms swings
    assert verdict_of(fig)[0] == ("forward" if included else "stable")


def test_the_lower_quartile_is_the_jitter():
    rels = [0.1, 0.2, 0.3, 0.4]
    stages = [StageFigures(f"s{i}", 30, 20.0, r * 20.0, 0.2) for i, r in enumerate(rels)]
    jitter, n = noise.run_jitter(stages, REF)
    assert n == 4 and jitter == pytest.approx(0.175)  # 25th percentile, linear interpolation
    assert noise.NOISE_QUANTILE == 25.0


# --- warm-run counts ----------------------------------------------------------------------------


def test_min_warm_runs():
    few = figures(stage("forward", 40.0, explains=0.9), total_swing=40.0, n=4)  # MIN_WARM_RUNS 5
    v = decide(few)
    assert (v.cause, v.stage, v.tentative) == (None, None, True)
    assert v.evidence[0].startswith("not enough data: 4 warm requests")
    enough = figures(stage("forward", 40.0, explains=0.9), total_swing=40.0, n=5)
    assert verdict_of(enough) == ("forward", "forward")


def test_tentative_below_the_recommended_runs_says_how_many_more():
    v = decide(figures(stage("forward", 40.0, explains=0.9), total_swing=40.0, n=19))
    assert v.tentative and v.cause == "forward"
    assert any("run the same input 1 more time (20+ in all)" in e for e in v.evidence)
    assert v.advice[0] == advice.more_runs(1)
    firm = decide(figures(stage("forward", 40.0, explains=0.9), total_swing=40.0, n=20))
    assert not firm.tentative and not any("tentative" in e for e in firm.evidence)


# --- cold start ---------------------------------------------------------------------------------


def cold(ratio: float, compared_with: str = SAME_INPUT) -> ColdFigures:
    return ColdFigures(count=1, total_ms=ratio * REF, stages_ms={"forward": 75.0 + (ratio - 1) * REF},
                       comparable_median_total_ms=REF, comparable_stages_ms=dict(MEDIANS),
                       compared_with=compared_with, comparable_requests=24,
                       warm_median_total_ms=300.0, cohort="1024x768")


def test_cold_start_min_ratio():
    below = decide(figures(total_swing=5.0, cold=cold(1.99)))  # COLD_START_MIN_RATIO 2
    above = decide(figures(total_swing=5.0, cold=cold(2.01)))
    assert (below.cause, below.stage) == ("stable", None)
    assert any(e.startswith("no cold-start penalty") for e in below.evidence)
    assert "1.99x the median" in " ".join(below.evidence)  # not 2.0x beside "no penalty"
    assert (above.cause, above.stage) == ("cold_start", "forward")
    assert above.evidence[0] == (
        "first request of the process took 201.0 ms, 2.01x the median of the 24 warm requests"
        " with the same input (1024x768, 100.0 ms); reported apart from warm runs")


def test_cold_start_against_all_warm_says_so():
    """Input unknown: compared with all warm requests, and nothing tells them apart."""
    v = decide(figures(total_swing=5.0, cold=replace(cold(3.0, ALL_WARM), input_known=False)))
    assert v.cause == "cold_start"
    assert "the median of all 24 warm requests" in v.evidence[0]
    assert "its input is unknown" in v.evidence[0]


def test_a_slow_first_request_of_an_input_few_share_is_not_comparable():
    """A known input fewer than 5 warm requests share (another image size, prompt or output
    length) may be what made it slow: not called a cold start (stage maps tester, vLLM v1b)."""
    v = decide(figures(total_swing=5.0, cold=cold(3.0, ALL_WARM)))
    assert v.cause == "stable"
    line = next(e for e in v.evidence if "first request" in e)
    assert "fewer than 5 share its input" in line and "not comparable" in line
    assert advice.WARM_UP not in v.advice and "also: " + advice.WARM_UP not in v.advice


def test_a_cold_start_next_to_a_warm_swing_keeps_the_warm_cause():
    v = decide(figures(stage("queue", 40.0, explains=0.9), total_swing=40.0, cold=cold(5.0)))
    assert (v.cause, v.stage) == ("queue", "queue")
    assert any(e.endswith("and a cold start too") for e in v.evidence)
    assert v.advice[-1] == "also: " + advice.WARM_UP


def cold_in(stage_name: str, ratio: float = 5.0) -> ColdFigures:
    """A cold request whose extra time lies in ``stage_name``."""
    extra = (ratio - 1) * REF
    return replace(cold(ratio), stages_ms={**MEDIANS, stage_name: MEDIANS[stage_name] + extra})


@pytest.mark.parametrize("stage_name, first", [
    ("download", "opening the connection to the image origin"),
    ("decode", "the first decode paid one-time setup"),
    ("resize", "the first resize paid one-time setup"),
    ("queue", "batcher / executor workers to start"),
    ("forward", advice.WARM_UP),
])
def test_cold_start_advice_follows_the_stage_that_was_cold(stage_name, first):
    # a cold download got model warm-up advice (weights, kernels) beside "download took 616 ms"
    v = decide(figures(total_swing=5.0, cold=cold_in(stage_name)))
    assert (v.cause, v.stage) == ("cold_start", stage_name)
    assert first in v.advice[0]
    model = "weight loading" in " ".join(v.advice)
    assert model is (stage_name == "forward")
    # beside a warm cause, the one "also:" line follows the cold stage too
    w = decide(figures(stage("queue", 40.0, explains=0.9), total_swing=40.0, cold=cold_in(stage_name)))
    assert w.cause == "queue" and w.advice[-1].startswith("also: ") and first in w.advice[-1]


# --- input mix ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mix, first", [(0.49, False), (0.51, True)])  # INPUT_MIX_DOMINATES 0.5
def test_a_dominating_input_mix_comes_first(mix, first):
    cohorts = (CohortFigures("4032x3024", 26, 600.0, 790.0, CohortVerdict("stable", None)),
               CohortFigures("1024x768", 24, 50.0, 52.0, CohortVerdict("cold_start", "forward")))
    v = decide(figures(stage("decode", 40.0, explains=0.9), total_swing=40.0, cohorts=cohorts,
                       input_mix_explains=mix))
    line = next(e for e in v.evidence if e.startswith("the input mix explains"))
    assert (v.evidence[0] == line) is first
    assert ("within the largest cohort, 4032x3024, the verdict is stable" in line) is first


# --- untraced time, mechanisms, causes ----------------------------------------------------------


def test_untraced_time_that_swings_gets_no_stage():
    gap = UnaccountedFigures(median_ms=5.0, swing_ms=40.0, share=0.05, explains=0.9)
    v = decide(figures(total_swing=40.0, unaccounted=gap))
    assert (v.cause, v.stage) == (None, None)
    assert "the swing is outside the stage spans" in v.evidence[0]
    assert v.advice == [advice.UNTRACED]


def test_confirmed_mechanism_names_the_cause_and_an_unconfirmed_one_does_not():
    contention = Mechanism("cpu_contention", True, ("decode wall time 4x its CPU time",),
                           ("give decode its own cores",))
    doubt = Mechanism("gc_pause", False, ("2 GC pauses",), ("tune gc",))
    base = {"total_swing": 40.0}
    confirmed = decide(figures(stage("decode", 40.0, explains=0.9),
                               stage_evidence={"decode": StageEvidence(mechanisms=(doubt, contention))},
                               **base))
    assert (confirmed.cause, confirmed.stage) == ("cpu_contention", "decode")
    assert "decode wall time 4x its CPU time" in confirmed.evidence
    assert confirmed.advice == ["give decode its own cores"]
    plain = decide(figures(stage("decode", 40.0, explains=0.9),
                           stage_evidence={"decode": StageEvidence(mechanisms=(doubt,))}, **base))
    assert plain.cause == "preprocess" and "2 GC pauses" not in plain.evidence


@pytest.mark.parametrize("mean, cause", [  # GPU_BUSY_MIN_UTILIZATION 0.7, GPU_STARVED_MAX 0.4
    (0.69, "forward"), (0.71, "gpu_busy"), (0.39, "gpu_starved"), (0.41, "forward"),
])
def test_gpu_thresholds(mean, cause):
    gpu = GpuEvidence(level=utilization_level(mean, 50, 30, 30), mean_utilization=mean, samples=50,
                      forwards=30, forwards_covered=30)
    assert verdict_of(figures(stage("forward", 40.0, explains=0.9), total_swing=40.0, gpu=gpu)) == (
        cause, "forward")


def test_gpu_sample_and_coverage_floors():
    assert utilization_level(0.9, 4, 30, 30) == "thin"  # MIN_GPU_SAMPLES 5
    assert utilization_level(0.9, 5, 30, 30) == "high"
    assert utilization_level(0.9, 50, 8, 30) == "thin"  # under 30 % of forwards covered
    assert utilization_level(0.9, 50, 9, 30) == "high"


@pytest.mark.parametrize("evidence, first, cap", [
    (StageEvidence(follows_size=True), advice.CAP_SIZE, True),
    (StageEvidence(follows_size=False), advice.NOT_SIZE, False),
    (StageEvidence(one_size=True, lines=("every request had the same 640x480 image",)),
     advice.ONE_SIZE, False),
    (StageEvidence(), advice.SIZE_UNKNOWN, False),
])
def test_preprocess_advice_follows_the_size_evidence(evidence, first, cap):
    v = decide(figures(stage("resize", 40.0, explains=0.9), stage_evidence={"resize": evidence},
                       total_swing=40.0))
    assert v.cause == "preprocess" and v.advice[0] == first
    assert any("cap them" in a or "cap the input" in a for a in v.advice) is cap


# --- the Prometheus report calls the same rules ---------------------------------------------------


def _summary(name: str, p50: float, floor: float) -> StageSummary:
    return StageSummary(name, 100, 1.0, p50, p50 - floor / 2, p50, p50 + floor / 2, p50 + floor,
                        swing_floor_ms=floor, spike_floor_ms=floor / 2, share=p50 / 100)


def test_histograms_go_through_the_same_rules(monkeypatch):
    calls = []
    real = decision.decide

    def spy(fig: Figures):
        calls.append(fig)
        return real(fig)

    monkeypatch.setattr(aggregate, "decide", spy)
    at = 15.0
    below = {"decode": _summary("decode", 25.0, 0.0), "forward": _summary("forward", 75.0, at - 0.5)}
    above = {"decode": _summary("decode", 25.0, 0.0), "forward": _summary("forward", 75.0, at + 0.5)}
    gpu = gpu_from_window(0.9, 100)
    assert decide_aggregate(below, None, gpu, 3600).cause == "stable"
    assert (decide_aggregate(above, None, gpu, 3600).cause, len(calls)) == ("gpu_busy", 2)
    assert calls[1].stages["forward"].swing_ms == at + 0.5  # the proven spread, not p95 - p5
    assert calls[1].stages["forward"].explains is None


def test_a_spike_says_it_is_a_spike():
    v = decide(figures(stage("forward", 2.0, spike=60.0, explains=0.9), total_swing=2.0,
                       total_spike=60.0))
    assert any(e.startswith("request total spikes: its farthest run lies 60.0 ms from the median 100.0 ms")
               for e in v.evidence)


# --- span ids shared by different spans -----------------------------------------------------------


@pytest.mark.parametrize("clash_spans, tentative", [(0, False), (4, False), (5, True), (100, True)])
def test_clashing_span_ids_make_the_verdict_tentative(clash_spans: int, tentative: bool) -> None:
    """CLASH_MIN_FRACTION 0.05 of 100 requests (literal: a changed threshold must fail): at 5 spans
    that share an id with a different span, which requests the figures describe depends on the
    read order, so the verdict (the same cause) is tentative with the reason first."""
    fig = figures(stage("forward", 40.0, explains=0.9), total_swing=40.0, requests=100,
                  clash_spans=clash_spans)
    v = decide(fig)
    assert (v.cause, v.stage) == ("forward", "forward")
    assert v.tentative is tentative
    assert v.evidence[0].startswith(f"{clash_spans} spans share a span id") is tentative


@pytest.mark.parametrize("failed, words", [(1, "the one that failed is not in these timings: look at its"),
                                           (2, "the 2 that failed are not in these timings: look at their")])
def test_steady_but_failed_agrees_in_number(failed, words):
    assert words in advice.steady_but_failed(failed)


@pytest.mark.parametrize("forward_swing, both", [(14.9, True), (59.9, True), (60.0, False),
                                                  (60.1, False)])
def test_a_suspect_of_a_few_far_runs_shares_the_verdict_with_the_body_of_the_swing(forward_swing, both):
    """A tester's: forward steady but for 3 stalls of 1.5 s in 100 requests (its variance share
    85 % from those runs), download bimodal (40 % at +200 ms: the total's p95 - p5). Forward alone
    led the verdict and the advice. While download's p5 -> p95 (60 ms) is wider than forward's,
    forward's share is a few runs', download is named with it and the verdict is tentative (a later
    tester: two 5 s forward stalls in 40 requests put forward's p95 into a stall, 249 ms, and
    dropped decode, swinging 258 ms, from the advice); at 60 ms forward swings as much and leads
    alone."""
    fig = figures(stage("download", 60.0, explains=0.15),
                  stage("forward", forward_swing, spike=1500.0, explains=0.85), total_swing=220.0,
                  total_spike=1500.0)
    v = decide(fig)
    assert (v.cause, v.stage) == ("forward", "forward")
    assert any(e.startswith("download makes the body of the swing") for e in v.evidence) is both
    assert any(a.startswith("download: ") for a in v.advice) is both
    assert v.tentative is both


def test_a_body_that_only_spikes_is_no_body():
    # download material by one far run of its own (its p5 -> p95 10 ms): no body of a swing
    fig = figures(stage("download", 10.0, spike=400.0, explains=0.15),
                  stage("forward", 10.0, spike=1500.0, explains=0.85), total_swing=220.0,
                  total_spike=1500.0)
    v = decide(fig)
    assert v.stage == "forward" and not v.tentative
    assert not any(a.startswith("download: ") for a in v.advice)


def test_no_body_of_a_swing_when_the_total_itself_does_not_swing():
    # a tester's: decode spikes (4 runs of 1.5 s), queue and forward trade 0..40 ms so that the
    # total's p5..p95 stays within the band: forward "made the body of the swing" (explaining 0 %)
    fig = figures(stage("decode", 1.0, spike=1500.0, explains=0.9),
                  stage("forward", 36.0, explains=0.0), stage("queue", 36.0, explains=0.0),
                  total_swing=1.0, total_spike=1500.0)
    v = decide(fig)
    assert v.stage == "decode" and not v.tentative
    assert not any("makes the body of the swing" in e for e in v.evidence)


@pytest.mark.parametrize("gap_swing, both", [(15.0 - 0.1, False), (60.0, True)])
def test_untraced_time_can_be_the_body_of_the_swing(gap_swing, both):
    # a tester's: decode spikes, every stage steady, a 0..60 ms gap before forward (untraced)
    from otel_stages.analysis.figures import UnaccountedFigures

    fig = figures(stage("decode", 1.0, spike=1500.0, explains=0.9), total_swing=60.0,
                  total_spike=1500.0, unaccounted=UnaccountedFigures(30.0, gap_swing, 0.3, 0.01))
    v = decide(fig)
    assert v.stage == "decode" and v.tentative is both
    assert any(e.startswith("the untraced time (outside every stage span) makes the body")
               for e in v.evidence) is both
    assert (f"untraced time: {advice.UNTRACED}" in v.advice) is both
