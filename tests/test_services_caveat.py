"""Warm requests of several services pooled in one report (a fresh-eyes tester's input: two
steady services, forward always 40 ms in one and 400 ms in the other, read as "forward swings
369 ms, the GPU is saturated"): the verdict is tentative, the reason first, and the advice says
to report each service alone. Threshold pinned on both sides; the file report and the
ClickHouse report agree."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import advice, load_paths
from otel_stages.analysis.caveats import (
    POOLED_SERVICE_MIN_REQUESTS,
    POOLED_SERVICE_MIN_SHARE,
    services_caveat,
)
from otel_stages.analysis.clickhouse import Tables, connect, fetch_aggregates, import_files, parse_url
from otel_stages.analysis.clickhouse_figures import report_dict
from otel_stages.analysis.clickhouse_sql import AggregateQuery
from otel_stages.analysis.decision import decide
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.verdict import Verdict
from tests import odd_inputs
from tests.test_decision import figures, stage


@pytest.mark.parametrize("first, second, pooled", [
    (100, POOLED_SERVICE_MIN_REQUESTS - 1, False),  # 4 of 104 warm requests: under 5 %
    (76, POOLED_SERVICE_MIN_REQUESTS - 1, True),    # 4 of 80: 5 %, the top of the swing
    (30, 1, False),                                 # one request (a traced health check)
    (30, 2, True),                                  # two of 32
    (200, POOLED_SERVICE_MIN_REQUESTS, True)])      # five: enough whatever the share
def test_a_second_service_with_enough_warm_requests_makes_the_verdict_tentative(first, second, pooled):
    assert (POOLED_SERVICE_MIN_REQUESTS, POOLED_SERVICE_MIN_SHARE) == (5, 0.05)
    fig = replace(figures(stage("forward", 40.0, explains=0.9), total_swing=40.0),
                  warm_requests=first + second)
    v = decide(replace_services(fig, (("caption", first), ("embed", second))))
    assert v.tentative is pooled
    assert ("services are pooled" in v.evidence[0]) is pooled
    assert (v.advice[0] == "report each service alone (otel-stages report ... --service caption)") is pooled


@pytest.mark.parametrize("second, pooled", [(POOLED_SERVICE_MIN_REQUESTS - 1, False),
                                             (POOLED_SERVICE_MIN_REQUESTS, True)])
def test_a_pooled_swing_with_no_stage_standing_out_is_no_process_wide_slowdown(second, pooled):
    """The total swings, no stage stands out: one service's advice is to look for what slows the
    whole process; pooled services' other stages alone make their totals differ (a tester's
    gateway and worker, both steady), so that advice goes and the pooled line says why."""
    fig = figures(stage("forward", 3.0, explains=0.2), stage("decode", 3.0, explains=0.2),
                  total_swing=40.0, n=100 + second)
    v = decide(replace_services(fig, (("gateway", 100), ("vlm-worker", second))))
    assert (v.cause, v.stage) == (None, None)
    assert (advice.SPREAD in v.advice) is not pooled
    assert ("the total's swing may be the services' difference alone" in v.evidence[0]) is pooled


def test_one_service_or_unnamed_processes_add_nothing():
    fig = figures(stage("forward", 40.0, explains=0.9), total_swing=40.0)
    assert decide(replace_services(fig, (("caption", 30),))).tentative is False
    v = Verdict("forward", "forward", ["x"], ["y"])
    services_caveat(v, replace_services(fig, (("", 10), ("caption", 10))))
    assert v.tentative and "(no service.name) 10" in v.evidence[0] and "--service caption" in v.advice[0]


def replace_services(fig: Any, services: tuple[tuple[str, int], ...]) -> Any:
    return replace(fig, services=services)


def two_services(path: Path, second: int) -> Path:
    """30 requests of ``caption`` (forward 400 ms) and ``second`` of ``embed`` (forward 40 ms),
    interleaved, each service its own process; every stage steady."""
    r = random.Random(3)
    t = odd_inputs.BASE_NS
    lines = []
    for i in range(30 + second):
        svc = "caption" if i % 2 == 0 or i // 2 >= second else "embed"
        fwd = 400.0 if svc == "caption" else 40.0
        spans, end = odd_inputs.request(r, t, [("download", 5 + r.random()), ("decode", 10 + r.random()),
                                                ("resize", 4.0), ("queue", 2.0), ("forward", fwd + r.random())],
                                        i + 1)
        resource = {"attributes": [odd_inputs._attr("service.name", svc),
                                   odd_inputs._attr("service.instance.id", svc + "-1")]}
        lines.append(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
            {"scope": {"name": "otel_stages"}, "spans": spans}]}]}))
        t = end + 100_000_000
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    with connect(parse_url(f"chdb:{tmp_path_factory.mktemp('chdb')}")) as eng:
        yield eng


@pytest.mark.parametrize("second, pooled", [(2, True), (POOLED_SERVICE_MIN_REQUESTS, True), (30, True)])
def test_file_and_clickhouse_reports_both_say_the_services_are_pooled(engine, tmp_path, second, pooled):
    path = two_services(tmp_path / f"two_{second}.jsonl", second + 1)  # + its cold first request
    want = diagnose(load_paths([path])).to_dict()
    tables = Tables(database=f"svc{second}")
    assert import_files(engine, tables, [path]).problems == []
    got = json.loads(json.dumps(report_dict(fetch_aggregates(engine, tables, AggregateQuery()))))
    for report in (want, got):
        assert report["verdict"]["tentative"] is pooled
        assert "services are pooled" in report["verdict"]["evidence"][0]
        assert report["verdict"]["advice"][0].startswith("report each service alone")
    assert got["verdict"]["evidence"][0] == want["verdict"]["evidence"][0]
    assert got["verdict"]["cause"] == want["verdict"]["cause"]


def _one_shots(path: Path, processes: int, requests_each: int) -> Path:
    """Service ``vlm`` (one process, 40 steady requests), and ``processes`` processes of another
    service ``batch-cli`` with ``requests_each`` requests of 2 s each (its normal cost: its
    first requests are all cold)."""
    r = random.Random(5)
    lines = []

    def write(svc: str, instance: str, forwards: list[float], t: int) -> int:
        resource = {"attributes": [odd_inputs._attr("service.name", svc),
                                   odd_inputs._attr("service.instance.id", instance)]}
        for i, fwd in enumerate(forwards):
            spans, end = odd_inputs.request(r, t, [("download", 5.0), ("decode", 10 + r.random()),
                                                   ("resize", 4.0), ("queue", 2.0), ("forward", fwd)], i + 1)
            lines.append(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
                {"scope": {"name": "otel_stages"}, "spans": spans}]}]}))
            t = end + 100_000_000
        return t

    t = write("vlm", "vlm-1", [100 + r.random() * 3 for _ in range(40)], odd_inputs.BASE_NS)
    for p in range(processes):
        t = write("batch-cli", f"job-{p}", [2000 + r.random() * 20] * requests_each, t)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("processes, requests_each", [(8, 1), (10, 2)])
def test_one_shot_processes_of_another_service_pool_too(engine, tmp_path, processes, requests_each):
    """A tester's: 8 one-shot processes of another service (each request cold, 2 s, its normal
    cost) made a confident cold_start, 16x, with no word of the pooling (the rule counted warm
    requests only); 10 processes of 2 requests each made a confident forward swing."""
    path = _one_shots(tmp_path / f"oneshot_{processes}.jsonl", processes, requests_each)
    want = diagnose(load_paths([path])).to_dict()
    tables = Tables(database=f"oneshot{processes}")
    assert import_files(engine, tables, [path]).problems == []
    got = json.loads(json.dumps(report_dict(fetch_aggregates(engine, tables, AggregateQuery()))))
    for report in (want, got):
        assert report["verdict"]["tentative"]
        assert "services are pooled here (vlm 40, batch-cli" in report["verdict"]["evidence"][0]
    assert got["verdict"] == want["verdict"]
