"""GPU utilization during the forward spans: busy, starved, or not enough data to say.

Two sources, the first that has data wins:

1. ``gpu.utilization.mean`` / ``gpu.sample_count`` set on forward spans by the sampler
   (``semconv.GPU_*``): exact per forward, weighted by sample count.
2. ``hw.gpu.utilization`` metric points, one series per process and ``hw.id``
   (:mod:`otel_stages.analysis.gpu_owners`: a request process's own points and those of
   processes that ran no request): a sample counts for a forward of that process when its time
   lies inside ``[start_ns, end_ns]`` of the forward span. Per process, the GPU whose utilization
   rises most during its forwards (vs. outside them) is taken as the model's; the sums over
   those GPUs give the evidence (as the ClickHouse SQL,
   :func:`otel_stages.analysis.clickhouse_queries.gpu_metrics_sql`). ``hw_id`` is named when one
   process's GPU was taken.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from otel_stages import semconv
from otel_stages.analysis.gpu_owners import PERCENT_GUESS, owned_series
from otel_stages.analysis.model import MetricPoint, Span
from otel_stages.analysis.requests import Request, process_keys

#: Fewer samples than this inside forward spans is too thin to call the GPU busy or starved:
#: a sampler at 5 Hz gives ~1 sample per 200 ms forward, so 5 samples is the least that averages
#: out one idle/busy blip.
MIN_GPU_SAMPLES = 5
#: Under this fraction of warm forwards with at least one sample, the samples may describe a few
#: unusual forwards rather than the typical one, so no busy/starved call is made.
MIN_FORWARD_COVERAGE = 0.3
#: Mean utilization during forwards at or above this is a busy GPU (compute-bound model): NVML's
#: "percent of time a kernel ran" stays above ~70 % for a model that keeps the GPU fed.
GPU_BUSY_MIN_UTILIZATION = 0.7
#: At or below this the GPU mostly waits during forward (data, locks, allocation, host syncs).
GPU_STARVED_MAX_UTILIZATION = 0.4

LEVEL_HIGH = "high"
LEVEL_LOW = "low"
LEVEL_MEDIUM = "medium"
LEVEL_THIN = "thin"
LEVEL_NONE = "none"


@dataclass(frozen=True)
class GpuEvidence:
    """GPU utilization (0..1) during warm forward spans and how much data backs it.

    ``level`` is ``high`` / ``low`` / ``medium`` (between the thresholds) / ``thin`` (too few
    samples or forwards covered: no call) / ``none`` (no GPU data). ``slow_`` / ``fast_`` means
    split forwards at the median forward duration.
    """

    level: str
    mean_utilization: float | None = None
    samples: int = 0
    forwards: int = 0
    forwards_covered: int = 0
    source: str | None = None
    hw_id: str | None = None
    slow_mean_utilization: float | None = None
    fast_mean_utilization: float | None = None

    @property
    def coverage(self) -> float:
        """Fraction of forwards with at least one sample (0 when there are no forwards)."""
        return self.forwards_covered / self.forwards if self.forwards else 0.0

    def describe(self) -> str:
        """One sentence with the numbers, for evidence lists and the text report."""
        if self.level == LEVEL_NONE:
            return "no GPU data (no hw.gpu.utilization points or gpu.* forward attributes)"
        mean = "n/a" if self.mean_utilization is None else f"{self.mean_utilization:.0%}"
        text = (
            f"GPU utilization during forward: {mean} mean over {self.samples} samples, "
            f"{self.forwards_covered} of {self.forwards} warm forwards covered"
        )
        if self.slow_mean_utilization is not None and self.fast_mean_utilization is not None:
            text += (
                f" (slow forwards {self.slow_mean_utilization:.0%},"
                f" fast {self.fast_mean_utilization:.0%})"
            )
        if self.level == LEVEL_THIN:
            text += (
                f"; too thin to call busy or starved (need >= {MIN_GPU_SAMPLES} samples and"
                f" >= {MIN_FORWARD_COVERAGE:.0%} of forwards covered)"
            )
        return text

    def to_dict(self) -> dict[str, object]:
        """JSON form for the report's ``gpu`` object."""
        return {
            "level": self.level,
            "mean_utilization": _round(self.mean_utilization),
            "samples": self.samples,
            "forwards": self.forwards,
            "forwards_covered": self.forwards_covered,
            "source": self.source,
            "hw_id": self.hw_id,
            "slow_forward_mean_utilization": _round(self.slow_mean_utilization),
            "fast_forward_mean_utilization": _round(self.fast_mean_utilization),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def gpu_evidence(requests: Sequence[Request], points: Sequence[MetricPoint],
                 processes: Collection[str] | None = None) -> GpuEvidence:
    """Line GPU utilization up with the forward spans of ``requests`` (pass the warm ones).

    ``points`` may hold any metrics; only ``hw.gpu.utilization`` is used. ``processes``: the
    process keys (:func:`~otel_stages.analysis.requests.process_key`) of every request read,
    cold and failed ones too (default: those of ``requests``); GPU points of other processes are
    lined up with every process's forwards. Never raises.
    """
    name = semconv.STAGE_FORWARD  # one pass over the spans of a fleet's requests, not one per use
    forwards = [s for r in requests for s in r.spans if s.name == name]
    if not forwards:
        return GpuEvidence(level=LEVEL_NONE)
    from_spans = _from_span_attributes(forwards, len(forwards))
    if from_spans is not None:
        return from_spans
    windows: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r, proc in zip(requests, process_keys(requests)):
        windows[proc].extend((s.start_ns, s.end_ns) for s in r.spans if s.name == name)
    owners = set(windows) if processes is None else set(processes) | set(windows)
    series = owned_series(points, semconv.HW_GPU_UTILIZATION, owners, PERCENT_GUESS)
    if not series:
        return GpuEvidence(level=LEVEL_NONE, forwards=len(forwards))
    by_process: dict[str, list[_Aligned]] = defaultdict(list)
    for (proc, hw_id), pts in series.items():
        by_process[proc].append(_align(hw_id, pts, windows.get(proc, [])))
    chosen = [max(found, key=lambda a: (a.rise, a.samples)) for found in by_process.values()]
    samples = sum(a.samples for a in chosen)
    covered = sum(a.covered for a in chosen)
    mean = sum(a.sum_in for a in chosen) / samples if samples else None
    split = [a for a in chosen if a.covered >= 2]
    slow_n, fast_n = sum(a.slow_n for a in split), sum(a.fast_n for a in split)
    return GpuEvidence(
        level=utilization_level(mean, samples, covered, len(forwards)),
        mean_utilization=mean,
        samples=samples,
        forwards=len(forwards),
        forwards_covered=covered,
        source="metrics",
        hw_id=(chosen[0].hw_id or None) if len(chosen) == 1 else None,
        slow_mean_utilization=sum(a.slow_sum for a in split) / slow_n if slow_n else None,
        fast_mean_utilization=sum(a.fast_sum for a in split) / fast_n if fast_n else None,
    )


def utilization_level(mean: float | None, samples: int, covered: int = 0, forwards: int = 0) -> str:
    """The evidence level for a mean utilization (0..1) backed by ``samples`` samples, ``covered``
    of ``forwards`` forwards having at least one (pass 0, 0 when coverage is unknown, e.g. for a
    window mean). The one place the busy / starved thresholds are applied."""
    if mean is None or samples < MIN_GPU_SAMPLES or covered < MIN_FORWARD_COVERAGE * forwards:
        return LEVEL_THIN
    if mean >= GPU_BUSY_MIN_UTILIZATION:
        return LEVEL_HIGH
    if mean <= GPU_STARVED_MAX_UTILIZATION:
        return LEVEL_LOW
    return LEVEL_MEDIUM


def _split_means(per_forward: list[tuple[int, list[float]]]) -> tuple[float | None, float | None]:
    """Mean utilization of slow (>= median duration) and fast forwards that have samples."""
    if len(per_forward) < 2:
        return None, None
    median_ns = statistics.median(d for d, _ in per_forward)
    slow = [v for d, vs in per_forward if d >= median_ns for v in vs]
    fast = [v for d, vs in per_forward if d < median_ns for v in vs]
    return (
        statistics.fmean(slow) if slow else None,
        statistics.fmean(fast) if fast else None,
    )


@dataclass(frozen=True)
class _Aligned:
    """One GPU series against one process's forwards: ``samples`` inside them and their
    ``sum_in``, forwards ``covered``, the sums and counts inside slow (>= the median covered
    forward) and fast forwards, and the ``rise`` of the mean inside over the mean outside."""

    hw_id: str
    samples: int
    sum_in: float
    covered: int
    slow_sum: float
    slow_n: int
    fast_sum: float
    fast_n: int
    rise: float


def _align(hw_id: str, samples: list[tuple[int, float]], windows: list[tuple[int, int]]) -> _Aligned:
    """One GPU's samples (time order, 0..1) against ``windows`` (may be empty)."""
    times = [t for t, _ in samples]
    inside_idx: set[int] = set()
    per_forward: list[tuple[int, list[float]]] = []
    for start_ns, end_ns in windows:
        lo = bisect.bisect_left(times, start_ns)
        hi = bisect.bisect_right(times, end_ns)
        if hi > lo:
            inside_idx.update(range(lo, hi))
            per_forward.append((end_ns - start_ns, [samples[i][1] for i in range(lo, hi)]))
    inside = [samples[i][1] for i in sorted(inside_idx)]
    outside = [v for i, (_, v) in enumerate(samples) if i not in inside_idx]
    slow: list[float] = []
    fast: list[float] = []
    if len(per_forward) >= 2:
        median_ns = statistics.median(d for d, _ in per_forward)
        slow = [v for d, vs in per_forward if d >= median_ns for v in vs]
        fast = [v for d, vs in per_forward if d < median_ns for v in vs]
    mean = statistics.fmean(inside) if inside else 0.0
    rise = mean - (statistics.fmean(outside) if outside else 0.0)
    return _Aligned(hw_id, len(inside), math.fsum(inside), len(per_forward), math.fsum(slow),
                    len(slow), math.fsum(fast), len(fast), rise)


def _from_span_attributes(forwards: Sequence[Span], n_forwards: int) -> GpuEvidence | None:
    per_forward: list[tuple[int, list[float]]] = []
    weighted = 0.0
    samples = 0
    for span in forwards:
        mean = span.attributes.get(semconv.GPU_UTILIZATION_MEAN)
        if not isinstance(mean, (int, float)) or isinstance(mean, bool):
            continue
        count = span.attributes.get(semconv.GPU_SAMPLE_COUNT, 1)
        count = int(count) if isinstance(count, (int, float)) else 1
        if count <= 0:
            continue
        weighted += float(mean) * count
        samples += count
        per_forward.append((span.end_ns - span.start_ns, [float(mean)] * count))
    if not per_forward:
        return None
    mean_all = weighted / samples
    slow, fast = _split_means(per_forward)
    return GpuEvidence(
        level=utilization_level(mean_all, samples, len(per_forward), n_forwards),
        mean_utilization=mean_all,
        samples=samples,
        forwards=n_forwards,
        forwards_covered=len(per_forward),
        source="span_attributes",
        slow_mean_utilization=slow,
        fast_mean_utilization=fast,
    )
