"""GPU utilization during the forward spans: busy, starved, or not enough data to say.

Two sources, the first that has data wins, unless it cannot judge the slow forwards (too few of
them sampled: below) where the second can (:func:`prefer_metrics`: a sampler that wrote span
attributes on few of the long forwards must not hide the metric points inside them):

1. ``gpu.utilization.mean`` / ``gpu.sample_count`` set on forward spans by the sampler
   (``semconv.GPU_*``): exact per forward, weighted by sample count. Their unit is guessed per
   process over its warm forwards; a process that mixes ratios and percent is left out
   (:data:`MIXED_UNIT_MIN_SHARE`).
2. ``hw.gpu.utilization`` metric points, one series per process and ``hw.id``
   (:mod:`otel_stages.analysis.gpu_owners`: a request process's own points and those of
   processes that ran no request): a sample counts for a forward of that process when its time
   lies inside ``[start_ns, end_ns]`` of the forward span. A forward recorded by a process that
   ran no request (a GPU worker under a gateway's request span) is that process's
   (:func:`~otel_stages.analysis.gpu_owners.forward_owners`). Per process, the GPU whose utilization
   rises most during its forwards (vs. outside them) is taken as the model's; the sums over
   those GPUs give the evidence (as the ClickHouse SQL,
   :func:`otel_stages.analysis.clickhouse_queries.gpu_metrics_sql`). ``hw_id`` is named when one
   process's GPU was taken. A GPU *rises* with the forwards by :data:`MIN_MODEL_GPU_RISE` and
   :data:`MIN_RISE_STANDARD_ERRORS` standard errors or more. A process that reads several GPUs
   inside its forwards gives no GPU when those that rise, or all when none rises (a node
   exporter's other GPUs, flat or noisy; a saturated service, whose forwards leave no sample
   outside them to compare with: rise 0), are at levels that differ (a shadow replica fed the same
   traffic rises too): which one runs its model cannot be told, and taking one would decide busy
   or starved by a neighbour's load (:func:`pick_gpu`). It is left out and counted
   (``unidentified_processes``); when no process is left, or the slow forwards cannot be judged
   apart (a process left out may hold them), the level is ``thin``. The GPU memory
   rule reads the memory of the GPU so chosen over the
   whole window (:func:`model_gpus`). A series whose unit cannot be told (undeclared, only 0 and
   1: :func:`otel_stages.analysis.gpu_owners.is_ambiguous`) is left out, and the problems say so.

The level is judged on the forwards that make the swing (DESIGN.md section 1: blame what explains
the swing; the mechanism is about the slow forwards). The *slow forwards* are the warm forwards
longer than the warm forward median (per forward span, every warm request's forwards) by more than
the run's noise band (:func:`otel_stages.analysis.noise.noise_band`, the band the verdict uses for
the request total): :func:`slow_forward_min_ms`. When at least :data:`MIN_SLOW_FORWARDS_COVERED` of
them, and :data:`MIN_FORWARD_COVERAGE` of them, have samples, with :data:`MIN_GPU_SAMPLES` samples
among them, the level is their mean utilization's (``judged_on`` = :data:`JUDGED_SLOW`). Otherwise
(no slow forward: the forward's spread stays inside the band; or too few of them sampled) the level
is the mean over all covered forwards' (:data:`JUDGED_ALL`), and the description says so; when the
few sampled slow forwards point to another level than that mean, the evidence contradicts itself
and the level is ``thin`` (not enough data), as it is when the samples miss the slow forwards
(:func:`slow_unsampled`: two or more of them, under :data:`MIN_FORWARD_COVERAGE` sampled; the
fast forwards' level says nothing about them). ``fast`` means every other warm forward.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from otel_stages import semconv
from otel_stages.analysis.gpu_owners import PERCENT_GUESS, forward_owners, hw_of, owned_series
from otel_stages.analysis.model import AttributeValue, MetricPoint, Span
from otel_stages.analysis.requests import Request, process_keys, usable_float, usable_int
from otel_stages.analysis.units import duration

#: Fewer samples than this inside forward spans is too thin to call the GPU busy or starved:
#: a sampler at 5 Hz gives ~1 sample per 200 ms forward, so 5 samples is the least that averages
#: out one idle/busy blip.
MIN_GPU_SAMPLES = 5
#: Under this fraction of warm forwards with at least one sample, the samples may describe a few
#: unusual forwards rather than the typical one, so no busy/starved call is made.
MIN_FORWARD_COVERAGE = 0.3
#: The slow forwards decide the level only when at least this many of them have samples: one
#: sampled forward is one event, which may be a blip (a context switch, another process's kernel).
MIN_SLOW_FORWARDS_COVERED = 2
#: Mean utilization during forwards at or above this is a busy GPU (compute-bound model): NVML's
#: "percent of time a kernel ran" stays above ~70 % for a model that keeps the GPU fed.
GPU_BUSY_MIN_UTILIZATION = 0.7
#: At or below this the GPU mostly waits during forward (data, locks, allocation, host syncs).
GPU_STARVED_MAX_UTILIZATION = 0.4
#: A GPU is seen to work with a process's forwards when its mean utilization inside them exceeds
#: its mean outside them by at least this: half a point. NVML's ``utilization.gpu`` moves in whole
#: percent, so a GPU stepping from 0 to 1 % with the forwards rises by about 1 point, somewhat
#: less where the cold request's forward counts as outside (only warm forwards are windows); a
#: flat series (another tenant's GPU on the node) rises by 0 give or take its noise. Without
#: samples outside the forwards there is nothing to compare (rise 0).
MIN_MODEL_GPU_RISE = 0.005
#: ... and by at least this many standard errors of that difference (the spread of its samples
#: inside and outside the forwards): another tenant's GPU wandering between 0 and 30 % rises by a
#: point or two inside the forwards by chance, a GPU that works with the forwards by many times
#: its noise.
MIN_RISE_STANDARD_ERRORS = 3.0
#: A process's model GPU whose mean utilization inside its forwards lies below its mean outside
#: them by at least this (five points), and by :data:`MIN_RISE_STANDARD_ERRORS` standard errors
#: or more, does not line up with the forwards (:func:`falls`): the model's kernels only add busy
#: time during its forwards, so a GPU busier between them is read on a clock or timestamps off
#: from the spans' (a sampler on another host, an exporter stamping its scrape time), or is
#: another GPU, or other work fills the gaps. A busy or starved call from those readings would
#: be a guess (a saturated GPU read 2 s off looks starved), so the level is ``thin``. Five
#: points: well above NVML's whole-percent steps and a starved GPU's wobble (low during and low
#: between, a point apart), below a shifted busy / idle pattern (tens of points).
MIN_MISALIGNED_FALL = 0.05
#: ... and only with at least this many readings during the warm forwards and this many between
#: them (outside every forward span of the process: a reading inside the cold request's forward,
#: or a failed or set-apart request's, is inside a forward, not between): a standard error of one
#: reading is none (its variance is 0), so one stray reading between the forwards made the fall
#: "3 standard errors" by itself. Five, as :data:`MIN_GPU_SAMPLES`: the least that averages out
#: one idle / busy blip.
MIN_MISALIGNED_READINGS = 5
#: A forward span's ``gpu.utilization.mean`` outside 0 .. this is no reading (a ratio or a percent
#: never is): a ``-1`` "not available" sentinel read as starved, a 1000 as busy.
MAX_UTILIZATION_READING = 100.0

LEVEL_HIGH = "high"
LEVEL_LOW = "low"
LEVEL_MEDIUM = "medium"
LEVEL_THIN = "thin"
LEVEL_NONE = "none"

#: ``GpuEvidence.judged_on``: the level is the slow forwards' (module docstring).
JUDGED_SLOW = "slow_forwards"
#: ``GpuEvidence.judged_on``: the level is all covered forwards' (no slow forwards, or too few
#: of them sampled).
JUDGED_ALL = "all_forwards"


def slow_forward_min_ms(forward_median_ms: float, band_ms: float) -> float:
    """The least duration (exclusive) of a slow forward, ms: the warm forward median plus the
    run's noise band (module docstring)."""
    return forward_median_ms + band_ms


@dataclass(frozen=True)
class GpuEvidence:
    """GPU utilization (0..1) during warm forward spans and how much data backs it.

    ``level`` is ``high`` / ``low`` / ``medium`` (between the thresholds) / ``thin`` (too few
    samples or forwards covered: no call) / ``none`` (no GPU data), judged on the slow forwards
    or on all (``judged_on``, module docstring). ``mean_utilization`` / ``samples`` /
    ``forwards_covered``: over all ``forwards`` warm forwards. ``slow_min_ms``: the slow-forward
    threshold (ms, exclusive; ``None`` when the run's noise band was not given), ``slow_forwards``
    warm forwards above it, ``slow_covered`` of them with samples, ``slow_samples`` samples in
    them; ``slow_`` / ``fast_mean_utilization``: mean over the slow forwards' / the others'
    samples (``None`` without samples there). ``unidentified_processes``: processes left out
    because their model's GPU cannot be told (:func:`pick_gpu`); ``unidentified_gpus``: when that
    is one process, its GPUs' ``(hw.id, mean utilization inside its forwards)``, by ``hw.id``.
    ``unread_forwards``: with no GPU data or too little (``none`` / ``thin``), the warm forward
    spans whose ``gpu.utilization.mean`` is no reading (:func:`utilization_reading`; the problems
    count them over every request; set by :func:`with_unread`), so the evidence and advice say
    the values are unusable, not missing. ``misaligned_processes``: processes whose model GPU is
    less busy inside their forwards than outside them (:func:`falls`): the level is then ``thin``;
    ``misaligned_means``: when that is one process, its ``(mean inside, mean outside)``, 0..1.
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
    slow_min_ms: float | None = None
    slow_forwards: int = 0
    slow_covered: int = 0
    slow_samples: int = 0
    judged_on: str = JUDGED_ALL
    unidentified_processes: int = 0
    unidentified_gpus: tuple[tuple[str, float], ...] = ()
    unread_forwards: int = 0
    misaligned_processes: int = 0
    misaligned_means: tuple[float, float] | None = None

    @property
    def coverage(self) -> float:
        """Fraction of forwards with at least one sample (0 when there are no forwards)."""
        return self.forwards_covered / self.forwards if self.forwards else 0.0

    @property
    def judged_utilization(self) -> float | None:
        """The mean the level was judged on (the slow forwards' or all forwards')."""
        return self.slow_mean_utilization if self.judged_on == JUDGED_SLOW else self.mean_utilization

    def judged_words(self) -> str:
        """The judged mean with the forwards it covers, e.g. ``95% during the 2 slow forwards
        (> 117.0 ms)``, for sentences that give the level's reason."""
        value = self.judged_utilization
        mean = "n/a" if value is None else f"{value:.0%}"
        if self.judged_on == JUDGED_SLOW and self.slow_min_ms is not None:
            return (f"{mean} during the {self.slow_forwards} slow forwards"
                    f" (> {duration(self.slow_min_ms)})")
        return f"{mean} during the forwards"

    def describe(self) -> str:
        """One sentence with the numbers, for evidence lists and the text report."""
        if self.level == LEVEL_NONE and self.unread_forwards:
            n = self.unread_forwards
            return (f"no GPU data: the {semconv.GPU_UTILIZATION_MEAN} of {n} forward"
                    f" span{'s is' if n != 1 else ' is'} no reading (see the problems), and no usable"
                    " hw.gpu.utilization points")
        if self.level == LEVEL_NONE:
            # "usable": an ambiguous-unit series is left out (gpu_owners.is_ambiguous), said in problems
            return ("no GPU data (no usable hw.gpu.utilization points or gpu.* forward"
                    " attributes)")
        mean = "n/a" if self.mean_utilization is None else f"{self.mean_utilization:.0%}"
        overall = (f"{mean} mean over {self.samples} samples, {self.forwards_covered} of"
                   f" {self.forwards} warm forwards covered")
        if self.misaligned_processes:
            return self._misaligned_words(overall)
        fast = ("" if self.fast_mean_utilization is None
                else f", the other forwards {self.fast_mean_utilization:.0%}")
        if self.judged_on == JUDGED_SLOW and self.slow_min_ms is not None:
            assert self.slow_mean_utilization is not None  # judged on them
            text = (f"GPU utilization during the slow forwards (the {self.slow_forwards} longer"
                    f" than {duration(self.slow_min_ms)}: the warm forward median plus the run's"
                    f" noise band): {self.slow_mean_utilization:.0%} over {self.slow_samples}"
                    f" samples, {self.slow_covered} of them covered{fast}; over all forwards"
                    f" {overall}")
        else:
            text = f"GPU utilization during forward: {overall}"
            if self.slow_min_ms is not None and self.level != LEVEL_THIN:
                text += (f"; judged on all forwards: {self._why_all()}")
            elif self.slow_mean_utilization is not None and self.slow_min_ms is not None:
                text += (f"; the {self.slow_covered} sampled of the {self.slow_forwards} slow"
                         f" forwards (> {duration(self.slow_min_ms)}) show"
                         f" {self.slow_mean_utilization:.0%}{fast}")
        if self.level == LEVEL_THIN and not self.samples and self.unidentified_processes:
            return self._unidentified_words() + "; too thin to call busy or starved"
        if self.level == LEVEL_THIN and self.unidentified_processes:
            return (text + "; left out: " + self._unidentified_words() + "; the slow forwards"
                    " cannot be judged apart without them: too thin to call busy or starved")
        if self.level == LEVEL_THIN:
            text += self._why_thin()
        if self.unidentified_processes:
            text += "; left out: " + self._unidentified_words()
        if self.level == LEVEL_THIN and self.unread_forwards:
            n = self.unread_forwards
            text += (f"; the {semconv.GPU_UTILIZATION_MEAN} of {n} warm forward"
                     f" span{'s is' if n != 1 else ' is'} no reading (see the problems)")
        return text

    def _misaligned_words(self, overall: str) -> str:
        n = self.misaligned_processes
        means = self.misaligned_means
        figures = (f"{means[0]:.0%} mean during, {means[1]:.0%} between" if means is not None
                   else f"in {n} processes")
        return (f"the GPU readings do not line up with the forward spans: the GPU is less busy"
                f" during the forwards than between them ({figures};"
                f" {MIN_MISALIGNED_FALL * 100:g} points and {MIN_RISE_STANDARD_ERRORS:g}"
                f" standard errors lower or more, over {MIN_MISALIGNED_READINGS}+ readings each),"
                " so the sampler's clock or timestamps are most"
                " likely off from the spans' (or these are another GPU's readings, or other work"
                " fills the gaps): no busy or starved call is made from them (during the forwards:"
                f" {overall})")

    def _unidentified_words(self) -> str:
        n = self.unidentified_processes
        gpus = ", ".join(f"hw.id {hw or '(none)'} {mean:.0%}" for hw, mean in self.unidentified_gpus)
        which = (f"{n} processes each read several GPUs" if n > 1 else
                 f"1 process reads {len(self.unidentified_gpus)} GPUs ({gpus})")
        return (f"{which} during the forwards at different levels, and either none rises with"
                f" the forwards (by {MIN_MODEL_GPU_RISE * 100:g} point and"
                f" {MIN_RISE_STANDARD_ERRORS:g} standard errors over its level outside them: a"
                " node's other GPUs, or no sample outside the forwards to compare) or several do"
                " (a replica fed the same traffic): which one runs the model cannot be told")

    def _why_all(self) -> str:
        if self.slow_forwards == 0:
            assert self.slow_min_ms is not None
            return (f"no forward is longer than {duration(self.slow_min_ms)} (the warm forward"
                    " median plus the run's noise band)")
        return (f"only {self.slow_covered} of the {self.slow_forwards} slow forwards"
                f" (> {duration(self.slow_min_ms or 0.0)}) have GPU samples ({self.slow_samples}"
                " samples), too few to judge them apart")

    def _why_thin(self) -> str:
        overall = utilization_level(self.mean_utilization, self.samples, self.forwards_covered,
                                    self.forwards)
        need = (f"need >= {MIN_SLOW_FORWARDS_COVERED} sampled slow forwards,"
                f" >= {MIN_FORWARD_COVERAGE:.0%} of them, and >= {MIN_GPU_SAMPLES} samples in them")
        if (self.slow_forwards and self.slow_mean_utilization is not None and overall != LEVEL_THIN
                and _level_of(self.slow_mean_utilization) != overall):
            return ("; the few sampled slow forwards and the mean over all forwards point different"
                    f" ways: too thin to call busy or starved ({need})")
        if overall != LEVEL_THIN and slow_unsampled(self.slow_forwards, self.slow_covered):
            return (f"; only {self.slow_covered} of the {self.slow_forwards} slow forwards"
                    f" (> {duration(self.slow_min_ms or 0.0)}) have GPU samples: the samples miss"
                    " the forwards that make the swing, and the other forwards' level says nothing"
                    f" about them: too thin to call busy or starved ({need})")
        return (f"; too thin to call busy or starved (need >= {MIN_GPU_SAMPLES} samples and"
                f" >= {MIN_FORWARD_COVERAGE:.0%} of forwards covered)")

    def to_dict(self) -> dict[str, object]:
        """JSON form for the report's ``gpu`` object."""
        return {
            "level": self.level,
            "judged_on": self.judged_on,
            "mean_utilization": _round(self.mean_utilization),
            "samples": self.samples,
            "forwards": self.forwards,
            "forwards_covered": self.forwards_covered,
            "source": self.source,
            "hw_id": self.hw_id,
            "slow_forward_min_ms": _round(self.slow_min_ms),
            "slow_forwards": self.slow_forwards,
            "slow_forwards_covered": self.slow_covered,
            "slow_forward_samples": self.slow_samples,
            "slow_forward_mean_utilization": _round(self.slow_mean_utilization),
            "fast_forward_mean_utilization": _round(self.fast_mean_utilization),
            "unidentified_processes": self.unidentified_processes,
            "unread_forwards": self.unread_forwards,
            "misaligned_processes": self.misaligned_processes,
        }


def with_unread(gpu: GpuEvidence, unread_forwards: int) -> GpuEvidence:
    """``gpu`` with ``unread_forwards`` (warm forward spans whose ``gpu.utilization.mean`` is no
    reading) when they may be why it makes no call (level ``none`` or ``thin``), else as it is:
    both reports' one rule for :attr:`GpuEvidence.unread_forwards`."""
    if gpu.level in (LEVEL_NONE, LEVEL_THIN) and unread_forwards:
        return replace(gpu, unread_forwards=unread_forwards)
    return gpu


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def gpu_evidence(requests: Sequence[Request], points: Sequence[MetricPoint],
                 processes: Collection[str] | None = None, *,
                 band_ms: float | None = None, units: SpanUnits | None = None,
                 misaligned: int | None = None, aside: Sequence[Request] = ()) -> GpuEvidence:
    """Line GPU utilization up with the forward spans of ``requests`` (pass the warm ones).

    ``points`` may hold any metrics; only ``hw.gpu.utilization`` is used. ``processes``: the
    process keys (:func:`~otel_stages.analysis.requests.process_key`) of every request read,
    cold and failed ones too (default: those of ``requests``); GPU points of other processes are
    lined up with every process's forwards. ``band_ms``: the run's noise band
    (:func:`otel_stages.analysis.noise.noise_band`), which sets the slow forwards (module
    docstring); without it the level is judged on all forwards. ``units``: each process's unit
    of its forward spans' readings (:func:`span_units` of all warm requests; default: of
    ``requests``). ``misaligned``: for a cohort, the whole window's
    :func:`misaligned_processes` (a sampler's clock is the run's, and a cohort's forwards
    against the others' would fall by the others' load); ``None``: judged on ``requests``, with
    ``aside`` (the requests read that are not warm: cold, failed, set apart) whose forwards'
    readings are not between the forwards (:func:`falls`). Never raises.
    """
    name = semconv.STAGE_FORWARD  # one pass over the spans of a fleet's requests, not one per use
    forwards = [s for r in requests for s in r.spans if s.name == name]
    every = [(s.start_ns, s.end_ns) for s in forwards]
    if not every:
        return GpuEvidence(level=LEVEL_NONE)
    slow_min_ns = None
    if band_ms is not None:
        median_ms = statistics.median(e - s for s, e in every) / 1e6
        slow_min_ns = slow_forward_min_ms(median_ms, band_ms) * 1e6
    procs = [p for r, p in zip(requests, process_keys(requests)) for s in r.spans if s.name == name]
    from_spans = _from_span_attributes(forwards, procs, every, slow_min_ns,
                                       span_units(requests) if units is None else units)
    if from_spans is not None and (from_spans.slow_forwards == 0
                                   or from_spans.judged_on == JUDGED_SLOW):
        return from_spans
    from_metrics = _from_metrics(requests, points, processes, every, slow_min_ns, misaligned,
                                 aside)
    if from_spans is not None and not prefer_metrics(
            from_spans.slow_forwards, from_spans.judged_on, from_metrics.judged_on):
        return from_spans
    return from_metrics


def prefer_metrics(slow_forwards: int, span_judged_on: str, metric_judged_on: str) -> bool:
    """Whether the metric points judge the GPU rather than the forward spans' own attributes
    (module docstring): there are slow forwards, the spans' samples cannot judge them
    (``judged_on`` is not :data:`JUDGED_SLOW`: :func:`judge_level`) and the metric points' can."""
    return slow_forwards > 0 and span_judged_on != JUDGED_SLOW and metric_judged_on == JUDGED_SLOW


def _from_metrics(requests: Sequence[Request], points: Sequence[MetricPoint],
                  processes: Collection[str] | None, every: Sequence[tuple[int, int]],
                  slow_min_ns: float | None, misaligned: int | None = None,
                  aside: Sequence[Request] = ()) -> GpuEvidence:
    """The evidence of the ``hw.gpu.utilization`` points (module docstring, source 2);
    ``misaligned``, ``aside``: as :func:`gpu_evidence`."""
    by_process = _aligned(requests, points, processes, slow_min_ns,
                          aside if misaligned is None else ())
    if not by_process:
        return GpuEvidence(level=LEVEL_NONE, forwards=len(every))
    picked = {proc: pick_gpu(found) for proc, found in by_process.items()}
    chosen = [a for a in picked.values() if a is not None]
    untold = sorted(proc for proc, a in picked.items() if a is None)
    gpus = () if len(untold) != 1 else tuple(
        (hw_of(a.hw_id), a.sum_in / a.samples) for a in sorted(by_process[untold[0]], key=lambda a: a.hw_id)
        if a.samples)
    split = None if slow_min_ns is None else SplitFigures(
        slow_forwards=sum(1 for s, e in every if e - s > slow_min_ns),
        slow_covered=sum(a.slow_covered for a in chosen),
        slow_samples=sum(a.slow_n for a in chosen), slow_sum=math.fsum(a.slow_sum for a in chosen),
        fast_samples=sum(a.fast_n for a in chosen), fast_sum=math.fsum(a.fast_sum for a in chosen))
    falling = [a for a in chosen if falls(a)] if misaligned is None else []
    one = falling[0] if len(falling) == 1 else None
    return evidence_of(
        misaligned_processes=len(falling) if misaligned is None else misaligned,
        misaligned_means=None if one is None else (
            one.sum_in / one.samples, one.sum_in / one.samples + one.drop),
        source="metrics", forwards=len(every), covered=sum(a.covered for a in chosen),
        samples=sum(a.samples for a in chosen), total=math.fsum(a.sum_in for a in chosen),
        split=split, slow_min_ms=None if slow_min_ns is None else slow_min_ns / 1e6,
        hw_id=(hw_of(chosen[0].hw_id) or None) if len(chosen) == 1 else None,
        unidentified_processes=len(untold), unidentified_gpus=gpus)


def _aligned(requests: Sequence[Request], points: Sequence[MetricPoint],
             processes: Collection[str] | None, slow_min_ns: float | None,
             aside: Sequence[Request] = ()) -> dict[str, list[_Aligned]]:
    """Every ``hw.gpu.utilization`` series of each process (module docstring, source 2) against
    the forwards it ran: each forward span is lined up with the GPU of the process that recorded
    it where that process ran no request (a GPU worker under a gateway's request:
    :func:`~otel_stages.analysis.gpu_owners.forward_owners`), else with its request's process's;
    empty without a series. ``aside``: requests whose forwards hold readings that are neither
    inside ``requests``' forwards nor between them (:func:`_align`)."""
    found = forward_owners(requests, points, processes)
    windows: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for proc, start_ns, end_ns in found.windows:
        windows[proc].append((start_ns, end_ns))
    others: dict[str, list[tuple[int, int]]] = defaultdict(list)
    if aside:
        every = processes if processes is not None else frozenset(process_keys(requests))
        for proc, start_ns, end_ns in forward_owners(aside, points, every).windows:
            others[proc].append((start_ns, end_ns))
    series = owned_series(points, semconv.HW_GPU_UTILIZATION, found.owners, PERCENT_GUESS,
                          found.hosts)
    by_process: dict[str, list[_Aligned]] = defaultdict(list)
    for (proc, hw_id), pts in series.items():
        by_process[proc].append(_align(hw_id, pts, windows.get(proc, []), slow_min_ns,
                                       others.get(proc, ())))
    return by_process


def _rank(a: _Aligned) -> tuple[float, int]:
    """How a process's GPU is chosen: the highest rise (at :data:`LEVEL_DECIMALS`: sums of the same
    values in another order differ in the last bits, in SQL too), then the most samples inside
    forwards."""
    return round(a.rise, LEVEL_DECIMALS), a.samples


def _choice(a: _Aligned) -> tuple[float, int, str]:
    """:func:`_rank`, then the greater series id, so that a tie (one GPU read by two senders at the
    same instants) is broken as the ClickHouse SQL breaks it (``argMax`` on the same tuple)."""
    return *_rank(a), a.hw_id


def _levels(a: _Aligned) -> tuple[str, str | None]:
    """The levels a series would give: over its samples inside the forwards, and inside the slow
    ones (``None`` without)."""
    return (_level_of(a.sum_in / a.samples),
            _level_of(a.slow_sum / a.slow_n) if a.slow_n else None)


def rises(a: _Aligned) -> bool:
    """Whether a series rises with the forwards: samples inside them, a rise of
    :data:`MIN_MODEL_GPU_RISE` or more and of :data:`MIN_RISE_STANDARD_ERRORS` standard errors or
    more (both at :data:`LEVEL_DECIMALS`, as the SQL compares them)."""
    rise = round(a.rise, LEVEL_DECIMALS)
    return (a.samples > 0 and rise >= MIN_MODEL_GPU_RISE
            and rise >= round(MIN_RISE_STANDARD_ERRORS * a.rise_se, LEVEL_DECIMALS))


def falls(a: _Aligned) -> bool:
    """Whether a series is less busy inside the warm forwards than between the process's
    forwards (``a.drop``): :data:`MIN_MISALIGNED_READINGS` readings or more on each side, a drop
    of :data:`MIN_MISALIGNED_FALL` or more and of :data:`MIN_RISE_STANDARD_ERRORS` standard
    errors or more (at :data:`LEVEL_DECIMALS`, as the SQL compares them): the readings do not
    line up with the forwards."""
    drop = round(a.drop, LEVEL_DECIMALS)
    return (a.samples >= MIN_MISALIGNED_READINGS and a.between >= MIN_MISALIGNED_READINGS
            and drop >= MIN_MISALIGNED_FALL
            and drop >= round(MIN_RISE_STANDARD_ERRORS * a.drop_se, LEVEL_DECIMALS))


def misaligned_processes(requests: Sequence[Request], points: Sequence[MetricPoint],
                         processes: Collection[str] | None = None,
                         aside: Sequence[Request] = ()) -> int:
    """The processes whose model GPU (:func:`pick_gpu`) :func:`falls` over the forwards of
    ``requests`` (pass the whole window's warm ones; ``processes``, ``aside`` as for
    :func:`gpu_evidence`): what each cohort's GPU evidence reads (:func:`gpu_evidence`
    ``misaligned``)."""
    picked = (pick_gpu(found) for found in _aligned(requests, points, processes, None,
                                                     aside).values())
    return sum(1 for a in picked if a is not None and falls(a))


def pick_gpu(found: Sequence[_Aligned]) -> _Aligned | None:
    """The series taken as a process's model GPU among ``found`` (its series against its
    forwards): with one series with samples inside the forwards, the greatest :func:`_choice`;
    with several, the greatest among those that :func:`rises` (all of them when none does),
    unless their levels (:func:`_levels`) differ: then ``None``, the model's GPU cannot be told
    (module docstring). The ClickHouse SQL decides alike
    (:func:`otel_stages.analysis.clickhouse_queries.gpu_metrics_sql`)."""
    seen = [a for a in found if a.samples]
    if len(seen) <= 1:
        return max(found, key=_choice)
    pool = [a for a in seen if rises(a)] or seen
    return max(pool, key=_choice) if len({_levels(a) for a in pool}) == 1 else None


#: A GPU whose utilization rises inside a process's forwards by at least this share of the most
#: any of its GPUs rises works with that one (a model split over GPUs, tensor parallel: each
#: rises with the forwards); the others (a node's other tenants, flat or idle) are not the model's.
MODEL_GPU_RISE_SHARE = 0.5


def model_gpus(requests: Sequence[Request], points: Sequence[MetricPoint],
               processes: Collection[str] | None = None) -> dict[str, frozenset[str]]:
    """Per process key, the series (``hw.id`` parts of :data:`~otel_stages.analysis.gpu_owners.
    SeriesKey`) of the GPUs its model runs on: those whose ``hw.gpu.utilization`` rises inside the
    process's forwards (over outside them, at :data:`LEVEL_DECIMALS`) by at least
    :data:`MODEL_GPU_RISE_SHARE` of the greatest rise, among those that :func:`rises` (module
    docstring,
    source 2), over the forwards of ``requests`` (pass the whole window's warm ones: one choice
    for every cohort). A process left out has no utilization series or none that rises (nothing
    tells its model's GPUs). ``processes``: as for :func:`gpu_evidence`. The GPU memory rule reads
    these GPUs' memory (:mod:`otel_stages.analysis.gpu_memory`); the ClickHouse SQL chooses the
    same (:func:`otel_stages.analysis.clickhouse_queries.model_gpus_sql`)."""
    out = {}
    for proc, found in _aligned(requests, points, processes, None).items():
        rising = [a for a in found if rises(a)]
        if rising:
            top = max(_rank(a)[0] for a in rising)
            out[proc] = frozenset(a.hw_id for a in rising if _rank(a)[0] >= MODEL_GPU_RISE_SHARE * top)
    return out


#: Means are compared with the thresholds at this many decimals: a mean of samples all at 0.4 is
#: 0.4000000000000001 in floating point, and must read as "at the threshold", not above it.
LEVEL_DECIMALS = 9


def _level_of(mean: float) -> str:
    mean = round(mean, LEVEL_DECIMALS)
    if mean >= GPU_BUSY_MIN_UTILIZATION:
        return LEVEL_HIGH
    if mean <= GPU_STARVED_MAX_UTILIZATION:
        return LEVEL_LOW
    return LEVEL_MEDIUM


def utilization_level(mean: float | None, samples: int, covered: int = 0, forwards: int = 0) -> str:
    """The evidence level for a mean utilization (0..1) backed by ``samples`` samples, ``covered``
    of ``forwards`` forwards having at least one (pass 0, 0 when coverage is unknown, e.g. for a
    window mean). The one place the busy / starved thresholds are applied."""
    if mean is None or samples < MIN_GPU_SAMPLES or covered < MIN_FORWARD_COVERAGE * forwards:
        return LEVEL_THIN
    return _level_of(mean)


@dataclass(frozen=True)
class SplitFigures:
    """The slow / other forwards' sums behind a :class:`GpuEvidence` (module docstring), as both
    the file report and SQL compute them: ``slow_forwards`` warm forwards above the threshold,
    ``slow_covered`` of them with samples, ``slow_samples`` / ``slow_sum`` their samples and the
    sum of their values (0..1), ``fast_samples`` / ``fast_sum`` the others'."""

    slow_forwards: int = 0
    slow_covered: int = 0
    slow_samples: int = 0
    slow_sum: float = 0.0
    fast_samples: int = 0
    fast_sum: float = 0.0


def judge_level(mean: float | None, samples: int, covered: int, forwards: int,
                split: SplitFigures | None) -> tuple[str, str]:
    """``(level, judged_on)`` for the overall figures and the slow forwards' ``split`` (``None``:
    no noise band given): the module docstring's rule. Both sources call it."""
    overall = utilization_level(mean, samples, covered, forwards)
    if split is None or split.slow_forwards == 0:
        return overall, JUDGED_ALL
    slow_mean = split.slow_sum / split.slow_samples if split.slow_samples else None
    slow = utilization_level(slow_mean, split.slow_samples, split.slow_covered, split.slow_forwards)
    if split.slow_covered >= MIN_SLOW_FORWARDS_COVERED and slow != LEVEL_THIN:
        return slow, JUDGED_SLOW
    if slow_mean is not None and overall != LEVEL_THIN and _level_of(slow_mean) != overall:
        return LEVEL_THIN, JUDGED_ALL  # the few slow samples contradict the overall mean
    if slow_unsampled(split.slow_forwards, split.slow_covered):
        return LEVEL_THIN, JUDGED_ALL  # the samples miss the slow forwards: the others cannot speak
    return overall, JUDGED_ALL


def slow_unsampled(slow_forwards: int, slow_covered: int) -> bool:
    """Whether the samples miss the slow forwards: at least :data:`MIN_SLOW_FORWARDS_COVERED` of
    them, under :data:`MIN_FORWARD_COVERAGE` of them sampled. A slow forward is longer than the
    others, so a sampler that ticks on a clock covers it at least as often; missing most of them
    is no chance but a sampler that stalled with them, or readings left unusable on them, and the
    other forwards' level says nothing about the ones that make the swing (module docstring)."""
    return (slow_forwards >= MIN_SLOW_FORWARDS_COVERED
            and slow_covered < MIN_FORWARD_COVERAGE * slow_forwards)


def evidence_of(*, source: str, forwards: int, covered: int, samples: int, total: float,
                split: SplitFigures | None, slow_min_ms: float | None,
                hw_id: str | None = None, unidentified_processes: int = 0,
                unidentified_gpus: tuple[tuple[str, float], ...] = (),
                misaligned_processes: int = 0,
                misaligned_means: tuple[float, float] | None = None) -> GpuEvidence:
    """:class:`GpuEvidence` from sums (``total``: the sum of the ``samples`` values, 0..1),
    judged by :func:`judge_level`: the file report and the ClickHouse aggregates alike.
    ``unidentified_*``: the processes left out by :func:`pick_gpu`; ``misaligned_*``: the
    processes whose model GPU :func:`falls`, which make the level ``thin`` (:class:`GpuEvidence`)."""
    mean = total / samples if samples else None
    level, judged = judge_level(mean, samples, covered, forwards, split)
    if unidentified_processes and judged == JUDGED_ALL and split is not None and split.slow_forwards:
        # the slow forwards could not be judged apart, and a process left out may hold them: the
        # other processes' forwards say nothing about them
        level = LEVEL_THIN
    if misaligned_processes:
        level = LEVEL_THIN  # readings off from the forwards: no busy / starved call from them
    return GpuEvidence(
        level=level, mean_utilization=mean, samples=samples, forwards=forwards,
        forwards_covered=covered, source=source, hw_id=hw_id,
        slow_mean_utilization=(split.slow_sum / split.slow_samples
                               if split is not None and split.slow_samples else None),
        fast_mean_utilization=(split.fast_sum / split.fast_samples
                               if split is not None and split.fast_samples else None),
        slow_min_ms=slow_min_ms,
        slow_forwards=split.slow_forwards if split is not None else 0,
        slow_covered=split.slow_covered if split is not None else 0,
        slow_samples=split.slow_samples if split is not None else 0,
        judged_on=judged,
        unidentified_processes=unidentified_processes,
        unidentified_gpus=unidentified_gpus if unidentified_processes == 1 else (),
        misaligned_processes=misaligned_processes,
        misaligned_means=misaligned_means if misaligned_processes == 1 else None,
    )


def _split(per_forward: list[tuple[int, int, float]], windows: Sequence[tuple[int, int]],
           slow_min_ns: float | None) -> SplitFigures | None:
    """Sums over the slow forwards (longer than ``slow_min_ns``) and the others; ``per_forward``:
    (duration ns, samples, their sum) of the covered forwards."""
    if slow_min_ns is None:
        return None
    slow = [(n, total) for d, n, total in per_forward if d > slow_min_ns]
    fast = [(n, total) for d, n, total in per_forward if d <= slow_min_ns]
    return SplitFigures(
        slow_forwards=sum(1 for s, e in windows if e - s > slow_min_ns),
        slow_covered=len(slow),
        slow_samples=sum(n for n, _ in slow), slow_sum=sum(total for _, total in slow),
        fast_samples=sum(n for n, _ in fast), fast_sum=sum(total for _, total in fast),
    )


@dataclass(frozen=True)
class _Aligned:
    """One GPU series against one process's forwards: ``samples`` inside them and their
    ``sum_in``, forwards ``covered``, the slow forwards (longer than the threshold) covered, the
    sums and counts inside slow and other forwards, the ``rise`` of the mean inside over the
    mean outside and its standard error ``rise_se`` (0 without samples on either side); the
    ``between`` readings, outside every forward of the process (warm or not), and the ``drop``
    of the mean inside below their mean with its standard error ``drop_se`` (0 without readings
    on either side): what :func:`falls` reads."""

    hw_id: str
    samples: int
    sum_in: float
    covered: int
    slow_covered: int
    slow_sum: float
    slow_n: int
    fast_sum: float
    fast_n: int
    rise: float
    rise_se: float = 0.0
    between: int = 0
    drop: float = 0.0
    drop_se: float = 0.0


def _align(hw_id: str, samples: list[tuple[int, float]], windows: list[tuple[int, int]],
           slow_min_ns: float | None, aside: Sequence[tuple[int, int]] = ()) -> _Aligned:
    """One GPU's samples (time order, 0..1) against ``windows`` (may be empty); slow forwards are
    longer than ``slow_min_ns`` (``None``: no split). ``aside``: the process's other forwards
    (cold, failed, set apart): their readings are neither inside ``windows`` nor between."""
    times = [t for t, _ in samples]
    inside_idx: set[int] = set()
    per_forward: list[tuple[int, int, float]] = []
    for start_ns, end_ns in windows:
        lo = bisect.bisect_left(times, start_ns)
        hi = bisect.bisect_right(times, end_ns)
        if hi > lo:
            inside_idx.update(range(lo, hi))
            per_forward.append((end_ns - start_ns, hi - lo, sum(samples[i][1] for i in range(lo, hi))))
    inside = [samples[i][1] for i in sorted(inside_idx)]
    outside = [v for i, (_, v) in enumerate(samples) if i not in inside_idx]
    split = _split(per_forward, windows, slow_min_ns) or SplitFigures()
    mean = statistics.fmean(inside) if inside else 0.0
    # no sample outside the forwards (a saturated service): nothing to compare, no rise
    rise = mean - statistics.fmean(outside) if outside else 0.0
    se = _difference_se(inside, outside)
    near = set(inside_idx)
    for start_ns, end_ns in aside:
        near.update(range(bisect.bisect_left(times, start_ns), bisect.bisect_right(times, end_ns)))
    between = [v for i, (_, v) in enumerate(samples) if i not in near] if aside else outside
    drop = statistics.fmean(between) - mean if inside and between else 0.0
    return _Aligned(hw_id, len(inside), math.fsum(inside), len(per_forward), split.slow_covered,
                    split.slow_sum, split.slow_samples, split.fast_sum, split.fast_samples, rise, se,
                    len(between), drop, _difference_se(inside, between))


def _difference_se(a: Sequence[float], b: Sequence[float]) -> float:
    """The standard error of the difference of the means of ``a`` and ``b`` (population
    variances, :func:`_variance`); 0 when either is empty."""
    return math.sqrt(_variance(a) / len(a) + _variance(b) / len(b)) if a and b else 0.0


def _variance(values: Sequence[float]) -> float:
    """Population variance from the sums, as the SQL computes it (never below 0)."""
    n = len(values)
    mean = math.fsum(values) / n
    return max(0.0, math.fsum(v * v for v in values) / n - mean * mean)


#: The most samples one forward span's ``gpu.sample_count`` may claim (a 1 kHz sampler over a
#: forward of 1000 s): more is no count a sampler wrote, and would outweigh every other forward.
MAX_SAMPLE_COUNT = 1_000_000


def utilization_reading(attributes: Mapping[str, AttributeValue]) -> tuple[float, int] | None:
    """``(mean, samples)`` from a forward span's ``gpu.utilization.mean`` (a number in 0 ..
    :data:`MAX_UTILIZATION_READING`: NVML's -1 "not available" or a value past 100 % is no
    reading) and ``gpu.sample_count`` (1 when absent; a reading needs an int above 0 and at most
    :data:`MAX_SAMPLE_COUNT`: a count that is no int, ``"abc"`` or ``"3.0"``, is no count a
    sampler wrote, and reading it as 1 would weigh a guess); ``None`` when the span has no such
    reading (the attribute absent or not one: :mod:`otel_stages.analysis.value_issues` counts
    the latter)."""
    mean = usable_float(attributes.get(semconv.GPU_UTILIZATION_MEAN))
    if mean is None or not 0.0 <= mean <= MAX_UTILIZATION_READING:
        return None
    count = usable_int(attributes.get(semconv.GPU_SAMPLE_COUNT, 1))
    return (mean, count) if count is not None and 0 < count <= MAX_SAMPLE_COUNT else None


#: A forward span's ``gpu.utilization.mean`` carries no unit, so each process's unit is guessed
#: over all its warm forwards' readings (one sampler writes one unit): with a value above
#: :data:`~otel_stages.analysis.gpu_owners.PERCENT_GUESS` it wrote percent, else ratios. But when
#: fractions (strictly between 0 and 1) are this share or more of its readings that are fractions
#: or above the guess, the process mixes the two (a ratio sampler with a stray percent value, or
#: a unit changed partway): read as percent, a busy GPU's 0.95 would be 1 % and the verdict a
#: confident ``gpu_starved``; read as ratios, percent values are no reading. Neither can be told,
#: so its readings are left out of the GPU evidence and the problems say so
#: (:func:`mixed_unit_lines`). Below the share, the fractions are percent of a GPU near idle in
#: those forwards (a mean of 0 % and 1 % samples is 0.5). 0 and a whole 1 (a saturated GPU's ratio,
#: or 1 %) count for neither.
MIXED_UNIT_MIN_SHARE = 0.5


def unit_divisor(above: int, fractions: int) -> float | None:
    """What one process's forward-span utilization readings are divided by, from how many are
    above :data:`~otel_stages.analysis.gpu_owners.PERCENT_GUESS` (``above``) and strictly between
    0 and 1 (``fractions``): 1 (ratios) with none above, ``None`` (mixed units: left out) when
    the fractions are :data:`MIXED_UNIT_MIN_SHARE` or more of both, else 100 (percent). The
    ClickHouse SQL writes the same rule
    (:func:`otel_stages.analysis.clickhouse_queries.span_units_sql`)."""
    if above == 0:
        return 1.0
    return None if fractions >= MIXED_UNIT_MIN_SHARE * (above + fractions) else 100.0


@dataclass(frozen=True)
class SpanUnits:
    """The unit of each process's forward-span readings (:data:`MIXED_UNIT_MIN_SHARE`), guessed
    once over all warm forwards and kept for every cohort (a cohort whose forwards all read
    0.5 % is not ratios because its own readings stay below 1). ``divisors``: process key ->
    100 (percent), 1 (ratios) or ``None`` (mixed: left out); ``mixed_forwards``: the readings
    left out, of which ``mixed_fractions`` are fractions and ``mixed_above`` above the guess."""

    divisors: Mapping[str, float | None]
    mixed_forwards: int = 0
    mixed_fractions: int = 0
    mixed_above: int = 0

    @property
    def mixed_processes(self) -> list[str]:
        """The processes left out, sorted."""
        return sorted(p for p, d in self.divisors.items() if d is None)

    def problems(self) -> list[str]:
        """:func:`mixed_unit_lines` of these units."""
        mixed = self.mixed_processes
        return mixed_unit_lines(len(mixed), mixed[0] if mixed else "", self.mixed_forwards,
                                self.mixed_fractions, self.mixed_above)


def mixed_unit_lines(processes: int, example: str, forwards: int, fractions: int, above: int
                     ) -> list[str]:
    """The problem line for ``processes`` whose warm forward spans mix ratios and percent (none
    when 0; ``example``: the first by process key; ``forwards``: their readings, ``fractions``
    and ``above`` as :func:`unit_divisor` counts them): the same text from the file report and
    the ClickHouse report."""
    if not processes:
        return []
    n = processes
    return [
        f"{semconv.GPU_UTILIZATION_MEAN}: the warm forward spans of {n} process{'es' if n > 1 else ''}"
        f" (e.g. {example or '(no service)'}) mix ratios and percent ({fractions} values"
        f" between 0 and 1, {above} above {PERCENT_GUESS:g}): one sampler writes one unit, and which"
        f" is which cannot be told (read as percent, a busy GPU's 0.95 is 1 %), so their {forwards}"
        " readings are left out of the GPU evidence. Write ratios (0..1), as otel-stages' sampler"
        " does"]


def span_units(requests: Sequence[Request]) -> SpanUnits:
    """The :class:`SpanUnits` of the forward spans of ``requests`` (pass the warm ones)."""
    name = semconv.STAGE_FORWARD
    above: dict[str, int] = defaultdict(int)
    fractions: dict[str, int] = defaultdict(int)
    readings: dict[str, int] = defaultdict(int)
    for r, proc in zip(requests, process_keys(requests)):
        for span in r.spans:
            if span.name != name:
                continue
            reading = utilization_reading(span.attributes)
            if reading is None:
                continue
            readings[proc] += 1
            if reading[0] > PERCENT_GUESS:
                above[proc] += 1
            elif 0.0 < reading[0] < 1.0:
                fractions[proc] += 1
    divisors = {p: unit_divisor(above[p], fractions[p]) for p in readings}
    mixed = [p for p, d in divisors.items() if d is None]
    return SpanUnits(divisors, mixed_forwards=sum(readings[p] for p in mixed),
                     mixed_fractions=sum(fractions[p] for p in mixed),
                     mixed_above=sum(above[p] for p in mixed))


def _from_span_attributes(forwards: Sequence[Span], procs: Sequence[str],
                          windows: Sequence[tuple[int, int]],
                          slow_min_ns: float | None, units: SpanUnits) -> GpuEvidence | None:
    """Source 1 (module docstring); ``procs``: each forward's process key; ``units``: each
    process's unit (:class:`SpanUnits`; a process it does not know reads as ratios)."""
    found: list[tuple[int, float, int]] = []
    for span, proc in zip(forwards, procs):
        reading = utilization_reading(span.attributes)
        divisor = units.divisors.get(proc, 1.0)
        if reading is None or divisor is None:
            continue
        mean, count = reading
        found.append((span.end_ns - span.start_ns, mean / divisor, count))
    if not found:
        return None
    per_forward = [(d, count, mean * count) for d, mean, count in found]
    weighted = math.fsum(mean * count for _, mean, count in found)
    samples = sum(count for _, _, count in found)
    return evidence_of(
        source="span_attributes", forwards=len(windows), covered=len(per_forward),
        samples=samples, total=weighted, split=_split(per_forward, windows, slow_min_ns),
        slow_min_ms=None if slow_min_ns is None else slow_min_ns / 1e6)
