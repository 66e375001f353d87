"""What the diagnosis rules (:mod:`otel_stages.analysis.decision`) read: aggregates, never raw
requests, so every source feeds the same rules: traces (computed in
:mod:`otel_stages.analysis.report`), Prometheus span-metric histograms
(:mod:`otel_stages.analysis.aggregate`), and a database that computes the same figures in SQL.

All times are milliseconds, all fractions 0..1. "Warm requests" are the finished requests of a
warm process (first request of each process, failed requests and requests set apart as cold left
out). A value a source cannot know is ``None`` and the rules say what they could not check.

Per-request evidence (does decode time follow image size? queue time follow queue.depth?) needs
rows, so the caller computes it and passes it in as :class:`StageEvidence`; mechanism evidence
(added by later analyses: CPU contention, GC pauses, throttling, GPU memory pressure) refines a
stage's cause through :class:`Mechanism`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from otel_stages.analysis.gpu import GpuEvidence

#: ``ColdFigures.compared_with``: warm requests with the cold request's input (cohort).
SAME_INPUT = "same_input"
#: ``ColdFigures.compared_with``: all warm requests (fewer than 5 share the cold request's input).
ALL_WARM = "all_warm"


@dataclass(frozen=True)
class StageFigures:
    """One stage over the warm requests.

    ``count``: requests (or spans, for histograms) in which the stage ran.
    ``median_ms``; ``p5_ms`` / ``p95_ms`` 5th / 95th percentiles; ``min_ms`` / ``max_ms``
    extremes; ``mean_ms`` arithmetic mean (each ``None`` when unknown).
    ``share``: ``sum(stage ms) / sum(request total ms)``, the stage's part of all request time.
    ``swing_ms``: the spread the rules use, ``p95 - p5`` (histograms: the least spread their bucket
    edges prove, which may be less than ``p95_ms - p5_ms`` as interpolated).
    ``spike_ms``: the furthest single run from the median, ``max(max - median, median - min)``
    (histograms: the proven ``p99 - p50`` spread); ``None`` when unknown.
    ``explains``: ``cov(stage, total) / var(total)``, the part of the request total's variance the
    stage accounts for; ``None`` without per-request pairs (histograms).
    """

    name: str
    count: int
    median_ms: float
    swing_ms: float
    share: float
    p5_ms: float | None = None
    p95_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    mean_ms: float | None = None
    spike_ms: float | None = None
    explains: float | None = None


@dataclass(frozen=True)
class TotalFigures:
    """The request total (request span duration) over the warm requests: same fields and units
    as :class:`StageFigures` (``count`` requests)."""

    count: int
    median_ms: float
    swing_ms: float
    p5_ms: float | None = None
    p95_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    spike_ms: float | None = None


@dataclass(frozen=True)
class UnaccountedFigures:
    """Request time outside every stage span: ``median_ms`` and ``swing_ms`` of the per-request
    gap, its ``share`` of all request time, and the part of the total's variance it ``explains``."""

    median_ms: float
    swing_ms: float
    share: float
    explains: float | None = None


@dataclass(frozen=True)
class ColdFigures:
    """The cold request(s): first request of each process, reported apart from warm runs.

    ``count`` cold requests; ``total_ms`` their (median) total; ``stages_ms`` their (median)
    stage times. ``comparable_median_total_ms`` / ``comparable_stages_ms``: medians over the warm
    requests they are compared with: the same input (``compared_with == SAME_INPUT``, ``cohort``
    its key) when at least 5 such warm requests exist, else all warm requests (``ALL_WARM``).
    ``comparable_requests``: how many warm requests that is. ``warm_median_total_ms``: median of
    all warm requests (shown for reference).
    """

    count: int
    total_ms: float
    stages_ms: Mapping[str, float]
    comparable_median_total_ms: float | None
    comparable_stages_ms: Mapping[str, float]
    compared_with: str
    comparable_requests: int
    warm_median_total_ms: float | None = None
    cohort: str | None = None

    @property
    def ratio(self) -> float | None:
        """``total_ms / comparable_median_total_ms``; ``None`` without comparable requests."""
        if not self.comparable_median_total_ms:
            return None
        return self.total_ms / self.comparable_median_total_ms


@dataclass(frozen=True)
class CohortVerdict:
    """The verdict within one cohort: ``cause``, ``stage``, ``tentative``."""

    cause: str | None
    stage: str | None
    tentative: bool = False

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        return {"cause": self.cause, "stage": self.stage, "tentative": self.tentative}


@dataclass(frozen=True)
class CohortFigures:
    """One input cohort (same image width x height, format, prompt-length bucket): ``key`` such as
    ``"1024x768"``, ``requests`` warm requests, their ``median_total_ms`` / ``p95_total_ms``,
    and the ``verdict`` within it (``None`` when it has too few requests)."""

    key: str
    requests: int
    median_total_ms: float
    p95_total_ms: float
    verdict: CohortVerdict | None = None


@dataclass(frozen=True)
class Mechanism:
    """Evidence that a named mechanism slowed a stage (e.g. ``cpu_contention``: wall time far
    above the thread's CPU time). ``confirmed``: the evidence passed its own thresholds; only then
    does ``cause`` replace the stage's plain cause. ``evidence`` / ``advice``: sentences."""

    cause: str
    confirmed: bool
    evidence: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()


@dataclass(frozen=True)
class StageEvidence:
    """Per-request evidence about one stage, computed by the caller.

    ``lines``: sentences with numbers (e.g. ``decode time follows image pixels (r = 0.95)``).
    ``follows_size``: the stage's time follows input size (``True``), sizes vary but time does
    not follow (``False``), unknown (``None``). ``one_size``: every request had the same input
    size (then "cap the input size" would contradict the evidence). ``mechanisms``: in order of
    precedence; the first confirmed one names the cause.
    """

    lines: tuple[str, ...] = ()
    follows_size: bool | None = None
    one_size: bool = False
    mechanisms: tuple[Mechanism, ...] = ()


@dataclass(frozen=True)
class Figures:
    """Everything :func:`otel_stages.analysis.decision.decide` reads.

    ``warm_requests``: how many warm requests the figures describe. ``stages``: per stage, in
    pipeline order. ``total``: the request total (``None`` when the source has no request span,
    e.g. histograms without one; the rules then use the sum of stage medians as the request's
    size and skip the checks that need the total's spread). ``unaccounted``: time outside stages.
    ``gpu``: utilization during forward. ``cold``: the cold request(s). ``cohorts``: input cohorts,
    largest first, and ``input_mix_explains`` the part of the total's variance they explain.
    ``stage_evidence``: per-request evidence by stage name. ``failed_requests`` / ``requests``:
    for the sentence about failed requests left out.
    """

    warm_requests: int
    stages: Mapping[str, StageFigures]
    total: TotalFigures | None
    gpu: GpuEvidence
    unaccounted: UnaccountedFigures | None = None
    cold: ColdFigures | None = None
    cohorts: Sequence[CohortFigures] = ()
    input_mix_explains: float | None = None
    stage_evidence: Mapping[str, StageEvidence] = field(default_factory=dict)
    failed_requests: int = 0
    requests: int = 0

    @property
    def reference_ms(self) -> float:
        """The size of a typical request, ms: the median total, else the sum of stage medians."""
        if self.total is not None and self.total.median_ms > 0:
            return self.total.median_ms
        return sum(s.median_ms for s in self.stages.values())
