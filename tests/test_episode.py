"""Episodes (:mod:`otel_stages.analysis.episode`): a tester's worker ran its forwards slow for the
first minute of five and was steady after; the report called "forward" firmly and advised on what
varies between calls. Now the slow warm requests' stretch is said, the verdict is tentative and
the advice is to look at what ran then. Thresholds just below and above each; both reports alike."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis.decision import decide
from otel_stages.analysis.episode import (
    EPISODE_BUCKETS,
    EPISODE_MAX_RATE_RATIO,
    EPISODE_MAX_REQUEST_SHARE,
    EPISODE_MAX_SPAN_SHARE,
    EPISODE_MIN_SLOW,
    EPISODE_MIN_SLOW_SHARE,
    Episode,
    bucket_counts,
    bucket_of,
    buckets,
    confirm,
    episode_advice,
    find_episode,
)
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports  # noqa: F401 - the chDB fixture
from tests.test_decision import figures, stage

WINDOW = round(EPISODE_BUCKETS * EPISODE_MAX_SPAN_SHARE)
T0 = 1_790_000_000 * 10**9
LAST = T0 + EPISODE_BUCKETS * 10**9 - 1  # one bucket per second, of one process


def _find(slow: dict[int, int], n: dict[int, int] | None = None, *, each: int = 40) -> Episode | None:
    """``slow``: slow requests per bucket; ``n``: requests per bucket (default ``each``, at least
    the slow ones)."""
    counts = [max(each, slow.get(b, 0)) if n is None else n.get(b, each) for b in range(EPISODE_BUCKETS)]
    return find_episode(counts, [slow.get(b, 0) for b in range(EPISODE_BUCKETS)], 150.0)


def test_the_buckets_run_from_each_processs_first_start_to_its_last() -> None:
    assert bucket_of(T0, T0, LAST) == 0
    assert bucket_of(LAST, T0, LAST) == EPISODE_BUCKETS - 1
    assert bucket_of(T0 + 10**9, T0, LAST) == 1
    # b's run starts a day later: its own first request is its bucket 0
    day = 86_400 * 10**9
    at = buckets([T0, LAST, T0 + 5 * 10**9, T0 + day, LAST + day], ["a", "a", "a", "b", "b"])
    assert at == [0, EPISODE_BUCKETS - 1, 5, 0, EPISODE_BUCKETS - 1]
    n, slow = bucket_counts(at, [100.0, 200.0, 150.0, 151.0, 100.0], 150.0)
    assert (sum(n), sum(slow)) == (5, 2)  # above, not at, the bar
    assert slow[EPISODE_BUCKETS - 1] == 1 and slow[0] == 1 and n[5] == 1


@pytest.mark.parametrize("slow_requests, found", [(9, False), (10, True)])
def test_too_few_slow_requests_are_no_episode(slow_requests: int, found: bool) -> None:
    assert EPISODE_MIN_SLOW == 10
    e = _find({3: slow_requests})
    assert (e is not None) is found
    if e is not None:
        assert not e.at_start and e.slow_in == e.slow == 10  # (slow from bucket 3 on)
        assert (e.bucket_lo, e.bucket_hi, e.held_lo, e.held_hi) == (0, WINDOW, 3, 4)


@pytest.mark.parametrize("inside, found", [(31, False), (32, True)])  # of 40: 0.775 / 0.8
def test_most_slow_requests_fall_in_the_window(inside: int, found: bool) -> None:
    assert EPISODE_MIN_SLOW_SHARE == 0.8
    slow = {40: inside}
    for b in range(40 - inside):  # the rest spread one per bucket after the window
        slow[70 + b] = 1
    e = _find(slow)
    assert (e is not None) is found
    if e is not None:
        assert (e.slow_in, e.slow, e.at_start) == (32, 40, False)
        start = 40 - WINDOW + 1  # the earliest window holding bucket 40
        assert (e.bucket_lo, e.bucket_hi) == (start, start + WINDOW)


@pytest.mark.parametrize("span, found", [(25, True), (26, False)])
def test_the_window_is_a_quarter_of_the_run(span: int, found: bool) -> None:
    assert EPISODE_MAX_SPAN_SHARE == 0.25 and EPISODE_BUCKETS == 100
    # 10 slow requests at each end of `span` buckets, one in each between: a stretch one bucket
    # wider than the window leaves 10 of 44 out (0.77)
    slow = {10 + b: 1 for b in range(span)} | {10: 10, 10 + span - 1: 10}
    assert (_find(slow) is not None) is found


def test_requests_crowding_in_the_window_are_no_episode() -> None:
    # 400 requests in all; the window (buckets 25..49) holds the slow ones (one in each of 30..49,
    # 3 requests there: no faster than outside) and 160 (0.4) or 161 requests
    assert EPISODE_MAX_REQUEST_SHARE == 0.4
    slow = {30 + i: 1 for i in range(20)}
    for inside, found in ((160, True), (161, False)):
        n = {b: 0 for b in range(EPISODE_BUCKETS)} | {b: 3 for b in slow}
        for k in range(inside - 60):  # the rest of the window's in its first 5 buckets
            n[25 + k % 5] += 1
        for k in range(400 - inside):  # outside
            n[[*range(25), *range(50, EPISODE_BUCKETS)][k % 75]] += 1
        assert sum(n.values()) == 400
        e = _find(slow, n)
        assert (e is not None) is found, inside
        assert e is None or (e.bucket_lo, e.requests_in) == (25, 160)


def test_the_earliest_window_wins_a_tie() -> None:
    e = _find({30: 20})  # every window holding bucket 30 holds them all: the earliest is taken
    assert e is not None and e.bucket_lo == 30 - WINDOW + 1


# --- the verdict ---------------------------------------------------------------------------------


def _episode(at_start: bool) -> Episode:
    start = T0 if at_start else T0 + 40 * 10**9
    lo = 0 if at_start else 40
    return Episode(start_ns=start, end_ns=start + WINDOW * 10**9, slow_in=60, slow=60,
                   requests_in=70, requests=299, slow_min_ms=142.9, bucket_lo=lo, bucket_hi=lo + WINDOW,
                   held_lo=lo, held_hi=lo + 20)


@pytest.mark.parametrize("at_start", [True, False])
def test_a_swing_in_an_episode_is_tentative_with_the_stretch_first(at_start: bool) -> None:
    fig = figures(stage("forward", 100.0, explains=0.9), total_swing=100.0)
    firm = decide(fig)
    assert firm.cause == "forward" and not firm.tentative
    v = decide(replace(fig, episode=_episode(at_start)))
    assert (v.cause, v.stage, v.tentative) == ("forward", "forward", True)
    assert v.evidence[0].startswith("the swing is an episode: 60 of the 60 slow warm requests")
    assert v.advice[0] == episode_advice(_episode(at_start))
    assert v.advice[0].startswith("it starts with the run: a warm-up") is at_start
    assert v.evidence[1:] == firm.evidence and v.advice[1:] == firm.advice


def test_a_stable_verdict_takes_no_episode() -> None:
    fig = replace(figures(stage("forward", 1.0, explains=0.9), total_swing=1.0), episode=_episode(True))
    v = decide(fig)
    assert v.cause == "stable" and not any("episode" in e for e in v.evidence)


# --- both reports ----------------------------------------------------------------------------------


def _run(slow: set[int], n: int = 300) -> list[list[dict[str, Any]]]:
    def stages(i: int, r: random.Random) -> odd_inputs.Stages:
        s = odd_inputs.normal(i, r)
        if i in slow:
            s[4] = ("forward", 180 + r.random() * 60)
        return s
    return odd_inputs.run(n, stages, seed=4, gap_ms=800)


def test_the_tester_case_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    got, want = reports(engine, odd_inputs.write(tmp_path / "ep.jsonl", _run(set(range(1, 61)))))
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    assert (v["cause"], v["tentative"]) == ("forward", True)
    assert v["evidence"][0].startswith("the swing is an episode: 60 of the 60 slow warm requests")
    assert v["advice"][0].startswith("it starts with the run")


def test_slow_requests_spread_over_the_run_are_no_episode_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    got, want = reports(engine, odd_inputs.write(tmp_path / "spread.jsonl", _run(set(range(1, 300, 5)))))
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    assert (v["cause"], v["tentative"]) == ("forward", False)
    assert not any("episode" in e for e in v["evidence"])


def test_an_episode_in_the_middle_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    got, want = reports(engine, odd_inputs.write(tmp_path / "mid.jsonl", _run(set(range(150, 200)))))
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    assert v["tentative"] and v["evidence"][0].startswith("the swing is an episode: 50 of the 50")
    assert v["advice"][0].startswith("look at what ran on these hosts then")


# --- what is no episode ------------------------------------------------------------------------------


def test_confirm_judges_the_requests_outside_against_the_band() -> None:
    e = _episode(True)
    assert confirm(e, 10.0, 10.0, start_ns=T0 + 5, end_ns=T0 + 9, process="p2") == replace(
        e, start_ns=T0 + 5, end_ns=T0 + 9, process="p2")
    assert confirm(e, 10.01, 10.0, start_ns=0, end_ns=0) is None
    assert confirm(e, None, 10.0, start_ns=0, end_ns=0) is None
    assert confirm(None, 1.0, 10.0, start_ns=0, end_ns=0) is None


def test_a_load_rising_over_the_run_is_no_episode_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    """The queue wait rises from 2 to 120 ms over the run: the slow requests are its last quarter,
    but the requests before them are no steady run (they swing beyond the band): no episode."""
    def stages(i: int, r: random.Random) -> odd_inputs.Stages:
        s = odd_inputs.normal(i, r)
        s[3] = ("queue", 2.0 + 118.0 * i / 240)
        return s
    got, want = reports(engine, odd_inputs.write(tmp_path / "ramp.jsonl", odd_inputs.run(240, stages)))
    assert got["verdict"] == want["verdict"]
    assert (want["verdict"]["cause"], want["verdict"]["tentative"]) == ("queue", False)
    assert not any("episode" in e for e in want["verdict"]["evidence"])


def test_inputs_sent_only_for_a_while_lead_over_the_episode(engine, tmp_path: Path) -> None:  # noqa: F811
    """A tester's: large images sent only during one stretch; the input mix explains the swing,
    so its line leads and the episode is not said (was: "look at what ran on these hosts")."""
    rows = _run(set(range(150, 200)))
    for i, spans in enumerate(rows):
        size = (1920, 1080) if 150 <= i < 200 else (640, 480)
        decode = next(s for s in spans if s["name"] == "decode")
        decode["attributes"] += [odd_inputs._attr("image.width", size[0]),
                                 odd_inputs._attr("image.height", size[1])]
    got, want = reports(engine, odd_inputs.write(tmp_path / "inputs.jsonl", rows))
    assert got["verdict"] == want["verdict"]
    assert want["input_mix_explains"] > 0.5
    assert not any("episode" in e for e in want["verdict"]["evidence"])


@pytest.mark.parametrize("explains, said", [(0.499, True), (0.5, False)])
def test_a_process_that_explains_the_swing_leads_over_the_episode(explains: float, said: bool) -> None:
    """A tester's: a slower replica alive only for a while; where the processes explain the swing
    (``PROCESS_MIX_DOMINATES``), their line leads and the episode is not said."""
    from tests.test_process_mix import _mix
    fig = replace(figures(stage("forward", 100.0, explains=0.9), total_swing=100.0),
                  episode=_episode(False), process_mix=_mix(explains))
    v = decide(fig)
    assert any(e.startswith("the swing is an episode") for e in v.evidence) is said


def _replicas(starts_s: list[int], slow_s: float = 60.0, seed: int = 20) -> list[list[dict[str, Any]]]:
    """One replica per start (s after the first), 300 requests 0.8 s apart each, slow (forward
    180-240 ms) for its first ``slow_s`` seconds."""
    rows: list[list[dict[str, Any]]] = []
    for k, at in enumerate(starts_s):
        def stages(i: int, r: random.Random) -> odd_inputs.Stages:
            s = odd_inputs.normal(i, r)
            if 1 <= i <= slow_s / 0.925:
                s[4] = ("forward", 180 + r.random() * 60)
            return s
        mine = odd_inputs.run(300, stages, seed=seed + k, gap_ms=800)
        for spans in mine:
            for span in spans:
                for key in ("startTimeUnixNano", "endTimeUnixNano"):
                    span[key] = str(int(span[key]) + at * 10**9)
                span.setdefault("_proc", f"p{k}")
        rows += mine
    return rows


def _write_replicas(path: Path, rows: list[list[dict[str, Any]]]) -> Path:
    import json
    with path.open("w") as f:
        for spans in rows:
            proc = spans[0].pop("_proc")
            for span in spans:
                span.pop("_proc", None)
            resource = {"attributes": [odd_inputs._attr("service.name", "svc"),
                                       odd_inputs._attr("service.instance.id", proc)]}
            f.write(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
                {"scope": {"name": "otel_stages"}, "spans": spans}]}]}) + "\n")
    return path


def test_replicas_each_slow_for_their_first_minute_are_one_episode_in_both_reports(
        engine, tmp_path: Path) -> None:  # noqa: F811
    """A tester's: four replicas started 150 s apart, each slow for its first 60 s: over the
    whole recording's time no quarter held them (a firm "forward"); in each replica's own run they
    meet in its first buckets."""
    path = _write_replicas(tmp_path / "replicas.jsonl", _replicas([0, 150, 300, 450]))
    got, want = reports(engine, path)
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    assert v["tentative"] and v["evidence"][0].startswith("the swing is an episode:")
    assert "within 0% .. 24% of their process's run" in v["evidence"][0]  # (each process's buckets)
    assert v["advice"][0].startswith("it starts with the run")


def test_a_replica_recorded_a_day_earlier_stretches_no_ones_run(engine, tmp_path: Path) -> None:  # noqa: F811
    """A tester's: the worker of the tester case, plus a few requests another instance recorded a
    day earlier: the episode stays (each process's run is its own), said as the worker's alone."""
    rows = _replicas([86_400], slow_s=60.0) + _replicas([0], slow_s=0.0)[:5]
    for spans in rows[-5:]:
        spans[0]["_proc"] = "smoke"
    path = _write_replicas(tmp_path / "day.jsonl", rows)
    got, want = reports(engine, path)
    assert got["verdict"] == want["verdict"]
    line = want["verdict"]["evidence"][0]
    assert line.startswith("the swing is an episode:") and "all in service.name=svc,service.instance.id=p0" in line


@pytest.mark.parametrize("rate, found", [(3, True), (4, False)])  # requests per bucket; 2 outside
def test_a_load_burst_is_no_episode(rate: int, found: bool) -> None:
    """A tester's: 10 s of 12 requests/s on top of 2/s, queue waits to 6 s, read as an episode
    ("another job on the GPU ...") with the burst diluted in the quarter-long window. Requests
    arriving twice as fast or more where the slow ones are (``EPISODE_MAX_RATE_RATIO``): none."""
    assert EPISODE_MAX_RATE_RATIO == 2.0
    slow = {40 + i: 1 for i in range(10)}
    e = _find(slow, {b: 2 for b in range(EPISODE_BUCKETS)} | {b: rate for b in slow})
    assert (e is not None) is found


def test_the_episode_is_in_the_json_of_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    got, want = reports(engine, odd_inputs.write(tmp_path / "ep.jsonl", _run(set(range(1, 61)))))
    assert got["episode"] == want["episode"]
    e = want["episode"]
    assert (e["slow_in"], e["slow"], e["at_start"], e["process"]) == (60, 60, True, None)
    assert e["run_share"] == [0.0, 0.22] and not e["per_process"]  # its slow requests' own buckets
    assert e["start_unix_ns"] < e["end_unix_ns"]
    steady, _ = reports(engine, odd_inputs.write(tmp_path / "spread.jsonl", _run(set(range(1, 300, 5)))))
    assert steady["episode"] is None



def test_an_episode_early_in_the_run_is_no_warm_up(engine, tmp_path: Path) -> None:  # noqa: F811
    """A tester's: slow from minute 8 to 13 of 60, after 480 steady requests, read "it starts with
    the run: a warm-up" (the window's earliest start on a tie was taken for the slow requests')."""
    got, want = reports(engine, odd_inputs.write(tmp_path / "early.jsonl", _run(set(range(40, 70)))))
    assert got["verdict"] == want["verdict"] and got["episode"] == want["episode"]
    assert want["episode"]["run_share"][0] > 0.1 and not want["episode"]["at_start"]
    assert want["verdict"]["advice"][0].startswith("look at what ran on these hosts then")


def test_an_incident_on_every_replica_with_a_short_lived_one_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    """A tester's: a 4-minute incident hits every replica, one of them up only for the 6 minutes
    around it: each process's own run spreads its slow requests over most of it (a firm
    "forward"); over the recording's time they meet."""
    rows = _replicas([0, 0], slow_s=0.0)
    for spans in rows:  # the incident: 100 .. 160 s into the recording, on both
        start = int(spans[0]["startTimeUnixNano"]) - odd_inputs.BASE_NS
        if 100e9 <= start < 160e9:
            fwd = next(s for s in spans if s["name"] == "forward")
            shift = 120_000_000
            fwd["endTimeUnixNano"] = str(int(fwd["endTimeUnixNano"]) + shift)
            spans[0]["endTimeUnixNano"] = str(int(spans[0]["endTimeUnixNano"]) + shift)
    short = _replicas([90], slow_s=0.0, seed=90)[:90]  # 90 .. 170 s
    for spans in short:
        spans[0]["_proc"] = "p9"
        start = int(spans[0]["startTimeUnixNano"]) - odd_inputs.BASE_NS
        if 100e9 <= start < 160e9:
            fwd = next(s for s in spans if s["name"] == "forward")
            fwd["endTimeUnixNano"] = str(int(fwd["endTimeUnixNano"]) + 120_000_000)
            spans[0]["endTimeUnixNano"] = str(int(spans[0]["endTimeUnixNano"]) + 120_000_000)
    got, want = reports(engine, _write_replicas(tmp_path / "incident.jsonl", rows + short))
    assert got["verdict"] == want["verdict"] and got["episode"] == want["episode"]
    assert want["verdict"]["evidence"][0].startswith("the swing is an episode")
    assert "of the recording's time" in want["verdict"]["evidence"][0]
    assert want["episode"]["per_process"] is False


def test_slow_requests_to_the_end_of_the_recording_may_be_going_on(engine, tmp_path: Path) -> None:  # noqa: F811
    got, want = reports(engine, odd_inputs.write(tmp_path / "end.jsonl", _run(set(range(250, 300)))))
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    assert v["evidence"][0].endswith("it runs to the end of the recording (it may be going on still)")
    assert v["advice"][0].endswith("it runs to the end of the recording: record on to see whether it ends")
