"""The shared tests of the mechanism rules (:mod:`otel_stages.analysis.mechanisms`,
:mod:`otel_stages.analysis.contention`): when a signal part is known for enough runs, when it
drives a stage's swing, and the sentences that state it. Pure."""

from __future__ import annotations

from otel_stages.analysis.signal_figures import TAIL_PERCENTILE, Part, StageSignals
from otel_stages.analysis.units import duration, pct

#: A part is judged only when known for at least this many warm requests ...
MIN_SIGNAL_REQUESTS = 5
#: ... and for at least this share of the warm requests the stage ran in (else the signal may
#: describe a few unusual runs, e.g. one process of several).
MIN_SIGNAL_COVERAGE = 0.5
#: A part explaining at least half of the stage's variance drives its swing more than everything
#: else together: the mechanism is confirmed.
MECHANISM_MIN_EXPLAINS = 0.5


def drives(part: Part | None, requests: int) -> bool:
    """The part explains the swing, and the typical slow run had more of it than the typical fast
    one (else a few outliers carry the explained variance: one long GC pause in 30 runs)."""
    return (part is not None and part.requests >= MIN_SIGNAL_REQUESTS
            and part.requests >= MIN_SIGNAL_COVERAGE * requests
            and part.explains is not None and part.explains >= MECHANISM_MIN_EXPLAINS
            and part.slow_median_ms is not None and part.fast_median_ms is not None
            and part.slow_median_ms > part.fast_median_ms)


def split_line(name: str, part: Part, sig: StageSignals, what: str) -> str:
    return (f"{what} in the slowest quarter of {name} runs (>= {duration(sig.slow_min_ms)}):"
            f" {duration(part.slow_median_ms)} median, vs {duration(part.fast_median_ms)} in the"
            f" faster half (<= {duration(sig.fast_max_ms)}); it explains {pct(part.explains)} of"
            f" {name}'s variance ({part.requests} warm requests)")


def share_words(explains: float) -> str:
    """``explains`` as a percentage; above 100 % with why (the slowdown's and the CPU work's
    shares add up to 1, so the CPU work's is then negative: the slow runs computed less)."""
    if explains <= 1.0:
        return pct(explains)
    return (f"{pct(explains)} (more than all of it: the slow runs did less CPU work than the fast"
            f" ones, a CPU-work part of {pct(1.0 - explains)})")


def slowest_utilization(sig: StageSignals) -> tuple[float, str] | None:
    """The lower of the slowest quarter's and the tail's median CPU/wall, with which runs it
    describes: a blocked tail of a tenth of the runs hides in the quarter's median."""
    groups = [(u, what) for u, what in (
        (sig.slow_cpu_utilization, "slow runs"),
        (sig.tail_cpu_utilization, f"slowest runs (>= p{TAIL_PERCENTILE:g})")) if u is not None]
    return min(groups) if groups else None


def known(part: Part | None, requests: int) -> bool:
    """The part is known for enough runs to judge (:data:`MIN_SIGNAL_REQUESTS`,
    :data:`MIN_SIGNAL_COVERAGE`)."""
    return (part is not None and part.requests >= MIN_SIGNAL_REQUESTS
            and part.requests >= MIN_SIGNAL_COVERAGE * requests)
