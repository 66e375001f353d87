"""Failed requests that are the slow tail (a tester's input: 16 of 100 requests hit a forward
stall and were ended by a 2 s deadline, the rest steady at 300 ms; both reports said a confident
"stable", the failures one line at the end). When at least
:data:`~otel_stages.analysis.failures.FAILED_SLOW_MIN_FRACTION` of the requests fail and their
median total lies beyond the warm p95 plus the noise band, the verdict is tentative, the failed
requests (how many, their median total, the stage that held it) come first in the evidence and
finding why that stage stalls first in the advice. Requests that fail fast do not. Each threshold
pinned on both sides; the file report and the ClickHouse report agree."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import advice, load_paths
from otel_stages.analysis.decision import decide, verdict_band_ms
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.failures import (
    FAILED_MIN_FRACTION,
    FAILED_SLOW_MIN_FRACTION,
    FAILED_STAGE_MIN_PART,
    failures_slow,
    failures_to_dict,
)
from otel_stages.analysis.figures import Figures
from otel_stages.analysis.units import duration
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports
from tests.test_decision import figures, stage

__all__ = ["engine"]  # the module's chDB fixture

#: The failed requests of the tester's input: 2 s in all, 1.96 s of it in forward.
TIMEOUT_STAGES = {"download": 20.0, "decode": 12.0, "resize": 4.0, "queue": 1.0, "forward": 1963.0}


def _failing(failed: int, *, requests: int = 100, total_ms: float = 2000.0,
             stages_ms: dict[str, float] | None = None, swing: float = 2.0) -> Figures:
    """Steady figures (the total's p95 101 ms: REF 100 ms plus half of ``swing``) with ``failed``
    of ``requests`` failed, their median total ``total_ms``."""
    return replace(figures(stage("forward", 1.0, explains=0.9), total_swing=swing),
                   failed_requests=failed, requests=requests, failed_median_total_ms=total_ms,
                   failed_stages_ms=TIMEOUT_STAGES if stages_ms is None else stages_ms,
                   failure_kinds={"TimeoutError": failed}, failure_stages={"last stage forward": failed})


# --- the rule on figures ---------------------------------------------------------------------------


@pytest.mark.parametrize("failed, slow", [(4, False), (5, True), (16, True)])
def test_the_share_of_slow_failures_pinned_on_both_sides(failed: int, slow: bool) -> None:
    assert FAILED_SLOW_MIN_FRACTION == 0.05  # 5 of 100 (literal: a changed threshold must fail)
    assert failures_slow(_failing(failed), band_ms=3.0) is slow
    v = decide(_failing(failed))
    assert v.cause == "stable" and v.tentative is slow
    assert v.evidence[0].startswith(f"{failed}% of requests failed ({failed} of 100;") is slow
    assert (v.advice[0] == advice.slow_failures("forward")) is slow


@pytest.mark.parametrize("total_ms, slow", [(104.0, False), (104.001, True)])
def test_slow_means_beyond_the_warm_p95_plus_the_noise_band(total_ms: float, slow: bool) -> None:
    """The warm p95 is 101 ms; with a band of 3 ms the failed median must pass 104 ms."""
    fig = _failing(16, total_ms=total_ms)
    assert fig.total is not None and fig.total.p95_ms == 101.0
    assert failures_slow(fig, band_ms=3.0) is slow


def test_no_band_no_slow_failures() -> None:
    """Under MIN_WARM_RUNS warm requests there is no verdict on them, and no band to judge by."""
    assert failures_slow(_failing(16), band_ms=None) is False


def test_requests_failing_fast_keep_the_steady_verdict() -> None:
    """16 % failing in 2 ms (a 400 before any work) are no tail: the verdict stays firm, the
    failures one line at the end, the steadiness said to be of the requests that succeeded."""
    v = decide(_failing(16, total_ms=2.0, stages_ms={"download": 1.5}))
    assert v.cause == "stable" and v.tentative is False
    assert v.advice[0] == advice.steady_but_failed(16)
    assert v.evidence[-1] == ("16 of 100 requests ended with an error and were left out of the"
                              " stage statistics")


def test_the_tester_timeouts_lead_the_verdict() -> None:
    """Deleting the rule fails this: the tester's figures, the failed requests first."""
    fig = _failing(16, total_ms=1999.9, stages_ms=TIMEOUT_STAGES)
    band = verdict_band_ms(fig)
    assert band is not None
    v = decide(fig)
    assert v.cause == "stable" and v.tentative
    assert v.evidence[0] == (
        "16% of requests failed (16 of 100; TimeoutError: 16; last stage forward: 16), slowly:"
        " their median total 1999.9 ms is beyond the warm requests' p95 101.0 ms plus this run's"
        f" noise band {duration(band)}; they spent most of it in forward (median 1963.0 ms"
        " there); they are the slow tail, so the verdict is tentative: the timings below describe"
        " only the 84 that succeeded")
    assert v.advice[0] == advice.slow_failures("forward")
    assert advice.STEADY not in v.advice and advice.steady_but_failed(16) not in v.advice
    assert not any(e.startswith("16 of 100 requests ended with an error") for e in v.evidence)


@pytest.mark.parametrize("forward_ms, named", [(1000.0, True), (999.9, False)])
def test_the_stage_is_named_when_it_held_half_of_their_time(forward_ms: float, named: bool) -> None:
    assert FAILED_STAGE_MIN_PART == 0.5  # half of the failed median total of 2000 ms
    v = decide(_failing(16, stages_ms={"download": 20.0, "forward": forward_ms}))
    assert v.tentative
    assert (v.advice[0] == advice.slow_failures("forward" if named else None))
    assert ("they spent most of it in forward" in v.evidence[0]) is named
    assert ("no stage holds half of it (the largest, forward" in v.evidence[0]) is not named


def test_many_slow_failures_lead_with_the_stall_then_the_fix_the_errors_advice() -> None:
    assert FAILED_MIN_FRACTION == 0.25
    v = decide(_failing(30))
    assert v.tentative
    assert "at least 25% failing is the problem to fix first" in v.evidence[0]
    assert "slowly: their median total 2000.0 ms" in v.evidence[0]
    assert v.advice[:2] == [advice.slow_failures("forward"), advice.FIX_FAILURES]


def test_a_swinging_verdict_is_tentative_too() -> None:
    """Not only "stable": a verdict on the successful requests alone is tentative, the failed
    ones first."""
    fig = replace(_failing(16), stages={**_failing(16).stages,
                                        "forward": stage("forward", 40.0, explains=0.9)},
                  total=figures(stage("forward", 40.0), total_swing=40.0).total)
    v = decide(fig)
    assert v.cause == "forward" and v.tentative
    assert v.evidence[0].startswith("16% of requests failed") and "slowly" in v.evidence[0]
    assert v.advice[0] == advice.slow_failures("forward")
    assert decide(replace(fig, failed_requests=0, requests=100)).tentative is False


def test_the_failures_object() -> None:
    assert failures_to_dict(replace(_failing(0), failed_median_total_ms=None), 3.0) is None
    got = failures_to_dict(_failing(16), 3.0)
    assert got == {"requests": 16, "share": 0.16, "kinds": {"TimeoutError": 16},
                   "stopped": {"last stage forward": 16}, "median_total_ms": 2000.0,
                   "stages": TIMEOUT_STAGES, "stage": "forward", "slow": True, "leads": True,
                   "cold": 0}
    fast = failures_to_dict(_failing(16, total_ms=2.0), 3.0)
    assert fast is not None and fast["slow"] is False and fast["leads"] is False
    assert failures_to_dict(_failing(16), None)["slow"] is None  # type: ignore[index]


# --- the tester's shape, from spans, in both reports ----------------------------------------------


def _steady(i: int, r: random.Random) -> odd_inputs.Stages:
    return [("download", 20 + r.gauss(0, 1)), ("decode", 12 + r.gauss(0, 0.3)),
            ("resize", 4 + r.gauss(0, 0.2)), ("queue", 1 + r.random() * 0.3),
            ("forward", 260 + r.gauss(0, 4))]


def _timeouts(path: Path, stalled: set[int], how: str = "forward") -> Path:
    """100 requests, steady at about 300 ms; those in ``stalled`` end with status ERROR and
    ``error.type`` ``TimeoutError`` at a 2 s deadline (``BadRequest`` when fast): ``how`` ``"forward"``: forward runs on to it;
    ``"untraced"``: the request hangs outside every stage span; ``"fast"``: rejected in 2 ms, in
    download (one in three after a short decode)."""
    def stages(i: int, r: random.Random) -> odd_inputs.Stages:
        st = _steady(i, r)
        if i not in stalled:
            return st
        if how == "fast":
            return [("download", 1.5)] + ([("decode", 0.4)] if (i // 6) % 3 == 0 else [])
        if how == "forward":
            return [*st[:4], ("forward", 2000 - sum(ms for _, ms in st[:4]) - 0.1)]
        return st
    rows = odd_inputs.run(100, stages, seed=13, gap_ms=40)
    kind = "BadRequest" if how == "fast" else "TimeoutError"
    for i in stalled:
        request = rows[i][0]
        request["status"] = {"code": 2, "message": "rejected" if how == "fast" else "deadline exceeded"}
        request["attributes"].append({"key": "error.type", "value": {"stringValue": kind}})
        if how == "untraced":  # the request span runs on to the deadline past its last stage
            request["endTimeUnixNano"] = str(int(request["startTimeUnixNano"]) + 2_000_000_000)
    return odd_inputs.write(path, rows)


#: 16 of the 100 requests, as the tester's seed drew them (never the first, the cold one)
STALLED = set(range(3, 99, 6))


def test_the_tester_input_in_the_file_report(tmp_path: Path) -> None:
    report = diagnose(load_paths([_timeouts(tmp_path / "t.jsonl", STALLED)]))
    v = report.verdict
    assert report.counts.failed == 16 and v.tentative
    assert v.evidence[0].startswith("16% of requests failed (16 of 100; TimeoutError: 16; last"
                                    " stage forward: 16), slowly: their median total 2000.0 ms")
    assert "they spent most of it in forward (median 19" in v.evidence[0]
    assert v.advice[0] == advice.slow_failures("forward")
    failures = report.to_dict()["failures"]
    assert isinstance(failures, dict) and failures["stage"] == "forward" and failures["slow"] is True


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["verdict"] == want["verdict"]
    assert got["failures"].keys() == want["failures"].keys()
    for key in ("median_total_ms", "stages"):
        assert got["failures"][key] == pytest.approx(want["failures"][key], rel=1e-9), key
    assert {k: v for k, v in got["failures"].items() if k not in ("median_total_ms", "stages")} == \
        {k: v for k, v in want["failures"].items() if k not in ("median_total_ms", "stages")}


@pytest.mark.parametrize("stalled, how, leads, stage_named", [
    (STALLED, "forward", True, "forward"),
    (set(range(3, 99, 6)[:5]), "forward", True, "forward"),   # 5 of 100: at the share
    (set(range(3, 99, 6)[:4]), "forward", False, "forward"),  # 4 of 100: under it
    (STALLED, "untraced", True, None),                        # no stage holds their time
    (STALLED, "fast", False, None),                           # a 400 in 2 ms is no tail
])
def test_both_reports_read_timeouts_alike(engine, tmp_path: Path, stalled: set[int], how: str,
                                          leads: bool, stage_named: str | None) -> None:
    got, want = reports(engine, _timeouts(tmp_path / f"{how}{len(stalled)}.jsonl", stalled, how))
    _same(got, want)
    v = want["verdict"]
    assert v["cause"] == "stable" and v["tentative"] is leads, v
    assert want["failures"]["leads"] is leads and want["failures"]["requests"] == len(stalled)
    assert (v["advice"][0] == advice.slow_failures(stage_named)) is leads
    if how == "fast":
        assert want["failures"]["stages"] == {"download": 1.5, "decode": 0.0}  # 0 where it lacks decode
