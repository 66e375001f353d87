"""Requests cut off by a window's start (a tester's: six requests waiting 150 s in the queue
started 31-33 minutes ago, three ended inside ``--since 30m``, and the ClickHouse report said
``stable`` with no hint): a request belongs to the window it starts in, so the slow ones that
started just before are left out. Now they are counted, and when the longest reaches the warm p95
plus the noise band the verdict is tentative and the advice leads with widening the window.
Files take no window (``--since`` goes with the servers), so this is the ClickHouse report's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import advice
from otel_stages.analysis.clickhouse import Tables, fetch_aggregates, import_files
from otel_stages.analysis.clickhouse_figures import report_dict
from otel_stages.analysis.clickhouse_sql import AggregateQuery
from otel_stages.analysis.verdict import Verdict
from otel_stages.analysis.window_edge import WIDEN_WINDOW, WindowEdge, cut_off_slow, window_caveat
from tests.test_clickhouse_issues import MS, STABLE, Spans, edited, engine, named, shift  # noqa: F401


@pytest.mark.parametrize(("longest_ms", "slow"), [(119.9, False), (120.0, True), (5000.0, True)])
def test_the_longest_cut_off_reaches_the_p95_plus_the_band(longest_ms: float, slow: bool) -> None:
    # warm p95 100 ms, band 20 ms: a request of 120 ms would be among the slow ones
    assert cut_off_slow(WindowEdge(3, longest_ms), 100.0, 20.0) is slow
    v = Verdict("stable", None, ["request total swings 3 ms"], [advice.STEADY, "start with forward"])
    window_caveat(v, WindowEdge(3, longest_ms), 100.0, 20.0)
    assert v.tentative is slow
    assert v.evidence[0].startswith("3 requests started before the window and ended inside it") is slow
    assert (v.advice == [WIDEN_WINDOW, "start with forward"]) is slow


def test_nothing_cut_off_or_no_p95_is_no_caveat() -> None:
    assert not cut_off_slow(WindowEdge(), 100.0, 20.0)
    assert not cut_off_slow(WindowEdge(2, 900.0), None, 20.0)


def _slow_first(i: int, spans: Spans) -> None:
    """The first three requests wait 60 s more in the queue (every later span moves on)."""
    if i < 3:
        queue = named(spans, "queue")
        end = int(queue["endTimeUnixNano"])
        queue["endTimeUnixNano"] = str(end + 60_000 * MS)
        for span in spans:
            if span is not queue and int(span["startTimeUnixNano"]) >= end:
                shift(span, 60_000 * MS)
        request = named(spans, "request")
        request["endTimeUnixNano"] = str(int(request["endTimeUnixNano"]) + 60_000 * MS)


def _windowed(engine: Any, path: Path, db: str) -> dict[str, Any]:  # noqa: F811
    """The ClickHouse report's JSON over ``path`` from the fourth request's start on."""
    tables = Tables(database=db)
    assert import_files(engine, tables, [path]).problems == []
    starts = sorted(int(s["startTimeUnixNano"]) for line in path.read_text().splitlines()
                    for rs in json.loads(line).get("resourceSpans", [])
                    for ss in rs["scopeSpans"] for s in ss["spans"] if s["name"] == "request")
    agg = fetch_aggregates(engine, tables, AggregateQuery(start_ns=starts[3]))
    return json.loads(json.dumps(report_dict(agg)))


def test_slow_requests_the_window_start_cut_off(engine, tmp_path: Path) -> None:  # noqa: F811
    got = _windowed(engine, edited(STABLE, tmp_path / "slow.jsonl", _slow_first), "edge1")
    assert got["requests"] == 27
    assert got["window_edge"]["requests"] == 2  # the cold first one is no slow request
    assert got["window_edge"]["longest_ms"] > 60_000
    v = got["verdict"]
    assert v["tentative"], v
    assert v["evidence"][0].startswith("2 requests started before the window and ended inside it")
    assert v["advice"][0] == WIDEN_WINDOW


def test_requests_that_ended_before_the_window_are_not_cut_off(engine, tmp_path: Path) -> None:  # noqa: F811
    got = _windowed(engine, STABLE, "edge2")
    assert got["window_edge"] == {"requests": 0, "longest_ms": None}
    assert got["verdict"]["advice"][0] != WIDEN_WINDOW


def _long_poll(i: int, spans: Spans) -> None:
    """A 200 s span with no stage children (a poller) in the second trace, across the window start."""
    if i == 1:
        poll = dict(named(spans, "request"), name="poll", spanId="00000000000000ff", parentSpanId="",
                    attributes=[])
        poll["endTimeUnixNano"] = str(int(poll["startTimeUnixNano"]) + 200_000 * MS)
        spans.append(poll)


def test_spans_without_stage_children_are_no_requests(engine, tmp_path: Path) -> None:  # noqa: F811
    got = _windowed(engine, edited(STABLE, tmp_path / "poll.jsonl", _long_poll), "edge3")
    assert got["window_edge"] == {"requests": 0, "longest_ms": None}


def _slow_cold_first(i: int, spans: Spans) -> None:
    """:func:`_slow_first` on the first request only: the cold one (seq 1)."""
    if i == 0:
        _slow_first(i, spans)


def test_a_cold_request_cut_off_is_no_slow_request(engine, tmp_path: Path) -> None:  # noqa: F811
    # a third tester's: the request the window cut off was the cold one, called a slow request
    got = _windowed(engine, edited(STABLE, tmp_path / "cold.jsonl", _slow_cold_first), "edge4")
    assert got["window_edge"] == {"requests": 0, "longest_ms": None}
    assert got["verdict"]["advice"][0] != WIDEN_WINDOW
