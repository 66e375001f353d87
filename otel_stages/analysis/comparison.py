"""Before/after comparison that knows run-to-run noise.

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
p95's interval spans both modes and is not significant. So each row also has a tail test
(:class:`ShareChange` ``tail``): the *tail line* is the baseline's slowest request plus the drift
margin, and the requests after the change above it are counted. Under "same code, drifted by at
most :data:`RUN_DRIFT_FRACTION`", ``k`` of ``n_after`` requests lie beyond it with probability at most
``C(n_after, k) / C(n_after + n_before, k)`` (every ordering of the pooled requests equally likely),
which is exactly Fisher's exact test (``scipy.stats.fisher_exact``, one-sided) of ``k`` of
``n_after`` against 0 of ``n_before``; significant below :data:`SIGNIFICANCE`. (Boschloo's test
would be more powerful but treats the baseline's 0, forced by the line, as a chance outcome; a line
at the baseline's p95 flags most pairs that merely drifted by 10 %.) A tail needs at least
:data:`MIN_EVENTS` such requests. A tail with a p-value under :data:`INCONCLUSIVE_LEVEL` that is
not significant is *inconclusive* (below). The *failure rate* (requests that ended with an error,
of all finished requests: ``failures``) is a fixed criterion, so Boschloo's exact test
(``scipy.stats.boschloo_exact``, uniformly more powerful than Fisher's; Fisher's past
:data:`EXACT_MAX_TABLES`) tests whether it rose. A significant tail counts as a significant change
of its row; a significant rise in the failure rate means the comparison is not within noise.

``inconclusive``: rows (the total or stages) that are not significant but which the output must
not call noise: the stage the verdicts name as the new bottleneck (it moved there, or appeared),
and rows whose tail test came close (p under :data:`INCONCLUSIVE_LEVEL`).

``uniform_shift``: every stage of the request (each at least 2 % of it) moved the same way by a
similar factor, which points at the host rather than a change in one stage.
``bottleneck_moved``: both verdicts name a stage and they differ. ``inputs_differ``: the two
recordings' input cohorts differ by :data:`INPUTS_DIFFER_MIN` or more (total variation distance
of the cohort proportions), so a change may be the inputs', not the code's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from otel_stages.analysis.noise import MIN_SWING_MS
from otel_stages.analysis.stats import order_stages
from otel_stages.analysis.units import duration, signed_ms, signed_pct

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from otel_stages.analysis.report import Report

#: Confidence of each row's verdict (family-wise over its median, p95 and swing).
CONFIDENCE = 0.95
#: Bootstrap resamples per row: percentile intervals at ~98 % need a couple of thousand.
BOOTSTRAP_RESAMPLES = 2000
#: Seed of the resampling: the same recordings always give the same intervals.
BOOTSTRAP_SEED = 0
#: Fewer requests than this on either side: no interval, never significant.
MIN_SAMPLES = 5
#: More requests than this on a side are subsampled (seeded) for the bootstrap: intervals get
#: wider, never narrower, and memory stays bounded (resamples x samples floats).
MAX_SAMPLES = 2000
#: Total variation distance of the cohort proportions from which the inputs differ.
INPUTS_DIFFER_MIN = 0.2
#: Two runs of the same code drift apart by a few percent as a whole (host load, other tenants,
#: thermal state, batch mix): a change must be beyond this fraction of the baseline value.
RUN_DRIFT_FRACTION = 0.10
#: A change in one place moves one or two stages; when at least this many stages' medians all
#: moved the same way beyond the drift margin, by factors within :data:`UNIFORM_MAX_SPREAD` of each
#: other, the whole host got slower or faster (CPU contention, throttling, another workload).
UNIFORM_MIN_STAGES = 3
#: ... largest / smallest median ratio among those stages.
UNIFORM_MAX_SPREAD = 2.0

#: Significance level of the tail and failure-rate tests (one-sided): ``1 - CONFIDENCE``.
SIGNIFICANCE = 1 - CONFIDENCE
#: Fewer requests than this above the tail line (or failed) after the change: one or two freak
#: requests are outliers, not a tail or a failure pattern; not tested.
MIN_EVENTS = 3
#: A row whose tail test's p-value is under this (but not under :data:`SIGNIFICANCE`) is
#: inconclusive, never "noise": e.g. 4 of 39 requests slower than anything in 39 before (p 0.058).
INCONCLUSIVE_LEVEL = 0.10
#: Boschloo's exact test enumerates every (before, after) table: up to this many
#: (``(n_before + 1) * (n_after + 1)``, about 0.1 s); above it Fisher's exact test, whose
#: conservatism costs little at that size.
EXACT_MAX_TABLES = 12_000

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


@dataclass(frozen=True)
class ShareChange:
    """The share of requests that are slow (above ``line_ms``: the tail) or failed, before and
    after: ``baseline_count`` of ``baseline_total``, ``count`` of ``total``. ``p_value``: one-sided
    exact test that the share rose (``test``: ``"boschloo"`` or ``"fisher"``); ``None`` when not
    tested (a side under :data:`MIN_SAMPLES` requests, or fewer than :data:`MIN_EVENTS` events
    after)."""

    baseline_count: int
    baseline_total: int
    count: int
    total: int
    p_value: float | None = None
    test: str | None = None
    line_ms: float | None = None

    @property
    def baseline_share(self) -> float | None:
        """``baseline_count / baseline_total`` (``None`` without requests)."""
        return self.baseline_count / self.baseline_total if self.baseline_total else None

    @property
    def share(self) -> float | None:
        """``count / total`` (``None`` without requests)."""
        return self.count / self.total if self.total else None

    @property
    def significant(self) -> bool:
        """The share rose, at :data:`SIGNIFICANCE`."""
        return self.p_value is not None and self.p_value < SIGNIFICANCE

    def describe(self, what: str) -> str:
        """``"<what> 0 of 39 (0%) -> 4 of 39 (10%), Boschloo's exact test p=0.029"``."""
        def side(k: int, n: int) -> str:
            return f"{k} of {n} ({k / n:.0%})" if n else "none"
        name = {"boschloo": "Boschloo's", "fisher": "Fisher's"}.get(self.test or "", "an")
        test = "" if self.p_value is None else f", {name} exact test p={self.p_value:.2g}"
        return (f"{what} {side(self.baseline_count, self.baseline_total)} ->"
                f" {side(self.count, self.total)}{test}")

    def to_dict(self, count_key: str) -> dict[str, object]:
        """JSON form; ``count_key`` names the events (``slow``, ``failed``)."""
        def r(v: float | None, digits: int) -> float | None:
            return None if v is None else round(v, digits)

        out: dict[str, object] = {} if self.line_ms is None else {"line_ms": round(self.line_ms, 3)}
        out.update({
            f"baseline_{count_key}": self.baseline_count, "baseline_requests": self.baseline_total,
            count_key: self.count, "requests": self.total,
            "baseline_share": r(self.baseline_share, 4), "share": r(self.share, 4),
            "p_value": None if self.p_value is None else float(f"{self.p_value:.4g}"),
            "test": self.test, "significant": self.significant,
        })
        return out


def share_rise(baseline_count: int, baseline_total: int, count: int, total: int,
               line_ms: float | None = None, *, exact: str = "boschloo") -> ShareChange:
    """Test whether the share ``count / total`` rose above ``baseline_count / baseline_total``:
    one-sided Boschloo exact test (``scipy.stats.boschloo_exact``), Fisher's exact test
    (``scipy.stats.fisher_exact``) past :data:`EXACT_MAX_TABLES` or with ``exact="fisher"``
    (the tail test: module docstring). Not tested (``p_value`` None)
    below :data:`MIN_SAMPLES` requests on a side or :data:`MIN_EVENTS` events after, or when the
    share did not rise."""
    out = ShareChange(baseline_count, baseline_total, count, total, line_ms=line_ms)
    if (min(baseline_total, total) < MIN_SAMPLES or count < MIN_EVENTS
            or count * baseline_total <= baseline_count * total):
        return out
    from scipy import stats

    # rows: after, before; columns: events, others. "greater": after's share is the larger
    table = [[count, total - count], [baseline_count, baseline_total - baseline_count]]
    if exact == "boschloo" and (baseline_total + 1) * (total + 1) <= EXACT_MAX_TABLES:
        p, test = float(stats.boschloo_exact(table, alternative="greater").pvalue), "boschloo"
    else:
        p, test = float(stats.fisher_exact(table, alternative="greater").pvalue), "fisher"
    return ShareChange(baseline_count, baseline_total, count, total, min(p, 1.0), test, line_ms)


def tail_line(baseline_max_ms: float) -> float:
    """The tail line (ms) of a row whose baseline's slowest request took ``baseline_max_ms``: that
    plus its drift margin (:func:`drift_margin`): slower than anything in the baseline by more
    than two runs of the same code drift apart."""
    return baseline_max_ms + drift_margin(baseline_max_ms)


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
        """JSON form: the DESIGN.md section 3 keys plus ``change_ms``, swing and intervals."""
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
                      exact="fisher")
    return Change(b50, a50, b95, a95, b95 - b5, a95 - a5, cis[0], cis[1], cis[2],
                  baseline_count=len(before), count=len(after), tail=tail)


def cohort_distance(before: Mapping[str, int], after: Mapping[str, int]) -> float | None:
    """Total variation distance (0..1) between two cohort-count tables; ``None`` when a side is empty."""
    nb, na = sum(before.values()), sum(after.values())
    if not nb or not na:
        return None
    keys = set(before) | set(after)
    return 0.5 * sum(abs(before.get(k, 0) / nb - after.get(k, 0) / na) for k in keys)


@dataclass
class Comparison:
    """Baseline vs current: per-row :class:`Change`, both verdicts, and summary sentences."""

    baseline_requests: int
    stages: dict[str, Change]
    total: Change
    baseline_cause: str | None
    baseline_stage: str | None
    cause: str | None
    stage: str | None
    bottleneck_moved: bool
    inputs_differ: bool
    input_distance: float | None = None
    uniform_shift: bool = False
    summary: list[str] = field(default_factory=list)
    failures: ShareChange | None = None
    inconclusive: list[str] = field(default_factory=list)

    @property
    def tested(self) -> bool:
        """Whether the request total had enough requests on both sides (:data:`MIN_SAMPLES`)
        to be tested at all; when not, nothing is judged (neither changed nor within noise)."""
        return self.total.median_ci is not None

    @property
    def any_significant(self) -> bool:
        """The total or a stage changed beyond run-to-run noise (bootstrap or tail test)."""
        return self.total.significant or any(c.significant for c in self.stages.values())

    @property
    def failures_rose(self) -> bool:
        """The failure rate rose significantly (module docstring)."""
        return self.failures is not None and self.failures.significant

    @property
    def within_noise(self) -> bool:
        """The total was tested, no row changed beyond run-to-run noise, the failure rate did not
        rise, and no stage is :attr:`inconclusive`."""
        return (self.tested and not self.any_significant and not self.failures_rose
                and not self.inconclusive)

    def regressions(self, threshold_pct: float) -> list[str]:
        """What trips ``--fail-on-regression threshold_pct``, as sentences (empty: nothing):

        - the total's median or p95 rose by more than ``threshold_pct`` percent and that
          statistic's change is significant (bootstrap);
        - the total's p95 rose by more than ``threshold_pct`` percent and the share of requests
          above the tail line rose significantly (the tail test: the bootstrap misses a tail);
        - the failure rate rose significantly, by more than ``threshold_pct`` percent of the
          baseline's rate (any rise from none).
        """
        out = []
        total = self.total
        for statistic, pct in (("median", total.change_pct), ("p95", total.p95_change_pct)):
            if pct is not None and pct > threshold_pct and total.significant_of(statistic):
                out.append(f"total {statistic} {total.describe(statistic)}, above"
                           f" {threshold_pct:g}% and outside run-to-run noise")
        pct = total.p95_change_pct
        if (total.tail is not None and total.tail.significant and not total.significant_of("p95")
                and pct is not None and pct > threshold_pct):
            out.append(f"total p95 {total.describe('p95')}, above {threshold_pct:g}%, with"
                       f" {_tail_clause(total.tail)}")
        f = self.failures
        if f is not None and f.significant:
            before, after = f.baseline_share or 0.0, f.share or 0.0
            if before == 0.0 or 100.0 * (after - before) / before > threshold_pct:
                out.append(f"{f.describe('failed requests')}: the failure rate rose"
                           + ("" if before == 0.0 else f" by more than {threshold_pct:g}%"))
        return out

    def to_dict(self) -> dict[str, object]:
        """The report's ``comparison`` object (DESIGN.md section 3 keys plus extras)."""
        return {
            "total": self.total.to_dict(),
            "stages": {name: c.to_dict() for name, c in self.stages.items()},
            "bottleneck_moved": self.bottleneck_moved,
            "inputs_differ": self.inputs_differ,
            "tested": self.tested,
            "within_noise": self.within_noise,
            "uniform_shift": self.uniform_shift,
            "input_distance": None if self.input_distance is None else round(self.input_distance, 3),
            "failures": None if self.failures is None else self.failures.to_dict("failed"),
            "inconclusive": list(self.inconclusive),
            "baseline_requests": self.baseline_requests,
            "baseline_verdict": {"cause": self.baseline_cause, "stage": self.baseline_stage},
            "verdict": {"cause": self.cause, "stage": self.stage},
            "confidence": CONFIDENCE,
            "summary": list(self.summary),
        }


def _label(stage: str | None, cause: str | None) -> str:
    name = cause or "no verdict"
    return name if stage is None else f"{stage} ({name})"


def _row_sentence(name: str, c: Change) -> str:
    parts = []
    for statistic, ci in (("median", c.median_ci), ("p95", c.p95_ci)):
        if ci is not None and ci.significant:
            parts.append(f"{statistic} {c.describe(statistic)}, CI {signed_ms(ci.low_ms)}.."
                         f"{signed_ms(ci.high_ms)} ms")
    if c.swing_ci is not None and c.swing_ci.significant and c.swing_change_ms is not None:
        parts.append(f"swing {duration(c.baseline_swing_ms)} -> {duration(c.swing_ms)}")
    if c.tail is not None and c.tail.significant:
        if not c.significant_of("p95"):
            parts.append(f"p95 {c.describe('p95')}")
        parts.append(_tail_clause(c.tail))
    return f"{name}: " + "; ".join(parts)


def _tail_clause(tail: ShareChange) -> str:
    line = duration(tail.line_ms) if tail.line_ms is not None else "the tail line"
    return (tail.describe(f"requests slower than {line} (the baseline's slowest + 10%)")
            + (": a tail regression" if tail.significant else ""))


def uniform_ratios(stages: Mapping[str, Change], baseline_total_ms: float | None) -> list[float] | None:
    """The stages' median ratios (after / before) when they all moved the same way together
    (see ``uniform_shift`` in the module docstring), else ``None``. Stages under 2 % of the
    baseline's median request are left out (their medians are timer-sized)."""
    from otel_stages.analysis.noise import NOISE_STAGE_MIN_FRACTION

    floor = NOISE_STAGE_MIN_FRACTION * (baseline_total_ms or 0.0)
    ratios = [c.median_ms / c.baseline_median_ms for c in stages.values()
              if c.baseline_median_ms and c.median_ms is not None and c.baseline_median_ms >= floor]
    if len(ratios) < UNIFORM_MIN_STAGES or len(ratios) < len(stages) - 1:
        return None
    up = all(r >= 1 + RUN_DRIFT_FRACTION for r in ratios)
    down = all(r <= 1 / (1 + RUN_DRIFT_FRACTION) for r in ratios)
    if not (up or down) or max(ratios) / min(ratios) > UNIFORM_MAX_SPREAD:
        return None
    return ratios


def compare(baseline: Report, current: Report) -> Comparison:
    """Compare two reports of the same inputs (``baseline`` = before the change)."""
    names = order_stages(set(baseline.stage_samples) | set(current.stage_samples))
    stages = {n: compare_samples(baseline.stage_samples.get(n, []), current.stage_samples.get(n, []))
              for n in names}
    total = compare_samples(baseline.total_samples, current.total_samples)
    b_cause, b_stage = baseline.verdict.cause, baseline.verdict.stage
    cause, stage = current.verdict.cause, current.verdict.stage
    moved = b_stage is not None and stage is not None and b_stage != stage
    distance = cohort_distance(baseline.cohort_counts, current.cohort_counts)
    differ = distance is not None and distance >= INPUTS_DIFFER_MIN
    ratios = uniform_ratios(stages, total.baseline_median_ms)
    failures = share_rise(baseline.counts.failed, baseline.requests, current.counts.failed,
                          current.requests)
    # the stage the verdicts now name (moved there, or appeared) is never called noise
    named = stage if stage is not None and stage != b_stage else None
    inconclusive = [n for n, c in [("total", total), *stages.items()]
                    if not c.significant and c.median_ci is not None
                    and (n == named or (c.tail is not None and c.tail.p_value is not None
                                        and c.tail.p_value < INCONCLUSIVE_LEVEL))]
    comparison = Comparison(baseline.requests, stages, total, b_cause, b_stage, cause, stage, moved,
                            differ, distance, uniform_shift=ratios is not None, failures=failures,
                            inconclusive=inconclusive)
    summary = comparison.summary
    if ratios is not None:
        summary.append(
            f"every stage moved the same way, by x{min(ratios):.2f} to x{max(ratios):.2f} (medians):"
            " that looks like the host (CPU contention or throttling, another workload), not a change"
            " in one stage; record both sides on a quiet host, or alternate them, before trusting it")
    if not comparison.tested:
        summary.append(
            f"not tested: too few warm requests ({total.baseline_count} before, {total.count} after;"
            f" at least {MIN_SAMPLES} a side): the changes shown are not judged against run-to-run"
            " noise; record more requests on both sides")
    elif comparison.within_noise:
        summary.append(
            f"within run-to-run noise: no change to the total or any stage is, with {CONFIDENCE:.0%}"
            f" confidence, larger than {RUN_DRIFT_FRACTION:.0%} of its baseline value (bootstrap"
            f" intervals of median, p95 and swing; total median {total.describe('median')}, p95"
            f" {total.describe('p95')})")
    else:
        rows = [("total", total)] + [(n, c) for n, c in stages.items()]
        summary.extend(_row_sentence(n, c) for n, c in rows if c.significant)
        quiet = [n for n, c in rows if not c.significant and c.median_ci is not None
                 and n not in inconclusive and (n != "total" or not comparison.any_significant)]
        if quiet:
            summary.append(f"within run-to-run noise: {', '.join(quiet)}")
        for n in inconclusive:
            row = total if n == "total" else stages[n]
            why = ("the verdict now names it as the bottleneck" if n == named
                   else _tail_clause(row.tail) if row.tail is not None else "")
            summary.append(f"{n}: not significant, yet {why}: inconclusive (neither a change nor"
                           " noise); record more requests on both sides")
    if failures.significant:
        summary.append(
            f"{failures.describe('failed requests')}: the failure rate rose (the timings above"
            " describe only the requests that succeeded)")
    few = [n for n, c in [("total", total), *stages.items()]
           if c.baseline_count and c.count and (min(c.baseline_count, c.count) < MIN_SAMPLES)]
    if few and comparison.tested:
        summary.append(f"too few requests to test {', '.join(few)} (fewer than {MIN_SAMPLES} on a side)")
    chance = ("" if not comparison.tested or comparison.any_significant
              else " (no change is significant: the verdicts may differ by chance)")
    if moved:
        summary.append(
            f"the bottleneck moved from {_label(b_stage, b_cause)} to {_label(stage, cause)}{chance}")
    elif b_stage is not None and stage is None:
        summary.append(f"{b_stage} is no longer the bottleneck ({_label(b_stage, b_cause)} before,"
                       f" {cause} now){chance}")
    elif b_stage is None and stage is not None:
        summary.append(f"a bottleneck appeared: {_label(stage, cause)} ({b_cause} before){chance}")
    elif stage is not None and b_cause != cause:
        summary.append(f"{stage} is still the bottleneck, but the cause changed from {b_cause} to {cause}")
    elif stage is not None:
        summary.append(f"the bottleneck is still {_label(stage, cause)}")
    else:
        summary.append(f"verdict before: {b_cause or 'no verdict'}, now: {cause or 'no verdict'}")
    if differ:
        summary.append(
            f"the inputs differ (cohort mix {distance:.0%} apart): part of any change may be the"
            " inputs'; compare recordings of the same inputs")
    return comparison
