"""A window (``--since``) over ClickHouse cuts processes mid-life: without ``request.cold_start`` or
``request.seq`` the cold request is each process's earliest, so the first request in the window of
a process that started hours before was called "first request of the process" and a one-off
400 ms stall a confident ``cold_start`` (a tester's input). A process with stage spans in the
hour before the window (``clickhouse_requests.BEFORE_WINDOW_S``) now has no cold request there,
and the problems say so; one that starts in the window keeps its cold request."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis.clickhouse import Tables, connect, fetch_aggregates, import_files, parse_url
from otel_stages.analysis.clickhouse_figures import report_dict
from otel_stages.analysis.clickhouse_requests import BEFORE_WINDOW_S
from otel_stages.analysis.clickhouse_sql import AggregateQuery
from tests import odd_inputs

S = 10**9
WINDOW_NS = odd_inputs.BASE_NS + 3 * 3600 * S  # the window starts 3 h after the first request


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    with connect(parse_url(f"chdb:{tmp_path_factory.mktemp('chdb')}")) as eng:
        yield eng


def _process(f: Any, r: random.Random, instance: str, times_ns: list[int], forward_ms: dict[int, float]) -> None:
    resource = {"attributes": [odd_inputs._attr("service.name", "vlm"),
                               odd_inputs._attr("service.instance.id", instance)]}
    for i, t in enumerate(times_ns):
        stages = [("download", 5 + r.random()), ("decode", 10 + r.random()), ("resize", 4 + r.random()),
                  ("queue", 2 + r.random() * 0.3), ("forward", forward_ms.get(i, 100 + r.random() * 3))]
        spans, _ = odd_inputs.request(r, t, stages, i + 1)
        spans[0]["attributes"] = []  # a producer that writes no request.seq / request.cold_start
        f.write(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
            {"scope": {"name": "otel_stages"}, "spans": spans}]}]}) + "\n")


def _fleet(path: Path, quiet_before_s: float, *, newcomer: bool = False) -> Path:
    """Process ``old``: a 3 s first request 3 h before the window, a request a minute until
    ``quiet_before_s`` before the window, then 30 in it a minute apart, the first a 400 ms stall.
    ``newcomer``: process ``new`` starts in the window, its first request 1.5 s."""
    r = random.Random(3)
    before = [odd_inputs.BASE_NS + k * 60 * S for k in range(180)
              if odd_inputs.BASE_NS + k * 60 * S < WINDOW_NS - quiet_before_s * S]
    inside = [WINDOW_NS + 30 * S + k * 60 * S for k in range(30)]
    with path.open("w") as f:
        _process(f, r, "old", before + inside, {0: 3000.0, len(before): 400.0})
        if newcomer:
            _process(f, r, "new", [WINDOW_NS + 45 * S + k * 60 * S for k in range(25)], {0: 1500.0})
    return path


def _report(engine: Any, path: Path) -> dict[str, Any]:
    tables = Tables(database=f"w{abs(hash(path)) % 10**8}")
    assert import_files(engine, tables, [path]).problems == []
    agg = fetch_aggregates(engine, tables, AggregateQuery(start_ns=WINDOW_NS))
    return json.loads(json.dumps(report_dict(agg)))


@pytest.mark.parametrize("quiet_s, started_before", [
    (BEFORE_WINDOW_S - 120, True),    # its last request 58 min before the window: it ran before
    (BEFORE_WINDOW_S + 120, False),   # idle 62 min: taken as starting in the window
])
def test_a_process_that_ran_before_the_window_has_no_cold_request_in_it(
        engine, tmp_path: Path, quiet_s: float, started_before: bool) -> None:
    assert BEFORE_WINDOW_S == 3600
    report = _report(engine, _fleet(tmp_path / f"quiet{quiet_s:g}.jsonl", quiet_s))
    said = [p for p in report["problems"] if "ran in the 60 min before the window" in p]
    if started_before:
        assert report["counts"]["cold"] == 0 and report["cold_start"] is None
        assert report["verdict"]["cause"] == "forward"  # the stall is a spike among warm runs
        assert said == ["1 process without request.cold_start or request.seq ran in the 60 min before"
                        " the window: it started before it, so its first request in the window is not"
                        " taken as cold (without those attributes a process's earliest request is)"]
    else:
        assert report["counts"]["cold"] == 1 and report["verdict"]["cause"] == "cold_start"
        assert not said


def test_a_process_that_starts_in_the_window_keeps_its_cold_request(engine, tmp_path: Path) -> None:
    report = _report(engine, _fleet(tmp_path / "newcomer.jsonl", 600, newcomer=True))
    assert report["counts"]["cold"] == 1 and report["cold_start"]["total_ms"] > 1500
    assert any(p.startswith("1 process without request.cold_start") for p in report["problems"])
