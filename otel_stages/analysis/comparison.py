"""Before/after comparison of two reports: per-stage median change and where the bottleneck went."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from otel_stages.analysis.units import duration, signed_ms, signed_pct

if TYPE_CHECKING:  # pragma: no cover
    from otel_stages.analysis.report import Report


@dataclass(frozen=True)
class Change:
    """Median before (``baseline_median_ms``) and after (``median_ms``), in ms; ``change_ms`` and
    ``change_pct`` are ``None`` when either side is missing (``change_pct`` also when the
    baseline is 0)."""

    baseline_median_ms: float | None
    median_ms: float | None

    @property
    def change_ms(self) -> float | None:
        """After minus before, ms."""
        if self.baseline_median_ms is None or self.median_ms is None:
            return None
        return self.median_ms - self.baseline_median_ms

    @property
    def change_pct(self) -> float | None:
        """Change as percent of the baseline median."""
        if self.change_ms is None or not self.baseline_median_ms:
            return None
        return 100.0 * self.change_ms / self.baseline_median_ms

    def to_dict(self) -> dict[str, float | None]:
        """JSON form."""
        return {
            "baseline_median_ms": _r(self.baseline_median_ms),
            "median_ms": _r(self.median_ms),
            "change_ms": _r(self.change_ms),
            "change_pct": None if self.change_pct is None else round(self.change_pct, 1),
        }

    def describe(self) -> str:
        """``"280.0 ms -> 120.0 ms (-160.0 ms, -57%)"``; no sign on a change that rounds to 0."""
        if self.change_ms is None:
            before = "absent" if self.baseline_median_ms is None else duration(self.baseline_median_ms)
            after = "absent" if self.median_ms is None else duration(self.median_ms)
            return f"{before} -> {after}"
        pct = "" if self.change_pct is None else f", {signed_pct(self.change_pct)}"
        return (
            f"{duration(self.baseline_median_ms)} -> {duration(self.median_ms)}"
            f" ({signed_ms(self.change_ms)} ms{pct})"
        )


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass
class Comparison:
    """Baseline vs current: stage median changes, both verdicts, and summary sentences."""

    baseline_requests: int
    stages: dict[str, Change]
    total: Change
    baseline_cause: str | None
    baseline_stage: str | None
    cause: str | None
    stage: str | None
    bottleneck_moved: bool
    summary: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        """The report's ``comparison`` object."""
        return {
            "baseline_requests": self.baseline_requests,
            "total": self.total.to_dict(),
            "stages": {name: c.to_dict() for name, c in self.stages.items()},
            "baseline_verdict": {"cause": self.baseline_cause, "stage": self.baseline_stage},
            "verdict": {"cause": self.cause, "stage": self.stage},
            "bottleneck_moved": self.bottleneck_moved,
            "summary": list(self.summary),
        }


def _label(stage: str | None, cause: str | None) -> str:
    if stage is None:
        return str(cause)
    return f"{stage} ({cause})"


def compare(baseline: Report, current: Report) -> Comparison:
    """Compare two reports of the same inputs (``baseline`` = before the change)."""
    from otel_stages.analysis.stats import order_stages

    names = order_stages(set(baseline.stages) | set(current.stages))
    stages = {
        n: Change(
            baseline.stages[n].median_ms if n in baseline.stages else None,
            current.stages[n].median_ms if n in current.stages else None,
        )
        for n in names
    }
    total = Change(
        baseline.total.median_ms if baseline.total else None,
        current.total.median_ms if current.total else None,
    )
    b_cause, b_stage = baseline.verdict.cause, baseline.verdict.stage
    cause, stage = current.verdict.cause, current.verdict.stage
    moved = b_stage is not None and stage is not None and b_stage != stage
    summary = [f"median total: {total.describe()}"]
    changed = sorted(
        (c for c in stages.items() if c[1].change_ms is not None),
        key=lambda kv: abs(kv[1].change_ms or 0.0),
        reverse=True,
    )
    summary += [f"{n} median: {c.describe()}" for n, c in changed[:2]]
    if moved:
        summary.append(
            f"the bottleneck moved from {_label(b_stage, b_cause)} to {_label(stage, cause)}"
        )
    elif b_stage is not None and stage is None:
        summary.append(
            f"{b_stage} is no longer the bottleneck ({_label(b_stage, b_cause)} before, {cause} now)"
        )
    elif b_stage is None and stage is not None:
        summary.append(f"a bottleneck appeared: {_label(stage, cause)} ({b_cause} before)")
    elif stage is not None and b_cause != cause:
        summary.append(f"{stage} is still the bottleneck, but the cause changed from {b_cause} to {cause}")
    elif stage is not None:
        summary.append(f"the bottleneck is still {_label(stage, cause)}")
    else:
        summary.append(f"verdict before: {b_cause}, now: {cause}")
    return Comparison(
        baseline_requests=baseline.requests,
        stages=stages,
        total=total,
        baseline_cause=b_cause,
        baseline_stage=b_stage,
        cause=cause,
        stage=stage,
        bottleneck_moved=moved,
        summary=summary,
    )
