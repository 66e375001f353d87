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
    EPISODE_MAX_REQUEST_SHARE,
    EPISODE_MAX_SPAN_SHARE,
    EPISODE_MIN_SLOW,
    EPISODE_MIN_SLOW_SHARE,
    Episode,
    bucket_counts,
    bucket_of,
    episode_advice,
    find_episode,
    steady_outside,
)
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports  # noqa: F401 - the chDB fixture
from tests.test_decision import figures, stage

WINDOW = round(EPISODE_BUCKETS * EPISODE_MAX_SPAN_SHARE)
T0 = 1_790_000_000 * 10**9
LAST = T0 + EPISODE_BUCKETS * 10**9 - 1  # one bucket per second


def _find(slow: dict[int, int], n: dict[int, int] | None = None, *, each: int = 4) -> Episode | None:
    """``slow``: slow requests per bucket; ``n``: requests per bucket (default ``each``, at least
    the slow ones)."""
    counts = [max(each, slow.get(b, 0)) if n is None else n.get(b, each) for b in range(EPISODE_BUCKETS)]
    return find_episode(counts, [slow.get(b, 0) for b in range(EPISODE_BUCKETS)], T0, LAST, 150.0)


def test_the_buckets_run_from_the_first_start_to_the_last() -> None:
    assert bucket_of(T0, T0, LAST) == 0
    assert bucket_of(LAST, T0, LAST) == EPISODE_BUCKETS - 1
    assert bucket_of(T0 + 10**9, T0, LAST) == 1
    n, slow, first, last = bucket_counts([T0, LAST, T0 + 5 * 10**9], [100.0, 200.0, 150.0], 150.0)
    assert (first, last, sum(n), sum(slow)) == (T0, LAST, 3, 1)  # above, not at, the bar
    assert slow[EPISODE_BUCKETS - 1] == 1 and n[5] == 1


@pytest.mark.parametrize("slow_requests, found", [(9, False), (10, True)])
def test_too_few_slow_requests_are_no_episode(slow_requests: int, found: bool) -> None:
    assert EPISODE_MIN_SLOW == 10
    e = _find({3: slow_requests})
    assert (e is not None) is found
    if e is not None:
        assert e.at_start and e.slow_in == e.slow == 10
        # said from the first to the last bucket that holds slow requests, not the window's edges
        assert (e.start_ns, e.end_ns) == (T0 + 3 * 10**9, T0 + 4 * 10**9)
        assert (e.bucket_lo, e.bucket_hi) == (0, WINDOW)


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
        assert e.start_ns == T0 + 40 * 10**9 and e.end_ns == T0 + 41 * 10**9


@pytest.mark.parametrize("span, found", [(25, True), (26, False)])
def test_the_window_is_a_quarter_of_the_run(span: int, found: bool) -> None:
    assert EPISODE_MAX_SPAN_SHARE == 0.25 and EPISODE_BUCKETS == 100
    # 10 slow requests at each end of `span` buckets, one in each between: a stretch one bucket
    # wider than the window leaves 10 of 44 out (0.77)
    slow = {10 + b: 1 for b in range(span)} | {10: 10, 10 + span - 1: 10}
    assert (_find(slow) is not None) is found


def test_requests_crowding_in_the_window_are_no_episode() -> None:
    # 400 requests in all; the window holds the slow ones and 160 (0.4) or 161 requests
    assert EPISODE_MAX_REQUEST_SHARE == 0.4
    for inside, found in ((160, True), (161, False)):
        n = {b: 0 for b in range(EPISODE_BUCKETS)}
        n[50] = inside
        for b in range(400 - inside):  # before every window that holds bucket 50
            n[b % (50 - WINDOW + 1)] += 1
        assert sum(n.values()) == 400
        assert (_find({50: 20}, n) is not None) is found, inside


def test_the_earliest_window_wins_a_tie() -> None:
    e = _find({30: 20})  # every window holding bucket 30 holds them all: the earliest is taken
    assert e is not None and e.bucket_lo == 30 - WINDOW + 1


# --- the verdict ---------------------------------------------------------------------------------


def _episode(at_start: bool) -> Episode:
    start = T0 if at_start else T0 + 40 * 10**9
    lo = 0 if at_start else 40
    return Episode(start_ns=start, end_ns=start + WINDOW * 10**9, slow_in=60, slow=60,
                   requests_in=70, requests=299, slow_min_ms=142.9, first_ns=T0, last_ns=LAST,
                   bucket_lo=lo, bucket_hi=lo + WINDOW)


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


def test_steady_outside_is_judged_against_the_band() -> None:
    e = _episode(True)
    assert steady_outside(e, 10.0, 10.0) is e
    assert steady_outside(e, 10.01, 10.0) is None
    assert steady_outside(e, None, 10.0) is None and steady_outside(None, 1.0, 10.0) is None


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
