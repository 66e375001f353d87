"""The figures of one stage's signals over the warm requests: :class:`Part` per signal (how
much of the stage's time it is, in the slowest quarter of runs and in the faster half, and the
share of the stage's variance it explains) and :class:`StageSignals`, what the mechanism rules of
:mod:`otel_stages.analysis.mechanisms` judge. Computed from a stage's columns
(:mod:`otel_stages.analysis.stage_signals`, numpy with exact arithmetic) or, for columns holding
NaN and as the tests' reference, from per-request lists; :class:`Held` summarises the spans that
held an event loop. Pure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from otel_stages.analysis import columns
from otel_stages.analysis.figures import Mechanism
from otel_stages.analysis.stage_signals import StageColumns
from otel_stages.analysis.stats import explained_fraction, percentile

#: The percentile of CPU/wall that stands for a stage's best runs.
BUSY_PERCENTILE = 75.0


#: The slow runs are those at or above this percentile of the stage's ms; the fast ones at or
#: below the median.
SLOW_PERCENTILE = 75.0
#: The tail: runs at or above this percentile of the stage's ms. When a tenth of the runs carry
#: the swing, the slowest quarter's median lands on runs that are only a little slow; the tail's
#: median CPU/wall is what the slowest runs did.
TAIL_PERCENTILE = 90.0


#: Runs with less thread CPU time than this (ms) are left out of the slowdown ratio (a ratio of
#: two tiny numbers says nothing).
_MIN_CPU_MS = 0.01


@dataclass(frozen=True)
class Part:
    """One signal's part of a stage: known for ``requests`` warm requests, ``median_ms`` over
    them, the medians in the slowest quarter and the faster half, and ``explains``, its share of
    the stage's variance (``None`` when the stage does not vary); ``max_ms`` its largest value."""

    requests: int
    median_ms: float
    slow_median_ms: float | None
    fast_median_ms: float | None
    explains: float | None
    max_ms: float = 0.0

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        def r(v: float | None, digits: int = 3) -> float | None:
            return None if v is None else round(v, digits)
        return {"requests": self.requests, "median_ms": r(self.median_ms),
                "slow_median_ms": r(self.slow_median_ms), "fast_median_ms": r(self.fast_median_ms),
                "explains": r(self.explains, 4), "max_ms": r(self.max_ms)}


@dataclass(frozen=True)
class StageSignals:
    """What the signals say about one stage over the warm requests.

    ``requests``: warm requests the stage ran in; ``slow_min_ms`` / ``fast_max_ms``: the slowest
    quarter's and the faster half's bounds. Parts (:class:`Part`, ``None`` when not recorded):
    ``cpu`` (thread CPU time), ``wait`` (wall - CPU), ``gc``, ``lag`` (event loop), ``throttled``,
    ``pressure`` (CPU pressure stall time while the stage ran, Linux PSI ``some``), ``runq`` (the
    stage thread's run-queue wait, Linux schedstat) and ``blocked`` (``wall - CPU - runq``: off
    the CPU and not waiting for one). ``pressure_scope``: ``cgroup`` or ``host`` (which tasks the
    pressure counts; ``None`` without pressure).
    ``slow_cpu_utilization`` / ``fast_cpu_utilization``: median CPU/wall in each group, and
    ``tail_cpu_utilization`` in the runs at or above :data:`TAIL_PERCENTILE`;
    ``busy_utilization`` its upper quartile over all runs. ``slowdown_explains``: the share of the
    variance of ``log(stage ms)`` that ``log(wall / CPU)`` accounts for (see
    :mod:`~otel_stages.analysis.mechanisms`).
    ``limit_cpus``: the cgroup CPU quota seen. ``loop_holder``: the stage whose spans held the
    event loop longest in all (``None`` when none did). ``mechanisms``: in order of precedence
    (:mod:`~otel_stages.analysis.mechanisms`).
    ``lines``: sentences about the parts when no mechanism is confirmed.
    """

    stage: str
    requests: int
    slow_min_ms: float
    fast_max_ms: float
    cpu: Part | None = None
    wait: Part | None = None
    gc: Part | None = None
    lag: Part | None = None
    throttled: Part | None = None
    pressure: Part | None = None
    runq: Part | None = None
    blocked: Part | None = None
    pressure_scope: str | None = None
    slow_cpu_utilization: float | None = None
    tail_cpu_utilization: float | None = None
    fast_cpu_utilization: float | None = None
    busy_utilization: float | None = None
    slowdown_explains: float | None = None
    limit_cpus: float | None = None
    loop_holder: str | None = None
    mechanisms: tuple[Mechanism, ...] = ()
    lines: tuple[str, ...] = ()

    @property
    def confirmed(self) -> Mechanism | None:
        """The first confirmed mechanism, or ``None``."""
        return next((m for m in self.mechanisms if m.confirmed), None)

    @property
    def pressure_of_wait(self) -> float | None:
        """CPU pressure during the slowest quarter's waiting: their median pressure over their
        median wait (``wall - CPU``), 1.0 when they did not wait; ``None`` when either is
        unknown. What ``cpu_contention`` checks (:mod:`~otel_stages.analysis.mechanisms`)."""
        wait, pressure = self.wait, self.pressure
        if (wait is None or pressure is None or wait.slow_median_ms is None
                or pressure.slow_median_ms is None):
            return None
        return pressure.slow_median_ms / wait.slow_median_ms if wait.slow_median_ms > 0 else 1.0

    def to_dict(self) -> dict[str, object]:
        """The report's ``signals[stage]`` object."""
        def part(p: Part | None) -> dict[str, object] | None:
            return None if p is None else p.to_dict()
        first = self.confirmed
        return {
            "requests": self.requests,
            "slow_min_ms": round(self.slow_min_ms, 3), "fast_max_ms": round(self.fast_max_ms, 3),
            "cpu": part(self.cpu), "wait": part(self.wait), "gc": part(self.gc),
            "event_loop_lag": part(self.lag), "throttled": part(self.throttled),
            "cpu_pressure": part(self.pressure), "cpu_pressure_scope": self.pressure_scope,
            "run_queue_wait": part(self.runq), "blocked": part(self.blocked),
            "cpu_pressure_of_wait": None if self.pressure_of_wait is None
            else round(self.pressure_of_wait, 4),
            "slow_cpu_utilization": None if self.slow_cpu_utilization is None
            else round(self.slow_cpu_utilization, 4),
            "tail_cpu_utilization": None if self.tail_cpu_utilization is None
            else round(self.tail_cpu_utilization, 4),
            "fast_cpu_utilization": None if self.fast_cpu_utilization is None
            else round(self.fast_cpu_utilization, 4),
            "busy_cpu_utilization": None if self.busy_utilization is None
            else round(self.busy_utilization, 4),
            "slowdown_explains": None if self.slowdown_explains is None
            else round(self.slowdown_explains, 4),
            "limit_cpus": self.limit_cpus,
            "mechanism": None if first is None else first.cause,
            "checked": [{"cause": m.cause, "confirmed": m.confirmed} for m in self.mechanisms],
        }


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _part(walls: Sequence[float], values: Sequence[float | None], slow_min: float,
          fast_max: float) -> Part | None:
    """The :class:`Part` of one signal, ``values[i]`` (``None``: not recorded) of the sample whose
    stage took ``walls[i]`` ms."""
    pairs = [(w, v) for w, v in zip(walls, values) if v is not None]
    if not pairs:
        return None
    known_walls = [w for w, _ in pairs]
    known = [v for _, v in pairs]
    varies = min(known_walls) != max(known_walls)
    if not any(known):  # all 0 (no GC, no lag: the usual case); what the general path gives
        return Part(len(pairs), 0.0, 0.0 if any(w >= slow_min for w in known_walls) else None,
                    0.0 if any(w <= fast_max for w in known_walls) else None,
                    0.0 if varies else None, 0.0)
    explains = explained_fraction(known, known_walls) if varies else None
    return Part(len(pairs), statistics.median(known),
                _median([v for w, v in pairs if w >= slow_min]),
                _median([v for w, v in pairs if w <= fast_max]), explains, max(known))


def _busy(utilizations: Sequence[float | None]) -> float | None:
    known = [u for u in utilizations if u is not None]
    return percentile(known, BUSY_PERCENTILE) if known else None


def _slowdown_explains(walls: Sequence[float], cpus: Sequence[float | None]) -> float | None:
    """``cov(log slowdown, log wall) / var(log wall)`` over runs with CPU time (mechanisms
    docstring); ``None`` with fewer than 2 such runs or a constant stage."""
    pairs = [(math.log(w), math.log(w / c)) for w, c in zip(walls, cpus)
             if c is not None and c > _MIN_CPU_MS and w >= c]
    log_walls = [w for w, _ in pairs]
    if len(pairs) < 2 or min(log_walls) == max(log_walls):
        return None
    return explained_fraction([x for _, x in pairs], log_walls)


@dataclass(frozen=True)
class Held:
    """The spans of one stage that held an event loop: ``count`` of them and the ``median_ms``,
    ``max_ms`` and ``sum_ms`` of how long each held it (what the evidence names)."""

    count: int
    median_ms: float
    max_ms: float
    sum_ms: float


def held_by_stage(held: Mapping[str, Sequence[float]]) -> dict[str, Held]:
    """:func:`~otel_stages.analysis.stage_signals.holders`' ms lists -> :class:`Held` per stage
    (stages with no value left out)."""
    return {name: Held(len(v), statistics.median(v), max(v), sum(v)) for name, v in held.items() if v}


def figures_of(stage: str, c: StageColumns, limit: float | None) -> StageSignals:
    """The figures of one stage from its columns (numpy, :mod:`otel_stages.analysis.columns`:
    the same numbers as :func:`_figures_from_lists`, which columns holding NaN go through)."""
    if any(columns.has_nan(values[known]) for values, known in (
            (c.cpu_ms, c.cpu_known), (c.gc_ms, c.gc_known), (c.lag_ms, c.lag_known),
            (c.throttled_ms, c.throttled_known), (c.pressure_ms, c.pressure_known),
            (c.runq_ms, c.runq_known))) or _LISTS_ONLY:
        samples = c.samples()
        return _figures_from_lists(
            stage, [s.wall_ms for s in samples], [s.cpu_ms for s in samples],
            [s.gc_ms for s in samples], [s.lag_ms for s in samples],
            [s.throttled_ms for s in samples], limit, [s.pressure_ms for s in samples],
            [s.runq_ms for s in samples])
    walls = c.wall_ms
    ordered = columns.sorted_values(walls)
    slow_min = columns.percentile_sorted(ordered, SLOW_PERCENTILE)
    tail_min = columns.percentile_sorted(ordered, TAIL_PERCENTILE)
    fast_max = columns.median_sorted(ordered)
    slow, fast = walls >= slow_min, walls <= fast_max
    cpus, known = c.cpu_ms, c.cpu_known
    busy = known & (walls > 0)
    ratio = np.divide(cpus, walls, out=np.zeros_like(walls), where=busy)
    utils = columns.clip_above(ratio, 1.0)
    return StageSignals(
        stage, len(walls), slow_min, fast_max,
        cpu=_part_of(walls, cpus, known, slow, fast),
        wait=_part_of(walls, columns.clip_below(walls - cpus, 0.0), known, slow, fast),
        gc=_part_of(walls, c.gc_ms, c.gc_known, slow, fast),
        lag=_part_of(walls, c.lag_ms, c.lag_known, slow, fast),
        throttled=_part_of(walls, c.throttled_ms, c.throttled_known, slow, fast),
        pressure=_part_of(walls, c.pressure_ms, c.pressure_known, slow, fast),
        runq=_part_of(walls, c.runq_ms, c.runq_known, slow, fast),
        blocked=_part_of(walls, columns.clip_below(walls - cpus - c.runq_ms, 0.0),
                         known & c.runq_known, slow, fast),
        slow_cpu_utilization=columns.median(utils[busy & slow]),
        tail_cpu_utilization=columns.median(utils[busy & (walls >= tail_min)]),
        fast_cpu_utilization=columns.median(utils[busy & fast]),
        busy_utilization=columns.percentile(utils[busy], BUSY_PERCENTILE),
        slowdown_explains=_slowdown_of(walls, cpus, known),
        limit_cpus=limit,
    )


#: Tests set this to send every stage through the list functions (the reference).
_LISTS_ONLY = False


def _part_of(walls: columns.Floats, values: columns.Floats, known: columns.Flags,
             slow: columns.Flags, fast: columns.Flags) -> Part | None:
    """:func:`_part` on columns: ``values`` where ``known``; ``slow`` / ``fast`` flag the runs
    at or above the slowest quarter's bound and at or below the median."""
    kv = values[known]
    n = len(kv)
    if not n:
        return None
    kw = walls[known]
    varies = columns.varies(kw)
    if not kv.any():  # all 0 (no GC, no lag: the usual case)
        return Part(n, 0.0, 0.0 if slow[known].any() else None, 0.0 if fast[known].any() else None,
                    0.0 if varies else None, 0.0)
    explains = columns.explained_fraction(kv, kw) if varies else None
    return Part(n, columns.median_sorted(columns.sorted_values(kv)),
                columns.median(values[known & slow]), columns.median(values[known & fast]),
                explains, float(kv.max()))


def _slowdown_of(walls: columns.Floats, cpus: columns.Floats, known: columns.Flags) -> float | None:
    """:func:`_slowdown_explains` on columns."""
    keep = known & (cpus > _MIN_CPU_MS) & (walls >= cpus)
    if np.count_nonzero(keep) < 2:
        return None
    kw = walls[keep]
    log_walls = columns.logs(kw)
    if min(log_walls) == max(log_walls):
        return None
    return explained_fraction(columns.logs(kw / cpus[keep]), log_walls)


def _figures_from_lists(stage: str, walls: list[float], cpus: list[float | None],
                        gcs: list[float | None], lags: list[float | None],
                        throttled: list[float | None], limit: float | None,
                        pressure: list[float | None] | None = None,
                        runqs: list[float | None] | None = None) -> StageSignals:
    """The figures of one stage from per-request lists (``None``: the part was not recorded;
    ``pressure`` / ``runqs`` ``None``: not recorded for any)."""
    waits = [None if c is None else max(0.0, w - c) for w, c in zip(walls, cpus)]
    runqs = runqs if runqs is not None else [None] * len(walls)
    blocked = [None if c is None or q is None else max(0.0, w - c - q)
               for w, c, q in zip(walls, cpus, runqs)]
    utils = [None if c is None or w <= 0 else min(1.0, c / w) for w, c in zip(walls, cpus)]
    slow_min, fast_max = percentile(walls, SLOW_PERCENTILE), statistics.median(walls)
    tail_min = percentile(walls, TAIL_PERCENTILE)
    return StageSignals(
        stage, len(walls), slow_min, fast_max,
        cpu=_part(walls, cpus, slow_min, fast_max),
        wait=_part(walls, waits, slow_min, fast_max),
        gc=_part(walls, gcs, slow_min, fast_max),
        lag=_part(walls, lags, slow_min, fast_max),
        throttled=_part(walls, throttled, slow_min, fast_max),
        pressure=None if pressure is None else _part(walls, pressure, slow_min, fast_max),
        runq=_part(walls, runqs, slow_min, fast_max),
        blocked=_part(walls, blocked, slow_min, fast_max),
        slow_cpu_utilization=_median([u for w, u in zip(walls, utils)
                                      if w >= slow_min and u is not None]),
        tail_cpu_utilization=_median([u for w, u in zip(walls, utils)
                                      if w >= tail_min and u is not None]),
        fast_cpu_utilization=_median([u for w, u in zip(walls, utils)
                                      if w <= fast_max and u is not None]),
        busy_utilization=_busy(utils),
        slowdown_explains=_slowdown_explains(walls, cpus),
        limit_cpus=limit,
    )
