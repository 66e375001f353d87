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
from dataclasses import dataclass, field, replace

from otel_stages.analysis.episode import Episode
from otel_stages.analysis.gpu import GpuEvidence
from otel_stages.analysis.model import Call
from otel_stages.analysis.process_mix import ProcessMix
from otel_stages.analysis.sampled import SeqCoverage

#: ``ColdFigures.compared_with``: warm requests with the cold request's input (cohort).
SAME_INPUT = "same_input"
#: ``ColdFigures.compared_with``: all warm requests (fewer than 5 share the cold request's input).
ALL_WARM = "all_warm"

REASON_NEW_INPUT = "new_input"  #: set apart: first request of its cohort in its process
REASON_AFTER_IDLE = "after_idle"  #: set apart: first request after an idle gap
#: set apart: first successful request after the process's first request failed
REASON_AFTER_FAILED_START = "after_failed_start"
#: set apart: one of the requests right after a process's cold request that still stood out
#: (the warm-up: lazy compilation, autotuning, caches filling over several requests)
REASON_WARM_UP = "warm_up"
#: set apart: a request that started while its process's cold request still ran and stood out as
#: a warm-up request would (it waited for the cold start: a start-up burst), not counted in the
#: warm-up's length
REASON_BEHIND_COLD = "behind_cold_start"


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
    ``alone``: ``var(stage) / var(total)``, the part it makes alone, its covariances with the other
    stages left out (``explains - alone``: what it moves in step with them); ``None`` when unknown.
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
    alone: float | None = None


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
    gap, its ``share`` of all request time, the part of the total's variance it ``explains`` and
    makes ``alone`` (as :class:`StageFigures`)."""

    median_ms: float
    swing_ms: float
    share: float
    explains: float | None = None
    alone: float | None = None


#: The key of the untraced time (request time outside every stage span) among a
#: :class:`ColdFigures`' ``stages_ms`` / ``comparable_stages_ms`` (last; the JSON gives it as
#: ``unaccounted_ms`` / ``comparable_unaccounted_ms``): one-time setup done lazily inside the first
#: request (an HTTP client, imports) lies outside the stage spans.
COLD_UNTRACED = "(unaccounted)"


@dataclass(frozen=True)
class ColdFigures:
    """The cold request(s): first request of each process, reported apart from warm runs.

    ``count`` cold requests; ``total_ms`` their (median) total; ``stages_ms`` their (median)
    stage times, and their untraced time under :data:`COLD_UNTRACED` (last).
    ``comparable_median_total_ms`` / ``comparable_stages_ms``: medians over the warm
    requests they are compared with: the same input (``compared_with == SAME_INPUT``, ``cohort``
    its key) when at least 5 such warm requests exist, else all warm requests (``ALL_WARM``).
    ``comparable_requests``: how many warm requests that is. ``warm_median_total_ms``: median of
    all warm requests (shown for reference). ``left_out``: cold requests not in ``count``, whose
    input is unknown or shared by fewer than 5 warm requests, when others' inputs are comparable
    (those are compared with their inputs' warm requests, the rest left out rather than compare
    all with all warm requests). ``without_penalty``: cold requests compared that did not pay a cold
    start (:func:`otel_stages.analysis.cohorts.paid_min_ms`), not in ``count``, when others
    (``count``) did: the figures are those that paid it. ``stages_mean_ms``: the same places'
    means over those cold requests (where each ran), for where the extra time of several cold
    starts went (a median over three processes hides one's model load); empty where unread.
    ``failed``: how many of the ``count`` ended with an error after paying the cold start
    (:func:`otel_stages.analysis.cohorts.failed_cold_paid`): their times run until the failure,
    so the figures are a lower bound of the cold start.
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
    #: the cold request's input is known (image size / prompt length recorded)
    input_known: bool = True
    #: every cold request is the first of its process (else ``request.cold_start`` marked it later)
    first_of_process: bool = True
    left_out: int = 0
    without_penalty: int = 0
    stages_mean_ms: Mapping[str, float] = field(default_factory=dict)
    failed: int = 0

    @property
    def ratio(self) -> float | None:
        """``total_ms / comparable_median_total_ms``; ``None`` without comparable requests."""
        if not self.comparable_median_total_ms:
            return None
        return self.total_ms / self.comparable_median_total_ms


@dataclass(frozen=True)
class ApartFigures:
    """A warm request reported apart as cold: ``reason`` (``REASON_*``), ``seq`` (or ``None``),
    ``trace_id``, ``total_ms``, the ``comparable_median_total_ms`` of its cohort, ``ratio`` of the
    two, and ``idle_s`` (seconds idle before it, for :data:`REASON_AFTER_IDLE`)."""

    reason: str
    seq: int | None
    trace_id: str
    total_ms: float
    comparable_median_total_ms: float
    ratio: float
    idle_s: float | None = None


@dataclass(frozen=True)
class WarmupFigures:
    """The warm-up after the cold requests (:data:`REASON_WARM_UP`), over the processes whose
    warm-up requests were set apart: ``processes`` of them; ``requests`` set apart as warm-up in
    all; ``longest_requests``: the most requests one process's warm-up lasted, its cold request
    included; ``longest_ended``: a later request of every process with that longest warm-up stood
    within the warm runs (else the warm-up may be longer); ``unended``: processes whose warm-up
    was not seen to end (every request after the cold one looked at stood out); ``capped``: of
    those, the ones where that reached ``cohorts.WARMUP_MAX_REQUESTS`` (their later requests stay
    warm and may hold the warm-up's tail); ``max_ratio``: the most a warm-up request took, as a
    multiple of the median of its input's warm requests after the warm-up."""

    processes: int
    requests: int
    longest_requests: int
    longest_ended: bool
    unended: int
    capped: int
    max_ratio: float


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


def share_tentative(cohorts: Sequence[CohortFigures], tentative: bool) -> list[CohortFigures]:
    """``cohorts`` with each verdict made tentative when the report's verdict is (``tentative``).

    A cohort's verdict is decided from its own warm requests, but what makes the report's verdict
    tentative (failures past the failures-first share, clashing span ids, overlapping stages that
    could change the lead, too few warm requests) holds for every cohort of the recording too: a
    cohort's verdict is never firmer than the report's. A cohort can still be tentative on its
    own (fewer than 20 warm requests in it) under a firm report verdict."""
    if not tentative:
        return list(cohorts)
    return [c if c.verdict is None or c.verdict.tentative
            else replace(c, verdict=replace(c.verdict, tentative=True)) for c in cohorts]


@dataclass(frozen=True)
class Mechanism:
    """Evidence that a named mechanism slowed a stage (e.g. ``cpu_contention``: wall time far
    above the thread's CPU time). ``confirmed``: the evidence passed its own thresholds; only then
    does ``cause`` replace the stage's plain cause. ``evidence`` / ``advice``: sentences (an
    unconfirmed mechanism's advice, when it has any, is added to the plain cause's: what its
    evidence points at, e.g. a blocked stage)."""

    cause: str
    confirmed: bool
    evidence: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()


@dataclass(frozen=True)
class DraftEstimate:
    """What JPEG draft decoding (Pillow ``Image.draft``: libjpeg's DCT scaling) would save, from the
    warm requests' own sizes (:mod:`otel_stages.analysis.preprocessing`).

    ``requests``: warm decodes of a JPEG at least twice the resize target in both sides and not
    drafted yet; ``scale``, ``source`` / ``target``: the reduction (2, 4 or 8: decoded at
    1/scale per side) and ``"WxH"`` sizes that carry most of their decode time; ``decode_ms``: their decode
    time in all, ms; ``speedup``: estimated ``decode_ms`` / decode time with draft (>= 1);
    ``share``: ``decode_ms`` / all warm decode time (0..1); ``worth``: passes the thresholds, so
    the advice names it.
    """

    requests: int
    scale: int
    source: str
    target: str
    decode_ms: float
    speedup: float
    share: float
    worth: bool

    @property
    def saved_ms(self) -> float:
        """Estimated decode time saved over these requests, ms."""
        return self.decode_ms - self.decode_ms / self.speedup


@dataclass(frozen=True)
class RepeatedInputs:
    """Warm decodes of an image already decoded earlier in the same process (same width, height
    and encoded bytes): ``requests`` of them, over ``images`` distinct images, ``decode_ms`` in all
    (ms), ``share`` of all warm decode time (0..1); ``worth``: passes the thresholds (and the
    recording has more than one input, so the repeats are not just a fixed-input run)."""

    requests: int
    images: int
    decode_ms: float
    share: float
    worth: bool


@dataclass(frozen=True)
class ThreadUse:
    """Where decode / resize ran, from ``thread.name`` and ``otel_stages.event_loop.running`` on
    their spans (warm requests). ``threads``: the most distinct threads that ran them in one process
    (``None``: no span recorded ``thread.name``); ``names``: a few of those names; ``on_loop``:
    spans that ran while an asyncio event loop was running on their thread, of ``loop_known``
    spans that recorded it, on the threads ``loop_names``; ``spans``: decode / resize spans looked
    at; ``several``: ``threads`` reaches ``POOL_MIN_THREADS`` (then a pool sized to the cores is
    the advice)."""

    spans: int
    threads: int | None
    names: tuple[str, ...]
    on_loop: int
    loop_known: int
    several: bool = False
    loop_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreprocessFacts:
    """Per-request facts about decode / resize that name concrete fixes (computed by
    :func:`otel_stages.analysis.preprocessing.preprocess_facts` over the warm requests).

    ``decodes``: warm requests with a decode span; ``jpeg``: of them JPEG (or MPO) sources;
    ``drafted``: of them already draft-decoded (``image.draft_scale`` recorded), with
    ``drafted_scale`` the most common scale; ``draft``: the estimate (``None`` when no JPEG could
    be drafted, or sizes are unknown); ``draft_missing``: what keeps the estimate from being made
    (:func:`otel_stages.analysis.preprocessing.draft_missing`: ``image.format`` missing on
    decodes, a resize target missing on JPEG decodes), empty when nothing does; ``repeats``:
    repeated inputs (``None``: none, or sizes unknown); ``threads``: where the work ran;
    ``decoded_twice``: warm requests that decoded one image (the same ``image.width``,
    ``image.height`` and ``image.size``) on two decode spans; ``several_images``: warm requests
    whose decode spans decoded two or more different images; ``decodes_untold``: warm requests
    with more than one decode span in neither count (sizes missing on some span, so a repeat
    cannot be told from several images).
    """

    decodes: int = 0
    jpeg: int = 0
    drafted: int = 0
    drafted_scale: int | None = None
    draft_missing: tuple[str, ...] = ()
    draft: DraftEstimate | None = None
    repeats: RepeatedInputs | None = None
    threads: ThreadUse | None = None
    decoded_twice: int = 0
    several_images: int = 0
    decodes_untold: int = 0


@dataclass(frozen=True)
class StageEvidence:
    """Per-request evidence about one stage, computed by the caller.

    ``lines``: sentences with numbers (e.g. ``decode time follows image pixels (r = 0.95)``).
    ``follows_size``: the stage's time follows input size (``True``), sizes vary but time does
    not follow (``False``), unknown (``None``). ``one_size``: every request had the same input
    size (then "cap the input size" would contradict the evidence). ``mechanisms``: in order of
    precedence; the first confirmed one names the cause. ``preprocess``: decode / resize facts
    behind the concrete preprocessing advice (draft decoding, caching, pool, event loop).
    ``lag_median_ms``: the stage's median event-loop lag (time it waited for a loop busy with other
    work; ``None`` when none was recorded) and ``loop_holder`` the stage that held the loop most.
    ``bytes_only``: every input had one pixel size and the time follows the encoded bytes (the
    format or compression differs: capping the pixels would not change it).
    """

    lines: tuple[str, ...] = ()
    follows_size: bool | None = None
    one_size: bool = False
    mechanisms: tuple[Mechanism, ...] = ()
    preprocess: PreprocessFacts | None = None
    lag_median_ms: float | None = None
    loop_holder: str | None = None
    bytes_only: bool = False


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
    for the sentence about failed requests left out; ``failure_kinds`` (``error.type`` /
    ``exception.type`` -> failed requests) and ``failure_stages`` (where they stopped -> failed
    requests) name them; ``failed_median_total_ms`` is the failed requests' median total
    (``None`` without any) and ``failed_stages_ms`` each stage's median over them (0 ms in a
    failed request without it), for :func:`~otel_stages.analysis.failures.failures_slow`.
    ``set_apart``: warm requests reported apart as cold, and ``warmup`` the warm-up among them
    (``None`` without warm-up requests set apart). ``per_request``:
    the figures come from per-request rows (traces), so ``StageFigures.count`` is requests.
    ``detached_requests``: requests with a stage span wholly outside their request span (a clock
    skew between hosts; such a span counts 0 ms, so its time shows as unaccounted).
    ``outlived_requests``: warm requests with a standard stage span that ends after their request
    span (by more than ``span_issues.OVERLAP_TOLERANCE_MS``; starting after it too), and
    ``outlived_p95_ms`` the p95 over all warm requests of the most one ends after it
    (``Request.after_ms``, 0 for the others): a request span that closes before its work (a
    streamed response), or a stage on a clock ahead.
    ``before_requests`` / ``before_p95_ms``: the same for standard stage spans that start before
    their request span (``Request.before_ms``): a stage on a clock behind the request's.
    ``clash_spans``: spans that share a trace and span id with a different span (dropped: only
    the first of each id is kept). ``services``: warm and cold requests per ``service.name`` of
    the request span, ``(name, requests)`` most first (a name ``""`` when unset; the largest
    ones, ``service_requests`` counting all). ``process_mix``: the part of the warm total's
    variance between processes (:mod:`otel_stages.analysis.process_mix`). ``sampling``: how much
    of each process's ``request.seq`` range was read, and why the sampler says it kept them
    (:mod:`otel_stages.analysis.sampled`; ``None``: not counted).
    ``episode``: the stretch of the run that holds the slow warm requests
    (:mod:`otel_stages.analysis.episode`; ``None``: none, or not looked for).
    """

    warm_requests: int
    stages: Mapping[str, StageFigures]
    total: TotalFigures | None
    gpu: GpuEvidence
    unaccounted: UnaccountedFigures | None = None
    cold: ColdFigures | None = None
    cohorts: Sequence[CohortFigures] = ()
    input_mix_explains: float | None = None
    #: warm requests with a known input (``None``: the sum of ``cohorts``, which then lists all)
    known_input_requests: int | None = None
    process_mix: ProcessMix | None = None
    stage_evidence: Mapping[str, StageEvidence] = field(default_factory=dict)
    failed_requests: int = 0
    #: the failed requests that were their process's cold request
    failed_cold: int = 0
    requests: int = 0
    failure_kinds: Mapping[str, int] = field(default_factory=dict)
    failure_stages: Mapping[str, int] = field(default_factory=dict)
    failed_median_total_ms: float | None = None
    failed_stages_ms: Mapping[str, float] = field(default_factory=dict)
    set_apart: Sequence[ApartFigures] = ()
    warmup: WarmupFigures | None = None
    per_request: bool = False
    detached_requests: int = 0
    outlived_requests: int = 0
    outlived_p95_ms: float | None = None
    before_requests: int = 0
    before_p95_ms: float | None = None
    clash_spans: int = 0
    services: Sequence[tuple[str, int]] = ()
    service_requests: int = 0
    sampling: SeqCoverage | None = None
    #: the ``batch`` spans' median fill and their members' median wait, ms
    #: (:class:`otel_stages.analysis.batching.BatchSummary`; ``None`` without batch spans read)
    batch_fill_ms: float | None = None
    batch_wait_ms: float | None = None
    #: ... and their p95s, ms (what the slow requests wait for)
    batch_fill_p95_ms: float | None = None
    batch_wait_p95_ms: float | None = None
    #: stages that are calls into another service's requests read in the same report
    #: (:func:`otel_stages.analysis.calls.remote_calls`), most calls first: left out of the
    #: suspects, their time being the called requests'
    calls: Sequence[Call] = ()
    episode: Episode | None = None
    #: with ``--service``: the stages of its requests that call requests it left out
    #: (:attr:`otel_stages.analysis.model.Recording.calls_left_out`), their figures read over the
    #: traces before the pick: whose their swing is (the call's own wait, how many calls it makes,
    #: or the called requests)
    calls_left_out: Sequence[Call] = ()

    @property
    def reference_ms(self) -> float:
        """The size of a typical request, ms: :func:`reference_ms`."""
        return reference_ms(self.stages, self.total)


def reference_ms(stages: Mapping[str, StageFigures], total: TotalFigures | None) -> float:
    """The size of a typical request, ms: the median total, else the sum of stage medians."""
    if total is not None and total.median_ms > 0:
        return total.median_ms
    return sum(s.median_ms for s in stages.values())
