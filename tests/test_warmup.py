"""The warm-up after a cold request (a tester's input: four replicas whose requests 2-5 still pay
lazy compilation and autotuning, 1.2 s down to 350 ms extra, then a steady 120 ms forward; both
reports said a confident ``gpu_starved`` with pinned-memory advice, plus "run one dummy request").
In a process whose start is in the recording, the requests right after its cold one that each
stand out (the cold request's bar: their input's p95 plus median of the warm requests after the
warm-up), consecutively from it and at most ``WARMUP_MAX_REQUESTS``, are set apart as warm-up;
the verdict reads the steady state and the advice warms up with as many requests as it lasted.
Each threshold pinned on both sides; the file report and the ClickHouse report (real chDB) agree."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import advice, load_paths
from otel_stages.analysis.caveats import WARMUP_MAX_REQUESTS
from otel_stages.analysis.cohorts import CohortKeys, find_set_apart, paid_min_ms, warm_up_min_ms
from otel_stages.analysis.decision import decide
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.figures import REASON_WARM_UP, ApartFigures, WarmupFigures
from otel_stages.analysis.model import Call
from otel_stages.analysis.requests import find_requests
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports
from tests.test_cohorts import SMALL, recording
from tests.test_decision import figures, stage

__all__ = ["engine"]  # the module's chDB fixture

WARM_UP_5 = [3000.0, 1200.0, 800.0, 500.0, 350.0]  # extra forward ms of seq 1..5 (the tester's)


def _fleet(path: Path, extra_ms: Sequence[float] | dict[int, float], *, processes: int = 4,
           n: int = 40, first_seq: int = 1, seed: int = 10,
           forward_ms: Any = None) -> Path:
    """``processes`` replicas (instances ``pod-0``..), each ``n`` requests of a 1024x768 image
    back to back, seq ``first_seq``.., ``request.cold_start`` on seq 1; forward a steady 120 ms
    (``forward_ms(seq, rng)`` when given) plus ``extra_ms`` for seq 1.. (a list) or by seq (a
    dict)."""
    extra = dict(enumerate(extra_ms, 1)) if not isinstance(extra_ms, dict) else extra_ms
    r = random.Random(seed)
    with path.open("w") as f:
        for p in range(processes):
            resource = {"attributes": [odd_inputs._attr("service.name", "vlm"),
                                       odd_inputs._attr("service.instance.id", f"pod-{p}")]}
            t = odd_inputs.BASE_NS + p * 1_000_000
            for seq in range(first_seq, first_seq + n):
                base = forward_ms(seq, r) if forward_ms else 120 + r.gauss(0, 2)
                stages = [("download", 6 + r.random() * 0.5), ("decode", 9 + r.random() * 0.5),
                          ("resize", 3 + r.random() * 0.3), ("queue", 1 + r.random() * 0.3),
                          ("forward", base + extra.get(seq, 0.0))]
                spans, end = odd_inputs.request(r, t, stages, seq, {"request.cold_start": seq == 1})
                spans[2]["attributes"] = [odd_inputs._attr("image.width", 1024),
                                          odd_inputs._attr("image.height", 768)]
                f.write(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
                    {"scope": {"name": "otel_stages"}, "spans": spans}]}]}) + "\n")
                t = end + 50_000_000
    return path


def _warm_up(out: dict[str, Any]) -> list[int]:
    return sorted(a["seq"] for a in out["set_apart"] if a["reason"] == REASON_WARM_UP)


def test_a_warm_up_of_four_requests_is_set_apart_in_both_reports(engine, tmp_path: Path) -> None:
    got, want = reports(engine, _fleet(tmp_path / "warmup.jsonl", WARM_UP_5))
    assert got["verdict"] == want["verdict"]
    assert got["set_apart"] == want["set_apart"] and got["counts"] == want["counts"]
    assert _warm_up(want) == [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4
    assert want["counts"] == {"warm": 140, "cold": 20, "failed": 0, "incomplete": 0}
    v = want["verdict"]
    assert (v["cause"], v["stage"], v["tentative"]) == ("cold_start", "forward", False)
    (line,) = [e for e in v["evidence"] if e.startswith("the warm-up")]
    assert line.startswith("the warm-up lasted 5 requests in the longest of 4 processes: 16 requests")
    assert "not ended" not in line
    # as many requests as it lasted, in place of the cold start's one dummy request
    assert v["advice"][0] == advice.warm_up_with(5, True)
    assert "warm up at startup with 5 dummy requests" in v["advice"][0].replace("the model ", "")
    assert advice.WARM_UP not in v["advice"] and "also: " + advice.WARM_UP not in v["advice"]
    assert want["stages"]["forward"]["max_ms"] < 140  # the steady state


def test_the_warm_up_ends_at_the_first_request_that_does_not_stand_out(engine, tmp_path: Path) -> None:
    # seq 4 is steady: seq 5, slow again, is not part of the warm-up (a warm request of the run)
    path = _fleet(tmp_path / "gap.jsonl", {1: 3000.0, 2: 1200.0, 3: 800.0, 5: 500.0})
    got, want = reports(engine, path)
    assert got["verdict"] == want["verdict"] and got["set_apart"] == want["set_apart"]
    assert _warm_up(want) == [2] * 4 + [3] * 4
    assert any(e.startswith("the warm-up lasted 3 requests in the longest of 4 processes")
               for e in want["verdict"]["evidence"])
    # the slow seq 5 stays in the warm runs, where the verdict reads it
    assert "also: " + advice.warm_up_with(3, True) in want["verdict"]["advice"]
    assert want["stages"]["forward"]["max_ms"] > 600


@pytest.mark.parametrize("slow, apart, said", [
    # WARMUP_MAX_REQUESTS 10: the cap's request steady, ended (lasted 10 requests)
    (9, 9, "the warm-up lasted 10 requests: 9 requests"),
    # every request looked at stood out: the warm-up may not have ended
    (10, 10, "the warm-up lasted at least 11 requests: 10 requests"),
    (11, 10, "the warm-up lasted at least 11 requests: 10 requests"),  # the 11th stays warm
])
def test_the_warm_up_is_looked_for_in_at_most_ten_requests(engine, tmp_path: Path, slow: int,
                                                          apart: int, said: str) -> None:
    assert WARMUP_MAX_REQUESTS == 10
    extra = {1: 3000.0, **{seq: 400.0 for seq in range(2, 2 + slow)}}
    got, want = reports(engine, _fleet(tmp_path / f"cap{slow}.jsonl", extra, processes=1))
    assert got["verdict"] == want["verdict"] and got["set_apart"] == want["set_apart"]
    assert _warm_up(want) == list(range(2, 2 + apart))
    (line,) = [e for e in want["verdict"]["evidence"] if e.startswith("the warm-up")]
    assert line.startswith(said)
    capped = slow >= WARMUP_MAX_REQUESTS
    assert ("it had not ended after the 10 warm requests after the cold one that are looked at: it"
            " may last longer" in line) is capped
    assert (advice.warm_up_with(11, False) if capped else advice.warm_up_with(10, True)) in \
        want["verdict"]["advice"]


def test_a_process_whose_start_is_not_recorded_has_no_warm_up(engine, tmp_path: Path) -> None:
    # the recording starts at seq 2: the slow seq 2-5 may be anything, not a warm-up seen to start
    path = _fleet(tmp_path / "late.jsonl", WARM_UP_5[1:], first_seq=2, n=39)
    got, want = reports(engine, path)
    assert want["counts"]["cold"] == 0 and want["set_apart"] == [] == got["set_apart"]
    assert got["verdict"] == want["verdict"]
    assert not any("warm-up" in e for e in want["verdict"]["evidence"])


def _bimodal(seq: int, r: random.Random) -> float:
    """A steady forward with a slow mode: every fourth request 280 ms, the others 120 ms."""
    return (280.0 if seq % 4 == 2 else 120.0) + r.gauss(0, 2)


def test_a_second_request_in_the_slow_mode_of_a_steady_forward_is_no_warm_up(engine, tmp_path: Path) -> None:
    path = _fleet(tmp_path / "bimodal.jsonl", {1: 3000.0}, processes=2, forward_ms=_bimodal)
    got, want = reports(engine, path)
    assert got["verdict"] == want["verdict"] and want["set_apart"] == [] == got["set_apart"]
    # it stands out by the other reasons' test (twice the median), not above the slow mode
    seq2 = [r for r in find_requests(load_paths([path]).spans) if r.seq == 2]
    assert all(r.total_ms >= 2 * want["total"]["median_ms"] for r in seq2)


@pytest.mark.parametrize("factor, apart", [(0.99, False), (1.01, True)])
def test_a_warm_up_request_stands_out_at_the_p95_plus_the_median(factor: float, apart: bool) -> None:
    """Seq 2 at 0.99 / 1.01 of the bar of the warm requests after the warm-up (seq 12..), whose
    p95 and median :func:`warm_up_min_ms` adds up (not twice the median: 20 ms apart here)."""
    steady = [50.0 + (i % 5) * 5 for i in range(30)]  # 50..70 ms: median 60, p95 70
    bar = warm_up_min_ms(steady)
    assert bar == paid_min_ms(steady)  # (the p95 an element here: both read it)
    assert bar == pytest.approx(130.0)
    rows = [(SMALL, 500.0, 0.0), (SMALL, bar * factor, 0.0)] + [(SMALL, 60.0, 0.0)] * 9
    rows += [(SMALL, ms, 0.0) for ms in steady]
    rec = recording(rows)
    requests = find_requests(rec.spans)
    got = [(a.request.seq, a.reason) for a in find_set_apart(requests, CohortKeys(requests))]
    assert got == ([(2, REASON_WARM_UP)] if apart else [])
    report = diagnose(rec)
    assert (report.counts.warm, report.counts.cold) == ((39, 2) if apart else (40, 1))


def test_the_cold_request_must_come_before_it_in_its_process() -> None:
    """A request marked cold later in its process (a model reload): the requests before it are not
    its warm-up."""
    rows = [(SMALL, 300.0, 0.0)] + [(SMALL, 60.0, 0.0)] * 30
    rec = recording(rows, cold_first=False)
    requests = find_requests(rec.spans)
    assert find_set_apart(requests, CohortKeys(requests)) == []


def _warmup(capped: int) -> WarmupFigures:
    return WarmupFigures(processes=2, requests=20, longest_requests=11, longest_ended=not capped,
                         unended=capped, capped=capped, max_ratio=4.0)


@pytest.mark.parametrize("capped, tentative", [(0, False), (1, True)])
def test_a_warm_up_cut_at_the_cap_makes_a_swing_tentative(capped: int, tentative: bool) -> None:
    """Its tail may be in the warm runs: the verdict on their swing is tentative, the warm-up's
    sentence and advice first."""
    fig = replace(figures(stage("forward", 40.0, explains=0.9), total_swing=40.0),
                  warmup=_warmup(capped))
    v = decide(fig)
    assert v.cause == "forward" and v.tentative is tentative
    assert v.evidence[0].startswith("the warm-up lasted at least 11 requests") is tentative
    assert v.evidence[0].endswith("so this is tentative") is tentative
    assert (v.advice[0] == advice.warm_up_with(11, False)) is tentative
    assert sum(1 for a in v.advice if "dummy requests" in a) <= 1  # said once


@pytest.mark.parametrize("held, callee", [(15, True), (14, False)])
def test_a_warm_up_is_the_callees_where_most_of_its_requests_waited_for_one(held: int, callee: bool) -> None:
    """``--service``: of 20 requests set apart as warm-up, 15 (WARM_UP_CALL_MIN_SHARE 0.75, literal:
    a changed threshold must fail) waited in POST for a called request that was cold or set apart
    in the service left out: its warm-up, with its advice, in the line and in the capped
    warm-up's caveat; 14 of them: the picked service's own."""
    traces = [f"{i:032x}" for i in range(20)]
    apart = [ApartFigures(reason=REASON_WARM_UP, seq=i + 2, trace_id=t, total_ms=400.0,
                          comparable_median_total_ms=100.0, ratio=4.0) for i, t in enumerate(traces)]
    call = Call(stage="POST", service="vlm-worker", calls=30, spans=30, caller="gateway",
                unsteady_traces=tuple(traces[:held]))
    fig = replace(figures(stage("forward", 40.0, explains=0.9), total_swing=40.0),
                  warmup=replace(_warmup(1), processes=1, requests=20), set_apart=apart,
                  calls_left_out=[call])
    v = decide(fig)
    assert v.tentative and v.evidence[0].endswith("so this is tentative")
    theirs = advice.warm_up_in_call("POST", "vlm-worker", 11, False)
    assert (v.advice[0] == theirs) is callee
    assert (v.advice[0] == advice.warm_up_with(11, False)) is not callee
    assert ("so the warm-up is vlm-worker's" in v.evidence[0]) is callee
    assert not [a for a in v.advice if "warm the model up" in a and callee]


def test_a_steady_run_after_a_capped_warm_up_stays_firm() -> None:
    fig = replace(figures(stage("forward", 1.0, explains=0.9), total_swing=1.0), warmup=_warmup(1))
    v = decide(fig)
    assert v.cause == "stable" and not v.tentative


def test_the_text_report_lists_the_warm_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_odd_inputs import text_of

    text = " ".join(text_of(_fleet(tmp_path / "text.jsonl", WARM_UP_5, processes=1), capsys).split())
    assert "Also reported apart as cold (4):" in text
    assert text.count("(warm-up after the process's cold request)") == 4
    assert "the warm-up lasted 5 requests: 4 requests right after the cold request" in text


def _burst(path: Path, during: int, *, after_ns: int = 0) -> Path:
    """One process: the cold request (forward 2 s), ``during`` requests that arrive while it runs
    (10 ms apart) and wait in ``queue`` for it, then 30 sequential steady ones; the first of those
    starts ``after_ns`` after the cold request ended (0: the instant it ended)."""
    r = random.Random(5)
    rows = []
    resource = {"attributes": [odd_inputs._attr("service.name", "vlm"),
                               odd_inputs._attr("service.instance.id", "pod-0")]}

    def one(t: int, seq: int, queue_ms: float, forward_ms: float) -> int:
        stages = [("download", 6 + r.random() * 0.5), ("decode", 9 + r.random() * 0.5),
                  ("resize", 3 + r.random() * 0.3), ("queue", queue_ms), ("forward", forward_ms)]
        spans, end = odd_inputs.request(r, t, stages, seq, {"request.cold_start": seq == 1})
        spans[2]["attributes"] = [odd_inputs._attr("image.width", 1024),
                                  odd_inputs._attr("image.height", 768)]
        rows.append(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
            {"scope": {"name": "otel_stages"}, "spans": spans}]}]}))
        return end

    t0 = odd_inputs.BASE_NS
    cold_end = one(t0, 1, 1.0, 2000.0)
    for i in range(during):  # waited for the cold request, then ran a normal forward
        start = t0 + (i + 1) * 10_000_000
        one(start, i + 2, (cold_end - start) / 1e6 - 19 + 120 * i, 120 + r.gauss(0, 2))
    t = cold_end + after_ns
    for seq in range(during + 2, during + 32):
        t = one(t, seq, 1 + r.random() * 0.3, 120 + r.gauss(0, 2)) + 50_000_000
    path.write_text("\n".join(rows) + "\n")
    return path


def test_requests_that_waited_for_the_cold_start_are_no_warm_up(engine, tmp_path: Path) -> None:
    # a third tester's: 8 clients at once, the first loading the model for 2 s, the other 7
    # waiting for it in queue: "the warm-up lasted 8 requests: warm up with 8 dummy requests"
    from otel_stages.analysis.figures import REASON_BEHIND_COLD

    got, want = reports(engine, _burst(tmp_path / "burst.jsonl", 7))
    assert got["verdict"] == want["verdict"] and got["set_apart"] == want["set_apart"]
    assert [a["reason"] for a in want["set_apart"]] == [REASON_BEHIND_COLD] * 7
    v = want["verdict"]
    assert (v["cause"], v["tentative"]) == ("cold_start", False), v
    assert not any(e.startswith("the warm-up") for e in v["evidence"])
    assert "also: " + advice.WARM_UP_AGAIN[REASON_BEHIND_COLD] in v["advice"]


@pytest.mark.parametrize(("after_ns", "behind"), [(0, False), (-1, True)])
def test_a_request_is_behind_the_cold_start_while_it_runs(tmp_path: Path, after_ns: int,
                                                         behind: bool) -> None:
    # the first sequential request, slow (2 s more), starts the instant the cold one ended (a
    # warm-up request) or 1 ns before (it waited for it)
    path = _burst(tmp_path / "edge.jsonl", 0, after_ns=after_ns)
    lines = path.read_text().splitlines()
    doc = json.loads(lines[1])
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        if span["name"] in ("forward", "request"):
            span["endTimeUnixNano"] = str(int(span["endTimeUnixNano"]) + 2_000_000_000)
    lines[1] = json.dumps(doc)
    path.write_text("\n".join(lines) + "\n")
    out = diagnose(load_paths([path])).to_dict()
    assert [a["reason"] for a in out["set_apart"]] == ["behind_cold_start" if behind else "warm_up"]


@pytest.mark.parametrize("slow_after", [2, 1])  # of the 28 warm requests after the warm-up
def test_the_first_of_a_slow_mode_after_the_cold_request_is_no_warm_up(slow_after: int) -> None:
    """A tester's: every so often a request is slow (317 ms, the rest 78 ms), the first of them
    right after the cold one. With 2 of the 28 requests after the warm-up as slow (7 %), the
    warm runs' own p95 is that slow mode: seq 2 is one of them, no warm-up (an interpolated p95
    fell between the modes, 311 ms, and set it apart); with 1 (4 %), the p95 is the fast mode's
    and seq 2 stands out."""
    after = [78.0] * (28 - slow_after) + [317.0] * slow_after
    assert warm_up_min_ms(after) == (317.0 if slow_after == 2 else 78.0) + 78.0
    rows = [(SMALL, 1500.0, 0.0), (SMALL, 317.5, 0.0)] + [(SMALL, 78.0, 0.0)] * 9
    rows += [(SMALL, ms, 0.0) for ms in after[::-1]]
    requests = find_requests(recording(rows).spans)
    got = [(a.request.seq, a.reason) for a in find_set_apart(requests, CohortKeys(requests))]
    assert got == ([] if slow_after == 2 else [(2, REASON_WARM_UP)])


def test_a_slow_mode_after_the_cold_request_reads_the_same_in_both_reports(engine, tmp_path: Path) -> None:
    """The tester's shape in both reports: seq 2, 20 and 33 slow (the first right after the cold
    one; 2 of the 28 after the warm-up), none set apart."""
    path = _fleet(tmp_path / "mode.jsonl", {1: 3000.0}, processes=1, n=39,
                  forward_ms=lambda seq, r: (280.0 if seq in (2, 20, 33) else 50.0) + r.gauss(0, 1))
    got, want = reports(engine, path)
    assert want["set_apart"] == [] == got["set_apart"]
    assert got["verdict"] == want["verdict"]
