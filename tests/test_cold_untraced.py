"""The cold request's untraced time (``figures.COLD_UNTRACED``): one-time setup done lazily inside
the first request lies outside every stage span (a tester's: 400 ms of a 673 ms first request
building the pooled HTTP client before the download span, shown nowhere; the queue's 216 ms named
as the cold start's place, with "start the executor at startup")."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from otel_stages.analysis import advice, load_paths
from otel_stages.analysis.decision import decide
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.figures import COLD_UNTRACED, SAME_INPUT, ColdFigures
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports  # noqa: F401 - the chDB fixture
from tests.test_decision import figures, stage

_PLACE = "the time outside every stage span took"


def _cold(untraced_ms: float, queue_ms: float) -> ColdFigures:
    return ColdFigures(
        count=1, total_ms=30.0 + untraced_ms + queue_ms,
        stages_ms={"download": 10.0, "queue": queue_ms, "forward": 20.0, COLD_UNTRACED: untraced_ms},
        comparable_median_total_ms=31.0,
        comparable_stages_ms={"download": 10.0, "queue": 1.0, "forward": 20.0, COLD_UNTRACED: 0.1},
        compared_with=SAME_INPUT, comparable_requests=30, cohort="1024x768")


@pytest.mark.parametrize("untraced_ms, queue_ms, place", [
    (400.0, 216.0, None),  # the tester's: most of the extra time is untraced
    (100.0, 216.0, "queue"),
    (215.1, 216.0, "queue"),  # extra 215.0 vs 215.0: a tie names the stage
])
def test_the_cold_start_names_where_the_extra_time_went(untraced_ms, queue_ms, place) -> None:
    v = decide(figures(stage("forward", 1.0, explains=0.5), total_swing=1.0,
                       cold=_cold(untraced_ms, queue_ms)))
    assert v.cause == "cold_start"
    assert v.stage == place
    untraced = place is None
    first = next(e for e in v.evidence if "in the cold request vs" in e)  # (a second may follow)
    assert first.startswith(_PLACE) is untraced
    assert (v.advice[0] == advice.for_cold_start(COLD_UNTRACED)[0]) is untraced
    assert v.advice[0].startswith("the first request's extra time lies outside") is untraced


def test_the_queue_line_names_a_lazy_model_load_too() -> None:
    assert "loaded the model lazily" in advice.for_cold_start("queue")[0]


def _lazy_client(rows: list[list[dict[str, object]]], gap_ms: float) -> None:
    """The first request spends ``gap_ms`` before its first stage span (a client built lazily)."""
    shift = int(gap_ms * 1e6)
    first = rows[0]
    for span in first:
        if span["name"] != "request":
            span["startTimeUnixNano"] = str(int(span["startTimeUnixNano"]) + shift)
        span["endTimeUnixNano"] = str(int(span["endTimeUnixNano"]) + shift)
    for later in rows[1:]:  # the rest after it
        for span in later:
            for k in ("startTimeUnixNano", "endTimeUnixNano"):
                span[k] = str(int(span[k]) + shift)


def _steady(i: int, r: random.Random) -> odd_inputs.Stages:
    return [("download", 5 + r.random()), ("decode", 10 + r.random()), ("resize", 4 + r.random()),
            ("queue", 1 + r.random()), ("forward", 30 + r.random())]


def test_from_spans_the_untraced_cold_time_is_shown_and_named(tmp_path: Path) -> None:
    rows = odd_inputs.run(40, _steady, seed=5)
    _lazy_client(rows, 400.0)
    report = diagnose(load_paths([odd_inputs.write(tmp_path / "lazy.jsonl", rows)]))
    out = report.to_dict()
    cold = out["cold_start"]
    assert cold["unaccounted_ms"] == pytest.approx(400.1, abs=0.01)
    assert cold["comparable_unaccounted_ms"] == pytest.approx(0.1, abs=0.01)
    assert COLD_UNTRACED not in cold["stages"] and COLD_UNTRACED not in cold["comparable_stages"]
    v = out["verdict"]
    assert (v["cause"], v["stage"]) == ("cold_start", None)
    assert v["advice"][0] == advice.for_cold_start(COLD_UNTRACED)[0]


def test_both_reports_read_the_untraced_cold_time_alike(engine, tmp_path: Path) -> None:  # noqa: F811
    rows = odd_inputs.run(40, _steady, seed=5)
    _lazy_client(rows, 400.0)
    got, want = reports(engine, odd_inputs.write(tmp_path / "lazy.jsonl", rows))
    assert got["verdict"] == want["verdict"]
    for key in ("unaccounted_ms", "comparable_unaccounted_ms", "stages", "comparable_stages"):
        assert got["cold_start"][key] == pytest.approx(want["cold_start"][key], rel=1e-6), key


def test_a_cold_start_in_a_stage_keeps_its_stage(tmp_path: Path) -> None:
    rows = odd_inputs.run(40, lambda i, r: [*_steady(i, r)[:4], ("forward", 900.0 if i == 0 else 30 + r.random())],
                          seed=5)
    v = diagnose(load_paths([odd_inputs.write(tmp_path / "load.jsonl", rows)])).verdict
    assert (v.cause, v.stage) == ("cold_start", "forward")
    assert not any(e.startswith(_PLACE) for e in v.evidence)


def test_figures_without_the_untraced_time_compare_stages_only() -> None:
    cold = _cold(400.0, 216.0)
    plain = replace(cold, stages_ms={k: v for k, v in cold.stages_ms.items() if k != COLD_UNTRACED})
    v = decide(figures(stage("forward", 1.0, explains=0.5), total_swing=1.0, cold=plain))
    assert v.stage == "queue"


# --- a second place of the extra time (COLD_SECOND_MIN_SHARE) ------------------------------------


@pytest.mark.parametrize("queue_ms, second", [
    (172.0, False),  # queue's extra 171 of 171 + 399.9: 29.96 %
    (173.0, True),   # 172 of 571.9: 30.08 %
])
def test_a_second_place_of_the_extra_time_is_named_from_its_share(queue_ms: float, second: bool) -> None:
    """COLD_SECOND_MIN_SHARE 0.3 (literal: a changed threshold must fail): the untraced time leads;
    the queue's extra is named with its share and its advice second when it holds 30 % or more."""
    cold = _cold(400.0, queue_ms)
    v = decide(figures(stage("forward", 1.0, explains=0.5), total_swing=1.0, cold=cold))
    assert (v.cause, v.stage) == ("cold_start", None)
    assert v.advice[0] == advice.for_cold_start(COLD_UNTRACED)[0]
    assert any(e.startswith("queue took") for e in v.evidence) is second
    assert (v.advice[1] == advice.for_cold_start("queue")[0]) is second
    if second:
        assert any(e.startswith(_PLACE) and e.endswith("of the extra time (70%)") for e in v.evidence)


def test_a_model_load_and_a_lazy_client_are_both_named_in_both_reports(
        engine, tmp_path: Path) -> None:  # noqa: F811
    """A tester's first request: 450 ms building a client outside every stage span, and a forward
    550 ms over its warm median (a model load). Only forward was named, 45 % of the extra time
    unsaid; now both, forward first (the larger), in both reports."""
    rows = odd_inputs.run(40, lambda i, r: [*_steady(i, r)[:4], ("forward", 580.0 if i == 0 else 30 + r.random())],
                          seed=5)
    _lazy_client(rows, 450.0)
    got, want = reports(engine, odd_inputs.write(tmp_path / "both.jsonl", rows))
    v = want["verdict"]
    assert (v["cause"], v["stage"]) == ("cold_start", "forward")
    assert any(e.startswith("forward took") and e.endswith("(55%)") for e in v["evidence"])
    assert any(e.startswith(_PLACE) and e.endswith("(45%)") for e in v["evidence"])
    assert v["advice"][:2] == [advice.for_cold_start("forward")[0], advice.for_cold_start(COLD_UNTRACED)[0]]
    assert got["verdict"] == v


# --- every place of 30 % or more, and a spread rest (COLD_REST_MIN_NAMED_SHARE) --------------------

_BASE = {"download": 10.0, "decode": 10.0, "queue": 1.0, "forward": 100.0, COLD_UNTRACED: 0.1}


def _spread(extra: dict[str, float]) -> ColdFigures:
    """A first request paying ``extra`` ms over the warm medians in each named place."""
    cold = {name: ms + extra.get(name, 0.0) for name, ms in _BASE.items()}
    return ColdFigures(count=1, total_ms=sum(cold.values()), stages_ms=cold,
                       comparable_median_total_ms=sum(_BASE.values()), comparable_stages_ms=dict(_BASE),
                       compared_with=SAME_INPUT, comparable_requests=30, cohort="1024x768")


def _cold_verdict(extra: dict[str, float]):
    return decide(figures(stage("forward", 1.0, explains=0.5), total_swing=1.0, cold=_spread(extra)))


def test_three_places_of_thirty_percent_are_all_named() -> None:
    """A tester's 38/31/31 cold start (a model load, a lazy client, the decoder's first use): the
    third place was unnamed; now each, the larger first, its advice in that order."""
    v = _cold_verdict({"forward": 380.0, COLD_UNTRACED: 310.0, "decode": 310.0})
    assert (v.cause, v.stage) == ("cold_start", "forward")
    took = [e for e in v.evidence if " in the cold request vs " in e]
    assert [e.split(" took ")[0] for e in took] == ["forward", "decode", "the time outside every stage span"]
    assert [e[-5:] for e in took] == ["(38%)", "(31%)", "(31%)"]
    assert v.advice[:3] == [advice.for_cold_start(p)[0] for p in ("forward", "decode", COLD_UNTRACED)]
    assert not any(e.startswith("the other ") for e in v.evidence)


@pytest.mark.parametrize("first_ms, said", [
    (705.0, False),  # the rest 295 of 1000: 29.5 %
    (695.0, True),   # 305 of 1000: 30.5 %
])
def test_a_spread_rest_of_thirty_percent_is_said(first_ms: float, said: bool) -> None:
    """COLD_SECOND_MIN_SHARE 0.3 for the places under it together (literal: a changed threshold
    must fail): a first place of 46 % and two of 27 % named the first only, 54 % unsaid."""
    rest = 1000.0 - first_ms
    v = _cold_verdict({"forward": first_ms, COLD_UNTRACED: rest / 2 + 5, "decode": rest / 2 - 5})
    assert v.stage == "forward"
    spread = [e for e in v.evidence if e.startswith("the other ")]
    assert bool(spread) is said
    assert (v.advice[1] == advice.for_cold_start(COLD_UNTRACED)[0]) is said
    if said:
        assert spread[0] == ("the other 30% of the extra time is spread over 2 places, each under 30%: the"
                             " time outside every stage span 157.5 ms (16%), decode 147.5 ms (15%)")
        assert any(e.startswith("forward took") and e.endswith("(70%)") for e in v.evidence)
    else:
        assert not any(e.endswith("%)") and "forward took" in e for e in v.evidence)


@pytest.mark.parametrize("decode_ms, named", [
    (99.0, False),  # 99 of 1000: 9.9 %
    (101.0, True),  # 101 of 1000: 10.1 %
])
def test_a_spread_place_is_named_from_a_tenth(decode_ms: float, named: bool) -> None:
    """COLD_REST_MIN_NAMED_SHARE 0.1 (literal): a place in the spread rest is named, with its
    advice, from a tenth of the extra time; the smaller are counted."""
    v = _cold_verdict({"forward": 640.0, COLD_UNTRACED: 360.0 - decode_ms - 1.0, "decode": decode_ms,
                       "download": 1.0})
    [spread] = [e for e in v.evidence if e.startswith("the other ")]
    assert ("decode " in spread) is named
    assert spread.endswith("1 more under 10%" if named else "2 more under 10%")
    assert (advice.for_cold_start("decode")[0] in v.advice) is named


# --- several cold requests: the places over their means ----------------------------------------


def _processes(path: Path, lazy: list[str]) -> Path:
    """One process per item of ``lazy``, 40 steady requests each: its first request pays 800 ms
    outside every stage span (``"client"``) or in forward (``"model"``)."""
    lines = []
    for k, kind in enumerate(lazy):
        rows = odd_inputs.run(40, lambda i, r, kind=kind: [
            *_steady(i, r)[:4], ("forward", (830.0 if i == 0 and kind == "model" else 30.0) + r.random())],
            seed=10 + k)
        if kind == "client":
            _lazy_client(rows, 800.0)
        resource = {"attributes": [odd_inputs._attr("service.name", "svc"),
                                   odd_inputs._attr("service.instance.id", f"p{k}")]}
        lines += [json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]})
                  for spans in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_one_process_of_three_loading_its_model_is_named(engine, tmp_path: Path) -> None:  # noqa: F811
    """A tester's fleet: two processes' first requests build a client lazily (800 ms untraced),
    the third loads its model in forward (800 ms). Over the medians the forward's load vanished
    (60 ms median of 60, 60, 860): the verdict named only the untraced time. Over the means both
    places are named (67 % / 33 %), each with its advice; the same in ClickHouse."""
    got, want = reports(engine, _processes(tmp_path / "three.jsonl", ["client", "client", "model"]))
    v = want["verdict"]
    assert (v["cause"], v["stage"]) == ("cold_start", None)
    took = [e for e in v["evidence"] if " on average over the 3 cold requests " in e]
    assert [e.split(" took ")[0] for e in took] == ["the time outside every stage span", "forward"]
    assert took[0].endswith("(67%)") and took[1].endswith("(33%)") and "(median 30." in took[1]
    assert v["advice"][:2] == [advice.for_cold_start(COLD_UNTRACED)[0], advice.for_cold_start("forward")[0]]
    assert got["verdict"] == v


def test_one_cold_request_keeps_its_own_times(tmp_path: Path) -> None:
    """One process: the figures are the request's own, said as such (no mean)."""
    report = diagnose(load_paths([_processes(tmp_path / "one.jsonl", ["model"])])).to_dict()
    line = next(e for e in report["verdict"]["evidence"] if e.startswith("forward took"))
    assert " in the cold request vs " in line and "average" not in line


def test_the_means_are_those_of_the_cold_requests_that_paid(engine, tmp_path: Path) -> None:  # noqa: F811
    """A fourth process whose first request paid nothing: the places are the three that paid
    (its steady times left out of the means too); the same in ClickHouse."""
    got, want = reports(engine, _processes(tmp_path / "four.jsonl", ["client", "none", "client", "model"]))
    v = want["verdict"]
    took = [e for e in v["evidence"] if " on average over the 3 cold requests " in e]
    assert [e[-5:] for e in took] == ["(67%)", "(33%)"]
    assert got["verdict"] == v
