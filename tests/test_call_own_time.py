"""The calls' own-time rule (:func:`otel_stages.analysis.decision.own_time_calls`) on figures built
by hand: a call into requests read in the report is the caller's own wait, ranked with the cause
``call``, when its own time (each span less its called requests' totals) swings materially and at
least :data:`~otel_stages.analysis.decision.CALL_OWN_MIN_RATIO` of the called requests' swing;
each threshold just below and just above."""

from __future__ import annotations

from dataclasses import replace

import pytest

from otel_stages.analysis import advice, calls, decision
from otel_stages.analysis.decision import decide
from otel_stages.analysis.figures import Figures
from otel_stages.analysis.model import Call
from tests.test_decision import figures, stage

TOTAL_SWING = 60.0  # ms, of a 100 ms median request


def _fig(own_swing: float, callee_swing: float = 2.0, *, name: str = "POST",
         callee_stage: bool = False) -> Figures:
    """A call stage ``name`` swinging ``TOTAL_SWING`` and explaining most; its own time
    ``own_swing`` (p5 2 ms), its called requests' totals ``callee_swing`` (p5 50 ms)."""
    post = stage("forward", TOTAL_SWING, median=60.0, explains=0.9)
    post = replace(post, name=name)
    fig = figures(total_swing=TOTAL_SWING)
    call = Call(name, "vlm-worker", 30, 30, False, callee_stage, 2.0, 2.0, 2.0 + own_swing,
                50.0, 50.0 + callee_swing)
    return replace(fig, stages={**fig.stages, name: post}, calls=(call,))


def test_rule_constants() -> None:
    assert decision.CALL_OWN_MIN_RATIO == 1.0
    assert decision.SWING_MIN_FRACTION == 0.15 and decision.STAGE_MIN_PART_OF_SWING == 0.25


def test_own_swing_at_the_material_floor() -> None:
    """15 ms (15 % of the 100 ms median request; also 25 % of the 60 ms total swing)."""
    below, above = _fig(15.0 - 0.1), _fig(15.0 + 0.1)
    assert decision.own_time_calls(below, decision.noise_band(below.stages.values(), 100.0)) == set()
    assert decide(below).stage != "POST"  # (left out as the callee's time)
    v = decide(above)
    assert (v.cause, v.stage) == ("call", "POST")
    assert v.advice[0] == advice.CALL_OWN.format(stage="POST")
    assert v.evidence[0].startswith("POST is a call into vlm-worker's requests (30 of its 30 spans")
    assert ("swings 15.1 ms (p5 2.0 ms -> p95 17.1 ms), the time the called requests cover 2.0 ms"
            in v.evidence[0])


def test_own_swing_against_the_total_swing() -> None:
    """A larger total swing (100 ms): the own time must carry 25 % of it (25 ms)."""
    def fig(own: float) -> Figures:
        f = _fig(own)
        return replace(f, total=replace(f.total, swing_ms=100.0, p5_ms=50.0, p95_ms=150.0))
    assert decide(fig(25.0 - 0.1)).cause != "call"
    assert decide(fig(25.0 + 0.1)).cause == "call"


def test_own_swing_against_the_callees_swing() -> None:
    """Own time and the called requests both swing: the larger names the place."""
    assert decide(_fig(40.0, callee_swing=40.0 + 0.1)).stage != "POST"
    v = decide(_fig(40.0, callee_swing=40.0 - 0.1))
    assert (v.cause, v.stage) == ("call", "POST")


def test_a_call_named_forward_is_not_the_model() -> None:
    """A call pooled under the callee's stage name: with its own time swinging, the cause is the
    call, no GPU line; without, the forward's plain cause."""
    assert decide(_fig(30.0, name="forward", callee_stage=True)).cause == "call"
    v = decide(_fig(1.0, name="forward", callee_stage=True))
    assert (v.cause, v.stage) == ("forward", "forward")


def test_unread_own_time_keeps_the_call_out() -> None:
    """A source without own-time figures (``None``): the call is left out as before."""
    f = _fig(30.0)
    f = replace(f, calls=(replace(f.calls[0], own_p5_ms=None, own_median_ms=None, own_p95_ms=None),))
    assert decide(f).stage != "POST"


# --- where the own time swings: before the called requests start, or after they end ----------------


def _sided(before: float, after: float, own: float = 40.0) -> Figures:
    """``_fig(own)`` with the own time's swing ``before`` the called requests start and ``after``
    they end (each p5 0.5 ms)."""
    f = _fig(own)
    (call,) = f.calls
    return replace(f, calls=(replace(call, before_p5_ms=0.5, before_p95_ms=0.5 + before,
                                     after_p5_ms=0.5, after_p95_ms=0.5 + after),))


def test_side_constants() -> None:
    assert calls.CALL_SIDE_MIN_SHARE == 0.75


@pytest.mark.parametrize("before, after, side", [
    (30.0 - 0.1, 1.0, None),  # under 0.75 of the 40 ms own swing
    (30.0 + 0.1, 1.0, calls.SIDE_BEFORE),
    (38.0, 10.0 - 0.1, calls.SIDE_BEFORE),  # the other side under the rest (10 ms)
    (38.0, 10.0 + 0.1, None),
    (1.0, 30.0 + 0.1, calls.SIDE_AFTER),
    (1.0, 30.0 - 0.1, None),
])
def test_the_side_that_swings_is_named(before: float, after: float, side: str | None) -> None:
    f = _sided(before, after)
    assert calls.own_side(f.calls[0]) == side
    v = decide(f)
    assert (v.cause, v.stage) == ("call", "POST")
    want = {calls.SIDE_BEFORE: advice.CALL_OWN_BEFORE, calls.SIDE_AFTER: advice.CALL_OWN_AFTER}.get(
        side or "", advice.CALL_OWN)
    assert v.advice[0] == want.format(stage="POST")
    where = {calls.SIDE_BEFORE: "; it swings before the called requests start (p5 500 µs",
             calls.SIDE_AFTER: "; it swings after they end (p5 500 µs"}.get(side or "")
    assert (where is not None and where in v.evidence[0]) or (where is None and "; it swings" not in v.evidence[0])


def test_unread_sides_name_no_side() -> None:
    assert calls.own_side(_fig(40.0).calls[0]) is None
    assert decide(_fig(40.0)).advice[0] == advice.CALL_OWN.format(stage="POST")
