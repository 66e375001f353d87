"""Concurrent stage spans of one request (two images fetched at once: two overlapping
``download`` spans): the summed stage time counts the shared time twice, so download "explains"
about 200 % of the total's variance. A tester's report said the stages "offset each other" and
that the total "is held steady by the trade-off" (the line for stages that trade time, one
slower when the other is faster); the time is counted twice, which the (overlap) row takes back.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import load_paths
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.stage_overlap import Overlap, overlap_caveat
from otel_stages.analysis.verdict import Verdict
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports
from tests.test_decision import figures, stage

__all__ = ["engine"]  # the chDB fixture

BASE_NS = 1_790_000_000_000_000_000
MS = 10**6


def _span(trace: str, sid: str, parent: str, name: str, start: int, end: int,
          attrs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"traceId": trace, "spanId": sid, "parentSpanId": parent, "name": name, "kind": 1,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
            "attributes": attrs or [], "status": {}}


def parallel_downloads(path: Path, n: int = 120) -> Path:
    """``n`` requests: two downloads at once (10 ms, or 100 ms each in every third request: a slow
    origin), then decode 12, resize 3, queue 1, forward 60 ms one after another."""
    r = random.Random(4)
    rows = []
    t = BASE_NS
    for i in range(n):
        trace, rid = f"{r.getrandbits(128):032x}", f"{r.getrandbits(64):016x}"
        slow = i % 3 == 1
        c = t + MS // 20
        spans = []
        for k in range(2):
            ms = (100.0 if slow else 10.0) + r.uniform(-0.5, 0.5) + k
            spans.append(_span(trace, f"{r.getrandbits(64):016x}", rid, "download", c, c + int(ms * MS)))
        c = max(int(s["endTimeUnixNano"]) for s in spans)
        for name, ms in (("decode", 12.0), ("resize", 3.0), ("queue", 1.0), ("forward", 60.0)):
            ms += r.uniform(-0.3, 0.3)
            spans.append(_span(trace, f"{r.getrandbits(64):016x}", rid, name, c, c + int(ms * MS)))
            c += int(ms * MS)
        end = c + MS // 20
        rows.append([_span(trace, rid, "", "request", t, end, [odd_inputs._attr("request.seq", i + 1)]),
                     *spans])
        t = end + 50 * MS
    return odd_inputs.write(path, rows)


def test_double_counted_time_is_said_as_such_in_both_reports(engine: Any, tmp_path: Path) -> None:
    path = parallel_downloads(tmp_path / "parallel.jsonl")
    got, want = reports(engine, path)
    assert want["stages"]["download"]["explains"] > 1.5 and want["overlap"]["explains"] > 0.5
    v = want["verdict"]
    assert (v["cause"], v["stage"]) == ("transfer", "download")
    line = next(e for e in v["evidence"] if e.startswith("explains outside 0-100% (download"))
    assert "count their shared time twice" in line and "the (overlap) row takes" in line
    assert not any("offset each other" in e or "trade-off" in e for e in v["evidence"])
    share = next(e for e in v["evidence"] if e.startswith("download is "))
    assert share.endswith("the shares add up to more than 100%: stage spans of a request overlap (in"
                          f" {want['overlap']['requests']} warm requests, which stages: see the warnings)"
                          " and their shared time counts in each,"
                          f" {round(100 * want['overlap']['share'])}% of request time that the (overlap)"
                          " row takes back")
    assert got["verdict"] == v


@pytest.mark.parametrize("share, said", [(0.0099, False), (0.0101, True)])
def test_the_share_line_says_the_double_count_from_one_percent(share: float, said: bool) -> None:
    """OVERLAP_SHARE_SAID 0.01 (literal: a changed threshold must fail)."""
    fig = figures(stage("download", 20.0, explains=0.9), total_swing=20.0)
    line = "download is 5% of all request time (5.0 ms median)"
    verdict = Verdict("transfer", "download", [line], [])
    overlap_caveat(verdict, fig, Overlap(30, 1.0, 0.1, share, 0.0))
    assert (verdict.evidence[0] != line) is said


def test_stages_that_trade_time_still_offset_each_other(tmp_path: Path) -> None:
    """No time counted twice: decode and forward trading time keep the offset line."""
    path = odd_inputs.anti_corr(tmp_path / "anti.jsonl")
    report = diagnose(load_paths([path])).to_dict()
    assert report["overlap"] is None
    assert any("offset each other" in e for e in report["verdict"]["evidence"])
