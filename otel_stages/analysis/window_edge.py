"""Requests cut off by a window's start: a report over a time window (``--since``) keeps a request
by its own start (as Jaeger and Tempo search), so a request that started just before the window and
ended inside it is left out, and those are the long ones, the very requests a latency report is
about (a tester's: six requests waiting 150 s in the queue started 31-33 minutes ago, three of
them ended inside ``--since 30m``; the report said ``stable``). Pure.

When such requests exist and the longest of them lasted at least the warm requests' p95 plus the
run's noise band (a request that slow would be among the slow ones if it were in), the verdict is
tentative, the evidence says first how many were left out and how long the longest took, and the
advice leads with widening the window."""

from __future__ import annotations

from dataclasses import dataclass

from otel_stages.analysis import advice as advice_text
from otel_stages.analysis.units import duration
from otel_stages.analysis.verdict import Verdict

#: The advice that leads when slow requests were cut off by the window's start.
WIDEN_WINDOW = (
    "widen the window to start before the requests it cut off (--since a little further back):"
    " a request belongs to the window it starts in, so the slow requests that ended inside this"
    " one were left out"
)


@dataclass(frozen=True)
class WindowEdge:
    """Requests (stage parents) that started before the window's start and ended inside it:
    ``requests`` of them, the longest ``longest_ms`` (``None`` without any)."""

    requests: int = 0
    longest_ms: float | None = None

    def to_dict(self) -> dict[str, object]:
        """JSON form: ``{"requests": n, "longest_ms": ms | null}``."""
        return {"requests": self.requests,
                "longest_ms": None if self.longest_ms is None else round(self.longest_ms, 3)}


def cut_off_slow(edge: WindowEdge, p95_ms: float | None, band_ms: float | None) -> bool:
    """Whether the requests cut off include a slow one: the longest lasted at least ``p95_ms`` (the
    warm requests' p95 total in the window) plus ``band_ms`` (the run's noise band)."""
    if not edge.requests or edge.longest_ms is None or p95_ms is None:
        return False
    return edge.longest_ms >= p95_ms + (band_ms or 0.0)


def window_caveat(verdict: Verdict, edge: WindowEdge, p95_ms: float | None,
                  band_ms: float | None) -> None:
    """Tentative, the reason first in the evidence and the advice, when :func:`cut_off_slow`."""
    if not cut_off_slow(edge, p95_ms, band_ms):
        return
    assert edge.longest_ms is not None and p95_ms is not None
    n = edge.requests
    verdict.tentative = True
    verdict.evidence.insert(0, (
        f"{n} request{'s' if n != 1 else ''} started before the window and ended inside it, left"
        f" out (a request belongs to the window it starts in): the longest took"
        f" {duration(edge.longest_ms)}, beyond the warm requests' p95 {duration(p95_ms)} plus the"
        f" noise band {duration(band_ms or 0.0)}; the window cut off slow requests, so this verdict"
        " may miss what slowed them"))
    # "latency is steady" holds for the requests in the window only
    verdict.advice[:] = [WIDEN_WINDOW, *(a for a in verdict.advice if a != advice_text.STEADY)]
