"""Before/after comparison that knows run-to-run noise.

Rows (:class:`~otel_stages.analysis.change.Change`: median, p95 and swing with bootstrap intervals,
and the tail test) are compared in :mod:`otel_stages.analysis.change`. Here: the failure rate, the
verdicts, the summary sentences and the CI gate's judgement (:meth:`Comparison.regressions`,
:meth:`Comparison.undecided`).

``failures``: the failure rate (requests that ended with an error, of all finished requests)
before and after; whether it rose is Boschloo's exact test
(:func:`~otel_stages.analysis.proportions.share_rise`: uniformly more powerful than Fisher's for a
fixed criterion such as "failed"). A significant rise means the comparison is not within noise.

``inconclusive``: rows (the total or stages) which the output must not call noise: the stage the
verdicts name as the new bottleneck (it moved there, or appeared) when not significant, and the
total when its tail test came close (p under :data:`INCONCLUSIVE_LEVEL`) without being
significant, whatever its median or p95 did (neither a faster median nor a modest p95 rise may
hide a slower tail).

``uniform_shift``: every stage of the request (each at least 2 % of it) moved the same way by a
similar factor, which points at the host rather than a change in one stage.
``bottleneck_moved``: both verdicts name a stage and they differ. ``inputs_differ``: the two
recordings' input cohorts differ by :data:`INPUTS_DIFFER_MIN` or more (total variation distance
of the cohort proportions), so a change may be the inputs', not the code's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from otel_stages.analysis.change import (
    CONFIDENCE,
    MIN_SAMPLES,
    RUN_DRIFT_FRACTION,
    TAIL_MARGIN_FRACTION,
    Change,
    compare_samples,
)
from otel_stages.analysis.proportions import ShareChange, share_rise
from otel_stages.analysis.stats import order_stages
from otel_stages.analysis.units import duration, signed_ms

if TYPE_CHECKING:  # pragma: no cover
    from otel_stages.analysis.report import Report

#: Total variation distance of the cohort proportions from which the inputs differ.
INPUTS_DIFFER_MIN = 0.2
#: A change in one place moves one or two stages; when at least this many stages' medians all
#: moved the same way beyond the drift margin, by factors within :data:`UNIFORM_MAX_SPREAD` of each
#: other, the whole host got slower or faster (CPU contention, throttling, another workload).
UNIFORM_MIN_STAGES = 3
#: ... largest / smallest median ratio among those stages.
UNIFORM_MAX_SPREAD = 2.0

#: A row whose tail test's p-value is under this (but not under ``SIGNIFICANCE``) is
#: inconclusive, never "noise": e.g. 4 of 39 requests slower than anything in 39 before (p 0.058).
INCONCLUSIVE_LEVEL = 0.10


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
        - the share of requests above the tail line rose significantly (the tail test: the
          bootstrap misses a tail) and either the total's p95 rose by more than ``threshold_pct``
          percent or the tail line's margin (50 %) is at least ``threshold_pct``: a few much
          slower requests do not move the p95;
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
        p95_tripped = pct is not None and pct > threshold_pct and total.significant_of("p95")
        if (total.tail is not None and total.tail.significant and not p95_tripped
                and _tail_above(pct, threshold_pct)):
            if pct is not None and pct > threshold_pct:
                out.append(f"total p95 {total.describe('p95')}, above {threshold_pct:g}%, with"
                           f" {_tail_clause(total.tail)}")
            else:  # a few much slower requests: the p95 did not move
                out.append(f"total tail: {_tail_clause(total.tail)}, each over"
                           f" {TAIL_MARGIN_FRACTION:.0%} slower than the baseline's slowest, beyond"
                           f" the gate's {threshold_pct:g}% (total p95 {total.describe('p95')})")
        f = self.failures
        if f is not None and f.significant:
            before, after = f.baseline_share or 0.0, f.share or 0.0
            if before == 0.0 or 100.0 * (after - before) / before > threshold_pct:
                out.append(f"{f.describe('failed requests')}: the failure rate rose"
                           + ("" if before == 0.0 else f" by more than {threshold_pct:g}%"))
        return out

    def undecided(self, threshold_pct: float) -> str | None:
        """Why ``--fail-on-regression threshold_pct`` cannot judge though the total was tested:
        its tail test is inconclusive (p under :data:`INCONCLUSIVE_LEVEL`, not under
        ``SIGNIFICANCE``) and, as for a tail regression, its p95 rose by more than
        ``threshold_pct`` percent or the tail line's margin is at least that; else ``None``."""
        total, pct = self.total, self.total.p95_change_pct
        if ("total" not in self.inconclusive or total.tail is None or total.tail.p_value is None
                or not _tail_above(pct, threshold_pct)):
            return None
        return (f"total p95 {total.describe('p95')}, but {_tail_clause(total.tail)} is not"
                f" significant at {CONFIDENCE:.0%}")

    def to_dict(self) -> dict[str, object]:
        """The report's ``comparison`` object: the DESIGN.md section 3 keys (``total``,
        ``stages``: :meth:`Change.to_dict`, ``bottleneck_moved``, ``inputs_differ``) plus
        ``tested``, ``within_noise`` (false when anything changed, the failure rate rose or a row
        is inconclusive), ``uniform_shift``, ``input_distance``, ``failures`` (``{"baseline_failed",
        "baseline_requests", "failed", "requests", "baseline_share", "share", "p_value", "test",
        "significant"}``: :meth:`~otel_stages.analysis.proportions.ShareChange.to_dict`, or null),
        ``inconclusive`` (row names: ``"total"`` or stages, never called noise), the verdicts,
        ``confidence`` and ``summary``."""
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
        parts.append(_tail_clause(c.tail, whole=c.significant_of("median")))
    return f"{name}: " + "; ".join(parts)


def _tail_above(p95_change_pct: float | None, threshold_pct: float) -> bool:
    """Whether a tail regression counts against ``--fail-on-regression threshold_pct``: the p95
    rose by more than it, or the tail's requests are (the tail line lies
    :data:`~otel_stages.analysis.change.TAIL_MARGIN_FRACTION` beyond the baseline's slowest): a
    few much slower requests (under 5 % of them) do not move the p95 at all."""
    return ((p95_change_pct is not None and p95_change_pct > threshold_pct)
            or threshold_pct <= 100.0 * TAIL_MARGIN_FRACTION)


def _tail_clause(tail: ShareChange, *, whole: bool = False) -> str:
    """The tail line's sentence; ``whole``: the median moved significantly too, so the tail is
    the whole distribution's shift, not a tail of its own (a tester: "a tail regression" for a
    release that doubled every request)."""
    line = duration(tail.line_ms) if tail.line_ms is not None else "the tail line"
    kind = ": the whole distribution moved (the median too)" if whole else ": a tail regression"
    return (tail.describe(f"requests slower than {line} (the baseline's slowest"
                          f" + {TAIL_MARGIN_FRACTION:.0%})")
            + (kind if tail.significant else ""))


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
                          current.requests, min_requests=MIN_SAMPLES)
    # the stage the verdicts now name (moved there, or appeared) is never called noise
    named = stage if stage is not None and stage != b_stage else None
    # the total (what the gate judges) whose tail came close; not every stage's: with six rows,
    # a near tail somewhere would be common between two runs of the same code
    # (the total's tail whatever its median and p95 did: neither may hide a slower tail)
    inconclusive = [n for n, c in [("total", total), *stages.items()]
                    if c.median_ci is not None
                    and ((n == named and not c.significant)
                         or (n == "total" and c.tail is not None and c.tail.p_value is not None
                             and c.tail.p_value < INCONCLUSIVE_LEVEL
                             and not c.significant_of("tail")))]
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
            lead = ("its tail is not significant, yet" if row.significant
                    else "not significant, yet")
            summary.append(f"{n}: {lead} {why}: inconclusive (neither a change nor"
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
              else " (no timing change is significant: the verdicts may differ by chance)")
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
