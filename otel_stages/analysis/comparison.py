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
        """Whether the change of ``statistic`` (``median``, ``p95``, ``swing``) is significant."""
        ci = {"median": self.median_ci, "p95": self.p95_ci, "swing": self.swing_ci}[statistic]
        return ci is not None and ci.significant

    @property
    def significant(self) -> bool:
        """Any of median, p95, swing changed beyond run-to-run noise (module docstring)."""
        return any(self.significant_of(s) for s in _STATS)

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
    return Change(b50, a50, b95, a95, b95 - b5, a95 - a5, cis[0], cis[1], cis[2],
                  baseline_count=len(before), count=len(after))


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

    @property
    def tested(self) -> bool:
        """Whether the request total had enough requests on both sides (:data:`MIN_SAMPLES`)
        to be tested at all; when not, nothing is judged (neither changed nor within noise)."""
        return self.total.median_ci is not None

    @property
    def within_noise(self) -> bool:
        """The total was tested and no row changed beyond run-to-run noise."""
        return (self.tested and not self.total.significant
                and not any(c.significant for c in self.stages.values()))

    def regressions(self, threshold_pct: float) -> list[str]:
        """The total's statistics (median, p95) that rose significantly by more than
        ``threshold_pct`` percent, as sentences; empty when none did."""
        out = []
        for statistic, pct in (("median", self.total.change_pct), ("p95", self.total.p95_change_pct)):
            if pct is not None and pct > threshold_pct and self.total.significant_of(statistic):
                out.append(f"total {statistic} {self.total.describe(statistic)}, above"
                           f" {threshold_pct:g}% and outside run-to-run noise")
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
    return f"{name}: " + "; ".join(parts)


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
    comparison = Comparison(baseline.requests, stages, total, b_cause, b_stage, cause, stage, moved,
                            differ, distance, uniform_shift=ratios is not None)
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
        quiet = [n for n, c in stages.items() if not c.significant and c.median_ci is not None]
        if quiet:
            summary.append(f"within run-to-run noise: {', '.join(quiet)}")
    few = [n for n, c in [("total", total), *stages.items()]
           if c.baseline_count and c.count and (min(c.baseline_count, c.count) < MIN_SAMPLES)]
    if few and comparison.tested:
        summary.append(f"too few requests to test {', '.join(few)} (fewer than {MIN_SAMPLES} on a side)")
    chance = ("" if not comparison.within_noise
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
