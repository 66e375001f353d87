"""A blocked event loop whose wait lands between the stages (a tester's real service: FastAPI under
uvicorn, 12 MP JPEGs decoded right in the async handler, 8 concurrent clients): the time after each
await waited for the loop, outside every stage span, and the report said "no verdict: wrap the
untraced work in stage() spans" while its own mechanism table said ``event_loop_blocked``. Now a
confirmed blocked loop names the holder, tentatively, with the advice to move it off the loop
first. ``tests/data/traces/loop_untraced.otlp.jsonl`` is that service's own recording
(``otel_stages`` instrumentation, ``OTEL_STAGES_GPU=off``, uvicorn, 120 requests from httpx
clients, 3 of 4 images 320x240 and 1 of 4 4000x3000)."""

from __future__ import annotations

from pathlib import Path

from otel_stages.analysis import advice
from otel_stages.analysis.decision import decide
from otel_stages.analysis.figures import Mechanism, StageEvidence, UnaccountedFigures
from tests.test_clickhouse_issues import engine, reports  # noqa: F401
from tests.test_decision import figures

TRACE = Path(__file__).parent / "data" / "traces" / "loop_untraced.otlp.jsonl"
_GAP = UnaccountedFigures(median_ms=50.0, swing_ms=40.0, share=0.5, explains=0.9)
_BLOCKED = Mechanism("event_loop_blocked", True,
                     ("asyncio event-loop lag explains 104% of resize's variance",
                      "held the event loop: decode 30 times"),
                     ("move decode off the event loop: await asyncio.to_thread(...)",))


def _with(mechanism: Mechanism, holder: str | None = "decode") -> list:
    v = decide(figures(total_swing=40.0, unaccounted=_GAP, stage_evidence={
        "resize": StageEvidence(mechanisms=(mechanism,), loop_holder=holder)}))
    return [v.cause, v.stage, v.tentative, v.evidence, v.advice]


def test_a_confirmed_blocked_loop_names_the_holder_of_the_untraced_wait() -> None:
    cause, stage, tentative, evidence, advice_lines = _with(_BLOCKED)
    assert (cause, stage, tentative) == ("event_loop_blocked", "decode", True)
    assert "the swing is outside the stage spans" in evidence[0]
    assert any(e.startswith("the event loop was blocked: asyncio event-loop lag") for e in evidence)
    assert "held the event loop: decode 30 times" in evidence
    assert advice_lines[0].startswith("move decode off the event loop")
    assert advice_lines[-1] == "also: " + advice.UNTRACED


def test_without_a_holder_the_lagging_stage_is_named() -> None:
    assert _with(_BLOCKED, holder=None)[:3] == ["event_loop_blocked", "resize", True]


def test_an_unconfirmed_lag_leaves_the_untraced_time_unexplained() -> None:
    unconfirmed = Mechanism("event_loop_blocked", False, ("lag 3% of resize's variance",))
    cause, stage, tentative, _, advice_lines = _with(unconfirmed)
    assert (cause, stage, tentative) == (None, None, False)
    assert advice_lines == [advice.UNTRACED]


def test_another_confirmed_mechanism_does_not_explain_the_untraced_time() -> None:
    gc = Mechanism("gc_pause", True, ("GC pauses explain 80% of resize's variance",), ("tune gc",))
    assert _with(gc)[:2] == [None, None]


def test_the_real_service_reads_alike_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    got, want = reports(engine, TRACE)
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    assert (v["cause"], v["stage"], v["tentative"]) == ("event_loop_blocked", "decode", True), v
    assert v["advice"][0].startswith("move decode off the event loop")
