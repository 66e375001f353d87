"""GPU memory during the forwards: does memory pressure line up with the slow ones?

DESIGN.md section 1: a swinging ``forward`` whose slow runs see GPU memory near its limit or
jumping up and down (allocation and release: the caching allocator freeing and re-growing, a
fragmented heap, another process taking memory) is ``gpu_memory_pressure``; memory flat with low
utilization stays ``gpu_starved``.

Per warm forward, from the ``hw.gpu.memory.usage`` points inside its span (of one ``hw.id``: the
GPU the utilization evidence chose, else the one with most points inside forwards; a forward
sees the points of its own process and of processes that ran no request,
:mod:`otel_stages.analysis.gpu_owners`, as the ClickHouse SQL does) over that GPU's largest
``hw.gpu.memory.limit``: the *peak* (fraction of the limit) and the *range*
(max - min, fraction of the limit; 0 with one point). A forward is *under pressure* when its peak
is at least :data:`NEAR_LIMIT_FRACTION` or its range at least :data:`CHURN_MIN_FRACTION`. Forwards
with no point inside are left out (a sampler every 200 ms misses short forwards).

Confirmed when, with at least :data:`MIN_MEMORY_FORWARDS` covered forwards among the slow ones
(the slowest quarter, ``>= p75`` of all warm forwards) and among the fast ones (the faster half,
``<= median``), at least :data:`PRESSURE_MIN_SLOW_SHARE` of the slow ones and at most
:data:`PRESSURE_MAX_FAST_SHARE` of the fast ones were under pressure: the pressure lines up with
the slow forwards. Memory equally high in fast and slow forwards does not explain the swing.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from otel_stages import semconv
from otel_stages.analysis.figures import Mechanism
from otel_stages.analysis.gpu_owners import owned_series
from otel_stages.analysis.model import MetricPoint
from otel_stages.analysis.requests import Request, process_keys
from otel_stages.analysis.stats import percentile
from otel_stages.analysis.units import duration, pct

CAUSE_GPU_MEMORY_PRESSURE = "gpu_memory_pressure"

#: Peak memory at or above this fraction of the limit is "near its limit": caching allocators
#: (PyTorch, TensorFlow) start freeing cached blocks and retrying, and fragmentation makes large
#: allocations fail and wait, in the last ~10 %.
NEAR_LIMIT_FRACTION = 0.9
#: Memory moving by at least this fraction of the limit inside one forward (4 GiB of 80) is
#: repeated allocation and release, not the steady state of a loaded model.
CHURN_MIN_FRACTION = 0.05
#: At least this share of the slow forwards must be under pressure ...
PRESSURE_MIN_SLOW_SHARE = 0.5
#: ... and at most this share of the fast ones, for the pressure to line up with the slow ones.
PRESSURE_MAX_FAST_SHARE = 0.25
#: Fewer covered forwards than this among the slow (or the fast) ones: not enough data.
MIN_MEMORY_FORWARDS = 3
#: The slow forwards are those at or above this percentile of warm forward ms.
SLOW_PERCENTILE = 75.0

_GIB = 1024 ** 3


@dataclass(frozen=True)
class ForwardMemory:
    """One warm forward: ``forward_ms``, ``peak`` and ``range`` (fractions of the limit) of its
    ``samples`` memory points."""

    forward_ms: float
    peak: float
    range: float
    samples: int

    @property
    def under_pressure(self) -> bool:
        """Peak near the limit, or memory jumping inside the forward (module docstring)."""
        return self.peak >= NEAR_LIMIT_FRACTION or self.range >= CHURN_MIN_FRACTION


@dataclass(frozen=True)
class MemoryEvidence:
    """What :func:`memory_evidence` found: one :class:`ForwardMemory` per covered warm forward,
    ``forwards`` warm forwards in all, the GPU's ``limit_bytes`` and ``hw_id``, and the slow /
    fast thresholds in ms."""

    covered: tuple[ForwardMemory, ...]
    forwards: int
    limit_bytes: float
    hw_id: str | None
    slow_min_ms: float
    fast_max_ms: float

    @property
    def slow(self) -> list[ForwardMemory]:
        """Covered forwards at or above the slow threshold."""
        return [f for f in self.covered if f.forward_ms >= self.slow_min_ms]

    @property
    def fast(self) -> list[ForwardMemory]:
        """Covered forwards at or below the median."""
        return [f for f in self.covered if f.forward_ms <= self.fast_max_ms]


def memory_evidence(warm: Sequence[Request], points: Sequence[MetricPoint],
                    hw_id: str | None = None, processes: Collection[str] | None = None
                    ) -> MemoryEvidence | None:
    """Line GPU memory up with the warm forwards; ``None`` without memory and limit points.
    ``processes``: the process keys of every request read (default: those of ``warm``), as for
    :func:`otel_stages.analysis.gpu.gpu_evidence`."""
    if not any(p.name == semconv.HW_GPU_MEMORY_LIMIT for p in points):
        return None  # before the windows: a fleet's recording has hundreds of thousands
    windows: list[tuple[int, int, int, str]] = [
        (e - s, s, e, proc) for r, proc in zip(warm, process_keys(warm))
        for s, e in r.stage_windows_ns(semconv.STAGE_FORWARD)]
    if not windows:
        return None
    owners = {w[3] for w in windows} | set(processes or ())
    usage = owned_series(points, semconv.HW_GPU_MEMORY_USAGE, owners)
    limits: dict[str, float] = {}
    for (_, key), pts in owned_series(points, semconv.HW_GPU_MEMORY_LIMIT, owners).items():
        limits[key] = max(limits.get(key, float("-inf")), max(v for _, v in pts))
    times = {k: [t for t, _ in pts] for k, pts in usage.items()}

    def inside(key: str) -> list[list[float]]:
        out = []
        for _, s, e, proc in windows:
            pts, ts = usage.get((proc, key), []), times.get((proc, key), [])
            out.append([v for _, v in pts[bisect.bisect_left(ts, s):bisect.bisect_right(ts, e)]])
        return out

    candidates = sorted({k for _, k in usage} & set(limits))
    if not candidates:
        return None
    key = hw_id if hw_id in candidates else max(candidates, key=lambda k: sum(map(len, inside(k))))
    limit = limits[key]
    if limit <= 0:
        return None
    covered = tuple(
        ForwardMemory((dur_ns) / 1e6, max(vals) / limit, (max(vals) - min(vals)) / limit, len(vals))
        for (dur_ns, _, _, _), vals in zip(windows, inside(key)) if vals
    )
    all_ms = [d / 1e6 for d, _, _, _ in windows]
    return MemoryEvidence(covered, len(windows), limit, key or None,
                          percentile(all_ms, SLOW_PERCENTILE), statistics.median(all_ms))


def _gib(fraction: float, limit: float) -> str:
    return f"{fraction * limit / _GIB:.1f} GiB"


def memory_mechanism(ev: MemoryEvidence | None) -> Mechanism | None:
    """The ``gpu_memory_pressure`` mechanism for ``forward`` (confirmed or not, with its
    evidence), or ``None`` without memory data."""
    if ev is None:
        return None
    slow, fast = ev.slow, ev.fast
    limit_text = f"{ev.limit_bytes / _GIB:.0f} GiB"
    if len(slow) < MIN_MEMORY_FORWARDS or len(fast) < MIN_MEMORY_FORWARDS:
        return Mechanism(CAUSE_GPU_MEMORY_PRESSURE, False, (
            f"GPU memory: too few forwards with a memory sample to line memory up with the slow ones"
            f" ({len(slow)} of the slowest quarter, {len(fast)} of the faster half; need"
            f" {MIN_MEMORY_FORWARDS} each: sample the GPU more often than the forwards last)",))
    slow_hit = [f for f in slow if f.under_pressure]
    fast_hit = [f for f in fast if f.under_pressure]
    slow_share, fast_share = len(slow_hit) / len(slow), len(fast_hit) / len(fast)
    confirmed = slow_share >= PRESSURE_MIN_SLOW_SHARE and fast_share <= PRESSURE_MAX_FAST_SHARE
    slow_peak = statistics.median(f.peak for f in slow)
    fast_peak = statistics.median(f.peak for f in fast)
    jumps = max((f.range for f in slow), default=0.0)
    line = (f"GPU memory during the slowest quarter of forwards (>= {duration(ev.slow_min_ms)}):"
            f" {len(slow_hit)} of {len(slow)} near its limit (>= {pct(NEAR_LIMIT_FRACTION)}) or"
            f" jumping by >= {pct(CHURN_MIN_FRACTION)} of it within the forward; peak median"
            f" {pct(slow_peak)} of {limit_text}, jumps up to {_gib(jumps, ev.limit_bytes)}."
            f" During the faster half (<= {duration(ev.fast_max_ms)}): {len(fast_hit)} of"
            f" {len(fast)}, peak median {pct(fast_peak)}")
    if not confirmed:
        why = ("memory is as high in the fast forwards: it does not explain the swing"
               if fast_share > PRESSURE_MAX_FAST_SHARE else
               "memory stays clear of its limit and steady in most slow forwards")
        return Mechanism(CAUSE_GPU_MEMORY_PRESSURE, False, (f"{line}: {why}",))
    return Mechanism(CAUSE_GPU_MEMORY_PRESSURE, True, (
        f"{line}: memory pressure lines up with the slow forwards",
        f"hw.id {ev.hw_id}: {len(ev.covered)} of {ev.forwards} warm forwards have a memory sample"
        if ev.hw_id else f"{len(ev.covered)} of {ev.forwards} warm forwards have a memory sample",
    ), (
        "leave the GPU memory headroom: lower the batch size or the maximum sequence / image size,"
        " or the share of memory given to caches (e.g. vLLM gpu_memory_utilization, a smaller KV"
        " cache)",
        "stop allocating and freeing per request: reuse preallocated buffers, do not call"
        " torch.cuda.empty_cache() per request, and let PyTorch's caching allocator grow in"
        " place (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) instead of fragmenting",
        "check for other processes on the same GPU (nvidia-smi): their allocations count against"
        " the same limit",
    ))
