"""Pure statistics over per-request stage durations (milliseconds). Standard library only.

Definitions used across the report:

- ``median_ms`` / ``p95_ms`` ...: percentiles with linear interpolation between closest ranks
  (numpy's default), over the requests where the stage ran.
- ``share``: the stage's part of all request time, ``sum(stage ms) / sum(request total ms)`` over
  the same requests. Shares add up: stage shares plus the unaccounted share (request time outside
  every stage span) are 1 when stages do not overlap. (Medians do not add up, so a share of the
  *median* total would not.) The same definition works on sums kept by a database or on histogram
  ``_sum`` series.
- ``swing_ms``: ``p95 - p5`` of the stage, i.e. the spread of its middle 90 %. It is symmetric, so a
  stage that is usually slow and sometimes fast swings as much as one that is usually fast and
  sometimes slow, and one freak run at either end of 20-40 runs does not dominate it.
- ``spike_ms``: how far the furthest single run lies from the median, either way:
  ``max(max - median, median - min)``; the one freak run that ``swing_ms`` leaves out.
- ``explains``: how much of the variance of the request total the stage accounts for,
  ``cov(stage, total) / var(total)``. Over all stages plus the unaccounted time these add up to 1; a
  stage that swings in step with the total gets most of it, a tiny stage gets little even when its
  *relative* swing is large. It is a decomposition, not a squared correlation, so it is not
  bounded by 0..1: stages that offset each other (one slower when the other is faster) get a
  negative part and one above 1 that cancel, and the report says so rather than clamping (clamped
  parts would no longer add up). Below the rules' minimum warm count it is not reported (``None``,
  :func:`otel_stages.analysis.diagnosis.diagnose`): a covariance of two to four points is noise.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import cast

from otel_stages import semconv


@dataclass(frozen=True)
class Distribution:
    """Summary of one series of ms values (e.g. request totals). ``count`` values."""

    count: int
    min_ms: float
    p5_ms: float
    median_ms: float
    p95_ms: float
    max_ms: float
    mean_ms: float = 0.0

    @property
    def swing_ms(self) -> float:
        """``p95 - p5`` (see the module docstring)."""
        return self.p95_ms - self.p5_ms

    @property
    def spike_ms(self) -> float:
        """``max(max - median, median - min)`` (see the module docstring)."""
        return max(self.max_ms - self.median_ms, self.median_ms - self.min_ms)

    def to_dict(self) -> dict[str, float]:
        """The CLI contract's ``total`` object, rounded to microseconds (plus ``p5_ms``)."""
        return {
            "min_ms": round(self.min_ms, 3),
            "p5_ms": round(self.p5_ms, 3),
            "median_ms": round(self.median_ms, 3),
            "p95_ms": round(self.p95_ms, 3),
            "max_ms": round(self.max_ms, 3),
            "swing_ms": round(self.swing_ms, 3),
        }


@dataclass(frozen=True)
class StageStats:
    """Warm-run statistics of one stage. Times in ms; ``share`` and ``explains`` are fractions
    (module docstring). ``count`` is the number of requests in which the stage ran."""

    name: str
    count: int
    min_ms: float
    p5_ms: float
    median_ms: float
    p95_ms: float
    max_ms: float
    mean_ms: float
    share: float
    swing_ms: float
    explains: float | None
    #: ``var(stage) / var(total)``: the part of the total's variance the stage makes alone, its
    #: covariances with the other stages left out (0-filled as for ``explains``; ``None``: unknown).
    alone: float | None = None

    @property
    def spike_ms(self) -> float:
        """``max(max - median, median - min)``."""
        return max(self.max_ms - self.median_ms, self.median_ms - self.min_ms)

    def to_dict(self) -> dict[str, float | int | None]:
        """The CLI contract's per-stage object, rounded (plus ``mean_ms``, ``p5_ms``, ``count``)."""
        return {
            "min_ms": round(self.min_ms, 3),
            "median_ms": round(self.median_ms, 3),
            "p95_ms": round(self.p95_ms, 3),
            "max_ms": round(self.max_ms, 3),
            "share": round(self.share, 4),
            "swing_ms": round(self.swing_ms, 3),
            "explains": None if self.explains is None else round(self.explains, 4),
            "p5_ms": round(self.p5_ms, 3),
            "mean_ms": round(self.mean_ms, 3),
            "count": self.count,
        }


@dataclass(frozen=True)
class Unaccounted:
    """Request time outside every stage span, over the same requests as the stages: ``median_ms``
    and ``swing_ms`` of the per-request gap, its ``share`` of all request time and how much of
    the total's variance it ``explains``."""

    median_ms: float
    swing_ms: float
    share: float
    explains: float | None
    #: ``var(gap) / var(total)`` (as :attr:`StageStats.alone`).
    alone: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        """The CLI contract's ``unaccounted`` object (plus ``swing_ms`` and ``explains``)."""
        return {
            "median_ms": round(self.median_ms, 3),
            "share": round(self.share, 4),
            "swing_ms": round(self.swing_ms, 3),
            "explains": None if self.explains is None else round(self.explains, 4),
        }


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation. Raises ``ValueError`` if empty."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    return _percentile_sorted(sorted(values), q)


def _percentile_sorted(ordered: Sequence[float], q: float) -> float:
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _median_sorted(ordered: Sequence[float]) -> float:
    """``statistics.median`` of already sorted values (it would sort them again)."""
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def distribution(values: Sequence[float]) -> Distribution:
    """Summarize ``values`` (ms). Raises ``ValueError`` if empty."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("distribution of no values")
    return Distribution(
        count=len(ordered),
        min_ms=ordered[0],
        p5_ms=_percentile_sorted(ordered, 5),
        median_ms=_median_sorted(ordered),
        p95_ms=_percentile_sorted(ordered, 95),
        max_ms=ordered[-1],
        mean_ms=statistics.fmean(ordered),
    )


def _centered(values: Sequence[float]) -> list[float]:
    """``values`` minus their mean (``fsum / n``)."""
    mean = math.fsum(values) / len(values)
    return [v - mean for v in values]


def _sum_of_products(xs: Sequence[float], ys: Sequence[float]) -> float:
    """``fsum(x * y)``: the sums ``statistics.covariance`` and ``correlation`` form (Python 3.10,
    3.11), with the loop in C; a fleet's recording has hundreds of thousands of requests."""
    return math.fsum(map(operator.mul, xs, ys))


def _varies(values: Sequence[float]) -> bool:
    """Whether ``values`` holds two different values (two passes in C; a set of every value costs
    more at a fleet's hundreds of thousands)."""
    return min(values) != max(values)


def correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation of two equal-length series; ``None`` when fewer than 3 pairs or when
    either series is constant (correlation undefined)."""
    if len(xs) != len(ys):
        raise ValueError("series of different lengths")
    if len(xs) < 3 or not _varies(xs) or not _varies(ys):
        return None
    dx, dy = _centered(xs), _centered(ys)
    sxx, syy = _sum_of_products(dx, dx), _sum_of_products(dy, dy)
    if sxx <= 0 or syy <= 0:
        return None
    return _sum_of_products(dx, dy) / math.sqrt(sxx * syy)


def explained_fraction(part_ms: Sequence[float], total_ms: Sequence[float]) -> float:
    """``cov(part, total) / var(total)``; 0 when fewer than 2 values or the total is constant."""
    if len(part_ms) < 2 or not _varies(total_ms):
        return 0.0
    total = _centered(total_ms)
    return _explained(part_ms, total, _sum_of_products(total, total))


def alone_fraction(part_ms: Sequence[float], total_ms: Sequence[float]) -> float:
    """``var(part) / var(total)``: the part of the total's variance ``part`` makes alone (its
    covariances with the total's other parts left out); 0 when fewer than 2 values or the total
    is constant."""
    if len(part_ms) < 2 or not _varies(total_ms):
        return 0.0
    part = _centered(part_ms)
    total = _centered(total_ms)
    return _sum_of_products(part, part) / _sum_of_products(total, total)


def _explained(part_ms: Sequence[float], total: Sequence[float], total_ss: float) -> float:
    """``cov(part, total) / var(total)`` given the centered totals and their sum of squares (the
    ``n - 1`` of both cancels)."""
    return _sum_of_products(_centered(part_ms), total) / total_ss


def variance_explained_by_groups(groups: Iterable[Sequence[float]]) -> float | None:
    """How much of the variance of all values the grouping explains: omega squared of a one-way
    analysis of variance, ``(SS_between - (k - 1) MS_within) / (SS_total + MS_within)``, clipped
    to 0..1. Unlike the plain ratio ``SS_between / SS_total`` it does not reward many small
    groups (a group of one "explains" its own value). ``None`` with fewer than 2 groups, no
    within-group degrees of freedom, or constant values."""
    series = [list(g) for g in groups if len(g) > 0]
    k = len(series)
    n = sum(len(g) for g in series)
    if k < 2 or n - k < 1:
        return None
    grand = statistics.fmean(v for g in series for v in g)
    ss_total = sum((v - grand) ** 2 for g in series for v in g)
    if ss_total <= 0:
        return None
    ss_between = sum(len(g) * (statistics.fmean(g) - grand) ** 2 for g in series)
    ms_within = (ss_total - ss_between) / (n - k)
    omega = (ss_between - (k - 1) * ms_within) / (ss_total + ms_within)
    return min(1.0, max(0.0, omega))


#: Stage names in the pipeline order a stage map gives (set by :func:`pipeline_order`); empty:
#: the library's own stages, in ``semconv.STANDARD_STAGES`` order.
_PIPELINE: ContextVar[tuple[str, ...]] = ContextVar("otel_stages_pipeline", default=())


@contextmanager
def pipeline_order(names: Sequence[str]) -> Iterator[None]:
    """Within the block, :func:`order_stages` keeps ``names`` in this order (another server's
    stages from a stage map: ``StageMap.stage_order()``, so the report's tables follow that
    server's pipeline), merged into the standard order: a named stage comes just before the
    first standard stage that follows it in ``names``. Nests; restored on exit."""
    token = _PIPELINE.set(tuple(names))
    try:
        yield
    finally:
        _PIPELINE.reset(token)


@functools.lru_cache(maxsize=16)
def _known_order(given: tuple[str, ...]) -> tuple[str, ...]:
    """``semconv.STANDARD_STAGES`` with ``given`` merged in (see :func:`pipeline_order`); where
    the two disagree, ``given`` wins for its own stages."""
    out: list[str] = []
    at = 0  # next position in ``given`` not yet placed
    for std in semconv.STANDARD_STAGES:
        if std in given:
            upto = given.index(std)
            out.extend(g for g in given[at : upto + 1] if g not in out)
            at = max(at, upto + 1)
        elif std not in out:
            out.append(std)
    out.extend(g for g in given[at:] if g not in out)
    return tuple(out)


def order_stages(names: Iterable[str]) -> list[str]:
    """Standard stages in pipeline order first (with a stage map's stages merged in, inside
    :func:`pipeline_order`), then custom ones alphabetically."""
    present = set(names)
    known = [s for s in _known_order(_PIPELINE.get()) if s in present]
    return known + sorted(present.difference(known))


def stage_stats(
    rows: Sequence[Mapping[str, float]], totals_ms: Sequence[float]
) -> dict[str, StageStats]:
    """Per-stage statistics over requests.

    ``rows[i]`` maps stage name -> ms for request ``i``; ``totals_ms[i]`` is that request's total.
    A stage missing from a request counts as 0 ms for ``share`` and ``explains`` and is left out
    of the percentiles. Returns stages in :func:`order_stages` order; empty when ``rows`` is empty.
    """
    if len(rows) != len(totals_ms):
        raise ValueError("rows and totals_ms differ in length")
    if not rows:
        return {}
    time_ms = sum(totals_ms)
    varies = len(rows) >= 2 and _varies(totals_ms)
    total = _centered(totals_ms)
    total_ss = _sum_of_products(total, total)
    names = order_stages(itertools.chain.from_iterable(rows))
    # one pass over the rows for every stage: at a fleet's hundreds of thousands of requests the
    # rows are spread over memory, and each pass over them costs more than the arithmetic
    columns: dict[str, list[float | None]] = {name: [] for name in names}
    appends = [(name, columns[name].append) for name in names]
    for row in rows:
        get = row.get
        for name, append in appends:
            append(get(name))
    out: dict[str, StageStats] = {}
    for name in names:
        column = columns[name]
        ran = [v for v in column if v is not None]
        filled = (cast("list[float]", column) if len(ran) == len(column)
                  else [0.0 if v is None else v for v in column])
        dist = distribution(ran)
        out[name] = StageStats(
            name=name,
            count=len(ran),
            min_ms=dist.min_ms,
            p5_ms=dist.p5_ms,
            median_ms=dist.median_ms,
            p95_ms=dist.p95_ms,
            max_ms=dist.max_ms,
            mean_ms=dist.mean_ms,
            share=sum(ran) / time_ms if time_ms > 0 else 0.0,
            swing_ms=dist.swing_ms,
            explains=_explained(filled, total, total_ss) if varies else 0.0,
            alone=_explained(filled, _centered(filled), total_ss) if varies else 0.0,
        )
    return out


def unaccounted_stats(gaps_ms: Sequence[float], totals_ms: Sequence[float]) -> Unaccounted | None:
    """:class:`Unaccounted` from per-request gaps (ms outside every stage) and totals; ``None``
    when there are no requests."""
    if not gaps_ms:
        return None
    dist = distribution(gaps_ms)
    time_ms = sum(totals_ms)
    return Unaccounted(
        median_ms=dist.median_ms,
        swing_ms=dist.swing_ms,
        share=sum(gaps_ms) / time_ms if time_ms > 0 else 0.0,
        explains=explained_fraction(gaps_ms, totals_ms),
        alone=alone_fraction(gaps_ms, totals_ms),
    )
