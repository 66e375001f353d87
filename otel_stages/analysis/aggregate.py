"""Fleet-wide stage report from span-metrics histogram summaries (answers of
:func:`otel_stages.analysis.promql.build_queries`). Pure.

Aggregates have no per-request rows, so which stage moves with the request total (``explains``)
cannot be known. Per stage (:class:`StageSummary`): mean (rate of ``_sum`` / rate of ``_count``),
p5 / p50 / p95 / p99 from ``histogram_quantile``, span count, and ``share`` = stage mean / request
mean (means add up; quantiles do not; without a request span, / sum of stage means). Only the
spread the bucket edges *prove* counts as swing (interpolation inside one wide bucket invents a
spread): ``swing_floor_ms`` for p5..p95 and ``spike_floor_ms`` for p50..p99.

The verdict is the trace report's: :func:`decide_aggregate` turns the summaries into
:class:`~otel_stages.analysis.figures.Figures` and calls
:func:`otel_stages.analysis.decision.decide`, the one rule set with the same thresholds (stages
ranked by swing, since ``explains`` is unknown here). GPU evidence comes from the window mean of
``hw_gpu_utilization_ratio`` through the same busy / starved thresholds
(:func:`otel_stages.analysis.gpu.utilization_level`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.decision import decide
from otel_stages.analysis.figures import Figures, StageFigures, TotalFigures
from otel_stages.analysis.gpu import LEVEL_NONE, GpuEvidence, utilization_level
from otel_stages.analysis.promql import GPU_UTILIZATION, QUANTILES, build_queries, parse_vector
from otel_stages.analysis.stats import order_stages
from otel_stages.analysis.verdict import Verdict

# --- per-stage summaries --------------------------------------------------------------------------


@dataclass(frozen=True)
class StageSummary:
    """One span name over the window. Times in ms; ``count`` spans (estimated by ``increase``);
    ``share`` = mean / sum of stage means. ``swing_floor_ms`` / ``spike_floor_ms``: the least
    p95 - p5 / p99 - p50 spread the bucket edges allow (0 when both fall in one bucket)."""

    name: str
    count: float
    rate_per_s: float
    mean_ms: float | None
    p5_ms: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    swing_floor_ms: float = 0.0
    spike_floor_ms: float = 0.0
    share: float = 0.0

    @property
    def swing_ms(self) -> float | None:
        """p95 - p5 (interpolated inside buckets, as histogram_quantile does)."""
        return None if self.p95_ms is None or self.p5_ms is None else self.p95_ms - self.p5_ms

    def to_dict(self) -> dict[str, object]:
        """The report contract's stage keys (min/max unknown from histograms: ``None``) + extras."""
        return {
            "min_ms": None,
            "median_ms": _r(self.p50_ms),
            "p95_ms": _r(self.p95_ms),
            "max_ms": None,
            "share": round(self.share, 4),
            "swing_ms": _r(self.swing_ms),
            "mean_ms": _r(self.mean_ms),
            "p5_ms": _r(self.p5_ms),
            "p99_ms": _r(self.p99_ms),
            "count": round(self.count, 1),
            "rate_per_s": round(self.rate_per_s, 4),
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _buckets(
    rows: list[tuple[dict[str, str], float | None]],
) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for labels, value in rows:
        if "span_name" in labels and "le" in labels and value is not None:
            out[labels["span_name"]].append((float(labels["le"]), value))
    return {name: sorted(b) for name, b in out.items()}


def _bucket_bounds(buckets: list[tuple[float, float]], q: float) -> tuple[float, float]:
    """(lower, upper) edge of the bucket holding quantile ``q`` (cumulative counts)."""
    total = buckets[-1][1]
    lower = 0.0
    for le, cumulative in buckets:
        if cumulative >= q * total:
            return lower, le
        lower = le
    return lower, math.inf


def _floor(buckets: list[tuple[float, float]], lo_q: float, hi_q: float) -> float:
    """Least spread between quantiles ``lo_q`` and ``hi_q`` that the bucket edges prove."""
    lo_upper, hi_lower = _bucket_bounds(buckets, lo_q)[1], _bucket_bounds(buckets, hi_q)[0]
    return 0.0 if math.isinf(lo_upper) else max(0.0, hi_lower - lo_upper)


def summarize(
    answers: Mapping[str, Any], window_s: int
) -> tuple[dict[str, StageSummary], StageSummary | None]:
    """Decoded answers of :func:`build_queries` -> (stages in pipeline order, request span summary).

    Pure. Span names with no spans in the window are left out. Raises ``ValueError`` for an
    answer that is not a vector.
    """
    buckets = _buckets(parse_vector(answers["buckets"]))
    per_key = {
        key: {labels.get("span_name"): v for labels, v in parse_vector(answers[key])}
        for key in ("mean", *QUANTILES)
    }
    summaries: dict[str, StageSummary] = {}
    for name, b in buckets.items():
        count = b[-1][1] if b and math.isinf(b[-1][0]) else 0.0
        if count <= 0:
            continue
        summaries[name] = StageSummary(
            name=name,
            count=count,
            rate_per_s=count / window_s,
            mean_ms=per_key["mean"].get(name),
            p5_ms=per_key["p5"].get(name),
            p50_ms=per_key["p50"].get(name),
            p95_ms=per_key["p95"].get(name),
            p99_ms=per_key["p99"].get(name),
            swing_floor_ms=_floor(b, 0.05, 0.95),
            spike_floor_ms=_floor(b, 0.5, 0.99),
        )
    total = summaries.pop(semconv.SPAN_REQUEST, None)
    mean_sum = ((total.mean_ms if total is not None and total.mean_ms else None)
                or sum(s.mean_ms or 0.0 for s in summaries.values()) or math.inf)
    stages = {
        n: replace(summaries[n], share=(summaries[n].mean_ms or 0.0) / mean_sum)
        for n in order_stages(summaries)
    }
    return stages, total


def gpu_from_window(mean: float | None, samples: float | None) -> GpuEvidence:
    """GPU evidence from the window mean utilization (0..1; percent is rescaled) and sample count,
    with the trace report's thresholds. Not aligned to forward spans (see the module docstring)."""
    n = int(samples or 0)
    if mean is None or n == 0:
        return GpuEvidence(level=LEVEL_NONE, source="prometheus")
    mean = mean / 100.0 if mean > 1.5 else mean
    return GpuEvidence(level=utilization_level(mean, n), mean_utilization=mean, samples=n,
                       source="prometheus")


def _gpu_line(gpu: GpuEvidence, window: str) -> str:
    if gpu.level == LEVEL_NONE:
        return f"no GPU data ({GPU_UTILIZATION}) in the last {window}"
    return (
        f"GPU utilization {gpu.mean_utilization:.0%} mean over the last {window} ({gpu.samples}"
        " samples, idle time between requests included: a lightly loaded GPU reads low)"
    )


# --- verdict from aggregates --------------------------------------------------------------------


def format_window(window_s: int) -> str:
    """``3600`` -> ``"1h"``, ``5400`` -> ``"90m"``, ``45`` -> ``"45s"``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if window_s % size == 0:
            return f"{window_s // size}{unit}"
    return f"{window_s}s"


def stage_figures(s: StageSummary) -> StageFigures:
    """A histogram summary -> the rules' input: swing and spike are the proven spreads; min,
    max and ``explains`` are unknown."""
    return StageFigures(
        name=s.name, count=round(s.count), median_ms=s.p50_ms or 0.0, swing_ms=s.swing_floor_ms,
        share=s.share, p5_ms=s.p5_ms, p95_ms=s.p95_ms, mean_ms=s.mean_ms, spike_ms=s.spike_floor_ms,
    )


def figures(
    stages: Mapping[str, StageSummary], total: StageSummary | None, gpu: GpuEvidence
) -> Figures:
    """The rules' input for a window (requests estimated from the request span's count, else the
    busiest stage's)."""
    counts = [total.count] if total else [s.count for s in stages.values()]
    total_fig = None
    if total is not None and total.p50_ms:
        total_fig = TotalFigures(
            count=round(total.count), median_ms=total.p50_ms, swing_ms=total.swing_floor_ms,
            p5_ms=total.p5_ms, p95_ms=total.p95_ms, spike_ms=total.spike_floor_ms,
        )
    return Figures(
        warm_requests=round(max(counts, default=0.0)),
        stages={n: stage_figures(s) for n, s in stages.items()},
        total=total_fig,
        gpu=gpu,
    )


def decide_aggregate(
    stages: Mapping[str, StageSummary],
    total: StageSummary | None,
    gpu: GpuEvidence,
    window_s: int,
) -> Verdict:
    """Verdict from per-stage histogram summaries with the shared rules
    (:func:`otel_stages.analysis.decision.decide`), plus where the figures came from. Never raises."""
    window = format_window(window_s)
    if not stages:
        return Verdict(
            None,
            None,
            [f"no span metrics for {', '.join(semconv.STANDARD_STAGES)} in the last {window}"],
            [
                "check that the span metrics are produced before sampling (the Collector's"
                " spanmetrics connector in the traces pipeline, or the older spanmetrics processor)"
                " and reach Prometheus; widen --since"
            ],
        )
    verdict = decide(figures(stages, total, gpu))
    if verdict.stage == semconv.STAGE_FORWARD:
        verdict.evidence = [e for e in verdict.evidence if e != gpu.describe()]
        verdict.evidence.append(_gpu_line(gpu, window))
    verdict.evidence.append(
        f"from span-metrics histograms over the last {window}: aggregates cannot say which stage"
        " moves with the request total, and cold starts are mixed in; `otel-stages report"
        " --jaeger/--tempo` gives the per-request view"
    )
    return verdict


# --- the report ---------------------------------------------------------------------------------


@dataclass
class AggregateReport:
    """What ``otel-stages report --prometheus`` shows; :meth:`to_dict` keeps the report contract's
    keys (``requests`` estimated, min/max ``None``, ``cold_start`` ``None``, ``unaccounted`` with
    its share of request time only, when the request span's mean is known) plus ``source``."""

    requests: int
    stages: dict[str, StageSummary]
    total: StageSummary | None
    verdict: Verdict
    gpu: GpuEvidence
    window_s: int
    service: str | None
    queries: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def unaccounted(self) -> dict[str, float | None] | None:
        """Request time outside the stage spans, as a share (1 - the stage shares; the per-request
        gap is unknown from histograms); ``None`` without the request span's mean."""
        if self.total is None or not self.total.mean_ms:
            return None
        return {"median_ms": None,
                "share": round(max(0.0, 1.0 - sum(s.share for s in self.stages.values())), 4)}

    def to_dict(self) -> dict[str, object]:
        """JSON form (see the class docstring)."""
        return {
            "source": "prometheus",
            "requests": self.requests,
            "stages": {n: s.to_dict() for n, s in self.stages.items()},
            "total": None if self.total is None else self.total.to_dict(),
            "unaccounted": self.unaccounted(),
            "cold_start": None,
            "verdict": self.verdict.to_dict(),
            "gpu": self.gpu.to_dict(),
            "problems": list(self.problems),
            "window": {"seconds": self.window_s, "service": self.service},
            "queries": dict(self.queries),
        }


def aggregate_report(
    answers: Mapping[str, Any], *, window_s: int, service: str | None
) -> AggregateReport:
    """Decoded answers of :func:`build_queries` (by the same names) -> :class:`AggregateReport`.
    Pure. Raises ``ValueError`` when an answer is not a Prometheus vector."""
    stages, total = summarize(answers, window_s)
    gpu_mean = next((v for _, v in parse_vector(answers["gpu_mean"])), None)
    gpu_n = next((v for _, v in parse_vector(answers["gpu_samples"])), None)
    gpu = gpu_from_window(gpu_mean, gpu_n)
    counts = [total.count] if total else [s.count for s in stages.values()]
    return AggregateReport(
        requests=round(max(counts, default=0.0)),
        stages=stages,
        total=total,
        verdict=decide_aggregate(stages, total, gpu, window_s),
        gpu=gpu,
        window_s=window_s,
        service=service,
        queries=build_queries(service, window_s),
    )
