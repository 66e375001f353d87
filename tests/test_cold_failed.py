"""A cold request that failed after paying the cold start (a tester's: the first request loaded the
model for 2.5 s inside its forward and then hit the client's deadline; the report read "59 warm,
0 cold, 1 failed ... Verdict: stable" and never said the cold start made the first request fail).

Such a request is in the cold figures (``cohorts.failed_cold_paid``: it ran until at least its
input's cold bar before failing), marked as failed (its times run until the error: a lower bound);
one that failed sooner stays out. Both reports, file and ClickHouse (chDB), say the same. And
which request is a process's first (its cold one) when two of one trace start in the same
nanosecond: the one of the smaller span id, in both."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import advice, load_paths
from otel_stages.analysis.cohorts import (
    COMPARABLE_MIN_REQUESTS,
    FAILED_COLD_STOP_MIN_SHARE,
    CohortKeys,
    failed_cold_paid,
    paid_min_ms,
)
from otel_stages.analysis.decision import decide
from otel_stages.analysis.figures import ALL_WARM, ColdFigures
from otel_stages.analysis.requests import group_spans
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports  # noqa: F401 - the chDB fixture
from tests.test_decision import figures, stage

_ERROR = {"code": 2, "message": "deadline exceeded"}
_SIZES = {"small": (320, 240), "large": (1920, 1080)}


def _sized(spans: list[dict[str, Any]], size: str) -> None:
    """Put ``size``'s image attributes on the request's decode span (the telemetry contract's)."""
    w, h = _SIZES[size]
    decode = next(s for s in spans if s["name"] == "decode")
    decode["attributes"] += [odd_inputs._attr("image.width", w), odd_inputs._attr("image.height", h)]


def _run(cold_forward_ms: float, *, failed: bool = True, sizes: tuple[str, ...] = (),
         cold_size: str = "small", n: int = 40) -> list[list[dict[str, Any]]]:
    """``n`` requests of one process; the first (cold) spends ``cold_forward_ms`` in forward and,
    when ``failed``, ends with an error (its forward too). ``sizes``: the warm requests' inputs in
    turn (a large input's forward is 10x); empty: no image size recorded."""
    def stages(i: int, r: random.Random) -> odd_inputs.Stages:
        s = odd_inputs.normal(i, r)
        if i == 0:
            s[4] = ("forward", cold_forward_ms)
        elif sizes and sizes[i % len(sizes)] == "large":
            s[4] = ("forward", 1000 + r.random() * 30)
        return s
    rows = odd_inputs.run(n, stages, seed=11)
    if sizes:
        for i, spans in enumerate(rows):
            _sized(spans, cold_size if i == 0 else sizes[i % len(sizes)])
    if failed:
        for span in rows[0]:
            if span["name"] in ("request", "forward"):
                span["status"] = dict(_ERROR)
    return rows


def _file(tmp_path: Path, rows: list[list[dict[str, Any]]]) -> Path:
    return odd_inputs.write(tmp_path / "cold_failed.jsonl", rows)


# --- the rule: which failed cold requests paid the cold start ---------------------------------------


def _requests(tmp_path: Path, rows: list[list[dict[str, Any]]]):
    recording = load_paths([_file(tmp_path, rows)])
    reqs = group_spans(recording.spans).requests
    keys = CohortKeys(reqs)
    warm = [r for r in reqs if not r.cold and not r.error]
    return [r for r in reqs if r.cold], warm, keys


@pytest.mark.parametrize("above", [False, True])
def test_a_failed_cold_request_counts_from_the_bar_on(tmp_path: Path, above: bool) -> None:
    rows = _run(100.0)  # the cold request's total is set below: just under or over the bar
    cold, warm, keys = _requests(tmp_path, rows)
    bar = paid_min_ms([r.total_ms for r in warm])
    # move the cold forward's end so that its request total lands 0.01 ms below / above the bar
    first = rows[0]
    req = next(s for s in first if s["name"] == "request")
    want_ns = int(req["startTimeUnixNano"]) + round((bar + (0.01 if above else -0.01)) * 1e6)
    delta = want_ns - int(req["endTimeUnixNano"])
    for s in first:
        if s["name"] in ("request", "forward"):
            s["endTimeUnixNano"] = str(int(s["endTimeUnixNano"]) + delta)
    cold, warm, keys = _requests(tmp_path, rows)
    assert [r.error for r in cold] == [True]
    assert (failed_cold_paid(cold, warm, keys) == cold) is above


def test_a_successful_cold_request_is_not_one_of_them(tmp_path: Path) -> None:
    cold, warm, keys = _requests(tmp_path, _run(2500.0, failed=False))
    assert cold and failed_cold_paid(cold, warm, keys) == []


def test_the_bar_is_the_inputs_own_when_enough_warm_requests_share_it(tmp_path: Path) -> None:
    # a small input's cold request failed after 400 ms: 3x its own warm median, under the bar of
    # all warm requests (half of them large, at 1 s)
    rows = _run(280.0, sizes=("small", "large"), cold_size="small")
    cold, warm, keys = _requests(tmp_path, rows)
    small = [w for w in warm if w.total_ms < 500]
    assert len(small) >= COMPARABLE_MIN_REQUESTS
    assert paid_min_ms([w.total_ms for w in small]) <= cold[0].total_ms < paid_min_ms(
        [w.total_ms for w in warm])
    assert failed_cold_paid(cold, warm, keys) == cold


def test_without_warm_requests_no_failed_cold_request_counts(tmp_path: Path) -> None:
    cold, _, keys = _requests(tmp_path, _run(2500.0))
    assert failed_cold_paid(cold, [], keys) == []


# --- the verdict's words ----------------------------------------------------------------------------


def _cold(failed: int, count: int = 1) -> ColdFigures:
    return ColdFigures(count=count, total_ms=2522.0, stages_ms={"forward": 2500.0},
                       comparable_median_total_ms=124.0, comparable_stages_ms={"forward": 101.0},
                       compared_with=ALL_WARM, comparable_requests=59, input_known=False,
                       failed=failed)


@pytest.mark.parametrize("failed", [0, 1])
def test_the_cold_start_says_it_failed_and_advises_on_its_error(failed: int) -> None:
    v = decide(figures(stage("forward", 1.0, explains=0.5), total_swing=1.0, cold=_cold(failed)))
    assert v.cause == "cold_start"
    assert v.evidence[0].startswith("first request of the process ended with an error after"
                                    if failed else "first request of the process took")
    assert ("so its cold start took at least this long" in v.evidence[0]) is bool(failed)
    assert (v.advice[0] == advice.COLD_FAILED) is bool(failed)
    assert v.advice.count(advice.COLD_FAILED) == failed


def test_several_cold_requests_say_how_many_failed() -> None:
    v = decide(figures(stage("forward", 1.0, explains=0.5), total_swing=1.0, cold=_cold(1, count=3)))
    assert "1 of them ended with an error after paying the cold start" in v.evidence[0]
    assert v.advice[0] == advice.COLD_FAILED


# --- both reports ------------------------------------------------------------------------------------


def test_the_tester_case_reads_cold_start_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    got, want = reports(engine, _file(tmp_path, _run(2500.0)))
    for out in (got, want):
        assert out["verdict"]["cause"] == "cold_start", out["verdict"]
        assert out["verdict"]["stage"] == "forward"
        assert out["verdict"]["advice"][0] == advice.COLD_FAILED
        assert out["cold_start"]["failed"] == 1 and out["cold_start"]["count"] == 1
        assert out["failures"]["cold"] == 1 and out["counts"]["cold"] == 0
    assert got["verdict"] == want["verdict"]
    assert got["cold_start"]["total_ms"] == pytest.approx(want["cold_start"]["total_ms"], abs=0.01)
    # the failures' line does not say the request in the cold figures was left out of the report
    assert ("1 of 40 requests ended with an error and was left out of the stage statistics (the"
            " cold one above: in the cold figures only)") in got["verdict"]["evidence"]


def test_a_cold_request_that_failed_at_once_stays_out_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    got, want = reports(engine, _file(tmp_path, _run(5.0)))
    for out in (got, want):
        assert out["cold_start"] is None
        assert out["verdict"]["cause"] != "cold_start"
        assert out["failures"]["cold"] == 1
        assert not any("cold one above" in e for e in out["verdict"]["evidence"])
    assert got["verdict"] == want["verdict"]


def test_the_inputs_own_bar_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    got, want = reports(engine, _file(tmp_path, _run(280.0, sizes=("small", "large"))))
    for out in (got, want):
        assert out["cold_start"] is not None and out["cold_start"]["failed"] == 1, out["cold_start"]
    assert got["cold_start"]["count"] == want["cold_start"]["count"] == 1
    assert got["verdict"] == want["verdict"]


# --- two first requests of one trace started in the same nanosecond --------------------------------


def test_one_of_two_requests_tied_at_the_start_is_cold_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    """A tester's: without ``request.seq`` or ``request.cold_start``, two requests of one trace and
    process started in the same nanosecond (a fan-out at start-up) were both the process's first
    in ClickHouse (its tie went by start and trace only): two cold requests there, one in the
    file. The tie now goes by span id in both."""
    def stages(i: int, r: random.Random) -> odd_inputs.Stages:
        s = odd_inputs.normal(i, r)
        if i < 2:  # both pay the model load; the second's forward 100 ms shorter
            s[4] = ("forward", 1500.0 - 100.0 * i)
        return s
    rows = odd_inputs.run(40, stages, seed=11)
    first_req = next(s for s in rows[0] if s["name"] == "request")
    second_req = next(s for s in rows[1] if s["name"] == "request")
    shift = int(first_req["startTimeUnixNano"]) - int(second_req["startTimeUnixNano"])
    for span in rows[1]:  # same trace, same start, a slow forward too (both pay the load)
        span["traceId"] = first_req["traceId"]
        for k in ("startTimeUnixNano", "endTimeUnixNano"):
            span[k] = str(int(span[k]) + shift)
    for spans in rows:
        for span in spans:
            span["attributes"] = [a for a in span["attributes"] if a["key"] != "request.seq"]
    # the request read first has the larger span id (so read order and id order disagree)
    for spans, sid in ((rows[0], "f" * 16), (rows[1], "0" * 15 + "1")):
        old = next(s for s in spans if s["name"] == "request")["spanId"]
        for span in spans:
            span["spanId"] = sid if span["spanId"] == old else span["spanId"]
            span["parentSpanId"] = sid if span.get("parentSpanId") == old else span.get("parentSpanId")
    got, want = reports(engine, _file(tmp_path, rows))
    for out in (got, want):
        assert out["cold_start"] is not None and out["cold_start"]["count"] == 1, out["cold_start"]
        # the cold one is the request of the smaller span id: its forward is 100 ms shorter
        assert out["cold_start"]["stages"]["forward"] == pytest.approx(1400.0, abs=0.01)
    assert got["counts"] == want["counts"]
    assert got["verdict"] == want["verdict"]
    assert [(a["trace_id"], a["reason"]) for a in got["set_apart"]] == [
        (a["trace_id"], a["reason"]) for a in want["set_apart"]]


# --- a failed first request counts where it stopped in the model ---------------------------------


_NORMAL = [("download", 5.0), ("decode", 10.0), ("resize", 4.0), ("queue", 2.0), ("forward", 100.0)]


@pytest.mark.parametrize("first, failing, counted", [
    ([("download", 5000.0)], "download", False),  # a ReadTimeout: the network
    ([*_NORMAL[:1], ("decode", 5000.0)], "decode", False),  # a decompression bomb
    ([*_NORMAL[:2], ("resize", 5000.0)], "resize", False),
    ([*_NORMAL[:3], ("queue", 5000.0)], "queue", True),  # stuck behind the model load
    ([*_NORMAL[:4], ("forward", 5000.0)], "forward", True),
    ([*_NORMAL, ("upload", 5000.0)], "upload", False),  # an upload after a warm forward
    ([("auth", 5000.0)], "auth", False),  # a dependency before any input stage
    ([("download", 600.0), *_NORMAL[1:3], ("queue", 0.5)], "queue", False),  # rejected at once
    ([("download", 600.0), *_NORMAL[1:3], ("queue", 0.5), ("forward", 2000.0)], "forward", True),
], ids=["download", "decode", "resize", "queue", "forward", "upload", "auth", "queue-rejects",
        "forward-after-slow-download"])
def test_a_failed_cold_request_counts_where_it_stopped_in_the_model_in_both_reports(
        engine, tmp_path: Path, first: odd_inputs.Stages, failing: str, counted: bool) -> None:  # noqa: F811
    """Testers': a first request whose download timed out after 5 s, or whose upload after a warm
    forward did, read as a firm cold start with model-load advice. A failed cold request counts
    only where it stopped in ``queue`` or ``forward`` (``cohorts.FAILED_COLD_STAGES``) and that
    stage holds half its total or more (``FAILED_COLD_STOP_MIN_SHARE``)."""
    assert FAILED_COLD_STOP_MIN_SHARE == 0.5
    def stages(i: int, r: random.Random) -> odd_inputs.Stages:
        return list(first) if i == 0 else odd_inputs.normal(i, r)
    rows = odd_inputs.run(40, stages, seed=11)
    for span in rows[0]:
        if span["name"] in ("request", failing):
            span["status"] = dict(_ERROR)
    got, want = reports(engine, _file(tmp_path, rows))
    for out in (got, want):
        assert (out["cold_start"] is not None and out["cold_start"]["failed"] == 1) is counted, out["cold_start"]
        assert (out["verdict"]["cause"] == "cold_start") is counted
        assert out["failures"]["cold"] == 1
    assert got["verdict"] == want["verdict"]


@pytest.mark.parametrize("forward_ms, counted", [(199.0, False), (201.0, True)])
def test_the_stopping_stage_holds_half_the_total(
        engine, tmp_path: Path, forward_ms: float, counted: bool) -> None:  # noqa: F811
    """A 200 ms download, then a forward that failed after 199 / 201 ms: just under / over half."""
    first = [("download", 200.0), ("forward", forward_ms)]
    def stages(i: int, r: random.Random) -> odd_inputs.Stages:
        return list(first) if i == 0 else odd_inputs.normal(i, r)
    rows = odd_inputs.run(40, stages, seed=11)
    for span in rows[0]:
        if span["name"] in ("request", "forward"):
            span["status"] = dict(_ERROR)
    got, want = reports(engine, _file(tmp_path, rows))
    for out in (got, want):
        assert (out["cold_start"] is not None) is counted, out["cold_start"]
    assert got["verdict"] == want["verdict"]


@pytest.mark.parametrize("cold_failed, leads", [(4, False), (0, True)])
def test_failed_cold_requests_are_not_blamed_twice(cold_failed: int, leads: bool) -> None:
    """A tester's: four replicas' first requests each hit a 2.5 s deadline during the model load
    (4 of 60 failed): the slow-failures rule led ("find why the failed requests spend most of
    their time in forward"), then the cold start explained the same four. Those in the cold
    figures are the cold start's: the failures lead only where others failed slowly."""
    from dataclasses import replace
    fig = figures(stage("forward", 1.0, explains=0.5), total_swing=1.0,
                  cold=_cold(cold_failed, count=4))
    fig = replace(fig, failed_requests=4, requests=60, failed_median_total_ms=2522.0,
                  failed_stages_ms={"forward": 2500.0})
    v = decide(fig)
    assert v.cause == "cold_start"
    assert v.evidence[0].startswith("4 cold requests (median)") is not leads


@pytest.mark.parametrize("in_figures, failed, clause", [
    (0, 2, ""),
    (1, 1, " (the cold one above: in the cold figures only)"),
    (2, 2, " (the cold ones above: in the cold figures only)"),
    (1, 3, " (1 of them the cold one above: in the cold figures only)"),
    (2, 3, " (2 of them the cold ones above: in the cold figures only)"),
])
def test_the_failures_line_names_those_in_the_cold_figures(in_figures: int, failed: int,
                                                         clause: str) -> None:
    """A failed request in the cold figures is left out of the warm statistics, not of the
    report: the failures' line says which of them the cold figures hold (a tester read "was left
    out of the stage statistics" beside the cold start built from it)."""
    from dataclasses import replace
    fig = figures(stage("forward", 1.0, explains=0.5), total_swing=1.0,
                  cold=_cold(in_figures, count=max(in_figures, 1)))
    fig = replace(fig, failed_requests=failed, requests=60, failed_cold=in_figures)
    v = decide(fig)
    lines = [e for e in v.evidence if "ended with an error and w" in e]
    assert lines == [f"{failed} of 60 requests ended with an error and"
                     f" {'was' if failed == 1 else 'were'} left out of the stage statistics{clause}"]


@pytest.mark.parametrize("warm_failed, cold_failed, leads", [
    (9, 1, False), (10, 0, True), (10, 1, True), (9, 0, False)])
def test_failed_cold_requests_do_not_tip_the_failures_first(warm_failed: int, cold_failed: int,
                                                            leads: bool) -> None:
    """A tester's: 9 of 40 requests failed (22.5 %, under FAILED_MIN_FRACTION) and the cold one,
    which failed after its model load: the tenth tipped "25 % of requests failed ... the timings
    below describe only the 30 that succeeded" beside the cold figures built from it. Those in the
    cold figures are the cold start's, as for the slow failures."""
    from dataclasses import replace

    from otel_stages.analysis.failures import FAILED_MIN_FRACTION, failures_dominate
    assert (warm_failed >= FAILED_MIN_FRACTION * 40) is leads
    fig = figures(stage("forward", 1.0, explains=0.5), total_swing=1.0, cold=_cold(cold_failed))
    fig = replace(fig, failed_requests=warm_failed + cold_failed, requests=40,
                  failed_cold=cold_failed)
    assert failures_dominate(fig) is leads
    v = decide(fig)
    assert any("is the problem to fix first" in e for e in v.evidence) is leads
