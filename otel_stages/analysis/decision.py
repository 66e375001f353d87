"""The diagnosis rules of DESIGN.md section 1: one rule set for every source, on aggregates.

:func:`decide` reads :class:`~otel_stages.analysis.figures.Figures` (per-stage statistics, the
request total, unaccounted time, cold request, cohorts, GPU evidence; see that module for units)
and returns a :class:`~otel_stages.analysis.verdict.Verdict`. The trace report, the Prometheus
fleet report and any later source call it with the same thresholds. Order of the rules:

1. Fewer than :data:`MIN_WARM_RUNS` warm requests: no verdict ("not enough data"). Fewer than
   :data:`RECOMMENDED_WARM_RUNS`: the verdict is ``tentative`` and says how many more to run.
2. The request total swings only when its ``p95 - p5`` is above the run's noise band, or one run
   lies ``SPIKE_MIN_FRACTION`` of the median away (:mod:`otel_stages.analysis.noise`). Otherwise:
   ``cold_start`` when the cold request took ``COLD_START_MIN_RATIO`` times its comparable warm
   requests (same input when 5+ exist; a known input fewer share is not comparable, and never
   called a cold start) or more, with the stage that grew most; else ``stable``
   (the largest share is named as the place to cut latency).
3. A stage is *material* when its own swing is: at least ``MIN_SWING_MS`` in absolute terms, at
   least ``SWING_MIN_FRACTION`` of the median request (or a single run ``SPIKE_MIN_FRACTION`` away
   from the stage median), and at least :data:`STAGE_MIN_PART_OF_SWING` of the total's swing (or
   spike). Untraced time (``unaccounted``) competes under the same test.
4. Among material stages the one that explains most of the total's variance is the suspect
   (so of two large stages the one that swings more in step with the total comes first; by swing
   only where the source cannot know ``explains``). Untraced time as the suspect: no cause, and the
   evidence says the time lies outside the stage spans. No material stage although the total
   swings: no cause, the swing is spread over several stages. A second material stage explaining
   :data:`CO_SUSPECT_MIN_RATIO` of what the suspect explains (or swinging that much of its swing)
   is a co-suspect: the evidence says so and the advice covers both, each line headed by its
   stage's name (``cause`` and ``stage`` stay the suspect's). So is the material stage that swings
   most when the suspect is material only by a few runs far out (its ``p95 - p5`` under
   ``SWING_MIN_FRACTION`` of the median request, the variance it explains from those runs), the
   total's own ``p95 - p5`` is beyond the noise band, and that stage makes this body of the swing
   (its ``p95 - p5`` at least ``SWING_MIN_FRACTION``; the untraced time too, then named with the
   advice to trace it): the two readings of "the swing" name two places, so the verdict is
   tentative too (:func:`spike_only`). A stage that is a call into another service's requests read
   in the same report (:attr:`Figures.calls <otel_stages.analysis.figures.Figures.calls>`) is no
   suspect: its time is the called requests', whose stages are ranked without it; the evidence
   says so first when it is material. But for its own time, each call span less the time its
   called requests cover (:func:`own_time_calls`): where that swings materially and at least
   :data:`CALL_OWN_MIN_RATIO` of that covered time's swing, the call is the caller's own wait,
   ranked as any stage with the cause ``call``; when both swing, the other side is said too.
5. Stage -> cause by :func:`otel_stages.analysis.verdict.cause_for` (mechanism evidence first).
6. When the untraced time is a larger share of all request time than any stage
   (:func:`untraced_is_largest`), evidence and advice say that most time lies outside the stage
   spans and to instrument it; a ``stable`` verdict then never names a stage as the place to start.

When the input mix explains :data:`INPUT_MIX_DOMINATES` of the total's variance or more, the
evidence says so first, with the verdict within the largest cohort. Never raises.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

from otel_stages import semconv
from otel_stages.analysis import advice as advice_text
from otel_stages.analysis.calls import SIDE_AFTER, SIDE_BEFORE, left_out, own_side
from otel_stages.analysis.caveats import (
    before_caveat,
    clash_caveat,
    episode_caveat,
    misaligned_gpu_caveat,
    missing_spans_advice,
    offset_line,
    outlived_caveat,
    partial_stage_lines,
    sampled_caveat,
    services_caveat,
    set_apart_lines,
    together_caveat,
    untraced_advice,
    untraced_is_largest,
    untraced_is_skew,
    untraced_share_line,
    warm_up_advice,
    warm_up_call_clause,
    warmup_caveat,
)
from otel_stages.analysis.failures import failures_first, failures_lead
from otel_stages.analysis.figures import (
    COLD_UNTRACED,
    REASON_WARM_UP,
    SAME_INPUT,
    ColdFigures,
    Figures,
    Mechanism,
    StageFigures,
    TotalFigures,
)
from otel_stages.analysis.gpu import JUDGED_SLOW, LEVEL_NONE, LEVEL_THIN, utilization_level
from otel_stages.analysis.mechanisms import CAUSE_EVENT_LOOP_BLOCKED
from otel_stages.analysis.model import Call
from otel_stages.analysis.noise import (
    MIN_SWING_MS,
    SPIKE_MIN_FRACTION,
    SWING_MIN_FRACTION,
    NoiseBand,
    noise_band,
)
from otel_stages.analysis.phrases import band_line, centre, spread_text, total_text
from otel_stages.analysis.units import duration, pct, times_beside
from otel_stages.analysis.verdict import (
    CAUSE_CALL,
    CAUSE_COLD_START,
    CAUSE_GPU_BUSY,
    CAUSE_GPU_STARVED,
    CAUSE_STABLE,
    Verdict,
    cause_for,
)

#: Below this many warm requests there is no verdict at all: p5 / p95 of fewer runs are the
#: extremes themselves, and one odd run decides everything.
MIN_WARM_RUNS = 5
#: DESIGN.md: run a fixed input 20+ times; below this the verdict is tentative.
RECOMMENDED_WARM_RUNS = 20
#: A stage must carry at least this part of the total's swing (p95 - p5, or of its spike) to be
#: blamed: a stage that moves a quarter of what the total moves is a contributor, less is not.
STAGE_MIN_PART_OF_SWING = 0.25
#: The cold request is a cold start when its total is at least this multiple of its comparable warm
#: requests' median: model load / kernel compilation is typically 10x+, ordinary noise < 1.5x.
COLD_START_MIN_RATIO = 2.0
#: Another place of the cold request's extra time (a stage, or the untraced time) is named too,
#: with its advice after the first place's, when it holds at least this share of the extra time
#: (the sum of the places' positive extras): a lazily built client and a model load in one first
#: request are two fixes, and naming only the larger left 45 % of a tester's cold start unsaid.
COLD_SECOND_MIN_SHARE = 0.3
#: The places of the cold request's extra time under :data:`COLD_SECOND_MIN_SHARE` are said
#: together when together they hold that share or more (a tester's 46/27/27 named the 46 % only),
#: each holding at least this share by name, with its advice after the named places': a tenth of
#: a cold start is a fix worth naming; less is jitter beside it.
COLD_REST_MIN_NAMED_SHARE = 0.1
#: A cold start paid by fewer than this share of the cold requests compared (the others did not
#: stand out from their inputs' warm runs: ``cohorts.paid_min_ms``, ``ColdFigures.without_penalty``)
#: is tentative: it may be those processes' own (a host's cold disk cache, a one-off stall at
#: start) rather than what every start pays.
COLD_PAID_MIN_SHARE = 0.5
#: The cold request is compared with warm requests of its own input when at least this many exist;
#: a median of fewer is one or two runs. The same floor applies to setting requests apart.
COMPARABLE_MIN_REQUESTS = 5
#: The input mix dominates when cohorts explain at least this part of the total's variance.
INPUT_MIX_DOMINATES = 0.5
#: When the input mix dominates and the cohorts with a verdict of their own are all steady (stable,
#: or a cold start over steady warm runs), the swing over all inputs is the difference in work
#: between inputs, not instability: the verdict over all inputs only says where that work lands,
#: so it is tentative and the advice leads with comparing like with like. The steady cohorts must
#: hold at least this share of the warm requests with a known input: a steady largest cohort
#: among many unjudged small ones says little about the rest (a tester's: 62 steady requests
#: beside 50 uploads of 50 sizes whose decode stalled at random read as "each input is steady").
STEADY_INPUTS_MIN_SHARE = 0.8
#: A steady run's largest stage whose median is at least this part event-loop lag is mostly
#: waiting for a loop held by other work: the place to cut latency is what holds the loop.
LAG_DOMINATES_FRACTION = 0.5
#: A second material stage is a co-suspect when it explains at least this part of what the
#: suspect explains (its swing, where a source cannot know ``explains``): the ranking between two
#: such stages is within what another run could reverse, so evidence and advice name both.
CO_SUSPECT_MIN_RATIO = 0.8

#: A call's own time (each span less the time its called requests cover) is the caller's: where it
#: swings materially (rule 3 on its p5 -> p95) and at least this multiple of the covered time's
#: swing, the call is ranked as the caller's (cause ``call``), no longer left out as the callee's
#: (a tester's gateway whose HTTP client waited 200-240 ms for a pooled connection in every 4th
#: request, the worker steady, read "no single stage swings" with advice to report the steady
#: worker alone). Where the called requests swing more, the swing is theirs: the call stays out.
CALL_OWN_MIN_RATIO = 1.0

#: With ``--service``, the warm-up is the called service's when at least this share of the
#: requests set apart as warm-up waited in a call it left out for a called request that was cold
#: or set apart there (:func:`_warm_up_call`). Not all of them: each process's warm-up is looked
#: for in its own first ``cohorts.WARMUP_MAX_REQUESTS`` warm requests, so where the callee's
#: warm-up outlasts that window the caller's can reach a request or two past it (a called request
#: the callee keeps warm at its cap), and "every one" advised warming the caller's "model" up.
WARM_UP_CALL_MIN_SHARE = 0.75

UNACCOUNTED = "unaccounted"  #: name of the untraced-time candidate in rankings


@dataclass(frozen=True)
class _Candidate:
    name: str
    swing_ms: float
    spike_ms: float | None
    explains: float | None


def total_swings(total: TotalFigures | None, band: NoiseBand) -> bool | None:
    """Rule 2: does the total swing beyond noise? ``None`` when the total is unknown."""
    if total is None:
        return None
    if total.swing_ms > band.band_ms:
        return True
    spike = total.spike_ms
    return spike is not None and spike >= max(MIN_SWING_MS, SPIKE_MIN_FRACTION * band.reference_ms)


def is_material(
    swing_ms: float, spike_ms: float | None, total: TotalFigures | None, band: NoiseBand
) -> bool:
    """Rule 3 for one stage (or the unaccounted time). Without a total the stage must swing
    beyond the noise band itself (or spike)."""
    ref = band.reference_ms
    spike = spike_ms or 0.0
    if max(swing_ms, spike) < MIN_SWING_MS or ref <= 0:
        return False
    spiky = spike >= SPIKE_MIN_FRACTION * ref
    if total is None:
        return swing_ms > band.band_ms or spiky
    if not (swing_ms >= SWING_MIN_FRACTION * ref or spiky):
        return False
    parts = []
    if total.swing_ms > 0:
        parts.append(swing_ms / total.swing_ms)
    if spike_ms is not None and total.spike_ms:
        parts.append(spike_ms / total.spike_ms)
    return bool(parts) and max(parts) >= STAGE_MIN_PART_OF_SWING


def rank(candidates: Sequence[_Candidate]) -> list[_Candidate]:
    """Rule 4: by explained variance (then swing); by swing where any ``explains`` is unknown."""
    if all(c.explains is not None for c in candidates):
        return sorted(candidates, key=lambda c: (c.explains or 0.0, c.swing_ms), reverse=True)
    return sorted(candidates, key=lambda c: (c.swing_ms, c.spike_ms or 0.0), reverse=True)


def is_co_suspect(suspect: _Candidate, other: _Candidate) -> bool:
    """Whether ``other`` (ranked after ``suspect``, both material) explains, or where either's
    ``explains`` is unknown swings, at least :data:`CO_SUSPECT_MIN_RATIO` of ``suspect``'s."""
    if suspect.explains is not None and other.explains is not None:
        return suspect.explains > 0 and other.explains >= CO_SUSPECT_MIN_RATIO * suspect.explains
    return suspect.swing_ms > 0 and other.swing_ms >= CO_SUSPECT_MIN_RATIO * suspect.swing_ms


def spike_only(suspect: StageFigures, reference_ms: float) -> bool:
    """Whether ``suspect`` is material only by its spikes: its ``p95 - p5`` under
    ``SWING_MIN_FRACTION`` of the median request (``reference_ms``), with a spike recorded (the
    evidence then says it "spikes"). Its share of the variance then comes from a few runs."""
    return suspect.swing_ms < SWING_MIN_FRACTION * reference_ms and suspect.spike_ms is not None


def own_time_calls(fig: Figures, band: NoiseBand) -> set[str]:
    """The names of :attr:`Figures.calls` stages whose own time (:attr:`Call.own_swing_ms
    <otel_stages.analysis.calls.Call.own_swing_ms>`) swings materially (:func:`is_material`) and
    at least :data:`CALL_OWN_MIN_RATIO` of their called requests' swing: ranked as the caller's."""
    return {call.stage for call in fig.calls if owns_its_swing(call, fig, band)}


def owns_its_swing(call: Call, fig: Figures, band: NoiseBand) -> bool:
    """Whether ``call``'s own time swings materially and at least :data:`CALL_OWN_MIN_RATIO`
    of the time its called requests cover (one pair of services: two calls of one name, a
    chain's hops, are judged apart)."""
    own = call.own_swing_ms
    return (own is not None and is_material(own, None, fig.total, band)
            and own >= CALL_OWN_MIN_RATIO * (call.callee_swing_ms or 0.0))


def repeated_calls(fig: Figures, band: NoiseBand) -> set[str]:
    """The names of :attr:`Figures.calls` stages (not in :func:`own_time_calls`) that hold more
    called requests in some spans than in others (:attr:`Call.repeated
    <otel_stages.analysis.calls.Call.repeated>`: retries, one call per item) where the time they
    cover swings materially and each called request does not (:func:`is_material`): the count,
    the caller's doing, makes the swing, so the call is ranked as the caller's (cause ``call``)."""
    own = own_time_calls(fig, band)
    return {call.stage for call in fig.calls
            if call.stage not in own and repeats_its_swing(call, fig, band)}


def repeats_its_swing(call: Call, fig: Figures, band: NoiseBand) -> bool:
    """Whether ``call`` holds more called requests in some spans than in others and the time
    they cover swings materially while each called request does not (:func:`repeated_calls`)."""
    covered, each = call.callee_swing_ms, call.each_swing_ms
    return bool(call.repeated and covered is not None and each is not None
                and is_material(covered, None, fig.total, band)
                and not is_material(each, None, fig.total, band))


def verdict_band_ms(fig: Figures) -> float | None:
    """The noise band (ms) :func:`decide` judges ``fig`` against; ``None`` where it makes no
    verdict on the warm requests (fewer than :data:`MIN_WARM_RUNS`, no stages)."""
    if fig.warm_requests < MIN_WARM_RUNS or not fig.stages:
        return None
    return noise_band(fig.stages.values(), fig.reference_ms).band_ms


def decide(fig: Figures) -> Verdict:
    """Apply the rules (module docstring) to ``fig``. Never raises."""
    n = fig.warm_requests
    if n == 0 or not fig.stages:
        verdict = Verdict(None, None, ["no warm requests to compare"], [advice_text.MORE_RUNS])
        _cold_line(verdict, fig.cold, calls=fig.calls_left_out)
        failures_first(verdict, fig)
        return verdict
    if n < MIN_WARM_RUNS:
        verdict = Verdict(
            None, None,
            [f"not enough data: {n} warm request{'s' if n != 1 else ''}; a verdict needs at least"
             f" {MIN_WARM_RUNS}, a firm one {RECOMMENDED_WARM_RUNS}+"],
            [advice_text.more_runs(RECOMMENDED_WARM_RUNS - n)], tentative=True)
        _cold_line(verdict, fig.cold, calls=fig.calls_left_out)
        verdict.evidence.extend(set_apart_lines(fig.set_apart, fig.warmup))
        failures_first(verdict, fig)
        return verdict
    band = noise_band(fig.stages.values(), fig.reference_ms)
    swings = total_swings(fig.total, band)
    if swings is False:
        cold = fig.cold
        if cold is not None and _cold_claim(cold):
            verdict = _cold_verdict(fig, cold, band)
        else:
            verdict = _stable_verdict(fig, band)
    else:
        own = own_time_calls(fig, band) | repeated_calls(fig, band)
        calls = left_out(fig.calls) - own
        candidates = [
            _Candidate(s.name, s.swing_ms, s.spike_ms, s.explains)
            for s in fig.stages.values()
            if is_material(s.swing_ms, s.spike_ms, fig.total, band) and s.name not in calls
        ]
        gap = fig.unaccounted
        if gap is not None and is_material(gap.swing_ms, None, fig.total, band):
            candidates.append(_Candidate(UNACCOUNTED, gap.swing_ms, None, gap.explains))
        ranked = rank(candidates)
        if ranked and ranked[0].name == UNACCOUNTED:
            verdict = _untraced_verdict(fig, band)
        elif ranked:
            verdict = _warm_verdict(fig, ranked[0], ranked[1:], band)
        elif swings is None:
            verdict = _stable_verdict(fig, band)
        else:
            verdict = _spread_verdict(fig, band)
        # a call's time is its callee's requests' (read here too): said first, never a suspect
        repeated = repeated_calls(fig, band)
        verdict.evidence[:0] = [
            _call_line(fig, c, owns_its_swing(c, fig, band),
                       c.stage in repeated and repeats_its_swing(c, fig, band))
            for c in fig.calls
            if is_material(fig.stages[c.stage].swing_ms, fig.stages[c.stage].spike_ms, fig.total, band)]
        _call_other_sides(verdict, fig, band, own - repeated, repeated)
        _calls_left_out(verdict, fig, band)  # (before the caveats add their advice)
    _append_common(verdict, fig, band.band_ms)
    if swings is not False and not _mix_dominates(fig):  # else the inputs move the stages
        together_caveat(verdict, fig)
    # before the caveats that name the swing's place (inputs, processes): theirs lead
    _no_slow_forward_caveat(verdict, fig)
    if swings is not False:
        _steady_inputs_caveat(verdict, fig)
        _process_caveat(verdict, fig)
        episode_caveat(verdict, fig, explained=_mix_dominates(fig) or bool(
            fig.process_mix is not None and fig.process_mix.dominates))
    warmup_caveat(verdict, fig, _warm_up_call(fig))
    outlived_caveat(verdict, fig, band.band_ms)
    before_caveat(verdict, fig, band.band_ms)
    misaligned_gpu_caveat(verdict, fig)
    failures_first(verdict, fig, band.band_ms)
    clash_caveat(verdict, fig)
    services_caveat(verdict, fig)
    sampled_caveat(verdict, fig)  # first: what was read at all
    return verdict


#: The advice that leads a GPU verdict judged with no slow forward (:func:`_no_slow_forward_caveat`).
NO_SLOW_FORWARD = (
    "no forward stands out from the others beyond the noise band: record more requests (or a"
    " heavier load) before acting on the GPU's level, which here is how it runs every forward"
)


def _no_slow_forward_caveat(verdict: Verdict, fig: Figures) -> None:
    """Tentative, the reason first in the evidence and the advice, when a ``gpu_busy`` /
    ``gpu_starved`` verdict was judged on all forwards because none is slow (longer than the warm
    forward median plus the noise band: ``GpuEvidence.slow_forwards`` 0): the GPU's level in every
    forward is how the model runs, not why requests swing (a tester's healthy three-worker fleet,
    its total 0.3 ms past the band and the GPU 93 % busy in every forward, read as a firm "the GPU
    is saturated: add GPU capacity")."""
    gpu = fig.gpu
    if (verdict.cause not in (CAUSE_GPU_BUSY, CAUSE_GPU_STARVED) or gpu.judged_on == JUDGED_SLOW
            or gpu.slow_min_ms is None or gpu.slow_forwards):
        return
    if steady_inputs(fig) is not None:
        return  # the input mix explains the swing, and its caveat says so first
    verdict.tentative = True
    verdict.evidence.insert(0, (
        f"no forward is longer than {duration(gpu.slow_min_ms)} (the warm forward median plus the"
        " run's noise band): the forward's swing stays inside the noise band forward by forward,"
        " so the GPU's level in every forward says how the model runs, not why requests swing;"
        " the verdict is tentative"))
    verdict.advice.insert(0, NO_SLOW_FORWARD)


def steady_inputs(fig: Figures) -> tuple[int, int] | None:
    """``(steady, known)`` warm requests when the input mix dominates (``INPUT_MIX_DOMINATES``)
    and every listed cohort with a verdict of its own is steady (``stable``, or ``cold_start``:
    its warm runs are), those holding at least ``STEADY_INPUTS_MIN_SHARE`` of the ``known`` warm
    requests with a known input (:attr:`Figures.known_input_requests`); else ``None``."""
    mix = fig.input_mix_explains
    if mix is None or mix < INPUT_MIX_DOMINATES or len(fig.cohorts) < 2:
        return None
    judged = [c for c in fig.cohorts if c.verdict is not None]
    if not judged or any(c.verdict is not None and c.verdict.cause not in (CAUSE_STABLE, CAUSE_COLD_START)
                         for c in judged):
        return None
    steady = sum(c.requests for c in judged)
    listed = (fig.known_input_requests if fig.known_input_requests is not None
              else sum(c.requests for c in fig.cohorts))
    return (steady, listed) if steady >= STEADY_INPUTS_MIN_SHARE * listed else None


def _steady_inputs_caveat(verdict: Verdict, fig: Figures) -> None:
    """Tentative, the reason after the input mix line and the advice first, when the input mix
    explains the swing and each input is steady (:func:`steady_inputs`); the advice that asks
    whether inputs vary is dropped (the mix line says they do)."""
    found = steady_inputs(fig)
    if found is None or verdict.cause in (None, CAUSE_STABLE, CAUSE_COLD_START):
        return
    evidence = fig.stage_evidence.get(verdict.stage or "")
    if evidence is not None and evidence.follows_size:
        return  # the stage's own advice already says its cost follows the input's size
    steady, listed = found
    judged = sum(1 for c in fig.cohorts if c.verdict is not None)
    verdict.tentative = True
    at = 1 if verdict.evidence and verdict.evidence[0].startswith("the input mix explains") else 0
    verdict.evidence.insert(at, (
        f"each input is steady: the {judged} input cohort{'s' if judged != 1 else ''} with enough"
        f" requests for a verdict of {'their' if judged != 1 else 'its'} own ({steady} of the"
        f" {listed} warm requests with a known input) {'have' if judged != 1 else 'has'} steady warm"
        f" runs, so"
        f" the swing over all inputs is the difference in work between inputs, not instability;"
        f" the verdict below only says where that work lands, so it is tentative"))
    verdict.advice[:] = [advice_text.STEADY_INPUTS,
                         *(a for a in verdict.advice if a != advice_text.INPUTS_VARY)]


def _process_caveat(verdict: Verdict, fig: Figures) -> None:
    """Tentative, the reason first in the evidence and the advice, when the warm total's swing
    lies between processes (:mod:`otel_stages.analysis.process_mix`) and the input mix does not
    explain it (inputs routed per process: the input mix line says so)."""
    mix = fig.process_mix
    if mix is None or not mix.dominates or verdict.cause in (None, CAUSE_STABLE):
        return
    if fig.input_mix_explains is not None and fig.input_mix_explains >= INPUT_MIX_DOMINATES:
        return
    verdict.tentative = True
    verdict.evidence.insert(0, mix.describe())
    verdict.advice.insert(0, mix.advice())


# --- verdicts ------------------------------------------------------------------------------------


def _warm_verdict(fig: Figures, first: _Candidate, others: Sequence[_Candidate],
                  band: NoiseBand) -> Verdict:
    d = duration
    suspect = fig.stages[first.name]
    repeated = repeated_calls(fig, band)
    own = own_time_calls(fig, band) | repeated
    cause, advice, lines = _stage_cause(fig, suspect.name, own, repeated)
    ref = band.reference_ms
    if not spike_only(suspect, ref):
        head = f"{suspect.name} swings {d(suspect.swing_ms)}{spread_text(suspect)}"
    else:
        head = (f"{suspect.name} spikes: its farthest run lies {d(suspect.spike_ms)} from its median"
                f" {d(suspect.median_ms)}{spread_text(suspect)}")
    if suspect.explains is not None:
        head += (f" and explains {pct(suspect.explains)} of the variance of the request total"
                 f" ({total_text(fig)})")
    else:
        head += f" ({total_text(fig)})"
    head_lines = [head, f"{suspect.name} is {pct(suspect.share)} of all request time"
                        f" ({centre(suspect)})"]
    if fig.total is not None:
        head_lines.append(band_line(fig, band, True))
    staged = [o for o in others if o.name != UNACCOUNTED]
    co_suspect = staged[0] if staged and is_co_suspect(first, staged[0]) else None
    # a suspect that leads by a few far runs, another stage (or the untraced time) swinging more
    # (p5..p95: DESIGN "the one that swings more comes first"; a suspect material only by its
    # spikes always is), the total's own p5..p95 beyond the band: the two readings name two
    # places, both named, tentative
    body = max(others, key=lambda o: o.swing_ms, default=None)
    by_body = (co_suspect is None and body is not None and body.swing_ms > suspect.swing_ms
               and fig.total is not None and fig.total.swing_ms > band.band_ms
               and body.swing_ms >= SWING_MIN_FRACTION * ref)
    untraced_body = by_body and body is not None and body.name == UNACCOUNTED
    if by_body:
        assert body is not None
        co_suspect = None if untraced_body else body
        name = "the untraced time (outside every stage span)" if untraced_body else body.name
        also = f", explaining {pct(body.explains)}" if body.explains is not None else ""
        head_lines.append(
            f"{name} makes the body of the swing: its p5 -> p95 spans {d(body.swing_ms)}"
            f"{also}, where {suspect.name}'s spans {d(suspect.swing_ms)} and its part of the"
            " variance comes from a few runs far out; the two readings name two places, so the"
            " advice covers both and the verdict is tentative")
    elif co_suspect is not None:
        nxt = co_suspect
        also = f" and explains {pct(nxt.explains)}" if nxt.explains is not None else ""
        head_lines.append(
            f"{nxt.name} swings about as much: {d(nxt.swing_ms)}{also} (at least"
            f" {pct(CO_SUSPECT_MIN_RATIO)} of {suspect.name}'s); another run could rank them the"
            f" other way, so the advice covers both")
    elif staged:
        nxt = staged[0]
        also = f" and explains {pct(nxt.explains)}" if nxt.explains is not None else ""
        head_lines.append(f"next: {nxt.name} swings {d(nxt.swing_ms)}{also}")
    else:
        calls = left_out(fig.calls) - own  # (said apart: their swing is the suspect's)
        rest = [s for s in fig.stages.values() if s.name != suspect.name and s.name not in calls]
        if rest:
            widest = max(rest, key=lambda s: s.swing_ms)
            head_lines.append(f"no other stage swings materially: the widest, {widest.name}, by"
                              f" {d(widest.swing_ms)}")
    material = {o.name for o in others} | (left_out(fig.calls) - own)
    for s in fig.stages.values():
        if (s.name != suspect.name and s.name not in material and s.min_ms and s.max_ms is not None
                and s.max_ms >= 2 * s.min_ms):
            head_lines.append(f"{s.name} varies {s.max_ms / s.min_ms:.1f}x ({d(s.min_ms)} .."
                              f" {d(s.max_ms)}) but only by {d(s.max_ms - s.min_ms)}: too small to"
                              " explain the swing")
    lines = head_lines + lines
    if co_suspect is not None:
        _, co_advice, co_lines = _stage_cause(fig, co_suspect.name, own, repeated)
        lines.extend(f"{co_suspect.name}: {line}" for line in co_lines)
        advice = [f"{suspect.name}: {line}" for line in advice]
        advice.extend(f"{co_suspect.name}: {line}" for line in co_advice)
    if untraced_body:
        advice = [f"{suspect.name}: {line}" for line in advice] + [f"untraced time: {advice_text.UNTRACED}"]
    return Verdict(cause, suspect.name, lines, advice, tentative=by_body)


def _call_line(fig: Figures, call: Call, own: bool, repeated: bool = False) -> str:
    """Why the call stage ``call`` (material) is no suspect, or, named as a stage of the requests
    it calls, what its figures hold; ``own``: its own time swings (:func:`own_time_calls`);
    ``repeated``: how many calls it makes does (:func:`repeated_calls`)."""
    stage = fig.stages[call.stage]
    also = f" and explains {pct(stage.explains)}" if stage.explains is not None else ""
    service = call.service or "(no service.name)"
    whose = (f"other requests of {service}, its own service.name," if call.shared_name
             else f"{service}'s requests")
    held = f"({call.calls} of its {call.spans} spans hold one), which this report reads too"
    if repeated:
        return (f"{call.stage} is a call into {whose} {held}, and holds more of them in"
                f" {call.repeated} of its calls than in the others (retries, or one call per item):"
                f" the time they cover swings {duration(call.callee_swing_ms or 0.0)} with how many"
                f" calls it makes, each called request steady (it swings"
                f" {duration(call.each_swing_ms or 0.0)}), so {call.stage} is ranked as the"
                f" caller's ({call.stage} swings {duration(stage.swing_ms)}{also})")
    if own and call.own_p5_ms is not None and call.own_p95_ms is not None:
        d = duration
        callee = call.callee_swing_ms
        theirs = f", the time the called requests cover {d(callee)}" if callee is not None else ""
        return (f"{call.stage} is a call into {whose} {held}, but its own time outside them (each"
                f" {call.stage} span less the time its called requests cover: waiting for a"
                " connection, connecting, the network, the called server before its request starts,"
                " reading the response after it ends, or a call that reaches no request read here)"
                " swings"
                f" {d(call.own_p95_ms - call.own_p5_ms)} (p5 {d(call.own_p5_ms)} -> p95"
                f" {d(call.own_p95_ms)}){theirs}{_side_clause(call)}: the wait is the caller's,"
                f" so {call.stage} is"
                f" ranked as the caller's own time ({call.stage} swings {d(stage.swing_ms)}{also}"
                + (f", its figures pooling the calls and the called requests' own {call.stage}"
                   " spans)" if call.callee_stage else ")"))
    if call.callee_stage:
        return (f"{call.stage} spans are calls into {whose} {held}, and those requests have"
                f" {call.stage} spans of their own: {call.stage}'s figures pool both, the calls'"
                f" time being the callees' ({call.stage} swings {duration(stage.swing_ms)}{also})")
    return (f"{call.stage} is a call into {whose} {held}: its time is theirs, so it is not ranked"
            f" against their stages ({call.stage} swings {duration(stage.swing_ms)}{also})")


def _calls_left_out(verdict: Verdict, fig: Figures, band: NoiseBand) -> None:
    """With ``--service``, where the verdict's stage calls the requests of another service, which
    the pick left out (:attr:`Figures.calls_left_out`, read over every called request): said first
    in the evidence, with whose the swing is, and the advice in place of the cause's (run before
    the caveats add theirs). Where its own time outside the called requests swings
    (:func:`owns_its_swing`), the wait is the picked service's: cause ``call``, the advice on its
    own time (a connection pool, reading the response), as the pooled report says; else the
    called service's report (where its stages show) and the pooled one, not a custom stage's
    advice (nested spans, a standard stage's name) nor a model call's (a call named ``forward``
    read no GPU data here: the called service's points went with it). Testers' gateway reports
    advised naming its httpx ``POST`` spans ``forward``, and the worker's report for a swing that
    was the gateway's own pool wait."""
    call = _left_out_call(fig.calls_left_out, verdict.stage)
    if call is None:
        return
    d = duration
    others = "".join(f"; {c.service}'s in {c.calls} more" for c in fig.calls_left_out
                     if c.stage == call.stage and c is not call)
    held = (f"{call.stage} is a call into {call.service}'s requests ({call.calls} of its"
            f" {call.spans} spans hold one{others}), which --service leaves out of this report")
    # (a remainder of float sums is no swing: both reports say 0)
    own, callee = _no_remainder(call.own_swing_ms), _no_remainder(call.callee_swing_ms)
    owns = owns_its_swing(call, fig, band) and call.own_p5_ms is not None and call.own_p95_ms is not None
    if not owns and repeats_its_swing(call, fig, band):  # how many calls it makes: the caller's
        verdict.cause = CAUSE_CALL
        verdict.evidence.insert(0, (
            f"{held}, and holds more of them in {call.repeated} of its calls than in the others"
            f" (retries, or one call per item): the time they cover swings {d(callee or 0.0)} with"
            f" how many calls it makes, each called request steady (it swings"
            f" {d(_no_remainder(call.each_swing_ms) or 0.0)})"))
        _call_advice(verdict, fig, call.stage,
                     [advice_text.CALL_REPEATED.format(stage=call.stage, service=call.service)])
        return
    if owns:
        assert call.own_p5_ms is not None and call.own_p95_ms is not None
        theirs = f", the time the called requests cover {d(callee)}" if callee is not None else ""
        verdict.cause = CAUSE_CALL
        verdict.evidence.insert(0, (
            f"{held}, but its own time outside them swings {d(own or 0.0)}"
            f" (p5 {d(call.own_p5_ms)} -> p95 {d(call.own_p95_ms)}){theirs}{_side_clause(call)}:"
            f" the wait is {call.caller or 'this service'}'s own"))
        lines = [_call_own_advice(fig, call.stage, call)]
        if callee is not None and is_material(callee, None, fig.total, band):  # a second place
            lines.append(advice_text.left_out_call(call.stage, call.service))
        _call_advice(verdict, fig, call.stage, lines)
        return
    mix = _callees_differ(fig, call, band)
    if mix is not None:  # each callee steady, one slower than another: which one is the swing
        verdict.evidence.insert(0, held + mix[0])
        _call_advice(verdict, fig, call.stage, [mix[1]])
        return
    if own is not None and callee is not None:
        whose = (f": the time they cover swings {d(callee)}, its own time outside them {d(own)}, so"
                 " the swing is theirs")
        if is_material(own, None, fig.total, band):
            whose += ", the caller's wait a second place"
    else:
        whose = ": its time is theirs and the call's own, which this report cannot part"
    verdict.evidence.insert(0, held + whose)
    lines = [advice_text.left_out_call(call.stage, call.service)]
    if own is not None and is_material(own, None, fig.total, band):
        lines.append(_call_own_advice(fig, call.stage, call))
    _call_advice(verdict, fig, call.stage, lines)


def _call_advice(verdict: Verdict, fig: Figures, stage: str, lines: list[str]) -> None:
    """The advice on a call ``--service`` left out (``lines``) in place of the stage's; a
    co-suspect's lines (headed by its name, :func:`_warm_verdict`) stay, and the call's are then
    headed by ``stage`` too (a tester's: "decode swings about as much ... so the advice covers
    both" beside advice on the call alone)."""
    other = [a for a in verdict.advice
             if (head := a.split(": ", 1)[0]) != stage and head in fig.stages]
    verdict.advice[:] = [f"{stage}: {line}" for line in lines] + other if other else lines


def _callees_differ(fig: Figures, call: Call, band: NoiseBand) -> tuple[str, str] | None:
    """``(clause, advice)`` where ``call``'s stage calls the requests of several services left out,
    the time each one's cover swings less than a material swing (:func:`is_material`) but the
    lowest p5 to the highest p95 across them does: the stage's swing is which service a request
    calls (a tester's gateway sending a tenth of its calls to a slower model was told its steady
    main worker held a 250 ms swing). ``None`` otherwise."""
    mates = [c for c in fig.calls_left_out if c.stage == call.stage]
    ranges = [(c.callee_p5_ms, c.callee_p95_ms, c) for c in mates
              if c.callee_p5_ms is not None and c.callee_p95_ms is not None]
    if len(ranges) < 2 or any(is_material(hi - lo, None, fig.total, band) for lo, hi, _ in ranges):
        return None
    low, high = min(lo for lo, _, _ in ranges), max(hi for _, hi, _ in ranges)
    if not is_material(high - low, None, fig.total, band):
        return None
    d = duration
    each = "; ".join(f"{c.service}'s {d(lo)} .. {d(hi)}" for lo, hi, c in sorted(ranges, key=lambda r: r[0]))
    slower = max(ranges, key=lambda r: (r[1], r[2].service))[2].service
    clause = (f": each service's requests are steady there (the time they cover, p5 .. p95: {each}),"
              f" so {call.stage}'s swing is which of them a request calls, not a swing inside one")
    return clause, advice_text.calls_differ(call.stage, slower, sorted(c.service for _, _, c in ranges))


def _left_out_call(calls: Sequence[Call], stage: str | None) -> Call | None:
    """The call ``--service`` left out under ``stage``; where that stage calls the requests of
    several services (a gateway's POST to two workers), the one whose covered time swings most,
    then the one most spans call (a tester's: the first found, the steady one, was said to hold
    the swing of the other)."""
    return max((c for c in calls if c.stage == stage), default=None,
               key=lambda c: (c.callee_swing_ms or 0.0, c.calls, c.service))


def _no_remainder(ms: float | None) -> float | None:
    """``ms`` rounded to the ns (a float sum's remainder, 1e-14 ms, is 0 as the SQL's integers)."""
    return None if ms is None else round(ms, 6)


def _call_other_sides(verdict: Verdict, fig: Figures, band: NoiseBand, own: set[str],
                      repeated: set[str]) -> None:
    """A call's other side when both swing materially (:func:`is_material`): where the call is
    ranked as the caller's wait (``own``), its called requests' swing, with the advice to report
    them alone; where it is left out as theirs, its own time's, with the advice on the caller's
    wait. Neither half of a split swing goes unsaid. A call that holds more called requests in
    some spans than in others (:attr:`Call.repeated <otel_stages.analysis.calls.Call.repeated>`)
    whose covered time swings: the count is said, with its advice (first when no stage is named)."""
    d = duration
    for call in fig.calls:
        own_swing, callee_swing = call.own_swing_ms, call.callee_swing_ms
        if own_swing is None or callee_swing is None:
            continue
        service = call.service or "(no service.name)"
        if call.stage in repeated and repeats_its_swing(call, fig, band):
            continue  # (the call's line says it)
        if call.repeated and is_material(callee_swing, None, fig.total, band):
            verdict.evidence.append(
                f"{call.stage} holds more of {service}'s requests in {call.repeated} of its calls"
                f" than in the others (retries, or one call per item): the time they cover, which"
                f" swings {d(callee_swing)}, grows with how many calls it makes")
            line = advice_text.CALL_REPEATED.format(stage=call.stage, service=service)
            if verdict.stage is None:  # (the count, not a stage, makes this swing)
                verdict.advice.insert(0, line)
            else:
                verdict.advice.append(line)
        ranked = call.stage in own and owns_its_swing(call, fig, band)
        if ranked and is_material(callee_swing, None, fig.total, band):
            verdict.evidence.append(
                f"the requests {call.stage} calls ({service}'s) swing too: the time they cover in"
                f" each call swings {d(callee_swing)}, beside the calls' own {d(own_swing)}")
            verdict.advice.append(
                f"{call.stage}'s called requests swing as well: report them alone too"
                f" (otel-stages report ... --service {service})")
        elif not ranked and call.stage not in _callee_stage_calls(fig) and is_material(
                own_swing, None, fig.total, band):
            verdict.evidence.append(
                f"{call.stage}'s own time outside the requests it calls swings {d(own_swing)} too"
                f" (p5 {d(call.own_p5_ms or 0.0)} -> p95 {d(call.own_p95_ms or 0.0)}), less than"
                f" the {d(callee_swing)} of the time they cover: the caller's wait is a second place")
            verdict.advice.append(_call_own_advice(fig, call.stage, call))


def _call_own_advice(fig: Figures, stage: str, call: Call | None = None) -> str:
    """The advice on ``stage``'s own time (``call``: the call it is about, else the one of that
    name with the most calls): where it swings when one side does (:func:`~otel_stages.analysis
    .calls.own_side`), else every place it may wait."""
    call = call or next((c for c in fig.calls if c.stage == stage), None)
    side = None if call is None else own_side(call)
    text = {SIDE_BEFORE: advice_text.CALL_OWN_BEFORE, SIDE_AFTER: advice_text.CALL_OWN_AFTER}.get(
        side or "", advice_text.CALL_OWN)
    return text.format(stage=stage)


def _side_clause(call: Call) -> str:
    """Where the call's own time swings, for its evidence line ('' when neither side alone)."""
    side = own_side(call)
    if side is None:
        return ""
    p5, p95 = ((call.before_p5_ms, call.before_p95_ms) if side == SIDE_BEFORE
               else (call.after_p5_ms, call.after_p95_ms))
    where = "before the called requests start" if side == SIDE_BEFORE else "after they end"
    return f"; it swings {where} (p5 {duration(p5 or 0.0)} -> p95 {duration(p95 or 0.0)})"


def _callee_stage_calls(fig: Figures) -> set[str]:
    """The call names that are also stages of the requests they call (:attr:`Call.callee_stage
    <otel_stages.analysis.calls.Call.callee_stage>`): ranked with them, never left out."""
    return {c.stage for c in fig.calls if c.callee_stage}


def _queue_lines(fig: Figures) -> list[str]:
    """The evidence the queue advice (:func:`otel_stages.analysis.advice.for_queue`) rests on:
    the batches' fill against the requests' wait, and the GPU during forward."""
    lines = []
    if fig.batch_fill_ms is not None and fig.batch_wait_ms is not None:
        tail = waited = ""
        if fig.batch_fill_p95_ms is not None and fig.batch_wait_p95_ms is not None:
            tail = f" (p95 {duration(fig.batch_fill_p95_ms)})"
            waited = f" (p95 {duration(fig.batch_wait_p95_ms)})"
        lines.append(f"batches filled in {duration(fig.batch_fill_ms)} median{tail} (from the first"
                     " enqueue, or from when the executor was free), requests waited"
                     f" {duration(fig.batch_wait_ms)} median{waited} from enqueue to pickup")
    lines.append(fig.gpu.describe())
    return lines


def _stage_cause(fig: Figures, name: str, own_calls: Container[str] = (),
                 repeated: Container[str] = ()) -> tuple[str | None, list[str], list[str]]:
    """Stage ``name``'s cause, advice and evidence lines (GPU, stage evidence, mechanism); a call
    in ``own_calls`` (:func:`own_time_calls`: its own time swings; :func:`repeated_calls`, in
    ``repeated`` too: how many calls it makes) is the caller's, its figures said in the call's
    line."""
    if name in repeated:
        service = next((c.service for c in fig.calls if c.stage == name), "")
        return CAUSE_CALL, [advice_text.CALL_REPEATED.format(stage=name, service=service)], []
    if name in own_calls:
        return CAUSE_CALL, [_call_own_advice(fig, name)], []
    evidence = fig.stage_evidence.get(name)
    cause, mechanism = cause_for(name, fig.gpu, evidence.mechanisms if evidence else ())
    lines: list[str] = []
    if name == semconv.STAGE_FORWARD:
        lines.append(fig.gpu.describe())
    if evidence is not None:
        lines.extend(evidence.lines)
    if mechanism is not None:
        lines.extend(mechanism.evidence)
        return cause, list(mechanism.advice), lines
    if cause == "queue":  # what the requests wait for, and the GPU's headroom, choose the advice
        lines.extend(_queue_lines(fig))
        gpu = fig.gpu  # headroom is the GPU's over all forwards, not the slow ones'
        overall = (gpu.level if gpu.level == LEVEL_NONE or gpu.misaligned_processes else
                   utilization_level(gpu.mean_utilization, gpu.samples, gpu.forwards_covered, gpu.forwards))
        words = ("" if gpu.mean_utilization is None else
                 f"{gpu.mean_utilization:.0%} mean over all {gpu.forwards} warm forwards")
        return cause, advice_text.for_queue(overall, words, fig.batch_fill_ms, fig.batch_wait_ms,
                                            fig.batch_fill_p95_ms, fig.batch_wait_p95_ms), lines
    advice = advice_text.for_cause(
        cause,
        follows_size=evidence.follows_size if evidence else None,
        one_size=evidence.one_size if evidence else False,
        bytes_only=evidence.bytes_only if evidence else False,
        gpu_level=fig.gpu.level,
        preprocess=evidence.preprocess if evidence else None,
        gpu_slow=fig.gpu.judged_on == JUDGED_SLOW,
        gpu_unidentified=fig.gpu.level == LEVEL_THIN and fig.gpu.unidentified_processes > 0,
        gpu_unread=fig.gpu.unread_forwards > 0,  # set only when the GPU evidence makes no call
        gpu_misaligned=fig.gpu.misaligned_processes > 0,
    )
    # first, what an unconfirmed mechanism's evidence points at (a blocked stage): no sentence in
    # the evidence is left without its advice
    pointed = [a for m in (evidence.mechanisms if evidence else ()) if not m.confirmed
               for a in m.advice]
    return cause, advice_text.with_one_input(pointed + advice, one_input(fig)), lines


def one_input(fig: Figures) -> str | None:
    """The input cohort's key when every warm request had that one known input (``fig.cohorts``
    holds one cohort of all of them), else ``None``."""
    if len(fig.cohorts) != 1 or fig.cohorts[0].requests != fig.warm_requests:
        return None
    known = fig.known_input_requests
    return fig.cohorts[0].key if known is None or known == fig.warm_requests else None


def _untraced_verdict(fig: Figures, band: NoiseBand) -> Verdict:
    gap = fig.unaccounted
    assert gap is not None and fig.total is not None
    explains = f" and explains {pct(gap.explains)} of its variance" if gap.explains is not None else ""
    lines = [
        f"request total swings {duration(fig.total.swing_ms)}{spread_text(fig.total)} but the time"
        f" outside the stage spans swings {duration(gap.swing_ms)}{explains}: the swing is outside"
        f" the stage spans (untraced time: median {duration(gap.median_ms)},"
        f" {pct(gap.share)} of all request time)",
        band_line(fig, band, True),
    ]
    if untraced_is_skew(fig):
        lines.append(untraced_share_line(fig))
        return Verdict(None, None, lines, [advice_text.SYNC_CLOCKS])
    missing = missing_spans_advice(fig)
    blocked = loop_blocked(fig)
    if blocked is not None:
        # asyncio: a coroutine resumes after each await only when the loop is free, so the time
        # between stages waits for a blocked loop as the stages do
        holder, mechanism = blocked
        lines.append(
            f"the event loop was blocked: {mechanism.evidence[0]}; in an asyncio service the time"
            " between stages (after each await) waits for that loop too, so the untraced swing is"
            " most likely the same wait; tentative: the untraced time carries no lag of its own")
        lines.extend(mechanism.evidence[1:])
        return Verdict(CAUSE_EVENT_LOOP_BLOCKED, holder, lines,
                       [*mechanism.advice, "also: " + (missing or advice_text.UNTRACED)],
                       tentative=True)
    return Verdict(None, None, lines, [missing] if missing else [advice_text.UNTRACED])


def loop_blocked(fig: Figures) -> tuple[str, Mechanism] | None:
    """``(stage, mechanism)`` when a stage's confirmed ``event_loop_blocked`` mechanism shows the
    loop was held by other work: the stage that held it most (``StageEvidence.loop_holder``, else
    the lagging stage itself) and that mechanism; ``None`` otherwise."""
    for name, evidence in fig.stage_evidence.items():
        for mechanism in evidence.mechanisms:
            if mechanism.confirmed and mechanism.cause == CAUSE_EVENT_LOOP_BLOCKED:
                return evidence.loop_holder or name, mechanism
    return None


def _spread_verdict(fig: Figures, band: NoiseBand) -> Verdict:
    widest = sorted(fig.stages.values(), key=lambda s: s.swing_ms, reverse=True)[:3]
    parts = "; ".join(
        f"{s.name} {duration(s.swing_ms)}"
        + (f" (explains {pct(s.explains)})" if s.explains is not None else "")
        for s in widest
    )
    lines = [
        band_line(fig, band, True),
        f"but no single stage swings materially (at least {pct(SWING_MIN_FRACTION)} of the median"
        f" request and {pct(STAGE_MIN_PART_OF_SWING)} of the total's swing): widest {parts}",
    ]
    return Verdict(None, None, lines, [advice_text.SPREAD])


def _stable_verdict(fig: Figures, band: NoiseBand) -> Verdict:
    largest = max(fig.stages.values(), key=lambda s: s.share)
    lines = []
    if fig.total is not None:
        lines.append(band_line(fig, band, False))
    else:
        lines.append(f"no stage swings beyond the {band.describe()}")
    if untraced_is_largest(fig):
        lines.append(untraced_share_line(fig))
        return Verdict(CAUSE_STABLE, None, lines, advice_text.for_stable_untraced(untraced_advice(fig)))
    lines.append(f"largest share: {largest.name} at {pct(largest.share)} of all request time"
                 f" ({centre(largest)})")
    evidence = fig.stage_evidence.get(largest.name)
    lag = evidence.lag_median_ms if evidence else None
    if lag is not None and lag >= LAG_DOMINATES_FRACTION * largest.median_ms > 0:
        holder = evidence.loop_holder if evidence else None
        held = f", held most by {holder}" if holder and holder != largest.name else ""
        lines.append(f"{largest.name} is mostly waiting for the event loop: median lag"
                     f" {duration(lag)} of its median {duration(largest.median_ms)} (the loop was"
                     f" busy with other work{held})")
        return Verdict(CAUSE_STABLE, None, lines, advice_text.for_stable_loop(
            holder if holder and holder != largest.name else None))
    return Verdict(CAUSE_STABLE, None, lines, advice_text.for_stable(largest.name))


def _cold_places_ms(cold: ColdFigures) -> Mapping[str, float]:
    """The cold requests' time per place the places are judged on: the means over several cold
    requests (their medians hide one process's model load among three whose extra time lies
    elsewhere), the figures themselves for one (or without means)."""
    return cold.stages_mean_ms if cold.count > 1 and cold.stages_mean_ms else cold.stages_ms


def _cold_excess(cold: ColdFigures) -> tuple[str | None, dict[str, float]]:
    """Where the cold request spent the most extra time (``None`` without stage figures): a
    stage, or :data:`~otel_stages.analysis.figures.COLD_UNTRACED` (outside every stage span: setup
    done lazily in the first request); and each one's extra ms over comparable warm requests
    (ties: the stage); over several cold requests, their mean time per place
    (:func:`_cold_places_ms`)."""
    excess = {name: ms - cold.comparable_stages_ms.get(name, 0.0)
              for name, ms in _cold_places_ms(cold).items()}
    order = [n for n in excess if n != COLD_UNTRACED] + [n for n in excess if n == COLD_UNTRACED]
    return (max(order, key=lambda k: excess[k]) if excess else None), excess


def _cold_place(name: str) -> str:
    """How the evidence names a stage, or the untraced time, of the cold request."""
    return "the time outside every stage span" if name == COLD_UNTRACED else name


def _cold_verdict(fig: Figures, cold: ColdFigures, band: NoiseBand) -> Verdict:
    stage, excess = _cold_excess(cold)
    lines = [band_line(fig, band, False).replace("request total swings", "warm runs are steady:"
                                                   " request total swings", 1)
             if fig.total is not None else "warm runs are steady"]
    extra = sum(ms for ms in excess.values() if ms > 0)
    places = [] if stage is None else [stage]
    rest: list[str] = []
    if stage is not None and extra > 0:
        # every place of 0.3 or more (three at most: 38/31/31), the larger first
        order = sorted((n for n in excess if n != stage and excess[n] > 0),
                       key=lambda n: (-excess[n], n == COLD_UNTRACED, n))
        places += [n for n in order if excess[n] >= COLD_SECOND_MIN_SHARE * extra]
        rest = [n for n in order if n not in places]
    spread = sum(excess[n] for n in rest)
    spread_said = bool(rest) and spread >= COLD_SECOND_MIN_SHARE * extra  # (46/27/27: most unsaid)
    shares = len(places) > 1 or spread_said
    took = _cold_places_ms(cold)
    where = ("in the cold request" if took is cold.stages_ms else
             f"on average over the {cold.count} cold requests")
    for place in places:
        share = f" ({pct(excess[place] / extra)})" if shares else ""
        median = (f" (median {duration(cold.stages_ms[place])})"
                  if took is not cold.stages_ms and place in cold.stages_ms else "")
        lines.append(
            f"{_cold_place(place)} took {duration(took[place])} {where}{median} vs"
            f" {duration(cold.comparable_stages_ms.get(place, 0.0))} in comparable warm requests:"
            f" {duration(excess[place])} of the extra time{share}")
    listed = [n for n in rest if excess[n] >= COLD_REST_MIN_NAMED_SHARE * extra] if spread_said else []
    if spread_said:
        each = ", ".join(f"{_cold_place(n)} {duration(excess[n])} ({pct(excess[n] / extra)})"
                         for n in listed)
        more = len(rest) - len(listed)
        under = (f"{', and ' if listed else ''}{more} more under {pct(COLD_REST_MIN_NAMED_SHARE)}"
                 if more else "")
        lines.append(f"the other {pct(spread / extra)} of the extra time is spread over {len(rest)}"
                     f" place{'s' if len(rest) > 1 else ''}, each under {pct(COLD_SECOND_MIN_SHARE)}:"
                     f" {each}{under}")
    advice = advice_text.for_cold_start(stage)
    call = _cold_call(cold, fig.calls_left_out)
    if call is not None:  # (the place's own line said where; this says whose)
        lines.append(f"{call[0]} is a call into {_whose(call[1])} requests, which --service leaves"
                     f" out of this report, so the cold start is {_whose(call[1])}")
        advice = [advice_text.cold_in_call(*call)]
    at = 1
    for place in [*places[1:], *listed]:  # each place's first line, in order, after the first's
        then = advice_text.for_cold_start(place)[0]
        if then not in advice:
            advice.insert(at, then)
            at += 1
    named = None if stage == COLD_UNTRACED else stage
    return Verdict(CAUSE_COLD_START, named, lines, advice)


# --- lines every verdict gets ---------------------------------------------------------------------


#: What marks a later request of a process cold (:func:`otel_stages.analysis.requests.group_spans`:
#: the attribute where the process's requests carry it, else seq 1 of nested worker spans).
_MARKS = f"{semconv.REQUEST_COLD_START} or {semconv.REQUEST_SEQ} 1"


def _cold_sentence(cold: ColdFigures) -> str:
    of = f" of the {cold.count + cold.without_penalty}" if cold.without_penalty else ""
    if cold.count == 1 and not of:
        who = ("first request of the process" if cold.first_of_process
               else f"the request marked cold by {_MARKS} (not the first of its process)")
    elif cold.count == 1:
        who = f"1{of} cold requests"
    else:
        who = f"{cold.count}{of} cold requests (median)"
        if not cold.first_of_process:
            who += f", some marked cold by {_MARKS} later in their process,"
    # a cold request that failed after paying the cold start (cohorts.failed_cold_paid)
    took, failed = "took", ""
    if cold.failed and cold.count == 1:
        took = "ended with an error after"
        failed = "; its times run until the failure, so its cold start took at least this long"
    elif cold.failed:
        failed = (f"; {cold.failed} of them ended with an error after paying the cold start: their"
                  " times run until the failure")
    ratio = cold.ratio
    if ratio is None:
        return f"{who} {took} {duration(cold.total_ms)}; no warm request to compare it with{failed}"
    if cold.compared_with == SAME_INPUT:
        against = (f"the median of the {cold.comparable_requests} warm requests with the same input"
                   + (f" ({cold.cohort}, " if cold.cohort else "s as theirs (")
                   + f"{duration(cold.comparable_median_total_ms)})")
    elif not cold.input_known:
        against = (f"the median of all {cold.comparable_requests} warm requests"
                   f" ({duration(cold.comparable_median_total_ms)}; its input is unknown: no usable"
                   " image size (image.width and image.height above 0) or prompt length recorded)")
    else:
        against = (f"the median of all {cold.comparable_requests} warm requests"
                   f" ({duration(cold.comparable_median_total_ms)}; fewer than"
                   f" {COMPARABLE_MIN_REQUESTS} share its input)")
    left_out = (f" ({cold.left_out} more, whose input is unknown or shared by fewer than"
                f" {COMPARABLE_MIN_REQUESTS} warm requests, left out of the comparison)"
                if cold.left_out else "")
    others = cold.without_penalty
    unpaid = (f"; the other {others} cold request{'s' if others != 1 else ''} stood within the warm"
              " runs of their input (under their p95 plus their median): no cold-start penalty there"
              if others else "")
    return (f"{who} {took} {duration(cold.total_ms)}, {cold_times(ratio)} {against}{left_out}; reported apart"
            f" from warm runs{unpaid}{failed}")


def cold_times(ratio: float) -> str:
    """The cold request's ratio to its comparable warm median, ``12.3x``, as printed beside the
    cold-start verdict it was compared for (:func:`~otel_stages.analysis.units.times_beside`
    against :data:`COLD_START_MIN_RATIO`): 1.999x, no cold start, never prints as 2.00x."""
    return times_beside(ratio, COLD_START_MIN_RATIO)


def few_paid(cold: ColdFigures) -> bool:
    """Whether fewer than :data:`COLD_PAID_MIN_SHARE` of the cold requests compared paid the cold
    start the figures show (``ColdFigures.without_penalty``): then it is claimed tentatively."""
    return bool(cold.without_penalty) and (
        cold.count < COLD_PAID_MIN_SHARE * (cold.count + cold.without_penalty))


def _few_paid_line(cold: ColdFigures) -> str:
    n = cold.count + cold.without_penalty
    whose = "its process's" if cold.count == 1 else "their processes'"
    return (f"only {cold.count} of the {n} cold requests paid a cold start: it may be {whose} own"
            " (a host's cold disk cache, a stall at start or at a reload) rather than what every"
            " start pays, so this is tentative")


def _cold_claim(cold: ColdFigures) -> bool:
    """Whether the cold request is called a cold start: ``COLD_START_MIN_RATIO`` times the warm
    requests it is compared with, and those had its input (``SAME_INPUT``) or its input is
    unknown (nothing tells them apart). A known input that fewer than ``COMPARABLE_MIN_REQUESTS``
    warm requests share (another image size, prompt or output length: a first request that
    generated 512 tokens among shorter ones) is not comparable."""
    if cold.ratio is None or cold.ratio < COLD_START_MIN_RATIO:
        return False
    return cold.compared_with == SAME_INPUT or not cold.input_known


def _cold_failed_clause(fig: Figures) -> str:
    """Where some failed requests are in the cold figures (:attr:`ColdFigures.failed`: cold ones
    that failed after paying the cold start), the failures' line says so: they are left out of
    the warm statistics but not out of the report."""
    cold = fig.cold.failed if fig.cold is not None else 0
    if not cold:
        return ""
    if cold == fig.failed_requests == 1:
        return " (the cold one above: in the cold figures only)"
    if cold == fig.failed_requests:
        return " (the cold ones above: in the cold figures only)"
    return (f" ({cold} of them the cold one{'s' if cold != 1 else ''} above: in the cold figures"
            " only)")


def _warm_up_call(fig: Figures) -> tuple[str, list[str]] | None:
    """``(stage, services)``: the call ``--service`` left out (:attr:`Figures.calls_left_out`)
    whose spans, in at least :data:`WARM_UP_CALL_MIN_SHARE` of the requests set apart here as
    warm-up, held a called request that was cold or set apart there (:attr:`Call.unsteady_traces
    <otel_stages.analysis.model.Call.unsteady_traces>`, over every service the stage calls: a
    POST into three workers in turn pays each worker's cold start in a request of its own), and
    the services whose called requests those were (sorted); of several stages, the one holding
    the most such requests. The warm-up is theirs (a tester's gateway report advised warming "the
    model" up with 2 dummy requests, the worker's warm-up paid inside its POST)."""
    traces = {a.trace_id for a in fig.set_apart if a.reason == REASON_WARM_UP}
    if fig.warmup is None or not traces:
        return None
    by_stage: dict[str, list[Call]] = {}
    for c in fig.calls_left_out:
        by_stage.setdefault(c.stage, []).append(c)
    best: tuple[int, str, list[str]] | None = None
    for stage, calls in by_stage.items():
        held = traces & {t for c in calls for t in c.unsteady_traces}
        services = sorted({c.service for c in calls if traces & set(c.unsteady_traces)})
        if len(held) >= WARM_UP_CALL_MIN_SHARE * len(traces) and (best is None or len(held) > best[0]):
            best = (len(held), stage, services)
    return (best[1], best[2]) if best is not None else None


def _cold_call(cold: ColdFigures, calls: Sequence[Call]) -> tuple[str, list[str]] | None:
    """``(stage, services)``: the stage holding most of the cold requests' extra time
    (:func:`_cold_excess`) where it is a call ``--service`` left out (:attr:`Figures.calls_left_out`),
    and the services it calls (sorted; several where it calls several: the figures do not say
    which one the cold request called). The gateway's first request paid the worker's cold start
    inside its call: the worker's cold start, not the gateway's."""
    stage = _cold_excess(cold)[0]
    services = sorted({c.service for c in calls if c.stage == stage})
    return (stage, services) if stage is not None and services else None


def _whose(services: Sequence[str]) -> str:
    """``a's`` / ``a's or b's``: whose cold start it is."""
    return " or ".join(f"{s}'s" for s in services)


def _cold_call_clause(call: tuple[str, list[str]]) -> str:
    stage, services = call
    return (f", in {stage}: a call into {_whose(services)} requests, which --service leaves out,"
            f" so the cold start is {_whose(services)}")


def _cold_line(verdict: Verdict, cold: ColdFigures | None, *, others_apart: bool = False,
               calls: Sequence[Call] = ()) -> None:
    if cold is None:
        return
    line = _cold_sentence(cold)
    if verdict.cause == CAUSE_COLD_START:
        verdict.evidence.insert(0, line)
        if few_paid(cold):
            verdict.tentative = True
            verdict.evidence.insert(1, _few_paid_line(cold))
    elif cold.ratio is not None and cold.ratio >= COLD_START_MIN_RATIO and not _cold_claim(cold):
        verdict.evidence.append(line + "; not comparable (its input differs), so not called a"
                                " cold start")
    elif _cold_claim(cold):
        call = _cold_call(cold, calls)
        verdict.evidence.append(line + (", and a cold start too" if not few_paid(cold) else
                                         f", and a cold start too in {cold.count} of the"
                                         f" {cold.count + cold.without_penalty}")
                                + (_cold_call_clause(call) if call is not None else ""))
        verdict.advice.append("also: " + (
            advice_text.cold_in_call(*call) if call is not None
            else advice_text.for_cold_start(_cold_excess(cold)[0])[0]))
    elif verdict.cause == CAUSE_STABLE:
        on = " on that request (others are set apart below)" if others_apart else ""
        verdict.evidence.append(f"no cold-start penalty{on}: {line}")
    else:
        verdict.evidence.append(line)
    if cold.failed and _cold_claim(cold):  # (the figures hold only cold requests that paid it)
        verdict.advice.insert(0 if verdict.cause == CAUSE_COLD_START else len(verdict.advice),
                              advice_text.COLD_FAILED if verdict.cause == CAUSE_COLD_START
                              else "also: " + advice_text.COLD_FAILED)


def _mix_dominates(fig: Figures) -> bool:
    """The input cohorts explain :data:`INPUT_MIX_DOMINATES` of the total's variance or more."""
    return fig.input_mix_explains is not None and fig.input_mix_explains >= INPUT_MIX_DOMINATES


def _mix_line(fig: Figures) -> str | None:
    mix = fig.input_mix_explains
    if mix is None or len(fig.cohorts) < 2:
        return None
    parts = "; ".join(f"{c.key}: {c.requests} requests, median {duration(c.median_total_ms)}"
                      for c in fig.cohorts[:4])
    more = f"; and {len(fig.cohorts) - 4} more" if len(fig.cohorts) > 4 else ""
    line = (f"the input mix explains {pct(mix)} of the variance of the request total"
            f" ({len(fig.cohorts)} input cohorts: {parts}{more})")
    if mix < INPUT_MIX_DOMINATES:
        return line
    largest = fig.cohorts[0]
    if largest.verdict is None:
        within = f"the largest cohort, {largest.key}, has too few requests for a verdict of its own"
    else:
        v = largest.verdict
        label = f"{v.cause} ({v.stage})" if v.stage else str(v.cause or "no verdict")
        within = f"within the largest cohort, {largest.key}, the verdict is {label}"
    return (f"{line}: compare like with like; {within}; the verdict below is over all inputs")


def _append_common(verdict: Verdict, fig: Figures, band_ms: float) -> None:
    if verdict.cause not in (None, CAUSE_STABLE) and untraced_is_largest(fig):
        verdict.evidence.append(untraced_share_line(fig))
        verdict.advice.append("also: " + untraced_advice(fig))
    mix = _mix_line(fig)
    if mix is not None:
        if fig.input_mix_explains is not None and fig.input_mix_explains >= INPUT_MIX_DOMINATES:
            verdict.evidence.insert(0, mix)
        else:
            verdict.evidence.append(mix)
    _cold_line(verdict, fig.cold, others_apart=bool(fig.set_apart), calls=fig.calls_left_out)
    apart = set_apart_lines(fig.set_apart, fig.warmup)
    call = _warm_up_call(fig)
    if call is not None and apart:  # (the warm-up's line is the first)
        apart[0] += warm_up_call_clause(*call)
    verdict.evidence.extend(apart)
    for reason in dict.fromkeys(a.reason for a in fig.set_apart):
        if reason == REASON_WARM_UP and fig.warmup is not None and call is not None:
            verdict.advice.append("also: " + advice_text.warm_up_in_call(
                call[0], call[1], fig.warmup.longest_requests, fig.warmup.longest_ended))
        elif reason == REASON_WARM_UP and fig.warmup is not None:
            warm_up_advice(verdict, fig.warmup)  # as many requests as it lasted
        else:
            verdict.advice.append("also: " + advice_text.WARM_UP_AGAIN[reason])
    verdict.evidence.extend(partial_stage_lines(fig))
    offsets = offset_line(fig)
    if offsets is not None:
        verdict.evidence.append(offsets)
    n = fig.warm_requests
    if n < RECOMMENDED_WARM_RUNS:
        verdict.tentative = True
        missing = RECOMMENDED_WARM_RUNS - n
        verdict.evidence.append(
            f"only {n} warm request{'s' if n != 1 else ''}: this verdict is tentative; run the same"
            f" input {missing} more time{'s' if missing != 1 else ''} ({RECOMMENDED_WARM_RUNS}+ in"
            " all) for a firm one")
        verdict.advice.insert(0, advice_text.more_runs(missing))
    if fig.failed_requests and not failures_lead(fig, band_ms):  # else the failures lead
        verb = "was" if fig.failed_requests == 1 else "were"
        verdict.evidence.append(
            f"{fig.failed_requests} of {fig.requests} requests ended with an error and {verb} left"
            f" out of the stage statistics{_cold_failed_clause(fig)}")
