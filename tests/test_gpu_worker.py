"""A GPU worker that records ``queue`` and ``forward`` under a gateway's request span (tester A's
F4: two gateway replicas on CPU nodes, one model server on a GPU node, trace context propagated):
each forward is lined up with the GPU points of the process that recorded it, not of the
gateway that ran the request. Both reports said "no GPU data", advised enabling a sampler that was
running, and warned to set one host.name on two nodes; without host.name on the worker the memory
line counted its one GPU twice. The common case (one process records the request and its
forward) keeps the request's process (tests/test_gpu_owners.py, tests/test_clickhouse_issues.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import load_paths
from otel_stages.analysis.clickhouse import Tables, import_files, run_queries
from otel_stages.analysis.clickhouse_sql import AggregateQuery
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.gpu_owners import forward_owners, unowned_gpu_senders
from otel_stages.analysis.requests import find_requests, process_key
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports

__all__ = ["engine"]  # the module's chDB fixture

GIB = 1024**3
WORKER = "service.name=vlm-worker,service.instance.id=w-1"
_WORKER_STAGES = ("queue", "forward")


def _resource(service: str, instance: str, host: str | None) -> dict[str, Any]:
    attrs = [odd_inputs._attr("service.name", service), odd_inputs._attr("service.instance.id", instance)]
    if host is not None:
        attrs.append(odd_inputs._attr("host.name", host))
    return {"attributes": attrs}


def _gauges(resource: dict[str, Any], points: list[tuple[int, float]], hw: str = "0") -> dict[str, Any]:
    """One line of ``hw.gpu.utilization`` (``points``, ratios) with memory at half an 80 GiB limit."""
    attrs = [odd_inputs._attr("hw.id", hw), odd_inputs._attr("hw.type", "gpu")]

    def gauge(name: str, unit: str, values: list[tuple[int, float]]) -> dict[str, Any]:
        return {"name": name, "unit": unit, "gauge": {"dataPoints": [
            {"timeUnixNano": str(t), "asDouble": v, "attributes": attrs} for t, v in values]}}
    return {"resourceMetrics": [{"resource": resource, "scopeMetrics": [{"metrics": [
        gauge("hw.gpu.utilization", "1", points),
        gauge("hw.gpu.memory.usage", "By", [(t, 40.0 * GIB) for t, _ in points]),
        gauge("hw.gpu.memory.limit", "By", [(t, 80.0 * GIB) for t, _ in points])]}]}]}


def gateway_worker(path: Path, *, worker_host: str | None = "gpu-node-1", workers: int = 1,
                   worker_gpu: bool = True, exporter_host: str | None = None,
                   gateway_gpu: bool = False) -> Path:
    """40 requests alternating between two gateways (``vlm-gateway`` ``gw-a`` / ``gw-b`` on
    ``cpu-node-a`` / ``-b``), which record ``request``, ``download``, ``decode`` and ``resize``;
    ``queue`` and ``forward`` recorded by ``workers`` GPU workers (``vlm-worker`` ``w-1``...,
    ``host.name`` ``worker_host`` with a suffix past the first; request ``i`` on worker
    ``i % workers``); forward 100 ms, 400 ms on every third request. GPU points every 20 ms, hw.id
    ``0``: 95 % inside the forwards the GPU's holder recorded, 3 % outside, sent by each worker
    (``worker_gpu``), or by a ``dcgm-exporter`` on ``exporter_host`` (if given); ``gateway_gpu``: each gateway
    also sends an idle GPU of its own."""
    rows = odd_inputs.run(40, lambda i, r: [
        ("download", 5 + r.random()), ("decode", 10 + r.random()), ("resize", 4 + r.random() * 0.5),
        ("queue", 2 + r.random() * 0.3), ("forward", (400 if i % 3 == 0 else 100) + r.random() * 3)])
    gateways = [_resource("vlm-gateway", f"gw-{c}", f"cpu-node-{c}") for c in "ab"]
    held = [_resource("vlm-worker", f"w-{k + 1}",
                      None if worker_host is None else worker_host + ("" if k == 0 else f"-{k}"))
            for k in range(workers)]
    lines: list[dict[str, Any]] = []
    forwards: list[list[tuple[int, int]]] = [[] for _ in held]

    def line(resource: dict[str, Any], spans: list[dict[str, Any]]) -> dict[str, Any]:
        return {"resourceSpans": [{"resource": resource, "scopeSpans": [
            {"scope": {"name": "otel_stages"}, "spans": spans}]}]}
    for i, spans in enumerate(rows):
        mine = [s for s in spans if s["name"] not in _WORKER_STAGES]
        theirs = [s for s in spans if s["name"] in _WORKER_STAGES]
        lines += [line(gateways[i % 2], mine), line(held[i % workers], theirs)]
        forwards[i % workers] += [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))
                                  for s in theirs if s["name"] == "forward"]
    lo = odd_inputs.BASE_NS - 10**9
    hi = max(e for fw in forwards for _, e in fw) + 10**9
    times = range(lo, hi, 20_000_000)
    for k, resource in enumerate(held):
        util = [(t, 0.95 if any(a <= t <= b for a, b in forwards[k]) else 0.03) for t in times]
        if worker_gpu:
            lines.append(_gauges(resource, util))
        elif k == 0 and exporter_host is not None:
            lines.append(_gauges(_resource("dcgm-exporter", "x-1", exporter_host), util))
    if gateway_gpu:
        lines += [_gauges(g, [(t, 0.0) for t in times]) for g in gateways]
    path.write_text("".join(json.dumps(doc) + "\n" for doc in lines))
    return path


def _no_host_advice(problems: list[str]) -> None:
    assert not [p for p in problems if "Set host.name" in p], problems


@pytest.mark.parametrize("layout", [
    {},                                          # tester A's s08: the worker names its node
    {"worker_host": None},                       # s08b: no host.name on the worker
    {"workers": 2},                              # two workers, each its own GPU "0"
    {"worker_gpu": False, "exporter_host": "gpu-node-1"},  # a node exporter beside the worker
])
def test_a_gpu_worker_under_a_gateways_request_is_busy_in_both_reports(
        engine, tmp_path: Path, layout: dict[str, Any]) -> None:
    got, want = reports(engine, gateway_worker(tmp_path / "gw.jsonl", **layout))
    assert want["verdict"]["cause"] == "gpu_busy", want["verdict"]
    assert got["verdict"] == want["verdict"]
    assert got["gpu"] == want["gpu"]
    assert want["gpu"]["level"] == "high" and want["gpu"]["forwards_covered"] == want["gpu"]["forwards"]
    _no_host_advice(want["problems"])
    _no_host_advice(got["problems"])
    memory = next(e for e in want["verdict"]["evidence"] if e.startswith("GPU memory during"))
    # one GPU per worker that ran the forwards, never one per gateway that ran the requests
    gpus = layout.get("workers", 1)
    assert ("of 80 GiB" in memory) is (gpus == 1) and (f"({gpus} GPUs" in memory) is (gpus > 1), memory
    assert not any("no GPU data" in e for e in want["verdict"]["evidence"])


def test_the_worker_owns_the_forwards_it_recorded(tmp_path: Path) -> None:
    rec = load_paths([gateway_worker(tmp_path / "gw.jsonl")])
    requests = find_requests(rec.spans)
    assert {process_key(r.resource) for r in requests} == {
        "service.name=vlm-gateway,service.instance.id=gw-a",
        "service.name=vlm-gateway,service.instance.id=gw-b"}
    found = forward_owners(requests, rec.metrics)
    assert {w[0] for w in found.windows} == {WORKER} and len(found.windows) == 40
    assert WORKER in found.owners and found.hosts[WORKER] == "gpu-node-1"
    assert unowned_gpu_senders(rec.metrics, {process_key(r.resource) for r in requests})


def test_without_a_gpu_sender_outside_the_requests_the_forwards_stay_with_the_request(
        tmp_path: Path) -> None:
    """GPU points from the gateways only: no point can be the worker's, so its forwards stay with
    their requests' processes, as before (and as the SQL, which then reads no forward span)."""
    rec = load_paths([gateway_worker(tmp_path / "gw.jsonl", worker_gpu=False, gateway_gpu=True)])
    requests = find_requests(rec.spans)
    keys = {process_key(r.resource) for r in requests}
    assert not unowned_gpu_senders(rec.metrics, keys)
    found = forward_owners(requests, rec.metrics)
    assert {w[0] for w in found.windows} == keys and found.owners == keys


def test_a_forward_recorded_by_another_request_process_stays_with_its_request(tmp_path: Path) -> None:
    """Only a process that ran no request takes a forward: one that ran requests of its own is
    another replica (the common fleet), whose forwards in another's trace are not its model's."""
    # a node exporter that ran no request: the forward spans' own processes are read
    rec = load_paths([gateway_worker(tmp_path / "gw.jsonl", worker_gpu=False,
                                     exporter_host="gpu-node-1")])
    requests = find_requests(rec.spans)
    gateways = {process_key(r.resource) for r in requests}
    assert {w[0] for w in forward_owners(requests, rec.metrics, gateways).windows} == {WORKER}
    found = forward_owners(requests, rec.metrics, gateways | {WORKER})  # the worker ran requests too
    assert unowned_gpu_senders(rec.metrics, gateways | {WORKER})
    assert {w[0] for w in found.windows} == gateways


def test_the_file_report_says_gpu_busy_without_the_host_advice(tmp_path: Path) -> None:
    """The finding as reported: no 'no GPU data', no advice to enable a running sampler."""
    report = diagnose(load_paths([gateway_worker(tmp_path / "gw.jsonl")])).to_dict()
    assert report["verdict"]["cause"] == "gpu_busy"
    assert not any("enable the GPU sampler" in a for a in report["verdict"]["advice"])
    _no_host_advice(report["problems"])


@pytest.mark.parametrize(("layout", "read"), [
    ({"worker_gpu": False, "gateway_gpu": True}, 0),  # GPU points from the request processes only
    ({}, 40),                                         # the worker's own: every forward it recorded
])
def test_the_sql_reads_the_forward_spans_own_process_only_when_needed(
        engine, tmp_path: Path, layout: dict[str, Any], read: int) -> None:
    """The forward spans' processes are read only when some GPU point comes from a process that
    ran no request, and kept only for the forwards such a process recorded: the common case (and
    the 10 M-span benchmark, whose GPU points come from the request processes) joins nothing."""
    tables = Tables(database=f"fw{read}")
    import_files(engine, tables, [gateway_worker(tmp_path / "gw.jsonl", **layout)])
    results, _ = run_queries(engine, tables, AggregateQuery())
    assert int(results["forward_owners"][0]["n"]) == read


def test_the_common_case_with_a_node_exporter_keeps_no_forward(engine, tmp_path: Path) -> None:
    """One process records each request and its forward, a node exporter sends the GPU points
    (a sender without requests: the forward spans are read, none kept): nothing changes."""
    from tests.test_clickhouse_issues import TRACES, _gpu_elsewhere

    tables = Tables(database="fwdcgm")
    import_files(engine, tables, [_gpu_elsewhere(TRACES / "gpu_busy.otlp.jsonl",
                                                 tmp_path / "dcgm.jsonl", 1)])
    results, _ = run_queries(engine, tables, AggregateQuery())
    assert int(results["forward_owners"][0]["n"]) == 0
