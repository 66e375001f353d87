"""What the ClickHouse queries return, as plain frozen dataclasses (pure; no engine, no verdict).

:func:`build_aggregates` turns the rows of :mod:`otel_stages.analysis.clickhouse_queries` into one
:class:`FleetAggregates`. Times are milliseconds (``*_ms``), Unix nanoseconds (``*_ns``) or
bytes; fractions are 0..1. Statistics are over *warm* requests (not cold, not failed) unless a
field says otherwise. ``FleetAggregates.to_dict()`` is the ``aggregates`` part of
``otel-stages report --clickhouse URL --json``; :mod:`otel_stages.analysis.clickhouse_figures`
turns it into the rules' input and the report's keys.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.clickhouse_apart import (
    ApartRequest,
    apart_requests,
    apart_total,
    unlisted_line,
    warmup_figures,
)
from otel_stages.analysis.clickhouse_failures import failed_times, failure_kinds
from otel_stages.analysis.clickhouse_gaps import gap_lines
from otel_stages.analysis.clickhouse_gpu_ids import ambiguous_units, shared_gpu_ids
from otel_stages.analysis.clickhouse_issues import SpanIssues, not_checked
from otel_stages.analysis.clickhouse_issues import span_issues as issues_of
from otel_stages.analysis.clickhouse_preprocess import facts as preprocess_facts
from otel_stages.analysis.clickhouse_signal_result import ScopeSignals, scopes
from otel_stages.analysis.clickhouse_sql import (
    DD_RELATIVE_ACCURACY,
    EXACT_RELATIVE_TOLERANCE,
    LEVELS,
)
from otel_stages.analysis.decision import MIN_WARM_RUNS
from otel_stages.analysis.episode import EPISODE_BUCKETS, Episode, confirm, find_episode
from otel_stages.analysis.figures import COLD_UNTRACED, PreprocessFacts, WarmupFigures
from otel_stages.analysis.gpu import SplitFigures, judge_level, mixed_unit_lines, prefer_metrics
from otel_stages.analysis.gpu_owners import ambiguous_unit_lines, hw_of, shared_hw_id_lines, unplaced_lines
from otel_stages.analysis.model import Call
from otel_stages.analysis.process_mix import ProcessMean, ProcessMix, one_version
from otel_stages.analysis.sampled import SeqCoverage
from otel_stages.analysis.stage_overlap import Overlap
from otel_stages.analysis.window_edge import WindowEdge

Rows = Sequence[Mapping[str, Any]]

#: Name of the quantile function per method, as reported in ``FleetAggregates.quantile_function``.
QUANTILE_FUNCTIONS = {"exact": "quantilesExactInclusive", "dd": "quantilesDD"}


def ordered_stages(names: Iterable[str]) -> list[str]:
    """Standard stages in pipeline order, then custom ones alphabetically."""
    present = set(names)
    standard = [s for s in semconv.STANDARD_STAGES if s in present]
    return standard + sorted(present - set(standard))


@dataclass(frozen=True)
class Summary:
    """A distribution of ms values: ``count`` values, percentiles (R-7 interpolation with the
    exact function), ``mean_ms``, ``variance_ms2`` (sample variance, ``None`` below 2 values) and
    ``sum_ms``."""

    count: int
    min_ms: float
    p5_ms: float
    p25_ms: float
    median_ms: float
    p75_ms: float
    p95_ms: float
    max_ms: float
    mean_ms: float
    variance_ms2: float | None
    sum_ms: float

    @property
    def swing_ms(self) -> float:
        """``p95 - p5``: how far the middle 90 % spreads (``analysis.stats`` definition)."""
        return self.p95_ms - self.p5_ms

    @property
    def iqr_ms(self) -> float:
        """``p75 - p25``."""
        return self.p75_ms - self.p25_ms

    @property
    def sum_of_squares_ms2(self) -> float:
        """``variance * (count - 1)``: the sum of squared deviations from the mean."""
        return (self.variance_ms2 or 0.0) * max(self.count - 1, 0)


def alone_of(part: Summary | None, total: Summary | None) -> float | None:
    """``var(part) / var(total)`` of two distributions over the same requests (the untraced
    time's and the total's); ``None`` when either is unknown, 0 when the total does not vary."""
    if part is None or total is None:
        return None
    ss_total = total.sum_of_squares_ms2
    return part.sum_of_squares_ms2 / ss_total if ss_total > 0 else 0.0


def summary(row: Mapping[str, Any], prefix: str) -> Summary | None:
    """The :class:`Summary` in ``row``'s ``{prefix}_*`` columns, ``None`` when it counts 0."""
    count = int(row.get(f"{prefix}_n") or 0)
    if count == 0:
        return None
    q = [float(v) for v in row[f"{prefix}_q"]]
    p5, p25, p50, p75, p95 = (q[LEVELS.index(level)] for level in LEVELS)
    variance = row.get(f"{prefix}_var")
    return Summary(
        count=count, min_ms=float(row[f"{prefix}_min"]), p5_ms=p5, p25_ms=p25, median_ms=p50,
        p75_ms=p75, p95_ms=p95, max_ms=float(row[f"{prefix}_max"]),
        mean_ms=float(row[f"{prefix}_mean"]),
        variance_ms2=None if count < 2 or variance is None else float(variance),
        sum_ms=float(row[f"{prefix}_sum"]),
    )


@dataclass(frozen=True)
class StageAggregate:
    """One stage over warm requests. ``ran``: its distribution over the requests where it ran.
    ``cross_ms2``: ``sum(stage * (total - mean_total))`` with the stage as 0 where it did not
    run. ``explained``: ``cov(stage, total) / var(total)`` = ``cross / ss_total`` (0 when the total
    does not vary). ``share_of_median``: ``ran.median / total.median``; ``share_of_time``:
    ``ran.sum / total.sum`` (these, plus the unaccounted share, add up to 1 when stages do not
    overlap). ``pixels_correlation`` / ``bytes_correlation``: Pearson correlation of the stage
    with the input's ``image.width * image.height`` / ``image.size`` over the requests where both
    are known (``None`` when undefined: fewer than 3 such requests, or a constant series);
    ``depth_correlation``: the same with the queue span's ``queue.depth``."""

    name: str
    ran: Summary
    cross_ms2: float
    explained: float
    share_of_median: float
    share_of_time: float
    pixels_correlation: float | None = None
    bytes_correlation: float | None = None
    depth_correlation: float | None = None
    #: ``var(stage) / var(total)`` with the stage as 0 where it did not run (``None``: answers
    #: without ``sq``).
    alone: float | None = None


def _alone(row: Mapping[str, Any], ran: Summary, total: Summary | None) -> float | None:
    """``var(stage) / var(total)`` over the ``total.count`` requests, the stage 0 where it did
    not run: ``(sum(ms^2) - sum(ms)^2 / n) / ss_total`` (0 when the total does not vary)."""
    sq = row.get("sq")
    if sq is None or total is None:
        return None
    ss_total = total.sum_of_squares_ms2
    if ss_total <= 0 or total.count <= 0:
        return 0.0
    return max(float(sq) - ran.sum_ms * ran.sum_ms / total.count, 0.0) / ss_total


def _stages(rows: Rows, total: Summary | None) -> dict[str, StageAggregate]:
    by_name = {str(r["stage"]): r for r in rows}
    ss_total = total.sum_of_squares_ms2 if total else 0.0
    out: dict[str, StageAggregate] = {}
    for name in ordered_stages(by_name):
        row = by_name[name]
        ran = summary(row, "stage")
        if ran is None:
            continue
        cross = float(row["cross"] or 0.0)
        out[name] = StageAggregate(
            name=name, ran=ran, cross_ms2=cross,
            explained=cross / ss_total if ss_total > 0 else 0.0,
            share_of_median=ran.median_ms / total.median_ms if total and total.median_ms > 0 else 0.0,
            share_of_time=ran.sum_ms / total.sum_ms if total and total.sum_ms > 0 else 0.0,
            pixels_correlation=_correlation(row.get("pixels_corr"), ran.count),
            bytes_correlation=_correlation(row.get("bytes_corr"), ran.count),
            alone=_alone(row, ran, total),
        )
    return out


def _with_depth(stages: dict[str, StageAggregate], rows: Rows | None) -> dict[str, StageAggregate]:
    """``stages`` with the queue stage's ``depth_correlation`` from the ``queue_depth`` row."""
    queue = stages.get(semconv.STAGE_QUEUE)
    if queue is None or not rows:
        return stages
    r = _correlation(rows[0].get("depth_corr"), int(rows[0].get("n") or 0))
    return {**stages, semconv.STAGE_QUEUE: replace(queue, depth_correlation=r)}


def _correlation(value: Any, count: int) -> float | None:
    """A correlation from the engine (NaN / NULL when undefined), ``None`` below 3 values."""
    if value is None or count < 3:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _union(rows: Rows) -> ColdComparison | None:
    """The ``cold_union`` answer (:func:`otel_stages.analysis.clickhouse_queries.cold_union_sql`)."""
    def side(name: str) -> tuple[int, float, dict[str, float]] | None:
        head = next((r for r in rows if r["side"] == name and r["stage"] == ""), None)
        if head is None or not int(head["n"] or 0):
            return None
        return int(head["n"]), float(head["median_ms"]), _per_stage(
            [r for r in rows if r["side"] == name])
    warm, cold = side("warm"), side("cold")
    if warm is None or cold is None:
        return None
    failed = next(int(r.get("failed") or 0) for r in rows if r["side"] == "cold" and r["stage"] == "")
    return ColdComparison(*warm, *cold, cold_stages_mean_ms=_per_stage(
        [r for r in rows if r["side"] == "cold"], "mean_ms"), cold_failed=failed)


def _paid(rows: Rows) -> ColdPaid | None:
    """The ``cold_paid`` answer (:func:`otel_stages.analysis.clickhouse_queries.cold_paid_sql`),
    or one input's rows of ``cold_input_paid`` (no ``side``: all cold)."""
    def side(name: str) -> tuple[int, float, dict[str, float], Mapping[str, Any]] | None:
        mine = [r for r in rows if r.get("side", "cold") == name]
        head = next((r for r in mine if r["stage"] == ""), None)
        if head is None or not int(head["n"] or 0):
            return None
        return int(head["n"]), float(head["median_ms"]), _per_stage(mine), head
    cold, warm = side("cold"), side("warm")
    if cold is None:
        return None
    head = cold[3]
    return ColdPaid(cold[0], cold[1], cold[2], inputs=int(head.get("inputs") or 0),
                    input=(head.get("w"), head.get("h"), head.get("f") or None),
                    warm=None if warm is None else warm[:3],
                    stages_mean_ms=_per_stage([r for r in rows if r.get("side", "cold") == "cold"],
                                              "mean_ms"), failed=int(head.get("failed") or 0))


def _per_stage(rows: Rows, column: str = "median_ms") -> dict[str, float]:
    """``stage -> column`` of a cold statement's per-stage ``rows`` (the ``''`` head row left
    out), in stage order (:func:`_ordered`)."""
    return _ordered({str(r["stage"]): float(r[column]) for r in rows if r["stage"] != ""})


def _cold_input(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """A cold statement's row's input: size, format and the images decoded (``images_sig``)."""
    return row["width"], row["height"], row["fmt"], row.get("images_sig") or 0


def _call(row: Mapping[str, Any]) -> Call:
    """A ``calls`` row (:func:`otel_stages.analysis.clickhouse_calls.calls_sql`) as a :class:`Call`."""
    own, callee = [_ms(q) for q in row["own_q"]], [_ms(q) for q in row["callee_q"]]
    each = [_ms(q) for q in row.get("each_q") or (None, None)]
    before = [_ms(q) for q in row.get("before_q") or (None, None)]
    after = [_ms(q) for q in row.get("after_q") or (None, None)]
    return Call(str(row["stage"]), str(row["service"]), int(row["calls"]), int(row["spans"]),
                bool(row["shared_name"]), bool(row["callee_stage"]),
                own_p5_ms=own[0], own_median_ms=own[1], own_p95_ms=own[2],
                callee_p5_ms=callee[0], callee_p95_ms=callee[1], repeated=int(row.get("repeated") or 0),
                each_p5_ms=each[0], each_p95_ms=each[1], caller=str(row.get("caller") or ""),
                before_p5_ms=before[0], before_p95_ms=before[1], after_p5_ms=after[0],
                after_p95_ms=after[1],
                unsteady_traces=tuple(str(t) for t in row.get("unsteady_traces") or ()))


def _ms(ns: Any) -> float | None:
    """A quantile in ns from the engine as ms; ``None`` for NaN (a quantile of no values)."""
    if ns is None:
        return None
    value = float(ns)
    return value / 1e6 if math.isfinite(value) else None


def _ordered(values: Mapping[str, float]) -> dict[str, float]:
    """``values`` in stage order, the untraced time's
    (:data:`~otel_stages.analysis.figures.COLD_UNTRACED`) last."""
    out = {name: values[name] for name in ordered_stages(values) if name != COLD_UNTRACED}
    if COLD_UNTRACED in values:
        out[COLD_UNTRACED] = values[COLD_UNTRACED]
    return out


def input_key(width: int | None, height: int | None, fmt: str | None, formats: int = 2) -> str:
    """The trace report's cohort key (:class:`otel_stages.analysis.cohorts.CohortKeys`):
    ``"1024x768"``, ``"1024x768 JPEG"`` when the requests hold more than one format
    (``formats``), ``"unknown"`` without a size."""
    if width is None or height is None:
        return "unknown"
    return f"{width}x{height}" + (f" {fmt or 'unknown'}" if formats > 1 else "")


@dataclass(frozen=True)
class CohortAggregate:
    """Warm requests with one input (``image.width`` x ``image.height``, ``image.format``):
    their total and per-stage statistics, ``explained`` within the cohort."""

    key: str
    width: int
    height: int
    format: str | None
    total: Summary
    stages: dict[str, StageAggregate]
    #: GPU utilization during the cohort's own warm forwards, split at its own slow-forward
    #: threshold (``None`` when not computed, e.g. answers of an older run).
    gpu: GpuAggregate | None = None
    #: Its warm requests' time outside every stage span, and the part of the cohort total's
    #: variance it explains (``None``: not computed).
    unaccounted: Summary | None = None
    unaccounted_explained: float | None = None


@dataclass(frozen=True)
class ColdPaid:
    """The cold requests compared that paid a cold start, read when they are several
    (:func:`otel_stages.analysis.clickhouse_queries.cold_paid_sql`): count, median total and
    per-stage medians, ms; ``inputs`` how many inputs they had and ``input`` one of them
    (``(width, height, format)``); ``warm``: the warm requests of those inputs (compared by input;
    :class:`ColdComparison` unprefixed figures: count, median total, per-stage medians)."""

    count: int
    median_total_ms: float
    stages_median_ms: dict[str, float]
    inputs: int = 0
    input: tuple[int | None, int | None, str | None] = (None, None, None)
    warm: tuple[int, float, dict[str, float]] | None = None
    #: the per-stage means over those cold requests (the cold figures' ``stages_mean_ms``)
    stages_mean_ms: dict[str, float] = field(default_factory=dict)
    #: those of them that failed after paying the cold start
    failed: int = 0


@dataclass(frozen=True)
class ColdInput:
    """Cold requests with one input (``width`` ``None`` = unknown) against warm requests with the
    same input: counts and median totals (``warm_median_total_ms`` ``None`` without any)."""

    key: str
    width: int | None
    height: int | None
    format: str | None
    cold_requests: int
    cold_median_total_ms: float
    warm_requests: int
    warm_median_total_ms: float | None
    warm_stages_median_ms: dict[str, float] = field(default_factory=dict)
    cold_stages_median_ms: dict[str, float] = field(default_factory=dict)
    #: the per-stage means over its cold requests
    cold_stages_mean_ms: dict[str, float] = field(default_factory=dict)
    #: those of its cold requests (two or more) that paid a cold start against the warm requests
    #: of the input (:func:`otel_stages.analysis.cohorts.paid_min_ms`;
    #: :func:`otel_stages.analysis.clickhouse_queries.cold_input_paid_sql`)
    paid: ColdPaid | None = None
    #: the images its decode spans decoded when it has several (a hash; 0 with at most one): part
    #: of the input (:func:`otel_stages.analysis.cohorts.decoded_images`)
    images_sig: int = 0


@dataclass(frozen=True)
class ColdComparison:
    """The cold requests whose input enough warm requests share, when the cold requests had
    several inputs or some not comparable (``cold_*``: count, median total, per-stage medians,
    ms), and the warm requests of those inputs (the same, unprefixed)."""

    requests: int
    median_total_ms: float
    stages_median_ms: dict[str, float]
    cold_requests: int
    cold_median_total_ms: float
    cold_stages_median_ms: dict[str, float]
    cold_stages_mean_ms: dict[str, float] = field(default_factory=dict)
    #: the cold requests among them that failed after paying the cold start
    cold_failed: int = 0


@dataclass(frozen=True)
class ColdStartAggregate:
    """Cold requests (first of each process; failed ones left out): their ``total``
    distribution, per-stage medians over the cold requests where the stage ran, and per input
    (largest first) the comparison with warm requests of the same input; ``union``: the cold
    requests whose input enough warm requests share and those inputs' warm requests
    (:class:`ColdComparison`; read only for cold requests of several inputs, some comparable);
    ``paid``: those compared that paid a cold start (:class:`ColdPaid`; read when they are
    several)."""

    total: Summary
    stages_median_ms: dict[str, float]
    by_input: list[ColdInput]
    union: ColdComparison | None = None
    paid: ColdPaid | None = None
    #: per-stage means over the cold requests where the stage ran
    stages_mean_ms: dict[str, float] = field(default_factory=dict)
    #: the cold requests in ``total`` that failed after paying the cold start
    failed: int = 0


@dataclass(frozen=True)
class GpuAggregate:
    """GPU utilization (0..1) during warm forward spans.

    ``source``: ``"span_attributes"`` (``gpu.utilization.mean`` on forward spans, weighted by
    ``gpu.sample_count``; preferred, as in ``analysis.gpu``), ``"metrics"`` (``hw.gpu.utilization``
    samples inside forward windows, per process the GPU whose utilization rises most during
    forwards) or ``None`` (no GPU data). ``forwards``: warm forward spans; ``forwards_covered``:
    those with at least one sample; ``samples``: samples inside them, ``sum_utilization`` their
    sum. ``split``: the slow forwards' and the others' sums
    (:class:`otel_stages.analysis.gpu.SplitFigures`) at ``slow_min_ms`` (the warm forward median
    plus the run's noise band); ``slow_*`` / ``fast_*`` their means. ``gpus``: GPUs taken (one per
    process with samples). ``unidentified_processes``: processes whose model GPU could not be told
    (:func:`otel_stages.analysis.gpu.pick_gpu`), left out; ``unidentified_gpus``: when one, its
    GPUs' ``(hw.id, mean utilization inside its forwards)``. ``unread_forwards``: the warm
    forward spans whose ``gpu.utilization.mean`` is no reading (as
    :func:`otel_stages.analysis.gpu.utilization_reading` reads it; 0 for a cohort).
    ``misaligned_processes``: taken GPUs less busy inside the forwards than outside them
    (:func:`otel_stages.analysis.gpu.falls`); ``misaligned_means``: when one, its ``(mean
    inside, mean outside)``.
    """

    source: str | None
    forwards: int
    forwards_covered: int = 0
    samples: int = 0
    mean_utilization: float | None = None
    slow_mean_utilization: float | None = None
    fast_mean_utilization: float | None = None
    hw_id: str | None = None
    gpus: int = 0
    sum_utilization: float = 0.0
    split: SplitFigures | None = None
    slow_min_ms: float | None = None
    unidentified_processes: int = 0
    unidentified_gpus: tuple[tuple[str, float], ...] = ()
    unread_forwards: int = 0
    misaligned_processes: int = 0
    misaligned_means: tuple[float, float] | None = None


def _ratio(num: Any, den: Any) -> float | None:
    return float(num) / float(den) if den and num is not None else None


def _split(row: Mapping[str, Any], head: Mapping[str, Any]) -> tuple[SplitFigures | None, float | None]:
    """The slow / other forwards' sums of a GPU row at the threshold of ``head`` (the
    ``slow_forwards`` answer); ``(None, None)`` without a threshold."""
    th = head.get("slow_min_ns")
    if th is None or not math.isfinite(float(th)):
        return None, None
    return SplitFigures(
        slow_forwards=int(head.get("slow_forwards") or 0), slow_covered=int(row.get("slow_covered") or 0),
        slow_samples=int(row.get("slow_n") or 0), slow_sum=float(row.get("slow_sum") or 0.0),
        fast_samples=int(row.get("fast_n") or 0), fast_sum=float(row.get("fast_sum") or 0.0),
    ), float(th) / 1e6


def _gpu(spans: Mapping[str, Any], metrics: Mapping[str, Any], forwards: int,
         slow: Mapping[str, Any]) -> GpuAggregate:
    """The forward spans' own attributes when they have data, unless they leave the slow forwards
    unsampled where the metric points do not (:func:`otel_stages.analysis.gpu.prefer_metrics`),
    else the metric points; as the file report chooses."""
    if forwards == 0:  # no warm forward to line anything up with (as analysis.gpu.gpu_evidence)
        return GpuAggregate(source=None, forwards=0)
    span_split, _ = _split(spans, slow)
    metric_split, _ = _split(metrics, slow)
    use_metrics = False
    if span_split is not None and metric_split is not None and int(metrics.get("split_gpus") or 0):
        _, span_judged = judge_level(
            _ratio(spans.get("weighted"), spans.get("samples")), int(spans.get("samples") or 0),
            int(spans.get("covered") or 0), forwards, span_split)
        _, metric_judged = judge_level(
            _ratio(metrics.get("sum_in"), metrics.get("samples")), int(metrics.get("samples") or 0),
            int(metrics.get("covered") or 0), forwards, metric_split)
        use_metrics = prefer_metrics(span_split.slow_forwards, span_judged, metric_judged)
    if int(spans.get("covered") or 0) > 0 and not use_metrics:
        covered = int(spans["covered"])
        split, slow_min = _split(spans, slow)
        return GpuAggregate(
            source="span_attributes", forwards=forwards, forwards_covered=covered,
            samples=int(spans["samples"]), mean_utilization=_ratio(spans["weighted"], spans["samples"]),
            slow_mean_utilization=_ratio(spans["slow_sum"], spans["slow_n"]),
            fast_mean_utilization=_ratio(spans["fast_sum"], spans["fast_n"]),
            sum_utilization=float(spans["weighted"] or 0.0), split=split, slow_min_ms=slow_min,
        )
    unidentified = int(metrics.get("unidentified") or 0)
    seen = tuple((hw_of(str(hw)), float(mean)) for hw, mean in metrics.get("unidentified_gpus") or ()
                 ) if unidentified == 1 else ()
    if int(metrics.get("gpus") or 0) == 0:
        if unidentified:
            split_row, slow_min = _split(metrics, slow)
            return GpuAggregate(source="metrics", forwards=forwards, split=split_row, slow_min_ms=slow_min,
                                unidentified_processes=unidentified, unidentified_gpus=seen)
        return GpuAggregate(source=None, forwards=forwards)
    split_row, slow_min = _split(metrics, slow)
    has_split = int(metrics.get("split_gpus") or 0) > 0
    misaligned = int(metrics.get("misaligned") or 0)
    gpus = int(metrics["gpus"])
    return GpuAggregate(
        source="metrics", forwards=forwards, forwards_covered=int(metrics["covered"] or 0),
        samples=int(metrics["samples"] or 0),
        mean_utilization=_ratio(metrics["sum_in"], metrics["samples"]),
        slow_mean_utilization=_ratio(metrics["slow_sum"], metrics["slow_n"]) if has_split else None,
        fast_mean_utilization=_ratio(metrics["fast_sum"], metrics["fast_n"]) if has_split else None,
        hw_id=(hw_of(str(metrics["hw_id"] or "")) or None) if gpus == 1 else None, gpus=gpus,
        sum_utilization=float(metrics["sum_in"] or 0.0), split=split_row if has_split else None,
        slow_min_ms=slow_min, unidentified_processes=unidentified, unidentified_gpus=seen,
        misaligned_processes=misaligned,
        misaligned_means=(float(metrics["misaligned_in"]), float(metrics["misaligned_out"]))
        if misaligned == 1 else None,
    )


def _cohort_gpus(results: Mapping[str, Sequence[Mapping[str, Any]]]
                 ) -> dict[tuple[Any, ...], GpuAggregate]:
    """Per cohort key ``(width, height, fmt)``: its GPU aggregate from the ``cohort_gpu_spans``
    (which carry the cohort's forwards and threshold) and ``cohort_gpu_metrics`` answers."""
    metrics = {(r["width"], r["height"], r["fmt"]): r for r in results.get("cohort_gpu_metrics") or ()}
    out = {}
    for row in results.get("cohort_gpu_spans") or ():
        key = (row["width"], row["height"], row["fmt"])
        out[key] = _gpu(row, metrics.get(key, {}), int(row["forwards"] or 0), row)
    return out


@dataclass(frozen=True)
class RunAggregate:
    """One process read: ``service.name``, ``service.instance.id`` (``""`` when not set), its
    first request's start and last request's end, its request count, its ``host.name`` (``""``
    when not set) and its ``process.pid`` (``""`` when not set or an instance id is)."""

    service_name: str
    service_instance_id: str
    first_unix_ns: int
    last_unix_ns: int
    requests: int
    host_name: str = ""
    process_pid: str = ""


@dataclass(frozen=True)
class SlowRequest:
    """One of the slowest warm requests: trace id (hex), ``request.seq``, total and per-stage
    ms, input size, and its time outside every stage span (``unaccounted_ms``)."""

    trace_id: str
    seq: int | None
    total_ms: float
    stages_ms: dict[str, float]
    image_width: int | None
    image_height: int | None
    image_bytes: int | None
    error: bool
    unaccounted_ms: float = 0.0


@dataclass(frozen=True)
class Counts:
    """``requests``: finished requests (warm + cold + failed; a cold failed request is in both
    ``cold`` and ``failed``, see ``cold_failed``). ``incomplete``: stage spans that form no
    request, as units of :mod:`otel_stages.analysis.requests`: one per parent span that never
    arrived, and one per stage span at the root of its trace (``by_trace`` of those);
    ``incomplete_spans``: the stage spans in them. ``odd_spans``: spans left out for broken times
    (spans without ids are skipped too, not counted: the exporter writes none). ``runs``:
    processes. ``warm_forwards``: forward spans of warm requests."""

    requests: int
    warm: int
    cold: int
    failed: int
    cold_failed: int
    incomplete: int
    incomplete_spans: int
    odd_spans: int
    by_trace: int
    runs: int
    warm_forwards: int
    #: cold requests (failed ones too) that are not the first of their process
    #: (``request.cold_start`` marked a later one, e.g. a model reload)
    cold_not_first: int = 0
    #: warm requests set apart as cold (:mod:`otel_stages.analysis.clickhouse_apart`): not in
    #: ``warm`` nor ``cold``
    set_apart: int = 0


@dataclass(frozen=True)
class FleetAggregates:
    """Everything the engine computed for one window (``url``: where, password left out;
    ``start_ns``/``end_ns``: the window, ``None`` = unbounded). ``total`` / ``unaccounted`` / ``stages``
    are over warm requests (``None`` / empty without any). ``cohorts``: the largest
    (``cohorts_total`` in all); ``input_mix_explains``: share of the total's variance between
    cohorts (``None`` with fewer than 2 cohorts or a constant total). ``quantile_function`` and
    ``quantile_relative_tolerance`` say how exact the percentiles are. ``unaccounted_explained``:
    ``cov(unaccounted, total) / var(total)`` (as a stage's ``explained``). ``problems``:
    readable messages about what was left out. ``issues``: the data problems the file report
    finds too (spans left out per reason, stage spans outside or overlapping, clock skew, span-id
    clashes; :mod:`otel_stages.analysis.clickhouse_issues`), their sentences first in ``problems``.
    ``failure_kinds`` / ``failure_stages``: failed requests by error kind and by where they stopped
    (:mod:`otel_stages.analysis.clickhouse_failures`; empty without failures), and
    ``failed_median_total_ms`` / ``failed_stages_ms`` their median total and each stage's median
    (``None`` / empty without failures). ``overlap``: time
    counted in two stages at once over the warm requests, as the file report's
    (:class:`~otel_stages.analysis.stage_overlap.Overlap`; ``None`` when no request has any).
    ``services``: warm and cold requests per ``service.name`` (:func:`~otel_stages.analysis
    .clickhouse_requests.services_sql`), most first; ``service_requests`` their sum over all.
    ``sampling``: the ``request.seq`` coverage and the sampler's own word
    (:func:`sampling_of`; ``None`` when the statement did not run)."""

    url: str
    start_ns: int | None
    end_ns: int | None
    service: str | None
    quantile_function: str
    quantile_relative_tolerance: float
    counts: Counts
    total: Summary | None
    unaccounted: Summary | None
    stages: dict[str, StageAggregate]
    cohorts: list[CohortAggregate]
    cohorts_total: int
    known_input_requests: int
    unknown_input_requests: int
    input_mix_explains: float | None
    unaccounted_explained: float | None
    cold_start: ColdStartAggregate | None
    gpu: GpuAggregate
    runs: list[RunAggregate]
    slowest: list[SlowRequest]
    problems: list[str] = field(default_factory=list)
    formats: int = 0
    preprocess: PreprocessFacts | None = None
    signals: list[ScopeSignals] = field(default_factory=list)
    issues: SpanIssues = field(default_factory=SpanIssues)
    failure_kinds: dict[str, int] = field(default_factory=dict)
    failure_stages: dict[str, int] = field(default_factory=dict)
    failed_median_total_ms: float | None = None
    failed_stages_ms: dict[str, float] = field(default_factory=dict)
    overlap: Overlap | None = None
    set_apart: tuple[ApartRequest, ...] = ()
    #: the warm-up among ``set_apart`` (``None``: no request set apart as warm-up)
    warmup: WarmupFigures | None = None
    services: tuple[tuple[str, int], ...] = ()
    service_requests: int = 0
    #: with ``--service`` and no request of that service: the other services whose requests hold
    #: its spans, ``(name, requests)`` most first (:func:`~otel_stages.analysis.clickhouse_services
    #: .hosts_sql`); empty otherwise
    service_hosts: tuple[tuple[str, int], ...] = ()
    #: stages that call into another service's requests read here (:mod:`otel_stages.analysis
    #: .clickhouse_calls`), most calls first
    calls: tuple[Call, ...] = ()
    #: with ``--service``: its stages that call the requests it leaves out
    #: (:func:`otel_stages.analysis.clickhouse_calls.left_out_sql`), most calls first
    calls_left_out: tuple[Call, ...] = ()
    #: the stretch of the run holding the slow warm requests (:mod:`otel_stages.analysis.episode`)
    episode: Episode | None = None
    process_mix: ProcessMix | None = None
    window_edge: WindowEdge = field(default_factory=WindowEdge)
    sampling: SeqCoverage | None = None

    def cohort_key(self, width: int | None, height: int | None, fmt: str | None) -> str | None:
        """The trace report's cohort key text (:class:`otel_stages.analysis.cohorts.CohortKeys`):
        ``"WxH"``, with the format only when the requests hold more than one (:attr:`formats`);
        ``None`` for an unknown input."""
        if width is None or height is None:
            return None
        return input_key(width, height, fmt, self.formats)

    def to_dict(self) -> dict[str, Any]:
        """The whole structure as JSON-ready dicts and lists (``swing_ms`` added to each
        distribution)."""
        data = asdict(replace(self, signals=[]))
        # the memory rule's per-forward rows stay out of the JSON: their count is enough there
        data["signals"] = [{**asdict(replace(s, memory=None)), "memory": None if s.memory is None else {
            **asdict(replace(s.memory, covered=())), "covered": len(s.memory.covered)}}
            for s in self.signals]
        return _jsonable(data)


def overlap_of(head: Mapping[str, Any], total: Summary | None) -> Overlap | None:
    """The :class:`~otel_stages.analysis.stage_overlap.Overlap` in the summary row's ``overlap_*``
    columns (``None`` when no warm request has more than the tolerance), as
    :func:`otel_stages.analysis.stage_overlap.overlap_stats` computes it: ``explains`` only from
    :data:`~otel_stages.analysis.decision.MIN_WARM_RUNS` warm requests on."""
    dist = summary(head, "overlap")
    if not int(head.get("n_overlap") or 0) or dist is None or total is None:
        return None
    explains = None
    if total.count >= MIN_WARM_RUNS:
        explains = (float(head["overlap_cross"] or 0.0) / total.sum_of_squares_ms2
                    if total.sum_of_squares_ms2 > 0 else 0.0)
    share = dist.sum_ms / total.sum_ms if total.sum_ms else 0.0
    return Overlap(int(head["n_overlap"]), dist.median_ms, dist.p95_ms - dist.p5_ms, share, explains)


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: walk(v) for k, v in node.items()}
            if {"p95_ms", "p5_ms"} <= out.keys():
                out["swing_ms"] = out["p95_ms"] - out["p5_ms"]
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return {"source": "clickhouse", **walk(data)}


def _unreadable(rows: Rows | None) -> str | None:
    """What is wrong with a metrics table (a :func:`otel_stages.analysis.clickhouse.metrics_table`
    row): ``"there is no T table"``, ``"T lacks the columns ..."``, or ``None``."""
    for r in rows or []:
        if not r["exists"]:
            return f"there is no {r['table']} table"
        if r.get("lacks"):
            return (f"{r['table']} lacks the columns {', '.join(r['lacks'])} (not the Collector"
                    " clickhouse exporter's schema)")
    return None


def _problems(issues: SpanIssues, runs_total: int,
              runs_shown: int, sum_table: str | None = None,
              memory_forwards: tuple[int, int] = (0, 0), gauge_table: str | None = None
              ) -> list[str]:
    out: list[str] = list(issues.problems)
    if gauge_table is not None:
        out.append(f"{gauge_table}: GPU utilization and memory (hw.gpu.*) and the container CPU"
                   " limit are not read; export metrics to ClickHouse too (the Collector's"
                   " clickhouse exporter), import them with otel-stages import, or name the table"
                   " with --gauge-table")
    if sum_table is not None:
        out.append(f"stage spans carry mechanism signals but {sum_table}: cgroup"
                   " CPU throttling (container.cpu.throttling_data.throttled_time, a Sum) and CPU"
                   " pressure (system.cpu.linux.pressure.total) are not read; export metrics to"
                   " ClickHouse too, or import them with otel-stages import")
    if memory_forwards[0] > memory_forwards[1]:
        out.append(f"GPU memory: {memory_forwards[0]} warm forwards have memory samples; the memory"
                   f" evidence is from a sample of {memory_forwards[1]} of them")
    if runs_total > runs_shown:
        out.append(f"runs: the first {runs_shown} of {runs_total} processes are listed")
    return out


def _version_explains(rows: Rows | None, ss_total: float) -> float | None:
    """The warm totals' variance between versions (omega squared) from
    :func:`~otel_stages.analysis.clickhouse_queries.process_versions_sql`'s per-process rows
    (``k``, ``m``, ``ss``, ``versions``) and the totals' sum of squares; ``None`` unread."""
    if not rows:
        return None
    groups: dict[str, list[tuple[int, float, float]]] = {}
    for r in rows:
        version = one_version([str(v) for v in r["versions"] or ()])
        groups.setdefault(version, []).append((int(r["k"]), float(r["m"]), float(r["ss"] or 0.0)))
    ss_within = 0.0
    for procs in groups.values():
        n = sum(k for k, _, _ in procs)
        mean = sum(k * m for k, m, _ in procs) / n
        ss_within += sum(ss + k * (m - mean) ** 2 for k, m, ss in procs)
    return omega_squared(ss_total, ss_within, len(groups), sum(int(r["k"]) for r in rows))


def omega_squared(ss_total: float, ss_within: float, groups: int, n: int) -> float | None:
    """The part of the total's variance the input cohorts explain, from sums of squares: omega
    squared, as :func:`otel_stages.analysis.stats.variance_explained_by_groups` (clipped to
    0..1; ``None`` with fewer than 2 groups, no within-group degrees of freedom, or a constant
    total)."""
    if groups < 2 or n - groups < 1 or ss_total <= 0:
        return None
    ms_within = ss_within / (n - groups)
    omega = (ss_total - ss_within - (groups - 1) * ms_within) / (ss_total + ms_within)
    return min(1.0, max(0.0, omega))


def sampling_of(coverage: Rows | None, kept: Rows | None, unbiased: Rows | None = None
                ) -> SeqCoverage | None:
    """:func:`~otel_stages.analysis.clickhouse_queries.seq_coverage_sql`'s row,
    :func:`~otel_stages.analysis.clickhouse_queries.sampling_kept_sql`'s rows and
    :func:`~otel_stages.analysis.clickhouse_queries.sampling_unbiased_sql`'s row (the last two
    run only when the first reads as sampled) as :func:`otel_stages.analysis.sampled.seq_coverage`
    answers; ``None`` without the first."""
    row = next(iter(coverage or ()), None)
    if row is None:
        return None
    head = next(iter(unbiased or ()), {})
    n = int(head.get("n") or 0)
    median_ms = head.get("median_ms")
    return SeqCoverage(int(row.get("kept") or 0), int(row.get("numbered") or 0),
                       {str(r["kept"]): int(r["n"]) for r in kept or ()}, n,
                       float(median_ms) if n and median_ms is not None else None)


def process_mix_of(row: Mapping[str, Any] | None, versions: Rows | None = None) -> ProcessMix | None:
    """:func:`otel_stages.analysis.clickhouse_queries.process_mix_sql`'s row as
    :func:`otel_stages.analysis.process_mix.process_mix` answers (``None`` where it would), with
    the two processes' versions from
    :func:`~otel_stages.analysis.clickhouse_queries.process_versions_sql`'s rows (``versions``;
    none: not read, no version)."""
    if not row:
        return None
    explains = omega_squared(float(row["ss_total"] or 0.0), float(row["ss_within"] or 0.0),
                             int(row["processes"] or 0), int(row["n"] or 0))
    if explains is None:
        return None
    read = {str(r["proc"]): one_version([str(v) for v in r["versions"] or ()]) for r in versions or ()}
    (fast, fast_n, fast_ms, fast_lo, fast_hi) = row["fastest"]
    (slow, slow_n, slow_ms, slow_lo, slow_hi) = row["slowest"]
    return ProcessMix(explains=explains, processes=int(row["processes"]),
                      version_explains=_version_explains(versions, float(row["ss_total"] or 0.0)),
                      fastest=ProcessMean(str(fast), int(fast_n), float(fast_ms), int(fast_lo), int(fast_hi),
                                          version=read.get(str(fast), "")),
                      slowest=ProcessMean(str(slow), int(slow_n), float(slow_ms), int(slow_lo), int(slow_hi),
                                          version=read.get(str(slow), "")))


def build_aggregates(results: Mapping[str, Rows], *, url: str, method: str,
                     start_ns: int | None, end_ns: int | None, service: str | None
                     ) -> FleetAggregates:
    """Assemble :class:`FleetAggregates` from the named query results
    (:func:`otel_stages.analysis.clickhouse_queries.aggregate_statements`)."""
    head = results["summary"][0]
    total = summary(head, "total")
    odd = results["odd_spans"][0] if results["odd_spans"] else {}
    span_issues = issues_of(odd, results["issues"][0] if results.get("issues") else {},
                            next(iter(results.get("clashes") or ()), None),
                            results.get("issue_spans") or [],
                            next(iter(results.get("names") or ()), None))
    counts = Counts(
        requests=int(head["n_requests"]), warm=int(head["n_warm"]), cold=int(head["n_cold"]),
        failed=int(head["n_failed"]), cold_failed=int(head["n_cold_failed"]),
        incomplete=int(head["n_incomplete"] or 0), incomplete_spans=int(head["n_incomplete_spans"] or 0),
        odd_spans=int(odd.get("n") or 0), by_trace=int(head["n_by_trace"]),
        runs=int(head["n_runs"]), warm_forwards=int(head["n_warm_forwards"] or 0),
        cold_not_first=int(head.get("n_cold_not_first") or 0),
        set_apart=apart_total(results.get("apart") or []),
    )
    formats = int(results["cohort_mix"][0].get("formats") or 0)
    cohort_stage_rows: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in results["cohort_stages"]:
        cohort_stage_rows.setdefault((row["width"], row["height"], row["fmt"]), []).append(row)
    cohort_gpu = _cohort_gpus(results)
    cohorts = []
    for row in results["cohorts"]:
        cohort_total = summary(row, "total")
        if cohort_total is None:
            continue
        key = (row["width"], row["height"], row["fmt"])
        cohorts.append(CohortAggregate(
            key=input_key(row["width"], row["height"], row["fmt"] or None, formats),
            width=int(row["width"]),
            height=int(row["height"]), format=row["fmt"] or None, total=cohort_total,
            stages=_stages(cohort_stage_rows.get(key, []), cohort_total),
            gpu=cohort_gpu.get(key), unaccounted=summary(row, "unaccounted"),
            unaccounted_explained=(float(row.get("unaccounted_cross") or 0.0)
                                   / cohort_total.sum_of_squares_ms2
                                   if cohort_total.sum_of_squares_ms2 > 0 else 0.0)))
    mix = results["cohort_mix"][0]
    ss_total = float(mix["ss_total"] or 0.0)
    n_cohorts = int(mix["cohorts"] or 0)
    cold_total = summary(results["cold"][0], "total") if results["cold"] else None
    cold_start = None
    if cold_total is not None:
        cold_start = ColdStartAggregate(
            total=cold_total,
            stages_median_ms=_per_stage(results["cold_stages"]),
            stages_mean_ms=_per_stage(results["cold_stages"], "mean_ms"),
            failed=int(results["cold"][0].get("total_failed") or 0),
            by_input=[ColdInput(
                key=input_key(r["width"], r["height"], r["fmt"] or None, formats), width=r["width"],
                height=r["height"], format=r["fmt"] or None, cold_requests=int(r["cold_n"]),
                cold_median_total_ms=float(r["cold_median_ms"]), warm_requests=int(r["warm_n"]),
                warm_median_total_ms=float(r["warm_median_ms"]) if int(r["warm_n"]) else None,
                warm_stages_median_ms=_ordered({
                    str(x["stage"]): float(x["median_ms"]) for x in results["cold_cohort_stages"]
                    if _cold_input(x) == _cold_input(r)}),
                cold_stages_median_ms=_per_stage(
                    [x for x in results["cold_input_stages"] if _cold_input(x) == _cold_input(r)]),
                cold_stages_mean_ms=_per_stage(
                    [x for x in results["cold_input_stages"] if _cold_input(x) == _cold_input(r)],
                    "mean_ms"),
                paid=_paid([x for x in results.get("cold_input_paid") or ()
                            if _cold_input(x) == _cold_input(r)]),
                images_sig=int(r.get("images_sig") or 0))
                for r in results["cold_cohorts"]],
            union=_union(results.get("cold_union") or ()),
            paid=_paid(results.get("cold_paid") or ()),
        )
    runs = [RunAggregate(**{k: r[k] for k in ("service_name", "service_instance_id",
                                              "first_unix_ns", "last_unix_ns", "requests",
                                              "host_name", "process_pid")})
            for r in results["runs"]]
    slowest = [SlowRequest(
        trace_id=r["trace_id"], seq=r["seq"], total_ms=r["total_ns"] / 1e6,
        stages_ms={n: r["stage_ns"][r["stage_names"].index(n)] / 1e6
                   for n in ordered_stages(r["stage_names"])},
        image_width=r["width"], image_height=r["height"], image_bytes=r["bytes"],
        error=bool(r["error"]), unaccounted_ms=float(r.get("unaccounted_ns") or 0) / 1e6)
        for r in results["slowest"]]
    span_gpu = results["gpu_spans"][0] if results.get("gpu_spans") else {}  # (not run yet: {})
    gpu = _gpu(span_gpu, results["gpu_metrics"][0] if results.get("gpu_metrics") else {},
               counts.warm_forwards, results["slow_forwards"][0] if results.get("slow_forwards") else {})
    # said where the evidence makes no call (gpu.with_unread); a mixed-unit process's readings too
    unread = span_issues.unread_warm_forwards + int(span_gpu.get("mixed_forwards") or 0)
    if unread:
        gpu = replace(gpu, unread_forwards=unread)
    memory = results.get("memory_forwards")
    foreign = next(iter(results.get("foreign_gpu") or ()), {})
    kinds, where = failure_kinds(results.get("failures") or [])
    failed_total, failed_stages = failed_times(results.get("failed_times") or [])
    unchecked = not_checked(
        groups=int(results["groups"][0]["n"]) if results.get("groups") else 0,
        signals=bool(results.get("signals") and results["signals"][0]["signals"]),
        grouped_preprocess=int(results["preprocess_grouped"][0]["n"])
        if results.get("preprocess_grouped") else 0)
    if results.get("gaps"):
        unchecked += gap_lines({**results["gaps"][0], **next(iter(results.get("foreign_gpu") or ()), {})},
                               standard_names=sum(1 for r in results["stages"]
                                                  if r["stage"] in semconv.STANDARD_STAGES))
    set_apart = apart_requests(results.get("apart") or [])
    return FleetAggregates(
        url=url, start_ns=start_ns, end_ns=end_ns, service=service,
        quantile_function=QUANTILE_FUNCTIONS[method],
        quantile_relative_tolerance=EXACT_RELATIVE_TOLERANCE if method == "exact"
        else DD_RELATIVE_ACCURACY,
        counts=counts, total=total, unaccounted=summary(head, "unaccounted"),
        stages=_with_depth(_stages(results["stages"], total), results.get("queue_depth")),
        cohorts=cohorts, cohorts_total=n_cohorts,
        known_input_requests=int(mix["known"] or 0), unknown_input_requests=int(mix["unknown"] or 0),
        input_mix_explains=omega_squared(ss_total, float(mix["ss_within"] or 0.0), n_cohorts,
                                         int(mix["known"] or 0)),
        formats=int(mix.get("formats") or 0),
        preprocess=preprocess_facts(results["preprocess"][0]) if results.get("preprocess") else None,
        unaccounted_explained=(float(head["unaccounted_cross"] or 0.0) / total.sum_of_squares_ms2
                               if total and total.sum_of_squares_ms2 > 0 else None),
        overlap=overlap_of(head, total),
        cold_start=cold_start,
        gpu=gpu,
        runs=runs, slowest=slowest,
        problems=_problems(span_issues, counts.runs, len(runs),
                           sum_table=_unreadable(results.get("sum_table")),
                           gauge_table=_unreadable(results.get("gauge_table")),
                           memory_forwards=(int(memory[0]["total"]), len(memory)) if memory else (0, 0))
        + mixed_unit_lines(int(span_gpu.get("mixed_processes") or 0),
                           str(span_gpu.get("mixed_example") or ""), int(span_gpu.get("mixed_forwards") or 0),
                           int(span_gpu.get("mixed_fractions") or 0), int(span_gpu.get("mixed_above") or 0))
        + unlisted_line(counts.set_apart, len(set_apart))
        + shared_hw_id_lines(shared_gpu_ids(results.get("shared_gpu_ids") or []))
        + ambiguous_unit_lines(ambiguous_units(results.get("ambiguous_units") or []))
        + unplaced_lines(int(foreign.get("unplaced") or 0), str(foreign.get("unplaced_host") or ""))
        + unchecked,
        signals=scopes(results),
        issues=span_issues,
        failure_kinds=kinds, failure_stages=where, set_apart=set_apart,
        failed_median_total_ms=failed_total, failed_stages_ms=failed_stages,
        warmup=warmup_figures(results.get("warmup") or []),
        services=tuple((str(r["service_name"]), int(r["n"])) for r in results.get("services") or ()),
        service_requests=int(next(iter(results.get("services") or ()), {}).get("all_n") or 0),
        service_hosts=tuple((str(r["service_name"]), int(r["n"]))
                            for r in results.get("service_hosts") or ()),
        calls=tuple(_call(r) for r in results.get("calls") or ()),
        calls_left_out=tuple(_call(r) for r in results.get("calls_left_out") or ()),
        process_mix=process_mix_of(next(iter(results.get("process_mix") or ()), None),
                                   results.get("process_versions")),
        window_edge=window_edge_of(next(iter(results.get("window_edge") or ()), None)),
        sampling=sampling_of(results.get("seq_coverage"), results.get("sampling_kept"),
                             results.get("sampling_unbiased")),
        episode=steady_episode(results.get("episode"), results.get("episode_outside")),
    )


def steady_episode(rows: Rows | None, outside: Rows | None) -> Episode | None:
    """:func:`episode_of` confirmed by the answer row of
    :func:`~otel_stages.analysis.clickhouse_queries.episode_outside_sql`
    (:func:`~otel_stages.analysis.episode.confirm`)."""
    if not outside:
        return None
    o = outside[0]
    swing = float(o["swing_ms"])
    one = str(o["one_proc"]) if int(o["slow_procs"]) == 1 and int(o["procs"]) > 1 else ""
    return confirm(episode_of(rows), swing if math.isfinite(swing) else None, float(o["band_ms"]),
                   start_ns=int(o["first_ns"]), end_ns=int(o["last_ns"]), process=one,
                   per_process=bool(int(o.get("per_process") or 0)))


def episode_of(rows: Rows | None) -> Episode | None:
    """:func:`~otel_stages.analysis.episode.find_episode` over the answer rows of
    :func:`~otel_stages.analysis.clickhouse_queries.episode_sql` (``None``: not read, or none): a
    candidate, before :func:`steady_episode` looks outside it."""
    if not rows:
        return None
    n, slow = [0] * EPISODE_BUCKETS, [0] * EPISODE_BUCKETS
    for r in rows:
        n[int(r["b"])], slow[int(r["b"])] = int(r["n"]), int(r["slow"])
    return find_episode(n, slow, float(rows[0]["slow_min_ms"]))


def window_edge_of(row: Mapping[str, Any] | None) -> WindowEdge:
    """:class:`~otel_stages.analysis.window_edge.WindowEdge` from the answer row of
    :func:`~otel_stages.analysis.clickhouse_requests.window_edge_sql` (``None``: no window start)."""
    n = int((row or {}).get("n") or 0)
    if not n or row is None:
        return WindowEdge()
    return WindowEdge(n, int(row["longest_ns"]) / 1e6)

