"""Stages that overlap in time: shares that cannot add up, and a lead they may have changed. Pure.

When stage spans of one request run at the same time (a stage map that maps a span and its child,
concurrent sub-tasks), the request's stage times add up to more than the time they cover: per
request, the *double-counted* time is ``sum(stage ms) + unaccounted ms - total ms`` (the stage
time inside the request beyond the time the stages cover). The stage shares then add up to more
than 100 %; the report shows the double count as an ``(overlap)`` share subtracted from them
(:class:`Overlap`, JSON ``overlap``), so that stage shares + unaccounted - overlap = 100 %.

The verdict ranks stages by their part of the total's variance (``explains``; by swing where that
is unknown). Double-counted time inflates the stages it lies in, so the leading stage may lead
only because it holds another stage's time. Removing it could cost the leader at most the
overlap's own part, so when the overlap explains at least :data:`OVERLAP_MAX_PART_OF_LEAD` of the
leader's margin over the next stage, the overlap could change which stage leads: the verdict is
made tentative, the evidence says so and names the runner-up, and the first advice is to map or
instrument each piece of time once (:func:`overlap_caveat`). Where at least
:data:`OVERLAP_SHARE_SAID` of the request time is counted twice, the verdict's share line says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from otel_stages.analysis.caveats import offset_line
from otel_stages.analysis.figures import Figures
from otel_stages.analysis.requests import Request
from otel_stages.analysis.span_issues import OVERLAP_TOLERANCE_MS
from otel_stages.analysis.stats import distribution, explained_fraction
from otel_stages.analysis.units import pct
from otel_stages.analysis.verdict import Verdict

#: The overlap may change which stage leads once its part of the variance (or its swing, where
#: ``explains`` is unknown) is at least this part of the leader's margin over the next stage: the
#: leader, stripped of the double-counted time, could fall below the runner-up.
OVERLAP_MAX_PART_OF_LEAD = 1.0
#: From this share of all request time counted twice, the verdict's line giving its stage's share
#: says the shares count it twice (a tester's two concurrent downloads: "download is 48 % of all
#: request time" beside a request the download spans covered a third of); below, the rounded
#: shares barely move.
OVERLAP_SHARE_SAID = 0.01
#: Advice when :func:`overlap_caveat` applies.
OVERLAP_ADVICE = ("count each piece of time in one stage: in a stage map, map a span or its"
                  " child, not both, and not spans that run at the same time; in your own spans,"
                  " nest concurrent work under one stage span")


@dataclass(frozen=True)
class Overlap:
    """Double-counted time over the warm requests: ``requests`` with some (more than
    :data:`~otel_stages.analysis.span_issues.OVERLAP_TOLERANCE_MS`), ``median_ms`` / ``swing_ms``
    (p95 - p5) per request over all warm requests, ``share`` of all request time (subtract it
    from the stage shares for them to add up), ``explains`` its part of the total's variance
    (``None`` below the rules' minimum warm count)."""

    requests: int
    median_ms: float
    swing_ms: float
    share: float
    explains: float | None

    def to_dict(self) -> dict[str, object]:
        """JSON ``overlap``: ``{"requests", "median_ms", "swing_ms", "share", "explains"}``."""
        return {"requests": self.requests, "median_ms": round(self.median_ms, 3),
                "swing_ms": round(self.swing_ms, 3), "share": round(self.share, 4),
                "explains": None if self.explains is None else round(self.explains, 4)}


def double_counted_ms(request: Request) -> float:
    """Stage time inside ``request`` beyond the time its stages cover (ms, >= 0)."""
    return max(0.0, sum(request.stages_ms.values()) + request.unaccounted_ms - request.total_ms)


def overlap_stats(warm: Sequence[Request], *, with_explains: bool) -> Overlap | None:
    """:class:`Overlap` of ``warm``; ``None`` when no request's stages overlap."""
    double = [double_counted_ms(r) for r in warm]
    hit = sum(d > OVERLAP_TOLERANCE_MS for d in double)
    if not hit:
        return None
    totals = [r.total_ms for r in warm]
    d = distribution(double)
    return Overlap(hit, d.median_ms, d.swing_ms, sum(double) / sum(totals) if sum(totals) else 0.0,
                   explained_fraction(double, totals) if with_explains else None)


def lead_at_risk(fig: Figures, verdict: Verdict, overlap: Overlap | None) -> str | None:
    """The stage that could lead instead of ``verdict.stage`` once the double count is taken out
    (module docstring), or ``None``."""
    if overlap is None or verdict.stage is None or verdict.stage not in fig.stages:
        return None
    leader = fig.stages[verdict.stage]
    others = [s for n, s in fig.stages.items() if n != verdict.stage]
    known = leader.explains is not None and overlap.explains is not None and all(
        s.explains is not None for s in others)

    def metric(explains: float | None, swing: float) -> float:
        return (explains or 0.0) if known else swing

    if not others:
        return None
    runner = max(others, key=lambda s: metric(s.explains, s.swing_ms))
    margin = metric(leader.explains, leader.swing_ms) - metric(runner.explains, runner.swing_ms)
    part = metric(overlap.explains, overlap.swing_ms)
    if part <= 0 or part < OVERLAP_MAX_PART_OF_LEAD * margin:
        return None
    return runner.name


def overlap_caveat(verdict: Verdict, fig: Figures, overlap: Overlap | None) -> None:
    """When :func:`lead_at_risk`: tentative, with the evidence first and the advice first. Where
    the double count is what puts a stage's ``explains`` above 100 %, the line about it says so
    (:func:`~otel_stages.analysis.caveats.offset_line`), not that stages offset each other."""
    if overlap is not None and overlap.explains is not None:
        said, meant = offset_line(fig), offset_line(fig, overlap.explains)
        if said is not None and meant != said and said in verdict.evidence:
            verdict.evidence[verdict.evidence.index(said)] = meant or said
    if overlap is not None and overlap.share >= OVERLAP_SHARE_SAID and verdict.stage is not None:
        head = f"{verdict.stage} is "
        at = next((i for i, e in enumerate(verdict.evidence)
                   if e.startswith(head) and " of all request time (" in e), None)
        if at is not None:
            verdict.evidence[at] += (
                f"; the shares add up to more than 100%: stage spans of a request overlap (in"
                f" {overlap.requests} warm requests, which stages: see the warnings) and their"
                f" shared time counts in each, {pct(overlap.share)} of request time that the"
                " (overlap) row takes back")
    runner = lead_at_risk(fig, verdict, overlap)
    if runner is None or overlap is None:
        return
    verdict.tentative = True
    what = (f"explains {pct(overlap.explains)} of the variance" if overlap.explains is not None
            else f"swings {overlap.swing_ms:.1f} ms")
    verdict.evidence.insert(0, (
        f"stages overlap in {overlap.requests} of {fig.warm_requests} warm requests: time counted"
        f" in two stages at once ({pct(overlap.share)} of request time) {what}, at least"
        f" {verdict.stage}'s lead over {runner}; without the double count {runner} could lead, so"
        " this verdict is tentative"))
    verdict.advice.insert(0, OVERLAP_ADVICE)
