"""The share of requests that are slow or failed, before and after, and an exact test of its rise.

Used by the before/after comparison (:mod:`otel_stages.analysis.comparison`) for the tail test
(requests beyond the baseline's slowest + drift margin: Fisher's exact test, the exact permutation
bound) and the failure rate (Boschloo's exact test). Pure; scipy is imported only when a test runs.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Significance level (one-sided) of the tail and failure-rate tests; the comparison's confidence
#: is ``1 - SIGNIFICANCE`` (95 %).
SIGNIFICANCE = 0.05
#: Fewer requests than this above the tail line (or failed) after the change: one or two freak
#: requests are outliers, not a tail or a failure pattern; not tested.
MIN_EVENTS = 3
#: Boschloo's exact test enumerates every (before, after) table: up to this many
#: (``(n_before + 1) * (n_after + 1)``, about 0.1 s); above it Fisher's exact test, whose
#: conservatism costs little at that size.
EXACT_MAX_TABLES = 12_000


@dataclass(frozen=True)
class ShareChange:
    """The share of requests that are slow (above ``line_ms``: the tail) or failed, before and
    after: ``baseline_count`` of ``baseline_total``, ``count`` of ``total``. ``p_value``: one-sided
    exact test that the share rose (``test``: ``"boschloo"`` or ``"fisher"``); ``None`` when not
    tested (a side under the comparison's ``MIN_SAMPLES`` requests, or fewer than :data:`MIN_EVENTS` events
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
               line_ms: float | None = None, *, exact: str = "boschloo",
               min_requests: int = 5) -> ShareChange:
    """Test whether the share ``count / total`` rose above ``baseline_count / baseline_total``:
    one-sided Boschloo exact test (``scipy.stats.boschloo_exact``), Fisher's exact test
    (``scipy.stats.fisher_exact``) past :data:`EXACT_MAX_TABLES` or with ``exact="fisher"``
    (the tail test: module docstring). Not tested (``p_value`` None)
    below ``min_requests`` requests on a side or :data:`MIN_EVENTS` events after, or when the
    share did not rise."""
    out = ShareChange(baseline_count, baseline_total, count, total, line_ms=line_ms)
    if (min(baseline_total, total) < min_requests or count < MIN_EVENTS
            or count * baseline_total <= baseline_count * total):
        return out
    import numpy as np
    from scipy import stats

    # rows: after, before; columns: events, others. "greater": after's share is the larger
    table = np.array([[count, total - count], [baseline_count, baseline_total - baseline_count]])
    if exact == "boschloo" and (baseline_total + 1) * (total + 1) <= EXACT_MAX_TABLES:
        p, test = float(stats.boschloo_exact(table, alternative="greater").pvalue), "boschloo"
    else:
        p, test = float(stats.fisher_exact(table, alternative="greater").pvalue), "fisher"
    return ShareChange(baseline_count, baseline_total, count, total, min(p, 1.0), test, line_ms)
