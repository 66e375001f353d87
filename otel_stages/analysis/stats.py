"""Pure statistics over per-request stage durations (milliseconds). Standard library only.

Definitions used across the report:

- ``median_ms`` / ``p95_ms`` ...: percentiles with linear interpolation between closest ranks
  (numpy's default), over the requests where the stage ran.
- ``share``: the stage's median divided by the median request total.
- ``swing_ms``: ``p95 - p5`` of the stage, i.e. the spread of its middle 90 %. It is symmetric, so a
  stage that is usually slow and sometimes fast swings as much as one that is usually fast and
  sometimes slow, and one freak run at either end of 20-40 runs does not dominate it.
- ``explained``: how much of the variance of the request total the stage accounts for,
  ``cov(stage, total) / var(total)``. Over all stages (plus untraced gaps) these add up to 1; a
  stage that swings in step with the total gets most of it, a tiny stage gets little even when its
  *relative* swing is large.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from otel_stages import semconv


@dataclass(frozen=True)
class StageStats:
    """Warm-run statistics of one stage. Times in ms; ``share`` and ``explained`` are fractions.

    ``count`` is the number of requests in which the stage ran.
    """

    name: str
    count: int
    min_ms: float
    p5_ms: float
    median_ms: float
    p95_ms: float
    max_ms: float
    share: float
    swing_ms: float
    explained: float

    def to_dict(self) -> dict[str, float]:
        """The CLI contract's per-stage object (``min_ms`` ... ``swing_ms``), rounded."""
        return {
            "min_ms": round(self.min_ms, 3),
            "median_ms": round(self.median_ms, 3),
            "p95_ms": round(self.p95_ms, 3),
            "max_ms": round(self.max_ms, 3),
            "share": round(self.share, 4),
            "swing_ms": round(self.swing_ms, 3),
        }


@dataclass(frozen=True)
class Distribution:
    """Summary of one series of ms values (e.g. request totals)."""

    count: int
    min_ms: float
    p5_ms: float
    median_ms: float
    p95_ms: float
    max_ms: float

    @property
    def swing_ms(self) -> float:
        """``p95 - p5`` (see the module docstring)."""
        return self.p95_ms - self.p5_ms


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation. Raises ``ValueError`` if empty."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> Distribution:
    """Summarize ``values`` (ms). Raises ``ValueError`` if empty."""
    return Distribution(
        count=len(values),
        min_ms=min(values),
        p5_ms=percentile(values, 5),
        median_ms=statistics.median(values),
        p95_ms=percentile(values, 95),
        max_ms=max(values),
    )


def correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation of two equal-length series; ``None`` when fewer than 3 pairs or when
    either series is constant (correlation undefined)."""
    if len(xs) != len(ys):
        raise ValueError("series of different lengths")
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


def explained_fraction(stage_ms: Sequence[float], total_ms: Sequence[float]) -> float:
    """``cov(stage, total) / var(total)``; 0 when fewer than 2 values or the total is constant."""
    if len(stage_ms) < 2 or len(set(total_ms)) < 2:
        return 0.0
    return statistics.covariance(stage_ms, total_ms) / statistics.variance(total_ms)


def order_stages(names: Iterable[str]) -> list[str]:
    """Standard stages in pipeline order first, then custom ones alphabetically."""
    present = set(names)
    standard = [s for s in semconv.STANDARD_STAGES if s in present]
    return standard + sorted(present - set(standard))


def stage_stats(
    rows: Sequence[Mapping[str, float]], totals_ms: Sequence[float]
) -> dict[str, StageStats]:
    """Per-stage statistics over requests.

    ``rows[i]`` maps stage name -> ms for request ``i``; ``totals_ms[i]`` is that request's total.
    A stage missing from a request counts as 0 ms for ``explained`` and is left out of the
    percentiles. Returns stages in :func:`order_stages` order; empty when ``rows`` is empty.
    """
    if len(rows) != len(totals_ms):
        raise ValueError("rows and totals_ms differ in length")
    if not rows:
        return {}
    median_total = statistics.median(totals_ms)
    out: dict[str, StageStats] = {}
    for name in order_stages(n for row in rows for n in row):
        ran = [row[name] for row in rows if name in row]
        dist = distribution(ran)
        out[name] = StageStats(
            name=name,
            count=len(ran),
            min_ms=dist.min_ms,
            p5_ms=dist.p5_ms,
            median_ms=dist.median_ms,
            p95_ms=dist.p95_ms,
            max_ms=dist.max_ms,
            share=dist.median_ms / median_total if median_total > 0 else 0.0,
            swing_ms=dist.swing_ms,
            explained=explained_fraction([row.get(name, 0.0) for row in rows], totals_ms),
        )
    return out
