"""``--service`` and the far side of a call: the spans between a call and the request it calls
(proxies, the callee's server span) and the GPU points of the callee's node go with the requests
left out; a cold start, a warm-up (capped too) paid inside a left-out call are the callee's; a
call into two or three services; stage maps that rename the call; file report and ClickHouse
report alike (tester L).
The recordings: :func:`tests.test_service_calls.gateway_calls_worker`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import advice, load_paths
from otel_stages.analysis.calls import MAX_CALL_HOPS
from otel_stages.analysis.services import pick_service
from otel_stages.cli import main
from tests import fleet_calls
from tests.odd_inputs import _attr
from tests.test_clickhouse_issues import engine
from tests.test_service_calls import (
    GATEWAY,
    LEFT_OUT,
    WORKER,
    N,
    _calls_worker,
    _file,
    _resource,
    _sql,
    gateway_calls_worker,
)

__all__ = ["engine"]  # the chDB fixture


@pytest.mark.parametrize("hops", [3, MAX_CALL_HOPS, MAX_CALL_HOPS + 1])
def test_a_call_through_proxies_is_a_call_up_to_max_call_hops(engine: Any, tmp_path: Path, hops: int) -> None:
    """A worker's request ``hops`` parent links below the POST (proxies' spans and the worker's
    server span in between, none a stage or request): a call up to MAX_CALL_HOPS (a tester's
    gateway behind one proxy, 3 hops, read its call as a custom stage and, with ``--service``,
    got a custom stage's advice); past it, POST ranks as a custom stage again; both reports."""
    assert MAX_CALL_HOPS == 5
    path = gateway_calls_worker(tmp_path / f"calls_{hops}.jsonl", hops=hops)
    want = _file(path)
    if hops <= MAX_CALL_HOPS:
        _calls_worker(want)
    else:
        assert (want["verdict"]["cause"], want["verdict"]["stage"]) == ("other", "POST")
        assert not any("is a call" in e for e in want["verdict"]["evidence"])
    picked = _file(path, GATEWAY)["verdict"]
    assert (picked["evidence"][0].startswith("POST is a call into") is (hops <= MAX_CALL_HOPS))
    if hops >= MAX_CALL_HOPS:  # (the SQL at the bound, both sides; CI time)
        assert _sql(engine, path)["verdict"] == want["verdict"]
    if hops == MAX_CALL_HOPS:
        assert _sql(engine, path, GATEWAY)["verdict"] == picked


def _moved(path: Path, name: str, service: str, *, gpu: bool = False) -> Path:
    """``path`` with the spans named ``name`` that the gateway's resource holds (its client span;
    with 3 hops, its proxy's SERVER spans ``POST /infer``) moved to a resource of ``service``;
    ``gpu``: which sends GPU points too (a copy of the worker's: a router with a GPU of its own)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    moved: list[dict[str, Any]] = []
    for line in lines:
        for rs in line.get("resourceSpans", [])[:1]:
            if rs["resource"] == _resource(GATEWAY, "gw-0"):
                for ss in rs["scopeSpans"]:
                    moved += [s for s in ss["spans"] if s["name"] == name]
                    ss["spans"] = [s for s in ss["spans"] if s["name"] != name]
    lines.append({"resourceSpans": [{"resource": _resource(service, "px-0"),
                                     "scopeSpans": [{"spans": moved}]}]})
    if gpu:
        gauge = json.loads(json.dumps(next(line for line in lines if "resourceMetrics" in line)))
        gauge["resourceMetrics"][0]["resource"] = _resource(service, "px-0")
        lines.append(gauge)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("proxy", [GATEWAY, "edge-proxy"])
def test_the_spans_between_a_call_and_the_requests_left_out_go_with_them(
        engine: Any, tmp_path: Path, proxy: str) -> None:
    """``--service gateway`` over a worker's request 3 links below the gateway's POST: the spans of
    other services between them (the worker's server span; a proxy's, when the proxy is a service
    of its own) are left out with the worker's request, the gateway's own (its proxy span) kept;
    so the worker's GPU points go too, as with one hop, and no GPU exporter on a host no request
    names is reported; both reports."""
    path = gateway_calls_worker(tmp_path / "calls_3.jsonl", hops=3)
    if proxy != GATEWAY:
        _moved(path, "POST /infer", proxy, gpu=True)
    picked = pick_service(load_paths([path]), GATEWAY)
    assert {str(s.resource.get("service.name")) for s in picked.spans} == {GATEWAY}
    assert sum(s.name == "POST /infer" for s in picked.spans) == (N if proxy == GATEWAY else 0)
    assert picked.metrics == []
    want = _file(path, GATEWAY)
    assert want["problems"] == []
    if proxy != GATEWAY:  # (the SQL where the walk goes furthest; CI time)
        got = _sql(engine, path, GATEWAY)
        assert got["problems"] == []
        assert got["verdict"] == want["verdict"] and got["counts"] == want["counts"]
        assert got["gpu"] == want["gpu"]


def test_a_stage_recorded_by_another_service_stays_though_it_holds_a_request_left_out(
        engine: Any, tmp_path: Path) -> None:
    """The gateway's call span recorded by a sidecar (a service of its own, its spans children of
    the gateway's request span): it is a stage of the gateway's requests, so ``--service gateway``
    keeps it though the worker's request under it is left out; both reports."""
    path = _moved(gateway_calls_worker(tmp_path / "sidecar.jsonl"), "POST", "gateway-sidecar")
    picked = pick_service(load_paths([path]), GATEWAY)
    assert sum(s.name == "POST" for s in picked.spans) == N
    assert not any(s.name == "forward" for s in picked.spans)
    want, got = _file(path, GATEWAY), _sql(engine, path, GATEWAY)
    assert "POST" in want["stages"] and want["verdict"]["stage"] == "POST"
    assert got["verdict"] == want["verdict"] and got["counts"] == want["counts"]
    assert got["stages"]["POST"] == want["stages"]["POST"]


COLD_IN_CALL = (", in POST: a call into vlm-worker's requests, which --service leaves out, so the cold"
                " start is vlm-worker's")


@pytest.mark.parametrize("slow_forwards", [True, False])  # the warm verdict the call's; steady
def test_the_callees_cold_start_paid_inside_a_left_out_call_is_the_callees(
        engine: Any, tmp_path: Path, slow_forwards: bool) -> None:
    """``--service gateway``: the gateway's first request waits out the worker's cold start inside
    its POST. That cold start is the worker's: the cold line says so and advises warming the
    worker (a tester's gateway report advised "also: warm the model up" for the gateway, which
    loads no model); where the warm runs are steady the cold-start verdict names the call and its
    service; both reports."""
    path = gateway_calls_worker(tmp_path / "cold.jsonl", slow_forwards=slow_forwards)
    want = _file(path, GATEWAY)
    v = want["verdict"]
    if slow_forwards:
        assert (v["cause"], v["stage"]) == ("other", "POST")
        cold = next(e for e in v["evidence"] if e.startswith("first request of the process"))
        assert cold.endswith("a cold start too" + COLD_IN_CALL)
        assert v["advice"][-1] == "also: " + advice.cold_in_call("POST", [WORKER])
    else:
        assert (v["cause"], v["stage"]) == ("cold_start", "POST")
        assert v["evidence"][-1] == ("POST is a call into vlm-worker's requests, which --service"
                                     " leaves out of this report, so the cold start is vlm-worker's")
        assert v["advice"] == [advice.cold_in_call("POST", [WORKER])]
    assert not any(a.endswith(advice.WARM_UP) for a in v["advice"])
    assert _sql(engine, path, GATEWAY)["verdict"] == v


def test_a_cold_start_outside_the_call_stays_the_services_own(engine: Any, tmp_path: Path) -> None:
    """The gateway's own first decode 1.4 s slower, the worker's first forward as its others: the
    cold start is the gateway's (its decode's advice, no call named); both reports."""
    path = gateway_calls_worker(tmp_path / "own_cold.jsonl", slow_forwards=False, cold_ms=50.0,
                                own_cold_ms=1400.0)
    v = _file(path, GATEWAY)["verdict"]
    assert (v["cause"], v["stage"]) == ("cold_start", "decode")
    assert not any("cold start is" in e for e in v["evidence"])
    assert v["advice"][0] == advice.for_cold_start("decode")[0]
    assert _sql(engine, path, GATEWAY)["verdict"] == v


@pytest.mark.parametrize("pool_ms", [0.0, 200.0])  # the worker's swing; the gateway's own wait
def test_a_stage_map_that_renames_the_call_keeps_it_a_call(tmp_path: Path, pool_ms: float,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``--service gateway --stage-map`` with ``{stage: upstream, span: POST}``: the call found
    under its span's name is said under the map's stage (a tester's map lost the call line and got
    the custom stage's advice); where the gateway's own wait swings, its advice stays (a tester's:
    the map's "timed from the server's own telemetry ... look at the server's metrics" replaced the
    pool-wait advice the evidence gave)."""
    path = gateway_calls_worker(tmp_path / "mapped.jsonl", pool_ms=pool_ms)
    mapfile = tmp_path / "gateway.yaml"
    mapfile.write_text("name: gw\nrequest: request\nstages:\n  - {stage: download, span: download}\n"
                       "  - {stage: decode, span: decode}\n  - {stage: resize, span: resize}\n"
                       "  - {stage: upstream, span: POST}\n")
    assert main(["report", str(path), "--service", GATEWAY, "--stage-map", str(mapfile), "--json"]) == 0
    v = json.loads(capsys.readouterr().out)["verdict"]
    if pool_ms:
        assert (v["cause"], v["stage"]) == ("call", "upstream")
        assert v["evidence"][0].endswith("the wait is gateway's own")
        assert v["advice"][0] == advice.CALL_OWN_BEFORE.format(stage="upstream")
        assert not any("server's own telemetry" in a for a in v["advice"])
        return
    assert (v["cause"], v["stage"]) == ("other", "upstream")
    assert v["evidence"][0] == LEFT_OUT.replace("POST", "upstream")
    assert v["advice"][0] == advice.left_out_call("upstream", WORKER)
    assert not {advice.CUSTOM_SUBSTEPS, advice.CUSTOM_IS_STANDARD} & set(v["advice"])


def _two_workers(path: Path) -> Path:
    """``path`` with every second worker request by start (its queue and forward with it) moved to
    a resource of ``xocr-worker``: the gateway's POST calls two services, the first call (cold)
    and every slow forward staying with vlm-worker's."""
    return _workers(path, ["xocr-worker"])


def _workers(path: Path, others: list[str], *, renumber: bool = False) -> Path:
    """``path`` with the worker requests by start dealt out in turn to vlm-worker and ``others``
    (each a resource of its own; a request's queue and forward with it): the first one (cold)
    stays vlm-worker's. The slow forwards stay where the turn puts them. ``renumber``: each
    process's ``request.seq`` counts its own requests from 1 (each worker's first one cold)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    worker = [s for line in lines for rs in line.get("resourceSpans", [])
              if rs["resource"] == _resource(WORKER, "wk-0") for ss in rs["scopeSpans"] for s in ss["spans"]]
    requests = sorted((s for s in worker if s["name"] == "request"), key=lambda s: int(s["startTimeUnixNano"]))
    for i, name in enumerate(others, start=1):
        moved_ids = {r["spanId"] for r in requests[i::len(others) + 1]}
        moved = [s for s in worker if s["spanId"] in moved_ids or s["parentSpanId"] in moved_ids]
        for line in lines:
            for rs in line.get("resourceSpans", []):
                for ss in rs["scopeSpans"]:
                    ss["spans"] = [s for s in ss["spans"] if s not in moved]
        lines.append({"resourceSpans": [{"resource": _resource(name, f"{name}-0"),
                                         "scopeSpans": [{"spans": moved}]}]})
        if renumber:
            _renumber([r for r in requests if r["spanId"] in moved_ids])
    if renumber:
        _renumber(requests[::len(others) + 1])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("forwards", [11, 12])
def test_a_capped_warm_up_paid_inside_a_left_out_call_is_the_callees(engine: Any, tmp_path: Path,
                                                                      forwards: int) -> None:
    """The worker's warm-up outlasts the WARMUP_MAX_REQUESTS looked at (11 or 12 forwards after its
    cold one, each slower than the warm runs): the gateway's verdict is tentative (the warm runs may
    hold the warm-up's tail), and its caveat advised "warm the model up at startup with more than
    10 dummy requests" beside the line saying the warm-up is vlm-worker's; with 12, one of the
    gateway's warm-up requests called one the worker keeps warm at its own cap, and the warm-up
    was said the gateway's (WARM_UP_CALL_MIN_SHARE). The caveat's sentence keeps whose it is and
    its advice is to warm vlm-worker up; both reports."""
    path = gateway_calls_worker(tmp_path / "capped.jsonl",
                                warmup=tuple(1200.0 - 50 * i for i in range(forwards)))
    v = _file(path, GATEWAY)["verdict"]
    assert v["evidence"][0].endswith(
        "so the warm-up is vlm-worker's, and the warm runs may hold its tail, so this is tentative")
    assert v["advice"][0] == advice.warm_up_in_call("POST", WORKER, 10, False)
    assert not [a for a in v["advice"] if "warm the model up" in a]
    assert _sql(engine, path, GATEWAY)["verdict"] == v


def test_the_other_workers_cold_starts_inside_a_left_out_call_are_no_warm_up_of_the_gateway(
        engine: Any, tmp_path: Path) -> None:
    """Tester M's: POST calls wk-a, wk-b, wk-c in turn, each worker's first request cold
    (1.5 s): the gateway's second and third requests paid wk-b's and wk-c's cold starts and were
    set apart as the gateway's warm-up, with "warm the model up at startup with 3 dummy requests"
    (the gateway loads no model), each call holding only one of the two. The warm-up is the
    workers' where the stage's calls into any of its services held them; both reports."""
    workers = [{"name": "wk-a", "cold_ms": 1500.0, "slow_every": 0},
               {"name": "wk-b", "cold_ms": 1500.0, "slow_every": 0},
               {"name": "wk-c", "cold_ms": 1500.0, "slow_every": 4}]
    path = fleet_calls.make(tmp_path / "turns.jsonl", n=45, gap_ms=2000, workers=workers,
                            server_span=True, route=lambda i: i % 3)
    v = _file(path, GATEWAY)["verdict"]
    line = next(e for e in v["evidence"] if e.startswith("the warm-up lasted 3 requests"))
    assert line.endswith("each of them waited in POST for wk-b's or wk-c's requests while those started"
                         " cold or warmed up (a call --service leaves out), so the warm-up is theirs")
    assert "also: " + advice.warm_up_in_call("POST", ["wk-b", "wk-c"], 3, True) in v["advice"]
    assert not [a for a in v["advice"] if "warm the model up" in a]
    assert _sql(engine, path, GATEWAY)["verdict"] == v


def test_a_fan_out_to_two_services_at_once_has_no_own_time_of_the_others_requests(
        engine: Any, tmp_path: Path) -> None:
    """Tester M's: each POST holds one wk-a and one wk-b request at once, wk-b slow in every 4th:
    the own time was taken per service, POST less wk-a's requests only, so wk-b's slow requests
    read as the gateway's own wait after wk-a's ended ("reading the response", cause ``call``; the
    true own time a steady 3 ms). A span's own time is what none of its called requests covers,
    whichever service's: the swing is wk-b's, pooled and with ``--service gateway``; both
    reports."""
    workers = [{"name": "wk-a", "cold_ms": 1500.0, "warmup": [400.0] * 5, "slow_every": 0},
               {"name": "wk-b", "cold_ms": 1000.0, "warmup": [300.0] * 5, "slow_every": 4}]
    path = fleet_calls.make(tmp_path / "fan.jsonl", n=45, gap_ms=2000, workers=workers, fanout=2,
                            fan_workers=[0, 1], server_span=True)
    for service in (None, GATEWAY):
        v = _file(path, service)["verdict"]
        assert v["cause"] != "call"
        assert not [line for line in v["evidence"] + v["advice"] if "own time swings" in line
                    or "reading the response" in line]
        assert _sql(engine, path, service)["verdict"] == v
    assert v["evidence"][0].startswith("POST is a call into wk-b's requests (45 of its 45 spans hold"
                                       " one; wk-a's in 45 more)")
    assert v["advice"][0] == advice.left_out_call("POST", "wk-b")


@pytest.mark.parametrize("small_ms, differ", [(300.0, True), (56.0, False)])
def test_a_call_into_services_of_different_speeds_swings_with_which_one_it_calls(
        engine: Any, tmp_path: Path, small_ms: float, differ: bool) -> None:
    """Tester M's: a tenth of the gateway's POSTs call wk-small (a steady 300 ms), the rest wk-big
    (a steady 50 ms): ``--service gateway`` said wk-big's requests held POST's 250 ms swing ("the
    time they cover swings 1.8 ms ... so the swing is theirs") and advised wk-big's report, which
    reads steady. Each callee steady and their ranges a material swing apart: the swing is which
    one a request calls, with the advice to compare like with like and the slower service; with
    wk-small at 56 ms (no material swing between them) nothing of the kind is said; both
    reports."""
    workers = [{"name": "wk-big", "cold_ms": 1500.0, "slow_every": 0},
               {"name": "wk-small", "cold_ms": 1500.0, "fwd": small_ms, "slow_every": 0}]
    path = fleet_calls.make(tmp_path / "speeds.jsonl", n=60, gap_ms=2000, workers=workers,
                            route=lambda i: 1 if i % 10 == 5 else 0)
    v = _file(path, GATEWAY)["verdict"]
    said = [e for e in v["evidence"] if "a request calls, not a swing inside one" in e]
    assert bool(said) is differ
    if differ:
        assert said[0].startswith("POST is a call into wk-big's requests (54 of its 60 spans hold one;"
                                  " wk-small's in 6 more), which --service leaves out of this report:"
                                  " each service's requests are steady there")
        assert v["advice"][0] == advice.calls_differ("POST", "wk-small", ["wk-big", "wk-small"])
        assert not [a for a in v["advice"] if a.startswith("report wk-big alone")]
    assert _sql(engine, path, GATEWAY)["verdict"] == v


def test_a_co_suspects_advice_stays_beside_the_left_out_calls(engine: Any, tmp_path: Path) -> None:
    """Tester M's: the gateway's own decode slower for its first 12 requests while POST swings with
    the worker's forwards: "decode swings about as much ... so the advice covers both", yet the
    advice held the call's lines alone. The co-suspect's lines stay (headed ``decode:``), the
    call's headed ``POST:``; both reports."""
    workers = [{"name": "vlm-worker", "cold_ms": 1500.0, "warmup": [400.0] * 5, "slow_every": 4}]
    path = fleet_calls.make(tmp_path / "both.jsonl", n=50, gap_ms=2000, workers=workers,
                            gw_cold_ms=400.0, gw_warmup=[250.0] * 12)
    v = _file(path, GATEWAY)["verdict"]
    assert any(e.startswith("decode swings about as much") and e.endswith("so the advice covers both")
               for e in v["evidence"])
    assert v["advice"][0] == "POST: " + advice.left_out_call("POST", WORKER)
    assert [a for a in v["advice"] if a.startswith("decode: ")]
    assert _sql(engine, path, GATEWAY)["verdict"] == v


def _renumber(requests: list[dict[str, Any]]) -> None:
    for i, r in enumerate(requests, start=1):
        for a in r["attributes"]:
            if a["key"] == "request.seq":
                a["value"] = {"intValue": str(i)}


def test_a_call_into_three_services_each_under_the_call_share_is_a_call(engine: Any, tmp_path: Path) -> None:
    """A tester's: POST calls vlm-worker, xocr-worker and xemb-worker in a third of its spans each,
    each under CALL_MIN_SHARE, and was read as the gateway's custom stage ("time its sub-steps").
    The share is of the spans that call any service's requests read: a call into each of them,
    in the pooled report (a line each, never ranked) and with ``--service gateway`` (left out, one
    said and the others named); both reports."""
    path = _workers(gateway_calls_worker(tmp_path / "three.jsonl"), ["xocr-worker", "xemb-worker"],
                    renumber=True)
    pooled = _file(path)["verdict"]
    lines = [e for e in pooled["evidence"] if e.startswith("POST is a call into ")]
    assert [line.split("'s requests")[0] for line in lines] == [
        f"POST is a call into {WORKER}", "POST is a call into xemb-worker", "POST is a call into xocr-worker"]
    assert pooled["stage"] != "POST"
    picked = _file(path, GATEWAY)["verdict"]
    assert picked["evidence"][0].startswith("POST is a call into ")
    said = picked["evidence"][0].removeprefix("POST is a call into ").split("'s requests")[0]
    others = sorted({WORKER, "xocr-worker", "xemb-worker"} - {said})
    assert all(f"; {name}'s in 13 more" in picked["evidence"][0] or f"; {name}'s in 14 more"
               in picked["evidence"][0] for name in others)
    assert picked["advice"][0] == advice.left_out_call("POST", said)
    assert _sql(engine, path)["verdict"] == pooled
    assert _sql(engine, path, GATEWAY)["verdict"] == picked


def test_a_call_into_two_services_left_out_names_the_one_whose_time_swings(
        engine: Any, tmp_path: Path) -> None:
    """A tester's: POST calls vlm-worker (the slow forwards, the cold start) in half its spans and
    xocr-worker (steady) in the other half; ``--service gateway`` named xocr-worker's requests as
    holding POST's swing ("the time they cover swings 1.9 ms ... so the swing is theirs" beside a
    240.9 ms swing) and its cold start. The swing is said over vlm-worker's, the other named; the
    cold start is one of theirs (the figures do not say whose); both reports. (The other worker's
    name sorts after the first's: neither the order found nor the name picks the one said.)"""
    path = _two_workers(gateway_calls_worker(tmp_path / "two.jsonl"))
    v = _file(path, GATEWAY)["verdict"]
    assert v["evidence"][0].startswith(
        f"POST is a call into {WORKER}'s requests (20 of its 40 spans hold one; xocr-worker's in 20"
        " more), which --service leaves out of this report: the time they cover swings 24")
    assert v["advice"][0] == advice.left_out_call("POST", WORKER)
    cold = next(e for e in v["evidence"] if e.startswith("first request of the process"))
    assert cold.endswith(", in POST: a call into vlm-worker's or xocr-worker's requests, which --service"
                         " leaves out, so the cold start is vlm-worker's or xocr-worker's")
    assert v["advice"][-1] == "also: " + advice.cold_in_call("POST", [WORKER, "xocr-worker"])
    assert _sql(engine, path, GATEWAY)["verdict"] == v


def _exporter(path: Path, host: str) -> Path:
    """``path`` with the worker's GPU points sent by a node exporter of its own service.name
    (``dcgm-exporter``, no span) on ``host``."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        for rm in line.get("resourceMetrics", []):
            rm["resource"] = {"attributes": [_attr("service.name", "dcgm-exporter"), _attr("host.name", host)]}
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("host, kept", [("wk-0-node", False), ("gw-0-node", True),
                                        ("one-node", True)])  # the gateway on the worker's node
def test_a_node_exporter_on_the_left_out_workers_host_goes_with_it(engine: Any, tmp_path: Path,
                                                                   host: str, kept: bool) -> None:
    """A tester's: the worker's GPU points sent by a node exporter (a metrics-only process of its
    own service.name) on the worker's host. ``--service gateway`` kept them (a metrics-only
    process's points are kept, for the GPU rules to place by host.name) and printed "GPU points of
    1 process that ran no request, on hosts no request process names (e.g. host.name wk-0-node)":
    a host only the requests left out name is theirs, and so are its points; on a host a span kept
    names (the gateway's), they stay. The worker's own report keeps those on its host, shared with
    the gateway's too (``one-node``: the gateway's requests left out there, the worker's kept);
    both reports."""
    path = _exporter(gateway_calls_worker(tmp_path / "exporter.jsonl"), host)
    if host == "one-node":
        path.write_text(path.read_text().replace('"gw-0-node"', '"one-node"').replace('"wk-0-node"', '"one-node"'))
    assert bool(pick_service(load_paths([path]), GATEWAY).metrics) is kept
    want = _file(path, GATEWAY)
    assert want["problems"] == []
    if host == "wk-0-node":  # (the SQL where each side decides; CI time)
        got = _sql(engine, path, GATEWAY)
        assert got["problems"] == [] and got["gpu"] == want["gpu"] and got["verdict"] == want["verdict"]
    if host != "gw-0-node":
        worker = _file(path, WORKER)
        assert (worker["verdict"]["cause"], worker["problems"]) == ("gpu_busy", [])
        if host == "one-node":
            assert _sql(engine, path, WORKER)["verdict"] == worker["verdict"]


@pytest.mark.parametrize("shape, whose", [
    ({"warmup": (900.0, 600.0, 300.0)}, WORKER),  # the worker's forwards after its cold one
    ({"own_warmup": (0.0, 700.0), "cold_ms": 50.0, "own_cold_ms": 1400.0, "slow_forwards": False},
     None),  # the gateway's own decodes
])
def test_a_warm_up_paid_inside_a_left_out_call_is_the_callees(engine: Any, tmp_path: Path,
                                                               shape: dict[str, Any], whose: str | None) -> None:
    """A tester's: ``--service gateway`` where the worker's forwards warm up after its cold one:
    the gateway's requests that waited in POST for them were set apart as its warm-up with the
    advice "warm the model up at startup with 2 dummy requests" (the gateway loads no model). The
    warm-up is the worker's where every request set apart as warm-up called a worker's request
    that was cold or set apart there; a warm-up in the gateway's own decode stays its own; both
    reports."""
    path = gateway_calls_worker(tmp_path / "warmup.jsonl", **shape)
    v = _file(path, GATEWAY)["verdict"]
    line = next(e for e in v["evidence"] if e.startswith("the warm-up lasted 2 requests"))
    said = ("each of them waited in POST for vlm-worker's requests while those warmed up (a call"
            " --service leaves out), so the warm-up is vlm-worker's")
    assert line.endswith(said) is (whose is not None)
    if whose is not None:
        assert v["advice"][-1] == "also: " + advice.warm_up_in_call("POST", WORKER, 2, True)
        assert advice.warm_up_with(2, True) not in " ".join(v["advice"])
    else:
        assert any(a.endswith(advice.warm_up_with(2, True)) for a in v["advice"])
    assert _sql(engine, path, GATEWAY)["verdict"] == v
