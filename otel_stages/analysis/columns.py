"""The statistics of :mod:`otel_stages.analysis.stats` on numpy columns, with the very same
results: a fleet's recording has hundreds of thousands of warm requests per stage, and Python
lists of them cost more than the arithmetic.

"The very same" is meant bit for bit, because the rules compare these figures with thresholds
(a part that explains 0.5 of a stage's variance confirms a mechanism, 0.4999999 does not):

* element-wise ``+ - * /`` and comparisons are IEEE operations, the same in numpy as in Python;
* sums are :func:`math.fsum` (correctly rounded) over the column's values, never numpy's
  pairwise sums, exactly as :func:`otel_stages.analysis.stats.explained_fraction` forms them;
* percentiles and medians index a sorted copy with Python floats, as ``stats.percentile`` and
  ``statistics.median`` do;
* logarithms stay :func:`math.log` (numpy's own ``log`` may differ in the last bit).

NaN sorts differently in numpy and Python (Python's ``sorted`` leaves it where comparisons put
it); callers route columns holding NaN through the list functions (:func:`has_nan`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

#: A column of floats (float64) or of flags (bool).
Floats = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]


def floats(values: Any) -> Floats:
    """``values`` (a list of floats, an array) as a float64 column."""
    return np.asarray(values, dtype=np.float64)


def has_nan(column: Floats) -> bool:
    """Whether ``column`` holds a NaN (see the module docstring)."""
    return bool(np.isnan(column).any())


def fsum(column: Floats) -> float:
    """``math.fsum`` of the column (correctly rounded, like :mod:`statistics`)."""
    return math.fsum(column.tolist())


def sorted_values(column: Floats) -> Floats:
    """An ascending copy (stable: equal values keep their order, as in Python's ``sorted``)."""
    return np.sort(column, kind="stable")


def percentile_sorted(ordered: Floats, q: float) -> float:
    """``stats.percentile`` of already sorted values (linear interpolation)."""
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    low, high = float(ordered[lo]), float(ordered[hi])
    return low + (high - low) * (pos - lo)


def median_sorted(ordered: Floats) -> float:
    """``statistics.median`` of already sorted values."""
    n = len(ordered)
    mid = n // 2
    return float(ordered[mid]) if n % 2 else (float(ordered[mid - 1]) + float(ordered[mid])) / 2


def median(column: Floats) -> float | None:
    """``statistics.median``; ``None`` for an empty column."""
    return median_sorted(sorted_values(column)) if len(column) else None


def percentile(column: Floats, q: float) -> float | None:
    """``stats.percentile``; ``None`` for an empty column."""
    return percentile_sorted(sorted_values(column), q) if len(column) else None


def varies(column: Floats) -> bool:
    """Whether the column holds two different values."""
    return bool(column.min() != column.max())


def explained_fraction(part_ms: Floats, total_ms: Floats) -> float:
    """:func:`otel_stages.analysis.stats.explained_fraction`: ``cov(part, total) / var(total)``;
    0 when fewer than 2 values or the total is constant."""
    if len(part_ms) < 2 or not varies(total_ms):
        return 0.0
    total = total_ms - fsum(total_ms) / len(total_ms)
    part = part_ms - fsum(part_ms) / len(part_ms)
    return fsum(part * total) / fsum(total * total)


def clip_below(column: Floats, floor: float) -> Floats:
    """``max(floor, v)`` per value, as Python's ``max`` picks (``floor`` unless ``v > floor``)."""
    return np.where(column > floor, column, floor)


def clip_above(column: Floats, ceiling: float) -> Floats:
    """``min(ceiling, v)`` per value, as Python's ``min`` picks (``ceiling`` unless
    ``v < ceiling``)."""
    return np.where(column < ceiling, column, ceiling)


def logs(column: Floats) -> list[float]:
    """``math.log`` of each value (see the module docstring)."""
    return list(map(math.log, column.tolist()))
