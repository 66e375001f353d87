"""The diagnosis rules of DESIGN.md section 1: which stage, which cause, why, and what to do.

Order of the rules (:func:`decide`):

1. A stage *swings* when its ``swing_ms`` (p95 - p5) reaches ``SWING_MIN_FRACTION`` of the median
   request total, or a single run lies ``SPIKE_MIN_FRACTION`` of the median total away from the
   stage median (either way: spike or dip). Thresholds are fractions of the *total*, so a tiny
   stage with a large relative swing never qualifies.
2. Among swinging stages the one that explains most of the total's variance is the suspect (when
   two stages are both large, the one that swings more explains more).
3. Nothing swings: the first request ``COLD_START_MIN_RATIO`` times the warm median or more is a
   ``cold_start`` (stage: the stage that grew most); otherwise ``stable`` (stage ``None``; the
   largest share is named in the evidence as the place to cut latency).
4. Stage -> cause: download -> transfer; decode/resize -> preprocess; queue -> queue; forward ->
   gpu_busy / gpu_starved / forward by GPU evidence; a custom stage -> ``other``.
5. The request total swings but no stage explains it (time outside the stage spans): cause
   ``None``, and the evidence says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from otel_stages import semconv
from otel_stages.analysis import advice as advice_text
from otel_stages.analysis.evidence import attribute_evidence, follow_evidence, size_evidence
from otel_stages.analysis.gpu import LEVEL_HIGH, LEVEL_LOW, GpuEvidence
from otel_stages.analysis.requests import Request
from otel_stages.analysis.stats import Distribution, StageStats
from otel_stages.analysis.units import duration, pct

CAUSE_TRANSFER = "transfer"
CAUSE_PREPROCESS = "preprocess"
CAUSE_QUEUE = "queue"
CAUSE_GPU_BUSY = "gpu_busy"
CAUSE_GPU_STARVED = "gpu_starved"
CAUSE_FORWARD = "forward"
CAUSE_COLD_START = "cold_start"
CAUSE_STABLE = "stable"
CAUSE_OTHER = "other"  #: a custom stage is the suspect; nothing more specific can be said

#: stage -> cause for the stages whose cause does not need more evidence
STAGE_CAUSES: dict[str, str] = {
    semconv.STAGE_DOWNLOAD: CAUSE_TRANSFER,
    semconv.STAGE_DECODE: CAUSE_PREPROCESS,
    semconv.STAGE_RESIZE: CAUSE_PREPROCESS,
    semconv.STAGE_QUEUE: CAUSE_QUEUE,
}

#: A stage swings when p95 - p5 reaches this fraction of the median total. Warm runs of a steady
#: service jitter by well under 10 % of the total (clock, scheduler, GC); 15 % leaves margin so
#: jitter is never called a swing, while a 300 ms -> 3 s problem is far above it.
SWING_MIN_FRACTION = 0.15
#: ... or when one run lies this far (as a fraction of the median total) above or below the stage
#: median: p95 - p5 deliberately ignores one freak run, but a single +50 % spike is what users see.
SPIKE_MIN_FRACTION = 0.5
#: The first request is a cold start when its total is at least this multiple of the warm median
#: total; model load / kernel compilation is typically 10x+, ordinary noise is < 1.5x.
COLD_START_MIN_RATIO = 2.0
#: When no single stage swings but the total does, the best stage must explain at least this much
#: of the total's variance to be blamed; below it the swing is in untraced time.
MIN_EXPLAINED_FOR_SUSPECT = 0.3
#: DESIGN.md: run a fixed input 20+ times; below this the evidence says the verdict is tentative.
RECOMMENDED_WARM_RUNS = 20


@dataclass
class Verdict:
    """``cause`` (one of the CAUSE_* names, ``None`` when there is nothing to judge), ``stage``
    (the suspect stage or ``None``), and human-readable ``evidence`` (with numbers) / ``advice``."""

    cause: str | None
    stage: str | None
    evidence: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        """The CLI contract's ``verdict`` object."""
        return {
            "cause": self.cause,
            "stage": self.stage,
            "evidence": list(self.evidence),
            "advice": list(self.advice),
        }


@dataclass(frozen=True)
class ColdStart:
    """The cold request(s), reported apart from warm runs. Times in ms.

    With several processes (several cold requests) ``total_ms`` and ``stages_ms`` are medians
    over them; ``count`` says how many.
    """

    total_ms: float
    warm_median_total_ms: float | None
    stages_ms: dict[str, float]
    count: int = 1

    @property
    def ratio(self) -> float | None:
        """Cold total / warm median total, ``None`` without warm runs."""
        if not self.warm_median_total_ms:
            return None
        return self.total_ms / self.warm_median_total_ms

    def to_dict(self) -> dict[str, object]:
        """The CLI contract's ``cold_start`` object."""
        return {
            "total_ms": round(self.total_ms, 3),
            "warm_median_total_ms": _r(self.warm_median_total_ms),
            "stages": {k: round(v, 3) for k, v in self.stages_ms.items()},
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def stage_swings(stage: StageStats, median_total_ms: float) -> bool:
    """Rule 1 of the module docstring (``median_total_ms`` of warm runs)."""
    if median_total_ms <= 0:
        return False
    spike = max(stage.max_ms - stage.median_ms, stage.median_ms - stage.min_ms)
    return (
        stage.swing_ms >= SWING_MIN_FRACTION * median_total_ms
        or spike >= SPIKE_MIN_FRACTION * median_total_ms
    )


def total_swings(total: Distribution) -> bool:
    """Same rule applied to the request total itself."""
    spike = max(total.max_ms - total.median_ms, total.median_ms - total.min_ms)
    return (
        total.swing_ms >= SWING_MIN_FRACTION * total.median_ms
        or spike >= SPIKE_MIN_FRACTION * total.median_ms
    )


def cause_for(stage: str, gpu: GpuEvidence) -> str:
    """Map a suspect stage to its cause (forward needs the GPU evidence)."""
    if stage == semconv.STAGE_FORWARD:
        if gpu.level == LEVEL_HIGH:
            return CAUSE_GPU_BUSY
        if gpu.level == LEVEL_LOW:
            return CAUSE_GPU_STARVED
        return CAUSE_FORWARD
    return STAGE_CAUSES.get(stage, CAUSE_OTHER)


def decide(
    warm: Sequence[Request],
    stages: dict[str, StageStats],
    total: Distribution | None,
    cold: ColdStart | None,
    gpu: GpuEvidence,
) -> Verdict:
    """Apply the rules to warm-run statistics.

    ``warm`` are the warm requests, ``stages`` their per-stage stats, ``total`` the distribution of
    their totals (``None`` when there are no warm runs), ``cold`` the cold request summary,
    ``gpu`` the utilization evidence for warm forwards. Never raises.
    """
    if total is None or not stages:
        evidence = ["no warm requests to compare"]
        if cold is not None:
            evidence.append(f"only the first (cold) request was found: {duration(cold.total_ms)}")
        return Verdict(None, None, evidence, [advice_text.MORE_RUNS])
    median_total = total.median_ms
    ranked = sorted(stages.values(), key=lambda s: s.explained, reverse=True)
    swinging = [s for s in ranked if stage_swings(s, median_total)]
    suspect: StageStats | None = swinging[0] if swinging else None
    if suspect is None and total_swings(total) and ranked[0].explained >= MIN_EXPLAINED_FOR_SUSPECT:
        suspect = ranked[0]

    if suspect is not None:
        verdict = _warm_verdict(suspect, ranked, warm, total, gpu)
    elif total_swings(total):
        verdict = Verdict(
            None,
            None,
            [
                f"request total swings {duration(total.swing_ms)} (p5 {duration(total.p5_ms)} -> p95"
                f" {duration(total.p95_ms)}) but no stage explains it: the time is outside the"
                " stage spans"
            ],
            [advice_text.UNTRACED],
        )
    elif cold is not None and cold.ratio is not None and cold.ratio >= COLD_START_MIN_RATIO:
        verdict = _cold_verdict(cold, stages, total)
    else:
        largest = max(stages.values(), key=lambda s: s.share)
        verdict = Verdict(
            CAUSE_STABLE,
            None,
            [
                f"no stage swings: request total p5 {duration(total.p5_ms)} -> p95"
                f" {duration(total.p95_ms)}"
                f" around a median of {duration(median_total)} over {total.count} warm requests",
                f"largest share: {largest.name} at {pct(largest.share)} of the median total"
                f" ({duration(largest.median_ms)})",
            ],
            advice_text.for_stable(largest.name),
        )
    _append_common(verdict, warm, total, cold)
    return verdict


def _warm_verdict(
    suspect: StageStats,
    ranked: list[StageStats],
    warm: Sequence[Request],
    total: Distribution,
    gpu: GpuEvidence,
) -> Verdict:
    cause = cause_for(suspect.name, gpu)
    d = duration
    evidence = [
        f"{suspect.name} swings {d(suspect.swing_ms)} (p5 {d(suspect.p5_ms)} -> p95"
        f" {d(suspect.p95_ms)}, min {d(suspect.min_ms)}, max {d(suspect.max_ms)}) and explains"
        f" {pct(suspect.explained)} of the variance of the request total (median"
        f" {d(total.median_ms)}, p95 {d(total.p95_ms)}, {total.count} warm requests)",
        f"{suspect.name} is {pct(suspect.share)} of the median total ({d(suspect.median_ms)} median)",
    ]
    others = [s for s in ranked if s.name != suspect.name]
    if others and stage_swings(others[0], total.median_ms):
        nxt = others[0]
        evidence.append(
            f"next: {nxt.name} swings {d(nxt.swing_ms)} and explains {pct(nxt.explained)}"
        )
    elif others:
        widest = max(others, key=lambda s: s.swing_ms)
        evidence.append(
            f"no other stage swings: the widest, {widest.name}, by {d(widest.swing_ms)}"
        )
    for s in others:
        if s.min_ms > 0 and s.max_ms >= 2 * s.min_ms and not stage_swings(s, total.median_ms):
            evidence.append(
                f"{s.name} varies {s.max_ms / s.min_ms:.1f}x ({d(s.min_ms)} .. {d(s.max_ms)}) but"
                f" only by {d(s.max_ms - s.min_ms)}: too small to explain the swing"
            )
    follows: bool | None = None
    if suspect.name == semconv.STAGE_FORWARD:
        evidence.append(gpu.describe())
    elif suspect.name in (semconv.STAGE_DECODE, semconv.STAGE_RESIZE):
        lines, follows = size_evidence(warm, suspect.name)
        evidence.extend(lines)
    elif suspect.name == semconv.STAGE_DOWNLOAD:
        evidence.extend(follow_evidence(warm, suspect.name, "image bytes", lambda r: r.image_bytes))
    elif suspect.name == semconv.STAGE_QUEUE:
        evidence.extend(attribute_evidence(warm, suspect.name, semconv.QUEUE_DEPTH))
    return Verdict(cause, suspect.name, evidence,
                   advice_text.for_cause(cause, follows_size=follows, gpu_level=gpu.level))


def _cold_verdict(cold: ColdStart, stages: dict[str, StageStats], total: Distribution) -> Verdict:
    excess = {
        name: ms - (stages[name].median_ms if name in stages else 0.0)
        for name, ms in cold.stages_ms.items()
    }
    stage = max(excess, key=lambda n: excess[n]) if excess else None
    evidence = [
        f"warm runs are steady: request total p5 {duration(total.p5_ms)} -> p95"
        f" {duration(total.p95_ms)}"
        f" over {total.count} warm requests",
    ]
    if stage is not None:
        warm_ms = stages[stage].median_ms if stage in stages else 0.0
        evidence.append(
            f"{stage} took {duration(cold.stages_ms[stage])} in the cold request vs"
            f" {duration(warm_ms)}"
            f" warm median: {duration(excess[stage])} of the extra time"
        )
    return Verdict(CAUSE_COLD_START, stage, evidence, advice_text.for_cause(CAUSE_COLD_START))


def _append_common(
    verdict: Verdict, warm: Sequence[Request], total: Distribution, cold: ColdStart | None
) -> None:
    if cold is not None and cold.ratio is not None:
        who = "first request of the process" if cold.count == 1 else f"{cold.count} cold requests"
        line = (
            f"{who} took {duration(cold.total_ms)}, {cold.ratio:.1f}x the warm median total"
            f" ({duration(cold.warm_median_total_ms)}); reported apart from warm runs"
        )
        if verdict.cause == CAUSE_COLD_START:
            verdict.evidence.insert(0, line)
        elif cold.ratio >= COLD_START_MIN_RATIO:
            verdict.evidence.append(line + ", and a cold start too")
            verdict.advice.append("also: " + advice_text.WARM_UP)
        elif verdict.cause == CAUSE_STABLE:
            verdict.evidence.append(f"no cold-start penalty: {line}")
    if total.count < RECOMMENDED_WARM_RUNS:
        verdict.evidence.append(
            f"only {total.count} warm request{'s' if total.count != 1 else ''}: run the same input"
            f" {RECOMMENDED_WARM_RUNS}+ times"
            " for a firm verdict"
        )
