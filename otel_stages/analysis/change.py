"""One row of a before/after comparison: the change of a stage's (or the total's) statistics
beyond run-to-run noise.

For the request total and each stage, the median, p95 and swing (p95 - p5) before and after, each
change with a bootstrap confidence interval (``scipy.stats.bootstrap``: the two recordings are
resampled independently, percentile intervals, fixed seed so a report is reproducible). The three
statistics of one row are tested together at :data:`CONFIDENCE` (Bonferroni: each interval at
``1 - (1 - CONFIDENCE) / 3``).

Resampling requests measures the noise *within* each recording, but two runs of the same code also
drift apart as a whole (host load, other tenants, thermal state, a different batch mix), by a few
percent. So a change counts only when its whole interval lies beyond a margin of
:data:`RUN_DRIFT_FRACTION` of the baseline value (and at least ``MIN_SWING_MS``): we are
:data:`CONFIDENCE` sure the change is larger than drift between runs. A row is ``significant``
when any of its statistics' changes counts: "outside run-to-run noise at 95 % confidence". Rows
with fewer than :data:`MIN_SAMPLES` requests on either side are never significant.

The bootstrap has little power for a *tail*: when a tenth of the requests become much slower, the
p95's interval spans both modes and is not significant. So each row also has a tail test (``tail``,
a :class:`~otel_stages.analysis.proportions.ShareChange`): the *tail line* is the baseline's
slowest request plus :data:`TAIL_MARGIN_FRACTION` of it (:func:`tail_line`), and the requests
after the change beyond it are counted. Were both runs draws of one distribution (every ordering
of the pooled requests equally likely), ``k`` of ``n_after`` requests would lie beyond the
baseline's slowest with probability ``C(n_after, k) / C(n_after + n_before, k)``, which is exactly
Fisher's exact test (``scipy.stats.fisher_exact``, one-sided) of ``k`` of ``n_after`` against 0 of
``n_before``: significant below ``proportions.SIGNIFICANCE`` (5 %), with at least
``proportions.MIN_EVENTS`` such requests. The margin allows for the runs' own tails drifting apart
(host load moves the slowest requests far more than the median). Boschloo's test would be more
powerful but treats the baseline's 0, forced by the line, as a chance outcome; a line at the
baseline's p95 flags most pairs that merely drifted by 10 % (measured: 51 of 60 pairs of 150
requests). A significant tail makes its row significant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from otel_stages.analysis.noise import MIN_SWING_MS
from otel_stages.analysis.proportions import SIGNIFICANCE, ShareChange, share_rise
from otel_stages.analysis.units import duration, signed_ms, signed_pct

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

#: Confidence of each row's verdict (family-wise over its median, p95 and swing); the tail and
#: failure-rate tests run at ``SIGNIFICANCE = 1 - CONFIDENCE`` (:mod:`.proportions`).
CONFIDENCE = 1 - SIGNIFICANCE
#: Bootstrap resamples per row: percentile intervals at ~98 % need a couple of thousand.
BOOTSTRAP_RESAMPLES = 2000
#: Seed of the resampling: the same recordings always give the same intervals.
BOOTSTRAP_SEED = 0
#: Fewer requests than this on either side: no interval, never significant.
MIN_SAMPLES = 5
#: More requests than this on a side are subsampled (seeded) for the bootstrap: intervals get
#: wider, never narrower, and memory stays bounded (resamples x samples floats).
MAX_SAMPLES = 2000
#: Two runs of the same code drift apart by a few percent as a whole (host load, other tenants,
#: thermal state, batch mix): a change must be beyond this fraction of the baseline value.
RUN_DRIFT_FRACTION = 0.10
#: The slowest requests of two runs of the same code drift apart far more than their medians: on
#: the shared 2-core host, the slowest resize of seven identical demo runs ranged 84..145 ms,
#: forward 238..332 ms. The tail line is the baseline's slowest plus this fraction of it; with 0.10
#: a stage row was a "tail regression" in 7 of 42 ordered pairs of those runs, with 0.25 in 2, with
#: 0.5 in none (the total in none at any of these).
TAIL_MARGIN_FRACTION = 0.5

_STATS = ("median", "p95", "swing")


def drift_margin(baseline_ms: float | None) -> float:
    """The least change (ms) that can count for a statistic whose baseline value is
    ``baseline_ms``: :data:`RUN_DRIFT_FRACTION` of it, at least ``MIN_SWING_MS``."""
    return max(MIN_SWING_MS, RUN_DRIFT_FRACTION * abs(baseline_ms or 0.0))


@dataclass(frozen=True)
class Interval:
    """Confidence interval of a change (after - before), ms, and the ``margin_ms`` the change
    must exceed to count (:func:`drift_margin`)."""

    low_ms: float
    high_ms: float
    margin_ms: float = 0.0

    @property
    def significant(self) -> bool:
        """The whole interval lies beyond the margin, on one side."""
        return self.low_ms > self.margin_ms or self.high_ms < -self.margin_ms

    def to_list(self) -> list[float]:
        """``[low, high]`` rounded to microseconds."""
        return [round(self.low_ms, 3), round(self.high_ms, 3)]


def _pct(change: float | None, base: float | None) -> float | None:
    if change is None or not base:
        return None
    return 100.0 * change / base


def _diff(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def tail_line(baseline_max_ms: float) -> float:
    """The tail line (ms) of a row whose baseline's slowest request took ``baseline_max_ms``: that
    plus :data:`TAIL_MARGIN_FRACTION` of it (at least ``MIN_SWING_MS``): much slower than anything
    in the baseline."""
    return baseline_max_ms + max(MIN_SWING_MS, TAIL_MARGIN_FRACTION * abs(baseline_max_ms))


@dataclass(frozen=True)
class Change:
    """One row (the total or a stage) before and after. Times in ms; ``None`` where a side has
    no data. ``*_ci`` are the intervals of after - before (``None``: too few requests)."""

    baseline_median_ms: float | None
    median_ms: float | None
    baseline_p95_ms: float | None = None
    p95_ms: float | None = None
    baseline_swing_ms: float | None = None
    swing_ms: float | None = None
    median_ci: Interval | None = None
    p95_ci: Interval | None = None
    swing_ci: Interval | None = None
    baseline_count: int = 0
    count: int = 0
    tail: ShareChange | None = None

    @property
    def change_ms(self) -> float | None:
        """Median after minus before."""
        return _diff(self.median_ms, self.baseline_median_ms)

    @property
    def change_pct(self) -> float | None:
        """Median change as percent of the baseline median."""
        return _pct(self.change_ms, self.baseline_median_ms)

    @property
    def p95_change_ms(self) -> float | None:
        """p95 after minus before."""
        return _diff(self.p95_ms, self.baseline_p95_ms)

    @property
    def p95_change_pct(self) -> float | None:
        """p95 change as percent of the baseline p95."""
        return _pct(self.p95_change_ms, self.baseline_p95_ms)

    @property
    def swing_change_ms(self) -> float | None:
        """Swing after minus before."""
        return _diff(self.swing_ms, self.baseline_swing_ms)

    def significant_of(self, statistic: str) -> bool:
        """Whether the change of ``statistic`` (``median``, ``p95``, ``swing``, ``tail``) is
        significant."""
        if statistic == "tail":
            return self.tail is not None and self.tail.significant
        ci = {"median": self.median_ci, "p95": self.p95_ci, "swing": self.swing_ci}[statistic]
        return ci is not None and ci.significant

    @property
    def significant(self) -> bool:
        """Any of median, p95, swing changed beyond run-to-run noise, or the share of requests
        above the tail line rose (module docstring)."""
        return any(self.significant_of(s) for s in (*_STATS, "tail"))

    def to_dict(self) -> dict[str, object]:
        """JSON form: the DESIGN.md section 3 keys (``significant`` now includes the tail test)
        plus ``change_ms``, swing, intervals, ``*_significant`` per statistic, ``tail`` (``{"line_ms",
        "baseline_slow", "baseline_requests", "slow", "requests", "baseline_share", "share",
        "p_value", "test", "significant"}``, or null without samples) and ``tail_significant``."""
        def r(v: float | None, digits: int = 3) -> float | None:
            return None if v is None else round(v, digits)

        def ci(v: Interval | None) -> list[float] | None:
            return None if v is None else v.to_list()

        return {
            "baseline_median_ms": r(self.baseline_median_ms),
            "median_ms": r(self.median_ms),
            "baseline_p95_ms": r(self.baseline_p95_ms),
            "p95_ms": r(self.p95_ms),
            "change_pct": r(self.change_pct, 1),
            "p95_change_pct": r(self.p95_change_pct, 1),
            "significant": self.significant,
            "change_ms": r(self.change_ms),
            "p95_change_ms": r(self.p95_change_ms),
            "baseline_swing_ms": r(self.baseline_swing_ms),
            "swing_ms": r(self.swing_ms),
            "swing_change_ms": r(self.swing_change_ms),
            "median_ci_ms": ci(self.median_ci),
            "p95_ci_ms": ci(self.p95_ci),
            "swing_ci_ms": ci(self.swing_ci),
            "margins_ms": None if self.median_ci is None else {
                name: round(v.margin_ms, 3)
                for name, v in (("median", self.median_ci), ("p95", self.p95_ci),
                                ("swing", self.swing_ci)) if v is not None},
            "median_significant": self.significant_of("median"),
            "p95_significant": self.significant_of("p95"),
            "swing_significant": self.significant_of("swing"),
            "tail": None if self.tail is None else self.tail.to_dict("slow"),
            "tail_significant": self.significant_of("tail"),
            "baseline_count": self.baseline_count,
            "count": self.count,
        }

    def describe(self, statistic: str = "median") -> str:
        """``"280.0 ms -> 120.0 ms (-160.0 ms, -57%)"`` for ``statistic`` (``median`` / ``p95``);
        no sign on a change that rounds to 0; ``absent`` for a missing side."""
        if statistic == "p95":
            before, after, change, pct = (self.baseline_p95_ms, self.p95_ms, self.p95_change_ms,
                                          self.p95_change_pct)
        else:
            before, after, change, pct = (self.baseline_median_ms, self.median_ms, self.change_ms,
                                          self.change_pct)
        if change is None:
            return (f"{'absent' if before is None else duration(before)} ->"
                    f" {'absent' if after is None else duration(after)}")
        tail = "" if pct is None else f", {signed_pct(pct)}"
        return f"{duration(before)} -> {duration(after)} ({signed_ms(change)} ms{tail})"


def _quantiles(x: np.ndarray[Any, Any], axis: int = -1) -> np.ndarray[Any, Any]:
    import numpy as np  # numpy (and scipy) load only when a comparison is made

    return np.asarray(np.percentile(x, [5.0, 50.0, 95.0], axis=axis))


def _statistic(before: np.ndarray[Any, Any], after: np.ndarray[Any, Any],
               axis: int = -1) -> np.ndarray[Any, Any]:
    import numpy as np

    qb, qa = _quantiles(before, axis), _quantiles(after, axis)
    return np.stack([qa[1] - qb[1], qa[2] - qb[2], (qa[2] - qa[0]) - (qb[2] - qb[0])])


def _sample(values: Sequence[float], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    import numpy as np

    arr = np.asarray(values, dtype=float)
    if arr.size > MAX_SAMPLES:
        arr = rng.choice(arr, size=MAX_SAMPLES, replace=False)
    return arr


def compare_samples(before: Sequence[float], after: Sequence[float]) -> Change:
    """One row from the per-request ms values before and after (module docstring)."""
    import numpy as np

    if not before or not after:
        def q(v: Sequence[float]) -> tuple[float | None, float | None, float | None]:
            if not v:
                return None, None, None
            p5, p50, p95 = _quantiles(np.asarray(v, dtype=float))
            return float(p50), float(p95), float(p95 - p5)
        b, a = q(before), q(after)
        return Change(b[0], a[0], b[1], a[1], b[2], a[2], baseline_count=len(before), count=len(after))
    b5, b50, b95 = (float(v) for v in _quantiles(np.asarray(before, dtype=float)))
    a5, a50, a95 = (float(v) for v in _quantiles(np.asarray(after, dtype=float)))
    cis: list[Interval | None] = [None, None, None]
    if len(before) >= MIN_SAMPLES and len(after) >= MIN_SAMPLES:
        from scipy import stats  # here: importing scipy.stats takes seconds, wanted only with a baseline

        rng = np.random.default_rng(BOOTSTRAP_SEED)
        res = stats.bootstrap(
            (_sample(before, rng), _sample(after, rng)), _statistic,
            n_resamples=BOOTSTRAP_RESAMPLES, confidence_level=1 - (1 - CONFIDENCE) / len(_STATS),
            method="percentile", vectorized=True, batch=250, rng=rng,
        )
        low = np.atleast_1d(np.asarray(res.confidence_interval.low, dtype=float))
        high = np.atleast_1d(np.asarray(res.confidence_interval.high, dtype=float))
        margins = (drift_margin(b50), drift_margin(b95), drift_margin(b95 - b5))
        cis = [Interval(float(low[i]), float(high[i]), margins[i]) for i in range(len(_STATS))]
    line = tail_line(max(before))
    tail = share_rise(0, len(before), sum(v > line for v in after), len(after), line_ms=line,
                      exact="fisher", min_requests=MIN_SAMPLES)
    return Change(b50, a50, b95, a95, b95 - b5, a95 - a5, cis[0], cis[1], cis[2],
                  baseline_count=len(before), count=len(after), tail=tail)
