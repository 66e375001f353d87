"""GPU memory during the forwards: does memory pressure line up with the slow ones?

DESIGN.md section 1: a swinging ``forward`` whose slow runs see GPU memory near its limit or
jumping up and down (allocation and release: the caching allocator freeing and re-growing, a
fragmented heap, another process taking memory) is ``gpu_memory_pressure``; memory flat with low
utilization stays ``gpu_starved``.

Each warm forward is judged on the GPU series of its process (keyed by process then ``hw.id`` as
the utilization's, :mod:`otel_stages.analysis.gpu_owners`: a forward sees the points of its own
process and of processes that ran no request, as the ClickHouse SQL does) that have
``hw.gpu.memory.usage`` points and a positive ``hw.gpu.memory.limit`` (*readable*), and of those:

- the *model's GPUs* that are readable: the series whose ``hw.gpu.utilization`` rises inside the
  process's forwards by at least :data:`~otel_stages.analysis.gpu.MODEL_GPU_RISE_SHARE` of the
  greatest rise (:func:`otel_stages.analysis.gpu.model_gpus`: one GPU, or each GPU of a model
  split over several, tensor parallel), chosen once over the whole window's warm forwards, so
  every cohort reads the same GPUs per process. A sampler (NVML, a DCGM exporter) reports every
  GPU of the node: on a node of single-GPU model servers each process's points hold its
  neighbours' GPUs too, and their memory (a preallocating server holds 90 % of its GPU; a
  neighbour's churn) says nothing of this model's forwards;
- *every* readable series, when there is no such choice (no utilization series for the process,
  none rising, or none of the rising ones with readable memory): which GPU the model uses cannot
  be told.

Each series is read over its own largest limit (each host's GPU its own limit: an 80 GiB card and
a 24 GiB card that both report ``hw.id`` 0 are not judged against 80 GiB). From the usage points
of one series inside the forward's span: the *peak* (fraction of the limit), the *range*
(max - min, fraction of the limit; 0 with one point; shown, not judged) and the memory
*released* inside the forward (the sum of every fall between consecutive points in time order,
within each sending process's own points: :func:`released_by_sender`; fraction of the limit). The
forward is *covered* when any series read for its process has a point inside it, and its
:class:`ForwardMemory` takes, over those series, the highest peak, the highest range, the highest
released fraction (each may come from a different GPU) and all their points as ``samples``. It is
*under pressure* when its peak is at least :data:`NEAR_LIMIT_FRACTION` or it released at least
:data:`CHURN_MIN_FRACTION` (memory jumping up and down: repeated allocation and release) on some
GPU read. Memory that only grows inside a forward is its activations being allocated (a larger
batch or input takes more), not pressure, however large the growth: the range is not a test.
Forwards with no point inside are left out (a sampler every 200 ms misses short forwards). The
GPU series read (:attr:`MemoryEvidence.gpus`) are those of the processes whose forwards are read;
the evidence names their largest limit, and their ``hw.id`` when they all share one.

Under :data:`~otel_stages.analysis.gpu.MIN_FORWARD_COVERAGE` of the warm forwards with a memory
point (one process of twenty sending memory), there is not enough data: no call, as for the
utilization. The slow forwards are those that make the swing, as for the utilization
(:func:`otel_stages.analysis.gpu.slow_forward_min_ms`: longer than the warm forward median by more
than the run's noise band); the fast ones are all the others. Confirmed when, with at least
:data:`MIN_MEMORY_FORWARDS` covered forwards among the slow ones and among the fast ones, at least
:data:`PRESSURE_MIN_SLOW_SHARE` of the slow ones and at most :data:`PRESSURE_MAX_FAST_SHARE` of the
fast ones were under pressure: the pressure lines up with the slow forwards. Memory higher during
the slow forwards but clear of the limit and not churning does not make pressure.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from otel_stages import semconv
from otel_stages.analysis import gpu
from otel_stages.analysis.figures import Mechanism
from otel_stages.analysis.gpu import MIN_FORWARD_COVERAGE, slow_forward_min_ms
from otel_stages.analysis.gpu_owners import (
    SeriesKey,
    forward_owners,
    hw_of,
    owned_points,
    owned_series,
)
from otel_stages.analysis.model import MetricPoint
from otel_stages.analysis.requests import Request
from otel_stages.analysis.units import duration, pct

CAUSE_GPU_MEMORY_PRESSURE = "gpu_memory_pressure"

#: Peak memory at or above this fraction of the limit is "near its limit": caching allocators
#: (PyTorch, TensorFlow) start freeing cached blocks and retrying, and fragmentation makes large
#: allocations fail and wait, in the last ~10 %.
NEAR_LIMIT_FRACTION = 0.9
#: Memory released by at least this fraction of the limit inside one forward (4 GiB of 80: the sum
#: of its falls between points) is repeated allocation and release, not the steady state of a
#: loaded model (a caching allocator keeps what it took until the process frees it).
CHURN_MIN_FRACTION = 0.05
#: At least this share of the slow forwards must be under pressure ...
PRESSURE_MIN_SLOW_SHARE = 0.5
#: ... and at most this share of the fast ones, for the pressure to line up with the slow ones.
PRESSURE_MAX_FAST_SHARE = 0.25
#: Fewer covered forwards than this among the slow (or the fast) ones: not enough data.
MIN_MEMORY_FORWARDS = 3

_GIB = 1024 ** 3


@dataclass(frozen=True)
class ForwardMemory:
    """One warm forward: ``forward_ms``, ``peak``, ``range`` and ``released`` (fractions of the
    limit, each the highest over its process's GPU series with points inside it; module docstring)
    of its ``samples`` memory points (of all those series)."""

    forward_ms: float
    peak: float
    range: float
    samples: int
    released: float = 0.0

    @property
    def under_pressure(self) -> bool:
        """Peak near the limit, or memory released inside the forward (module docstring)."""
        return self.peak >= NEAR_LIMIT_FRACTION or self.released >= CHURN_MIN_FRACTION


@dataclass(frozen=True)
class MemoryEvidence:
    """What :func:`memory_evidence` found: one :class:`ForwardMemory` per covered warm forward,
    ``forwards`` warm forwards in all, ``limit_bytes`` (the largest limit of the GPU series read;
    the fractions are each of its own), ``hw_id`` (when every series read has the same one),
    ``gpus`` (GPU series read for the processes whose forwards are read: the model's GPU, or
    every readable series of a process without one; module docstring), the warm forward median
    ``median_ms`` and the run's noise band ``band_ms`` (they set the slow forwards)."""

    covered: tuple[ForwardMemory, ...]
    forwards: int
    limit_bytes: float
    hw_id: str | None
    median_ms: float
    band_ms: float = 0.0
    gpus: int = 1

    @property
    def slow_min_ms(self) -> float:
        """The slow-forward threshold, ms (exclusive):
        :func:`~otel_stages.analysis.gpu.slow_forward_min_ms`."""
        return slow_forward_min_ms(self.median_ms, self.band_ms)

    @property
    def slow(self) -> list[ForwardMemory]:
        """Covered forwards above the slow threshold."""
        return [f for f in self.covered if f.forward_ms > self.slow_min_ms]

    @property
    def fast(self) -> list[ForwardMemory]:
        """The other covered forwards."""
        return [f for f in self.covered if f.forward_ms <= self.slow_min_ms]


def released(values: Sequence[float]) -> float:
    """The memory released between consecutive points (time order): the sum of the falls."""
    return sum(max(a - b, 0.0) for a, b in itertools.pairwise(values))


def released_by_sender(points: Sequence[tuple[int, float, str]]) -> float:
    """:func:`released` of each sending process's own points (``(time_ns, value, sender)`` in time
    order), summed: two senders' readings of one GPU (the service's sampler and a GPU exporter)
    differ by their own offsets, and a fall from one's reading to the other's is not a release."""
    by_sender: dict[str, list[float]] = {}
    for _, v, sender in points:
        by_sender.setdefault(sender, []).append(v)
    return sum(released(values) for values in by_sender.values())


def memory_evidence(warm: Sequence[Request], points: Sequence[MetricPoint],
                    processes: Collection[str] | None = None, *,
                    band_ms: float = 0.0, model_gpus: Mapping[str, frozenset[str]] | None = None
                    ) -> MemoryEvidence | None:
    """Line GPU memory up with the warm forwards, each on the GPU series read for its process
    (module docstring); ``None`` without a readable series for a process whose forwards are read.
    ``processes``: the process keys of every request read (default: those of ``warm``), as for
    :func:`otel_stages.analysis.gpu.gpu_evidence`. ``band_ms``: the run's noise band (0: every
    forward above the median is slow). ``model_gpus``: process key -> the model's ``hw.id``
    (:func:`otel_stages.analysis.gpu.model_gpus` over the whole window's warm requests; a
    cohort's evidence is given the window's); ``None``: chosen over ``warm``."""
    if not any(p.name == semconv.HW_GPU_MEMORY_LIMIT for p in points):
        return None  # before the windows: a fleet's recording has hundreds of thousands
    # each forward on the GPU of the process that ran it (gpu_owners.forward_owners)
    ran = forward_owners(warm, points, processes)
    windows: list[tuple[int, int, int, str]] = [(e - s, s, e, proc) for proc, s, e in ran.windows]
    if not windows:
        return None
    owners, hosts = ran.owners, ran.hosts
    usage = owned_points(points, semconv.HW_GPU_MEMORY_USAGE, owners, hosts=hosts)
    limits = {k: max(v for _, v in pts) for k, pts in
              owned_series(points, semconv.HW_GPU_MEMORY_LIMIT, owners, hosts=hosts).items()}
    times = {k: [t for t, _, _ in pts] for k, pts in usage.items()}
    forward_processes = {w[3] for w in windows}
    readable: dict[str, list[SeriesKey]] = {}
    for key in sorted(usage):
        if key[0] in forward_processes and limits.get(key, 0.0) > 0:
            readable.setdefault(key[0], []).append(key)
    if not readable:
        return None
    if model_gpus is None:
        model_gpus = gpu.model_gpus(warm, points, processes)
    series: dict[str, list[SeriesKey]] = {}  # process -> the GPU series its forwards are judged on
    for proc, keys in readable.items():
        models = [key for key in keys if key[1] in model_gpus.get(proc, ())]
        series[proc] = models or keys
    covered = []
    for dur_ns, s, e, proc in windows:
        found = []  # (peak, range, released, points) of each series with points inside
        for key in series.get(proc, ()):
            ts = times[key]
            pts = usage[key][bisect.bisect_left(ts, s):bisect.bisect_right(ts, e)]
            if pts:
                vals, limit = [v for _, v, _ in pts], limits[key]
                found.append((max(vals) / limit, (max(vals) - min(vals)) / limit,
                              released_by_sender(pts) / limit, len(pts)))
        if found:
            covered.append(ForwardMemory(dur_ns / 1e6, max(f[0] for f in found),
                                         max(f[1] for f in found), sum(f[3] for f in found),
                                         max(f[2] for f in found)))
    read = [key for keys in series.values() for key in keys]
    ids = {hw_of(hw) for _, hw in read}
    all_ms = [d / 1e6 for d, _, _, _ in windows]
    return MemoryEvidence(tuple(covered), len(windows), max(limits[k] for k in read),
                          (next(iter(ids)) or None) if len(ids) == 1 else None,
                          statistics.median(all_ms), band_ms, gpus=len(read))


def _gib(fraction: float, limit: float) -> str:
    return f"{fraction * limit / _GIB:.1f} GiB"


def memory_mechanism(ev: MemoryEvidence | None) -> Mechanism | None:
    """The ``gpu_memory_pressure`` mechanism for ``forward`` (confirmed or not, with its
    evidence), or ``None`` without memory data."""
    if ev is None:
        return None
    slow, fast = ev.slow, ev.fast
    limit_text = (f"{ev.limit_bytes / _GIB:.0f} GiB" if ev.gpus == 1
                  else f"each GPU's limit ({ev.gpus} GPUs, up to {ev.limit_bytes / _GIB:.0f} GiB)")
    slow_words = (f"the slow forwards (> {duration(ev.slow_min_ms)}: the warm forward median"
                  f" {duration(ev.median_ms)} plus the run's noise band {duration(ev.band_ms)})")
    coverage = len(ev.covered) / ev.forwards if ev.forwards else 0.0
    if coverage < MIN_FORWARD_COVERAGE:
        return Mechanism(CAUSE_GPU_MEMORY_PRESSURE, False, (
            f"GPU memory: only {len(ev.covered)} of {ev.forwards} warm forwards have a memory"
            f" sample (under {pct(MIN_FORWARD_COVERAGE)}): too few to say whether memory"
            " pressure lines up with the slow forwards; sample GPU memory in every process"
            " that runs forwards",))
    if len(slow) < MIN_MEMORY_FORWARDS or len(fast) < MIN_MEMORY_FORWARDS:
        return Mechanism(CAUSE_GPU_MEMORY_PRESSURE, False, (
            f"GPU memory: too few forwards with a memory sample to line memory up with {slow_words}"
            f" ({len(slow)} of them, {len(fast)} of the others; need {MIN_MEMORY_FORWARDS} each:"
            " sample the GPU more often than the forwards last)",))
    slow_hit = [f for f in slow if f.under_pressure]
    fast_hit = [f for f in fast if f.under_pressure]
    slow_share, fast_share = len(slow_hit) / len(slow), len(fast_hit) / len(fast)
    confirmed = slow_share >= PRESSURE_MIN_SLOW_SHARE and fast_share <= PRESSURE_MAX_FAST_SHARE
    slow_peak = statistics.median(f.peak for f in slow)
    fast_peak = statistics.median(f.peak for f in fast)
    freed = max((f.released for f in slow), default=0.0)
    near = sum(1 for f in slow if f.peak >= NEAR_LIMIT_FRACTION)
    churn = sum(1 for f in slow if f.released >= CHURN_MIN_FRACTION)
    line = (f"GPU memory during {slow_words}: {len(slow_hit)} of {len(slow)} near its limit"
            f" (peak >= {pct(NEAR_LIMIT_FRACTION)}: {near}) or allocating and releasing (>="
            f" {pct(CHURN_MIN_FRACTION)} of it released within the forward: {churn}); peak median"
            f" {pct(slow_peak)} of {limit_text}, released up to"
            f" {_gib(freed, ev.limit_bytes) if ev.gpus == 1 else pct(freed) + ' of it'}."
            f" During the other forwards: {len(fast_hit)} of {len(fast)}, peak median"
            f" {pct(fast_peak)}")
    if not confirmed:
        if fast_share > PRESSURE_MAX_FAST_SHARE and slow_share >= PRESSURE_MIN_SLOW_SHARE:
            why = (f"more than {pct(PRESSURE_MAX_FAST_SHARE)} of the other forwards are under"
                   " pressure too: it does not single out the slow ones")
        elif slow_peak > fast_peak:
            why = ("memory is higher in the slow forwards but clear of its limit and not released"
                   " within them: memory that grows with the work (activations of a larger batch or"
                   " input) is not pressure")
        else:
            why = "memory stays clear of its limit and steady in most slow forwards"
        return Mechanism(CAUSE_GPU_MEMORY_PRESSURE, False, (f"{line}: {why}",))
    return Mechanism(CAUSE_GPU_MEMORY_PRESSURE, True, (
        f"{line}: memory pressure lines up with the slow forwards",
        (f"{ev.gpus} GPUs" + (f" (hw.id {ev.hw_id} on each host)" if ev.hw_id else "")
         if ev.gpus > 1 else f"hw.id {ev.hw_id}" if ev.hw_id else "")
        + f"{': ' if ev.hw_id or ev.gpus > 1 else ''}{len(ev.covered)} of {ev.forwards} warm"
        " forwards have a memory sample",
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
