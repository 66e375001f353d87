"""event_loop_blocked when no stage span held the loop: the lag may be the loop thread waiting for
a core (a fresh-eyes tester's asyncio service did all its work in a thread pool beside busy
processes: the loop thread's own schedstat run-queue wait was 52 of the slow runs' 53 ms of lag,
and the report said event_loop_blocked). With CPU pressure covering at least
LOOP_STARVED_MIN_PRESSURE_OF_LAG of the slow runs' lag the blocked loop is not confirmed."""

from __future__ import annotations

import pytest

from otel_stages.analysis import mechanisms as mech
from otel_stages.analysis.signal_figures import Held, Part, StageSignals

LAG_SLOW_MS = 50.0


def _signals(pressure_slow_ms: float | None) -> StageSignals:
    lag = Part(requests=40, median_ms=20.0, slow_median_ms=LAG_SLOW_MS, fast_median_ms=10.0,
               explains=0.9, max_ms=80.0)
    pressure = None if pressure_slow_ms is None else Part(
        requests=40, median_ms=pressure_slow_ms / 2, slow_median_ms=pressure_slow_ms,
        fast_median_ms=5.0, explains=0.5, max_ms=pressure_slow_ms * 2)
    return StageSignals(stage="download", requests=40, slow_min_ms=60.0, fast_max_ms=30.0,
                        lag=lag, pressure=pressure)


def _loop_mechanism(sig: StageSignals, held: dict[str, Held] | None = None):
    judged = mech.judge(sig, held or {})
    assert judged is not None
    (found,) = [m for m in judged.mechanisms if m.cause == mech.CAUSE_EVENT_LOOP_BLOCKED]
    return found


@pytest.mark.parametrize("share, confirmed", [(0.49, True), (0.51, False)])
def test_pressure_threshold_on_the_lag(share, confirmed):
    assert mech.LOOP_STARVED_MIN_PRESSURE_OF_LAG == 0.5
    found = _loop_mechanism(_signals(share * LAG_SLOW_MS))
    assert found.confirmed is confirmed
    if not confirmed:
        assert "may have been waiting for a core rather than blocked" in found.evidence[0]
        assert found.advice[0].startswith("check whether the loop's thread got a core")


def test_without_pressure_the_lag_still_confirms():
    assert _loop_mechanism(_signals(None)).confirmed


def test_a_named_holder_confirms_whatever_the_pressure():
    held = {"decode": Held(count=30, sum_ms=1500.0, median_ms=50.0, max_ms=80.0)}
    found = _loop_mechanism(_signals(LAG_SLOW_MS), held)
    assert found.confirmed and any("decode 30 times" in line for line in found.evidence)


def test_the_rule_is_what_decides(monkeypatch):
    """Break it on purpose: without the check, high pressure no longer holds the verdict back."""
    monkeypatch.setattr(mech, "_loop_may_be_starved", lambda sig: None)
    assert _loop_mechanism(_signals(LAG_SLOW_MS)).confirmed
