"""Fleet-wide stage report from span-metrics histogram summaries (answers of
:func:`otel_stages.analysis.promql.build_queries`). Pure.

Aggregates have no per-request rows, so the trace report's swing analysis (which stage moves with
the request total) cannot run. Instead, per stage (:class:`StageSummary`): mean (rate of ``_sum`` /
rate of ``_count``), p5 / p50 / p95 / p99 from ``histogram_quantile``, span count, and
``share`` = stage mean / sum of stage means (means add up; quantiles do not). The verdict
(:func:`decide_aggregate`) applies the trace report's thresholds to the p95 - p5 spread: a stage
swings when its spread reaches ``SWING_MIN_FRACTION`` of the median request (or p99 - p50 reaches
``SPIKE_MIN_FRACTION``), counting only the spread the bucket edges *prove* (interpolation inside
one wide bucket invents a spread). The widest-swinging stage is the suspect; the stage -> cause
mapping is :func:`otel_stages.analysis.verdict.cause_for`, with GPU evidence from the window mean
of ``hw_gpu_utilization_ratio``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from otel_stages import semconv
from otel_stages.analysis import advice as advice_text
from otel_stages.analysis.gpu import (
    GPU_BUSY_MIN_UTILIZATION,
    GPU_STARVED_MAX_UTILIZATION,
    LEVEL_HIGH,
    LEVEL_LOW,
    LEVEL_MEDIUM,
    LEVEL_NONE,
    LEVEL_THIN,
    MIN_GPU_SAMPLES,
    GpuEvidence,
)
from otel_stages.analysis.promql import GPU_UTILIZATION, QUANTILES, build_queries, parse_vector
from otel_stages.analysis.stats import order_stages
from otel_stages.analysis.verdict import (
    CAUSE_STABLE,
    SPIKE_MIN_FRACTION,
    SWING_MIN_FRACTION,
    Verdict,
    cause_for,
)

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
    mean_sum = sum(s.mean_ms or 0.0 for s in summaries.values()) or math.inf
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
    if n < MIN_GPU_SAMPLES:
        level = LEVEL_THIN
    elif mean >= GPU_BUSY_MIN_UTILIZATION:
        level = LEVEL_HIGH
    elif mean <= GPU_STARVED_MAX_UTILIZATION:
        level = LEVEL_LOW
    else:
        level = LEVEL_MEDIUM
    return GpuEvidence(level=level, mean_utilization=mean, samples=n, source="prometheus")


def _gpu_line(gpu: GpuEvidence, window: str) -> str:
    if gpu.level == LEVEL_NONE:
        return f"no GPU data ({GPU_UTILIZATION}) in the last {window}"
    return (
        f"GPU utilization {gpu.mean_utilization:.0%} mean over the last {window} ({gpu.samples}"
        " samples, idle time between requests included: a lightly loaded GPU reads low)"
    )


# --- verdict from aggregates --------------------------------------------------------------------


def _swings(s: StageSummary, median_total_ms: float) -> bool:
    return median_total_ms > 0 and (
        s.swing_floor_ms >= SWING_MIN_FRACTION * median_total_ms
        or s.spike_floor_ms >= SPIKE_MIN_FRACTION * median_total_ms
    )


def format_window(window_s: int) -> str:
    """``3600`` -> ``"1h"``, ``5400`` -> ``"90m"``, ``45`` -> ``"45s"``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if window_s % size == 0:
            return f"{window_s // size}{unit}"
    return f"{window_s}s"


def decide_aggregate(
    stages: Mapping[str, StageSummary],
    total: StageSummary | None,
    gpu: GpuEvidence,
    window_s: int,
) -> Verdict:
    """Verdict from per-stage histogram summaries (rules in the module docstring). Never raises."""
    window = format_window(window_s)
    if not stages:
        return Verdict(
            None,
            None,
            [f"no span metrics for {', '.join(semconv.STANDARD_STAGES)} in the last {window}"],
            [
                "check that the collector's span_metrics connector sits in the traces pipeline"
                " before sampling and that its metrics reach Prometheus; widen --since"
            ],
        )
    median_total = (total.p50_ms if total and total.p50_ms else None) or sum(
        s.p50_ms or 0.0 for s in stages.values()
    )
    ranked = sorted(
        stages.values(), key=lambda s: (s.swing_floor_ms, s.swing_ms or 0.0, s.share), reverse=True
    )
    swinging = [s for s in ranked if _swings(s, median_total)]
    source = (
        f"from span-metrics histograms over the last {window}: aggregates cannot say which stage"
        " moves with the request total, and cold starts are mixed in; `otel-stages report"
        " --jaeger/--tempo` gives the per-request view"
    )
    if swinging:
        s = swinging[0]
        cause = cause_for(s.name, gpu)
        evidence = [
            f"{s.name} swings: p5 {s.p5_ms:.1f} -> p95 {s.p95_ms:.1f} ms (p99 {s.p99_ms:.1f} ms);"
            f" the histogram buckets put p5 and p95 at least {s.swing_floor_ms:.1f} ms apart,"
            f" {s.swing_floor_ms / median_total:.0%} of the median request ({median_total:.1f} ms)",
            f"{s.name} is {s.share:.0%} of the summed stage means (mean {s.mean_ms or 0:.1f} ms,"
            f" {s.count:.0f} spans)",
        ]
        if len(swinging) > 1:
            nxt = swinging[1]
            evidence.append(f"next: {nxt.name} swings at least {nxt.swing_floor_ms:.1f} ms")
        else:
            others = [o for o in ranked if o is not s]
            if others and others[0].swing_floor_ms > 0:
                evidence.append(
                    f"no other stage swings: the widest, {others[0].name}, by at least"
                    f" {others[0].swing_floor_ms:.1f} ms"
                )
            elif others:
                evidence.append("no other stage spreads beyond one histogram bucket")
        if s.name == semconv.STAGE_FORWARD:
            evidence.append(_gpu_line(gpu, window))
        verdict = Verdict(cause, s.name, evidence, advice_text.for_cause(cause, gpu_level=gpu.level))
    elif total is not None and _swings(total, median_total):
        verdict = Verdict(
            None,
            None,
            [
                f"request total swings (p5 {total.p5_ms:.1f} -> p95 {total.p95_ms:.1f} ms) but no"
                " stage does: the time is outside the stage spans"
            ],
            [advice_text.UNTRACED],
        )
    else:
        largest = max(stages.values(), key=lambda x: x.share)
        verdict = Verdict(
            CAUSE_STABLE,
            None,
            [
                f"no stage swings beyond the histogram resolution around a median request of"
                f" {median_total:.1f} ms",
                f"largest share: {largest.name} at {largest.share:.0%} of the summed stage means"
                f" (mean {largest.mean_ms or 0:.1f} ms)",
            ],
            advice_text.for_stable(largest.name),
        )
    verdict.evidence.append(source)
    return verdict


# --- the report ---------------------------------------------------------------------------------


@dataclass
class AggregateReport:
    """What ``otel-stages report --prometheus`` shows; :meth:`to_dict` keeps the report contract's
    keys (``requests`` estimated, min/max ``None``, ``cold_start`` ``None``) plus ``source``."""

    requests: int
    stages: dict[str, StageSummary]
    total: StageSummary | None
    verdict: Verdict
    gpu: GpuEvidence
    window_s: int
    service: str | None
    queries: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        """JSON form (see the class docstring)."""
        return {
            "source": "prometheus",
            "requests": self.requests,
            "stages": {n: s.to_dict() for n, s in self.stages.items()},
            "total": None if self.total is None else self.total.to_dict(),
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
