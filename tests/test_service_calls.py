"""A gateway whose own request calls a worker's request, one trace, two services (a tester's
fleet): ``--service`` picks each service's requests (not whole traces), and the unfiltered report
reads the gateway's HTTP client span as a call into the worker's requests, not as a custom stage
that outranks the worker's stages; the file report and the ClickHouse report alike.

The tester's recording: gateway ``request`` (``download``, ``decode``, ``resize``, then httpx's
``POST`` CLIENT span), the worker's ``request`` (``queue``, ``forward``) a child of that ``POST``;
the worker's forward swings with its GPU 85-97 % busy. The report said "other (stage: POST)", with
the advice ``--service vlm-worker``, which printed the same report again.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import advice, load_paths
from otel_stages.analysis.calls import MAX_CALL_HOPS, remote_calls
from otel_stages.analysis.clickhouse import Tables, fetch_aggregates, import_files
from otel_stages.analysis.clickhouse_figures import report_dict
from otel_stages.analysis.clickhouse_sql import AggregateQuery
from otel_stages.analysis.cohorts import CohortKeys, set_apart_and_warmup
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.model import Call
from otel_stages.analysis.requests import group_spans
from otel_stages.analysis.services import no_request_line, pick_service
from otel_stages.cli import main
from tests.odd_inputs import _attr
from tests.test_clickhouse_issues import _dbs, engine

__all__ = ["engine"]  # the chDB fixture

BASE_NS = 1_790_000_000_000_000_000
MS = 10**6
N = 40
GATEWAY, WORKER = "gateway", "vlm-worker"


def _resource(service: str, instance: str, namespace: str | None = None) -> dict[str, Any]:
    return {"attributes": [_attr("service.name", service), _attr("service.instance.id", instance),
                           _attr("host.name", f"{instance}-node"),
                           *([_attr("service.namespace", namespace)] if namespace else [])]}


def _span(trace: str, sid: str, parent: str | None, name: str, start: int, end: int,
          attrs: dict[str, object] | None = None, kind: int = 1) -> dict[str, Any]:
    return {"traceId": trace, "spanId": sid, "parentSpanId": parent or "", "name": name, "kind": kind,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
            "attributes": [_attr(k, v) for k, v in (attrs or {}).items()], "status": {}}


def gateway_calls_worker(path: Path, *, hops: int = 1, calls: int = N, worker_only: bool = False,
                         gateway: str = GATEWAY, call_name: str = "POST", pool_ms: float = 0.0,
                         slow_forwards: bool | None = None, warmup: tuple[float, ...] = (),
                         fanout: int = 1, unrecorded_ms: float = 0.0, repeat: int = 1,
                         fail_first_ms: float = 0.0, fanout_gap_ms: float = 1.0,
                         read_ms: float = 0.0, cold_ms: float = 1500.0,
                         own_cold_ms: float = 0.0, own_warmup: tuple[float, ...] = ()) -> Path:
    """``N`` gateway requests (``download`` 8, ``decode`` 12, ``resize`` 3 ms, then a ``POST``
    CLIENT span); the first ``calls`` of them call the worker: its ``request`` (``queue`` 2 ms,
    ``forward`` 50 ms, every fourth 250-290 ms, the first 1.5 s: its cold start) ``hops`` parent
    links below the ``POST`` (1: its child; 2: under the worker's server span; 3: under a proxy's
    span too); the others' ``POST`` calls something not recorded (55 ms). The worker's GPU is
    90 % busy in its forwards, idle between. ``worker_only``: the worker's spans and points alone
    (what its own files would hold). ``gateway``: the gateway's service.name (the worker's: one
    name for both, the gateway in service.namespace ``edge``, the worker in ``gpu``);
    ``call_name``: the client span's name (``forward``: a gateway's stage around its call).
    ``pool_ms``: every fourth call waits ``pool_ms`` (x 1 / 1.1 / 1.2) in the gateway's client
    before the worker's request starts (a connection pool's wait, inside POST, outside the
    worker), the worker's forward then a steady 50 ms after its cold start unless
    ``slow_forwards`` (then the waits fall on other calls: every fourth from the first).
    ``warmup``: the worker's forwards after its cold one (ms: a warm-up). ``fanout``: worker
    requests each call makes at once (1 ms apart). ``unrecorded_ms``: every second call that
    reaches no recorded worker takes this long (not 55 ms). ``repeat``: every fourth call (from
    the third) makes this many worker requests one after another (retries), the forwards steady;
    ``fail_first_ms``: the first of them fails (status ERROR) after a forward this long.
    ``fanout_gap_ms``: how far apart a fan-out's requests start (0: in one nanosecond).
    ``read_ms``: as ``pool_ms``, but after the worker's request ends (reading the response).
    ``cold_ms``: the worker's first forward; ``own_cold_ms``: what the gateway's first decode
    takes more (its own cold start); ``own_warmup``: what its decodes after the first take more
    (ms: its own warm-up)."""
    slow_forwards = not (pool_ms or read_ms) if slow_forwards is None else slow_forwards
    r = random.Random(7)
    ids = iter(f"{r.getrandbits(64):016x}" for _ in range(100 * N))
    gateway_spans: list[dict[str, Any]] = []
    worker: list[dict[str, Any]] = []
    points: list[tuple[int, float]] = []
    for i in range(N):
        trace = f"{r.getrandbits(128):032x}"
        t = BASE_NS + i * 1000 * MS
        rid = next(ids)
        stages = []
        c = t + MS // 20
        for name, ms, attrs in (("download", 8.0, {}),
                                ("decode", 12.0, {"image.width": 1024, "image.height": 768,
                                                  "image.size": 150_000, "image.format": "JPEG"}),
                                ("resize", 3.0, {})):
            ms += r.uniform(-0.2, 0.2) + (own_cold_ms if i == 0 and name == "decode" else 0.0)
            ms += own_warmup[i - 1] if name == "decode" and 0 < i <= len(own_warmup) else 0.0
            stages.append(_span(trace, next(ids), rid, name, c, c + int(ms * MS), attrs))
            c += int(ms * MS) + MS // 50
        slow = i % 4 == 2
        forward = cold_ms if i == 0 else warmup[i - 1] if i <= len(warmup) else (
            250.0 + (i % 3) * 20 if slow and slow_forwards else 50.0 + r.uniform(-1, 1))
        waits = i % 4 == (0 if slow_forwards else 2)
        wait = pool_ms * (1 + (i % 3) / 10) if waits else 0.0
        read = read_ms * (1 + (i % 3) / 10) if waits else 0.0
        inner = 2.0 + forward + 0.2
        calls_made = repeat if slow and repeat > 1 else fanout
        failed_inner = 2.0 + fail_first_ms + 0.2 if calls_made > 1 and fail_first_ms else inner
        call = (inner + 2.0 + wait + read + (fanout - 1)
                + (calls_made - 1) * (failed_inner + 1.0) * (fanout == 1)
                if i < calls else
                (unrecorded_ms if unrecorded_ms and i % 2 else 55.0) + r.uniform(-0.5, 0.5))
        post = next(ids)
        stages.append(_span(trace, post, rid, call_name, c, c + int(call * MS), kind=3))
        end = c + int(call * MS) + MS // 10
        gateway_spans += [_span(trace, rid, None, "request", t, end, {"request.seq": i + 1}), *stages]
        if i >= calls:
            continue
        for j in range(calls_made):
            gap = (int(j * fanout_gap_ms * MS) if fanout > 1  # at once, or in turn
                   else int(j * (failed_inner + 1.0) * MS))
            above, s = post, c + MS // 2 + int(wait * MS) + gap
            fails = j == 0 and calls_made > 1 and bool(fail_first_ms)
            took, fwd = (failed_inner, fail_first_ms) if fails else (inner, forward)
            for k in range(hops - 1):  # a proxy's span, then the worker's server span
                sid = next(ids)
                target = worker if k == hops - 2 else gateway_spans
                target.append(_span(trace, sid, above, "POST /infer", s, s + int((took + 0.5) * MS), kind=2))
                above, s = sid, s + MS // 10
            wid, q = next(ids), s + MS // 10
            request = _span(trace, wid, above, "request", s, s + int(took * MS),
                            {"request.seq": i * max(fanout, repeat) + j + 1})
            if fails:
                request["status"] = {"code": 2, "message": "upstream timeout"}
            worker += [request, _span(trace, next(ids), wid, "queue", q, q + 2 * MS),
                       _span(trace, next(ids), wid, "forward", q + 2 * MS, q + int((2 + fwd) * MS))]
            f0, f1 = q + 2 * MS, q + int((2 + fwd) * MS)
            points += [(f, 0.9 + r.uniform(-0.03, 0.03)) for f in range(f0 + 2 * MS, f1, 10 * MS)]
            points += [(f1 + 20 * MS, 0.02), (f1 + 200 * MS, 0.02)]
    gauge = {"resourceMetrics": [{"resource": _resource(WORKER, "wk-0"), "scopeMetrics": [{"metrics": [
        {"name": "hw.gpu.utilization", "unit": "1", "gauge": {"dataPoints": [
            {"timeUnixNano": str(tp), "asDouble": v,
             "attributes": [_attr("hw.id", "GPU-0"), _attr("hw.type", "gpu")]} for tp, v in points]}}]}]}]}
    shared = gateway == WORKER
    lines = [] if worker_only else [{"resourceSpans": [{
        "resource": _resource(gateway, "gw-0", "edge" if shared else None),
        "scopeSpans": [{"spans": gateway_spans}]}]}]
    lines += [{"resourceSpans": [{"resource": _resource(WORKER, "wk-0", "gpu" if shared else None),
                                  "scopeSpans": [{"spans": worker}]}]}, gauge]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _file(path: Path, service: str | None = None) -> dict[str, Any]:
    recording = load_paths([path])
    if service is not None:
        recording = pick_service(recording, service)
    return json.loads(json.dumps(diagnose(recording).to_dict()))


def _sql(engine: Any, path: Path, service: str | None = None) -> dict[str, Any]:
    tables = Tables(database=f"i{next(_dbs)}")
    assert import_files(engine, tables, [path]).problems == []
    agg = fetch_aggregates(engine, tables, AggregateQuery(service=service))
    return json.loads(json.dumps(report_dict(agg)))


ADVICE = f"report each service alone (otel-stages report ... --service {WORKER}: the service POST calls)"


def _calls_worker(report: dict[str, Any]) -> None:
    """The pooled report of the tester's shape: the worker's forward on a busy GPU, POST said to be
    a call, the advice to report the worker alone."""
    v = report["verdict"]
    assert (v["cause"], v["stage"], v["tentative"]) == ("gpu_busy", "forward", True)
    assert v["evidence"][0].startswith("requests of 2 services are pooled here")
    assert v["evidence"][1].startswith(f"POST is a call into {WORKER}'s requests ({N} of its {N} spans")
    assert v["advice"][0] == ADVICE
    assert not any("widest, POST" in e for e in v["evidence"])


@pytest.mark.parametrize("hops", [1, 2])  # the client span's child; under the server span
def test_a_call_is_no_suspect_and_the_advice_names_the_called_service(
        engine: Any, tmp_path: Path, hops: int) -> None:
    path = gateway_calls_worker(tmp_path / f"calls_{hops}.jsonl", hops=hops)
    want = _file(path)
    _calls_worker(want)
    assert want["stages"]["POST"]["explains"] > want["stages"]["forward"]["explains"]  # (it would lead)
    got = _sql(engine, path)
    assert got["verdict"] == want["verdict"]


def test_the_advised_command_gives_the_workers_own_report(engine: Any, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Following the advice (``--service vlm-worker``) prints another report: the worker's
    requests alone, as its own files give, firm; in both reports."""
    path = gateway_calls_worker(tmp_path / "calls.jsonl")
    alone = _file(gateway_calls_worker(tmp_path / "worker.jsonl", worker_only=True))
    assert (alone["verdict"]["cause"], alone["verdict"]["stage"]) == ("gpu_busy", "forward")
    assert not alone["verdict"]["tentative"]
    assert main(["report", str(path), "--json"]) == 0
    pooled = json.loads(capsys.readouterr().out)
    assert main(["report", str(path), "--service", WORKER, "--json"]) == 0
    picked = json.loads(capsys.readouterr().out)
    assert picked != pooled
    assert picked["verdict"] == alone["verdict"] and picked["counts"] == alone["counts"]
    assert picked["gpu"] == alone["gpu"]
    assert _sql(engine, path, WORKER)["verdict"] == alone["verdict"]


LEFT_OUT = (f"POST is a call into {WORKER}'s requests ({N} of its {N} spans hold one), which"
            " --service leaves out of this report: the time they cover swings 240.9 ms, its own"
            " time outside them 0.0 ms, so the swing is theirs")


@pytest.mark.parametrize("hops", [1, 2])  # the client span's child; under the server span
def test_service_gateway_keeps_its_requests_and_their_call(engine: Any, tmp_path: Path,
                                                           hops: int) -> None:
    """``--service gateway``: the gateway's requests alone; the worker's request in the same trace
    is left out, so POST is one stage of the gateway's. Its time being the worker's requests' and
    the call's own, the report says so and advises the worker's report and the pooled one, not a
    custom stage's sub-steps or a standard stage's name (a tester's: "name its spans forward").
    With the worker's HTTP server span between (hops 2) it is left out too, and the worker's GPU
    points with it: kept, they read as a GPU exporter on a host no request names (a problem
    printed in both reports)."""
    path = gateway_calls_worker(tmp_path / "calls.jsonl", hops=hops)
    want = _file(path, GATEWAY)
    assert want["requests"] == N and "queue" not in want["stages"]
    assert (want["verdict"]["cause"], want["verdict"]["stage"]) == ("other", "POST")
    assert not any("pooled" in e for e in want["verdict"]["evidence"])
    assert want["verdict"]["evidence"][0] == LEFT_OUT.replace("240.9", "241.0" if hops == 2 else "240.9")
    assert want["verdict"]["advice"][0] == advice.left_out_call("POST", WORKER)
    assert not {advice.CUSTOM_SUBSTEPS, advice.CUSTOM_IS_STANDARD} & set(want["verdict"]["advice"])
    got = _sql(engine, path, GATEWAY)
    assert got["verdict"] == want["verdict"] and got["counts"] == want["counts"]
    # the worker's GPU points go with its spans (a process with no span kept), in both reports
    picked = pick_service(load_paths([path]), GATEWAY)
    assert picked.metrics == []
    assert {str(s.resource.get("service.name")) for s in picked.spans} == {GATEWAY}
    assert got["gpu"] == want["gpu"]
    assert want["problems"] == got["problems"] == []


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
    assert _sql(engine, path)["verdict"] == want["verdict"]
    picked = _file(path, GATEWAY)["verdict"]
    assert (picked["evidence"][0].startswith("POST is a call into") is (hops <= MAX_CALL_HOPS))
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
    want, got = _file(path, GATEWAY), _sql(engine, path, GATEWAY)
    assert want["problems"] == got["problems"] == []
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


@pytest.mark.parametrize("calls, is_call", [(20, True), (19, False)])  # of N = 40 (CALL_MIN_SHARE)
def test_a_stage_is_a_call_from_half_of_its_spans(tmp_path: Path, calls: int, is_call: bool) -> None:
    path = gateway_calls_worker(tmp_path / f"share_{calls}.jsonl", calls=calls)
    spans = load_paths([path]).spans
    found = remote_calls(group_spans(spans).requests, spans)
    assert [(c.stage, c.service, c.calls, c.spans) for c in found] == (
        [("POST", WORKER, calls, N)] if is_call else [])


@pytest.mark.parametrize("calls, is_call", [(20, True), (19, False)])  # of N = 40 (CALL_MIN_SHARE)
def test_a_call_left_out_by_service_from_half_of_its_spans(engine: Any, tmp_path: Path, calls: int,
                                                           is_call: bool) -> None:
    """``--service gateway`` says POST calls the worker's requests it left out from
    CALL_MIN_SHARE of its spans on, in both reports; below, POST is a custom stage of the
    gateway's (what it waits for: an API this report does not read) with a custom stage's advice."""
    path = gateway_calls_worker(tmp_path / f"left_out_{calls}.jsonl", calls=calls)
    want = _file(path, GATEWAY)
    assert want["verdict"]["stage"] == "POST"
    said = [e for e in want["verdict"]["evidence"] if "which --service leaves out of" in e]
    assert [e.split(": the time")[0] for e in said] == (
        [f"POST is a call into {WORKER}'s requests ({calls} of its {N} spans hold one),"
         " which --service leaves out of this report"] if is_call else [])
    assert (advice.CUSTOM_SUBSTEPS in want["verdict"]["advice"]) is not is_call
    assert _sql(engine, path, GATEWAY)["verdict"] == want["verdict"]


def test_a_call_named_forward_left_out_by_service_gets_no_gpu_advice(engine: Any, tmp_path: Path) -> None:
    """A tester's: the gateway's call named ``forward`` (its stage around the HTTP call), reported
    with ``--service gateway``: the worker's GPU points went with its requests, and the report
    advised enabling the GPU sampler. The call's advice replaces the cause's, in both reports."""
    path = gateway_calls_worker(tmp_path / "named.jsonl", call_name="forward")
    want = _file(path, GATEWAY)
    v = want["verdict"]
    assert v["stage"] == "forward" and v["evidence"][0].startswith(
        f"forward is a call into {WORKER}'s requests")
    assert v["advice"][0] == advice.left_out_call("forward", WORKER)
    assert not [a for a in v["advice"] if "GPU" in a or "gpu" in a], v["advice"]
    assert _sql(engine, path, GATEWAY)["verdict"] == v


@pytest.mark.parametrize("wait, side", [("pool_ms", "before the called requests start"),
                                        ("read_ms", "after they end")])
def test_the_gateways_own_wait_left_out_by_service_is_the_gateways(engine: Any, tmp_path: Path,
                                                                 wait: str, side: str) -> None:
    """A tester's: every fourth POST waited 200 ms in the gateway's client (the worker steady);
    ``--service gateway`` said the call's time was the worker's and advised the worker's report,
    which read 'steady'. The call's own time outside the requests it calls is read over the
    traces before the pick: it swings, so the wait is the gateway's (cause ``call``) with the
    advice on that side, in both reports, as the pooled report says."""
    path = gateway_calls_worker(tmp_path / f"{wait}.jsonl", **{wait: 200.0})
    want = _file(path, GATEWAY)
    v = want["verdict"]
    assert (v["cause"], v["stage"]) == ("call", "POST")
    assert v["evidence"][0].startswith(
        f"POST is a call into {WORKER}'s requests ({N} of its {N} spans hold one), which --service"
        " leaves out of this report, but its own time outside them swings")
    assert f"it swings {side}" in v["evidence"][0] and v["evidence"][0].endswith("the wait is gateway's own")
    assert v["advice"][0] == (advice.CALL_OWN_BEFORE if wait == "pool_ms" else advice.CALL_OWN_AFTER
                              ).format(stage="POST")
    # (the worker's cold start, paid inside the first POST, is the worker's: said apart)
    assert v["advice"][1:] == ["also: " + advice.cold_in_call("POST", [WORKER])]
    assert _sql(engine, path, GATEWAY)["verdict"] == v


@pytest.mark.parametrize("shape, cause, said, advised", [
    # retries: every fourth call makes two worker requests, each steady (tester K)
    ({"repeat": 2, "slow_forwards": False}, "call",
     "and holds more of them in 10 of its calls than in the others (retries, or one call per item)",
     [advice.CALL_REPEATED.format(stage="POST", service=WORKER)]),
    # the worker's warm-up (set apart in its own report) is no swing of the calls (tester K)
    ({"warmup": (900.0, 700.0, 500.0, 400.0), "pool_ms": 200.0}, "call",
     "the time the called requests cover 1.7 ms", [advice.CALL_OWN_BEFORE.format(stage="POST")]),
    # both sides swing, the worker's more: the gateway's wait is a second place (tester K)
    ({"pool_ms": 180.0, "slow_forwards": True}, "other",
     "so the swing is theirs, the caller's wait a second place",
     [advice.left_out_call("POST", WORKER), advice.CALL_OWN_BEFORE.format(stage="POST")]),
    # both sides swing, the wait more: the worker's report is a second place
    ({"pool_ms": 360.0, "slow_forwards": True}, "call", "the wait is gateway's own",
     [advice.CALL_OWN_BEFORE.format(stage="POST"), advice.left_out_call("POST", WORKER)]),
], ids=["retries", "worker warm-up", "worker first", "wait first"])
def test_whose_the_left_out_calls_swing_is(engine: Any, tmp_path: Path, shape: dict[str, Any],
                                           cause: str, said: str, advised: list[str]) -> None:
    """``--service gateway``: the call's figures over the traces before the pick, its called
    requests neither cold nor set apart, judged as the pooled report judges a call (its own time,
    how many calls it makes, the called requests), each side said with its advice; both reports."""
    path = gateway_calls_worker(tmp_path / "shape.jsonl", **shape)
    v = _file(path, GATEWAY)["verdict"]
    assert (v["cause"], v["stage"]) == (cause, "POST")
    assert said in v["evidence"][0], v["evidence"][0]
    assert [a for a in v["advice"] if not a.startswith("also: ")] == advised
    assert _sql(engine, path, GATEWAY)["verdict"] == v


@pytest.mark.parametrize("service, called", [("gateway", "router"), ("router", WORKER)])
def test_a_left_out_calls_own_time_of_nothing_reads_the_same_in_both(engine: Any, tmp_path: Path,
                                                                    service: str, called: str) -> None:
    """A tester's: on the chain the own time swings by a float sum's remainder (1e-14 ms) in the
    file report, 0 in ClickHouse's integers: "0.0 µs" against "0.0 ms". Both say 0.0 ms."""
    path = chain(tmp_path / "chain.jsonl", slow_forwards=True)
    v = _file(path, service)["verdict"]
    assert v["evidence"][0].endswith("its own time outside them 0.0 ms, so the swing is theirs")
    assert f"call into {called}'s requests" in v["evidence"][0]
    assert _sql(engine, path, service)["verdict"] == v


def test_the_gateways_report_from_the_command_line_says_the_call(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's ``--service`` (its stage-map step rebuilds the recording) keeps what the pick
    found: the text report says the call and its advice."""
    from otel_stages.cli import main
    path = gateway_calls_worker(tmp_path / "calls.jsonl")
    assert main(["report", str(path), "--service", GATEWAY]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "POST is a call into vlm-worker's requests (40 of its 40 spans hold one)" in out
    assert f"report {WORKER} alone (otel-stages report ... --service {WORKER})" in out


def test_share_parity_just_below(engine: Any, tmp_path: Path) -> None:
    path = gateway_calls_worker(tmp_path / "below.jsonl", calls=19)
    want = _file(path)
    assert not any("is a call" in e for e in want["verdict"]["evidence"])
    assert _sql(engine, path)["verdict"] == want["verdict"]


def test_one_service_reads_no_call(tmp_path: Path) -> None:
    """The worker's requests alone: none is called from a stage read here."""
    path = gateway_calls_worker(tmp_path / "worker.jsonl", worker_only=True)
    spans = load_paths([path]).spans
    assert remote_calls(group_spans(spans).requests, spans) == ()


def test_a_service_whose_spans_are_stages_of_others_names_them(
        engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A GPU worker that records only ``forward`` under the gateway's request spans has no request
    of its own: ``--service`` of it says whose requests hold its spans, in both reports."""
    path = gateway_calls_worker(tmp_path / "calls.jsonl")
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    gateway_spans = docs[0]["resourceSpans"][0]["scopeSpans"][0]["spans"]
    request = {s["traceId"]: s["spanId"] for s in gateway_spans if s["name"] == "request"}
    worker_spans = docs[1]["resourceSpans"][0]["scopeSpans"][0]["spans"]
    docs[1]["resourceSpans"][0]["scopeSpans"][0]["spans"] = [
        {**s, "parentSpanId": request[s["traceId"]]} for s in worker_spans if s["name"] == "forward"]
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    line = (f"no request span of service '{WORKER}': its spans are stages of the requests of"
            f" {GATEWAY} ({N}); --service {GATEWAY} reports those")
    assert main(["report", str(path), "--service", WORKER]) == 1
    assert capsys.readouterr().err.strip().endswith(line)
    tables = Tables(database=f"i{next(_dbs)}")  # (one chDB path per process: the fixture's)
    import_files(engine, tables, [path])
    agg = fetch_aggregates(engine, tables, AggregateQuery(service=WORKER))
    assert agg.counts.requests == 0 and agg.service_hosts == ((GATEWAY, N),)
    assert no_request_line(WORKER, agg.service_hosts) == line  # (the CLI's error, as for files)
    # the gateway's report keeps the worker's forward spans (a GPU worker under its requests)
    assert main(["report", str(path), "--service", GATEWAY, "--json"]) == 0
    assert "forward" in json.loads(capsys.readouterr().out)["stages"]


def test_one_service_name_for_gateway_and_worker_is_still_a_call(engine: Any, tmp_path: Path) -> None:
    """A tester's fleet: the gateway and the worker share one service.name (``vlm-worker``; told
    apart by service.namespace ``edge`` / ``gpu``). The report read the gateway's POST as a
    custom-stage culprit, firmly: calls were looked for only across service names. Now POST is a
    call into the same name's requests, the verdict the worker's busy GPU, tentative, with the
    pooling said first and the advice to name the services apart (``--service`` cannot part one
    name); the same in ClickHouse."""
    path = gateway_calls_worker(tmp_path / "shared.jsonl", gateway=WORKER)
    spans = load_paths([path]).spans
    found = remote_calls(group_spans(spans).requests, spans)
    assert [(c.stage, c.service, c.calls, c.shared_name, c.callee_stage) for c in found] == [
        ("POST", WORKER, N, True, False)]
    want = _file(path)
    v = want["verdict"]
    assert (v["cause"], v["stage"], v["tentative"]) == ("gpu_busy", "forward", True)
    assert v["evidence"][0].startswith(f"POST calls requests of the same service.name ({WORKER})")
    assert v["evidence"][1].startswith(f"POST is a call into other requests of {WORKER}, its own"
                                       f" service.name, ({N} of its {N} spans hold one)")
    assert v["advice"][0].startswith("give the processes POST calls their own service.name")
    assert _sql(engine, path)["verdict"] == v


def test_a_call_named_as_the_callees_stage_is_pooled_with_it(engine: Any, tmp_path: Path) -> None:
    """A tester's gateway wraps its HTTP call in ``stage("forward")``: the worker's own forward
    spans share the name. Leaving the name out as a call left the worker's forward out too ("no
    single stage swings" while forward explains most); now forward is the verdict, its line says
    the figures pool the calls and the callees' forwards; the same in ClickHouse."""
    path = gateway_calls_worker(tmp_path / "named.jsonl", call_name="forward")
    spans = load_paths([path]).spans
    found = remote_calls(group_spans(spans).requests, spans)
    assert [(c.stage, c.service, c.calls, c.spans, c.callee_stage) for c in found] == [
        ("forward", WORKER, N, N, True)]  # (the gateway's forward spans)
    want = _file(path)
    v = want["verdict"]
    assert (v["cause"], v["stage"], v["tentative"]) == ("gpu_busy", "forward", True)
    assert any(e.startswith(f"forward spans are calls into {WORKER}'s requests ({N} of its {N}"
                            " spans hold one), which this report reads too, and those requests have"
                            " forward spans of their own") for e in v["evidence"])
    assert v["advice"][0] == ADVICE.replace("POST", "forward")
    assert _sql(engine, path)["verdict"] == v



# --- a call's own time: the wait outside the called requests is the caller's ----------------------

POOL_MS = 200.0


def _own(path: Path) -> list[tuple[str, float, float, float, float, float]]:
    """Each call's own-time and called-request percentiles, the steady requests as the report
    reads them (neither cold nor set apart)."""
    spans = load_paths([path]).spans
    requests = group_spans(spans).requests
    apart = {id(a.request) for a in set_apart_and_warmup(requests, CohortKeys(requests))[0]}
    steady = {(r.trace_id, r.span_id) for r in requests if not r.cold and id(r) not in apart}
    return [(c.stage, c.own_p5_ms or 0.0, c.own_median_ms or 0.0, c.own_p95_ms or 0.0,
             c.callee_p5_ms or 0.0, c.callee_p95_ms or 0.0)
            for c in remote_calls(requests, spans, steady)]


@pytest.mark.parametrize("hops", [1, 2])
def test_a_calls_own_wait_is_the_callers(engine: Any, tmp_path: Path, hops: int) -> None:
    """A tester's gateway whose HTTP client waits 200-240 ms for a pooled connection in every fourth
    call before the worker's request starts, the worker steady: POST was left out as the worker's
    time ("no single stage swings", advice to report the steady worker alone). Now POST's own time
    (each span less its called request) is read, and POST is the verdict with the cause ``call``,
    the client-pool advice and ``--service gateway``; the same in ClickHouse."""
    path = gateway_calls_worker(tmp_path / f"pool_{hops}.jsonl", hops=hops, pool_ms=POOL_MS)
    [(name, own_p5, own_median, own_p95, callee_p5, callee_p95)] = _own(path)
    assert name == "POST" and own_p5 == pytest.approx(2.0, abs=0.7)
    assert own_median == pytest.approx(2.0, abs=0.7) and own_p95 > POOL_MS
    assert callee_p95 - callee_p5 < 5.0  # (the worker is steady: its cold start is past p95)
    want = _file(path)
    v = want["verdict"]
    assert (v["cause"], v["stage"], v["tentative"]) == ("call", "POST", True)
    own = next(e for e in v["evidence"] if e.startswith("POST is a call into"))
    assert "but its own time outside them" in own and "the wait is the caller's" in own
    assert v["advice"][0] == (f"report each service alone (otel-stages report ... --service {GATEWAY}:"
                              " the calling service, where POST's swing lies, for its stages' figures"
                              f" alone; there POST is one stage of its own, {WORKER}'s requests left"
                              " out, so its split into the caller's wait and the called requests'"
                              " time is this report's)")
    assert v["advice"][1] == advice.CALL_OWN_BEFORE.format(stage="POST")  # (the pool's wait)
    assert _sql(engine, path)["verdict"] == v


@pytest.mark.parametrize("shape", [
    {}, {"warmup": (900.0, 700.0)}, {"fanout": 3}, {"calls": 24, "unrecorded_ms": 405.0},
], ids=["plain", "warm-up", "fan-out", "partial"])
def test_own_time_figures_parity(engine: Any, tmp_path: Path, shape: dict[str, Any]) -> None:
    """The calls' own-time and callee percentiles, file and ClickHouse (exact quantiles: equal up
    to float rounding)."""
    path = gateway_calls_worker(tmp_path / "pool.jsonl", hops=2, pool_ms=POOL_MS, **shape)
    tables = Tables(database=f"i{next(_dbs)}")
    assert import_files(engine, tables, [path]).problems == []
    got = [(c.stage, c.own_p5_ms, c.own_median_ms, c.own_p95_ms, c.callee_p5_ms, c.callee_p95_ms)
           for c in fetch_aggregates(engine, tables, AggregateQuery()).calls]
    [want] = _own(path)
    assert got[0][0] == want[0] and got[0][1:] == pytest.approx(want[1:], abs=1e-6)


def test_a_steady_calls_own_time_leaves_it_out(tmp_path: Path) -> None:
    """The rule's other side on the same shape: a wait of 5-6 ms, under the 15 % of the median
    request a stage must swing, is no swing of POST's own: the call stays out (the pooled totals,
    the gateway's and the worker's, still swing: no single stage does)."""
    path = gateway_calls_worker(tmp_path / "short.jsonl", hops=2, pool_ms=5.0)
    v = _file(path)["verdict"]
    assert v["cause"] is None
    assert any("no single stage swings materially" in e and "widest POST" in e for e in v["evidence"])
    assert not any("but its own time outside them" in e for e in v["evidence"])


def test_own_wait_with_the_call_named_forward(engine: Any, tmp_path: Path) -> None:
    """The same wait in a gateway's ``stage("forward")`` around its call (pooled with the worker's
    forward spans): a tentative forward verdict blamed the model; now the cause is the call, the
    GPU advice gone; the same in ClickHouse."""
    path = gateway_calls_worker(tmp_path / "named.jsonl", hops=2, call_name="forward", pool_ms=POOL_MS)
    want = _file(path)
    v = want["verdict"]
    assert (v["cause"], v["stage"], v["tentative"]) == ("call", "forward", True)
    assert any(e.startswith("forward is a call into") and "its figures pooling the calls and the"
               " called requests' own forward spans" in e for e in v["evidence"])
    assert v["advice"][1] == advice.CALL_OWN_BEFORE.format(stage="forward")
    assert not any("GPU" in a for a in v["advice"])  # (the worker's cold start: warm-up advice)
    assert _sql(engine, path)["verdict"] == v


def test_own_wait_under_one_service_name(engine: Any, tmp_path: Path) -> None:
    """One service.name for both: the pooling line says the caller's stages are ranked with the
    callee's (not that the callee's swing reads in the caller's totals), the advice to name them
    apart first; the same in ClickHouse."""
    path = gateway_calls_worker(tmp_path / "shared_pool.jsonl", hops=2, gateway=WORKER, pool_ms=POOL_MS)
    v = _file(path)["verdict"]
    assert (v["cause"], v["stage"], v["tentative"]) == ("call", "POST", True)
    assert v["evidence"][0].endswith("pooled here as one, so a caller's stages are ranked with its"
                                     " callee's; the verdict is tentative")
    assert v["advice"][0].startswith("give the processes POST calls their own service.name")
    assert _sql(engine, path)["verdict"] == v


# --- a tester's shapes: warm-up, fan-out, calls that reach no recorded worker, both sides ---------


@pytest.mark.parametrize("shape", [
    # the worker's first forwards after its cold one are a warm-up (set apart): no swing of the calls
    {"warmup": (900.0, 700.0)},
    # six worker requests at once per call: the time they cover counts once (their union)
    {"fanout": 6},
], ids=["warm-up", "fan-out"])
def test_the_pool_wait_is_read_past_warm_ups_and_fan_outs(engine: Any, tmp_path: Path,
                                                          shape: dict[str, Any]) -> None:
    """A tester's: a worker warm-up made the called requests' p95 712 ms (the pool wait's 240 ms
    swing lost to it: "no single stage swings"); six concurrent calls summed to 312 ms per call,
    the own time 0. Now the percentiles read the warm called requests only, and the time they
    cover as a union; the wait is the caller's in both reports."""
    path = gateway_calls_worker(tmp_path / "shape.jsonl", hops=2, pool_ms=150.0, **shape)
    [(_, _, _, own_p95, callee_p5, callee_p95)] = _own(path)
    assert own_p95 > 150.0 and callee_p95 - callee_p5 < 10.0
    spans = load_paths([path]).spans
    [call] = remote_calls(group_spans(spans).requests, spans)
    assert (call.calls, call.spans) == (N, N)  # calling spans, not called requests
    v = _file(path)["verdict"]
    assert (v["cause"], v["stage"]) == ("call", "POST")
    assert any(f"({N} of its {N} spans hold one)" in e for e in v["evidence"])
    assert _sql(engine, path)["verdict"] == v


def test_calls_that_reach_no_recorded_worker_are_the_callers_own(engine: Any, tmp_path: Path) -> None:
    """24 of 40 calls reach the (steady) recorded worker; of the 16 others every second takes
    405 ms (a service this report does not read). Those spans' time is wholly the caller's: POST
    is no longer left out as the steady worker's; the same in ClickHouse."""
    path = gateway_calls_worker(tmp_path / "partial.jsonl", hops=2, calls=24, unrecorded_ms=405.0,
                                slow_forwards=False)
    [(_, _, _, own_p95, _, _)] = _own(path)
    assert own_p95 > 400.0
    v = _file(path)["verdict"]
    assert (v["cause"], v["stage"]) == ("call", "POST")
    assert any("or a call that reaches no request read here" in e for e in v["evidence"])
    assert _sql(engine, path)["verdict"] == v


@pytest.mark.parametrize("pool_ms, cause, stage", [
    (180.0, "gpu_busy", "forward"),  # the worker's slow forwards (200-240 ms) swing more
    (360.0, "call", "POST"),         # the pool wait swings more
])
def test_both_sides_of_a_call_are_said(engine: Any, tmp_path: Path, pool_ms: float, cause: str,
                                       stage: str) -> None:
    """The gateway's pool wait and the worker's slow forwards at once: the larger names the
    verdict, and the other is said with its advice (was: the smaller side vanished)."""
    path = gateway_calls_worker(tmp_path / "both.jsonl", hops=2, pool_ms=pool_ms, slow_forwards=True)
    v = _file(path)["verdict"]
    assert (v["cause"], v["stage"]) == (cause, stage)
    if cause == "call":
        assert any(e.startswith(f"the requests POST calls ({WORKER}'s) swing too") for e in v["evidence"])
        assert (f"POST's called requests swing as well: report them alone too (otel-stages report ..."
                f" --service {WORKER})") in v["advice"]
    else:
        assert any(e.startswith("POST's own time outside the requests it calls swings") and
                   e.endswith("the caller's wait is a second place") for e in v["evidence"])
        assert advice.CALL_OWN_BEFORE.format(stage="POST") in v["advice"]
    assert _sql(engine, path)["verdict"] == v


def test_calls_made_more_than_once_are_the_callers(engine: Any, tmp_path: Path) -> None:
    """A tester's retries: every fourth POST calls the (steady) worker twice, one call after the
    other. The covered time swings with the count; it was left out as the worker's ("no single
    stage swings", advice to report the steady worker). Now the count is said and POST is the
    caller's (cause ``call``) with the retry advice; the same in ClickHouse."""
    path = gateway_calls_worker(tmp_path / "retry.jsonl", hops=2, repeat=2, slow_forwards=False)
    spans = load_paths([path]).spans
    [call] = remote_calls(group_spans(spans).requests, spans)
    assert call.repeated == N // 4 and (call.each_swing_ms or 0.0) < 5.0
    v = _file(path)["verdict"]
    assert (v["cause"], v["stage"]) == ("call", "POST")
    line = next(e for e in v["evidence"] if e.startswith("POST is a call into"))
    assert f"holds more of them in {N // 4} of its calls than in the others" in line
    assert advice.CALL_REPEATED.format(stage="POST", service=WORKER) in v["advice"]
    assert _sql(engine, path)["verdict"] == v


def test_calls_made_more_than_once_to_a_swinging_worker(engine: Any, tmp_path: Path) -> None:
    """The same retries to a worker whose own forwards swing (200-240 ms): each called request
    swings, so the worker's stage is the verdict; the count is still said, with its advice."""
    path = gateway_calls_worker(tmp_path / "retry_slow.jsonl", hops=2, repeat=2, slow_forwards=True)
    v = _file(path)["verdict"]
    assert v["stage"] == "forward"
    assert any(e.startswith(f"POST holds more of {WORKER}'s requests in") for e in v["evidence"])
    assert advice.CALL_REPEATED.format(stage="POST", service=WORKER) in v["advice"]
    assert _sql(engine, path)["verdict"] == v


def test_a_retry_after_a_slow_failure_is_the_callers(engine: Any, tmp_path: Path) -> None:
    """A tester's: in every fourth POST the first worker call fails after a 300 ms forward and is
    retried at once. The failed attempts' time made each called request look unsteady, so the
    count was only said beside "several stages swing together: look for what slows the whole
    process". Each called request is now judged on the successful ones: the retries are the
    caller's (cause ``call``, the retry advice); the same in ClickHouse."""
    path = gateway_calls_worker(tmp_path / "retry_fail.jsonl", hops=2, repeat=2, fail_first_ms=300.0,
                                slow_forwards=False)
    v = _file(path)["verdict"]
    assert (v["cause"], v["stage"]) == ("call", "POST")
    assert advice.CALL_REPEATED.format(stage="POST", service=WORKER) in v["advice"]
    assert not any("several stages swing together" in a for a in v["advice"])
    assert _sql(engine, path)["verdict"] == v


# --- a chain: gateway -> router -> worker, every hop an httpx POST -------------------------------


def chain(path: Path, *, gateway_wait: float = 0.0, router_wait: float = 0.0,
          slow_forwards: bool = False) -> Path:
    """``N`` traces: the gateway's ``request`` (``download`` 8 ms, ``POST``) calls the router's
    ``request`` (``POST``), which calls the worker's ``request`` (``queue`` 2, ``forward`` 50 ms);
    every fourth call waits ``gateway_wait`` in the gateway's POST or ``router_wait`` in the
    router's before its callee starts, or (``slow_forwards``) its worker forward takes 250 ms."""
    r = random.Random(11)
    out: dict[str, list[dict[str, Any]]] = {"gateway": [], "router": [], WORKER: []}

    def sid() -> str:
        return f"{r.getrandbits(64):016x}"

    for i in range(N):
        trace, slow = f"{r.getrandbits(128):032x}", i % 4 == 2
        t = BASE_NS + i * 1000 * MS
        forward = (250.0 if slow and slow_forwards else 50.0) + r.uniform(-1, 1)
        w_start = t + int((8.5 + 1.0 + (gateway_wait if slow else 0.0) + 1.0
                           + (router_wait if slow else 0.0)) * MS)
        w_end = w_start + int((2.2 + forward) * MS)
        w_id, r_id, g_id = sid(), sid(), sid()
        r_post, g_post = sid(), sid()
        r_start = t + int((8.5 + 1.0 + (gateway_wait if slow else 0.0)) * MS)
        out[WORKER] += [_span(trace, w_id, r_post, "request", w_start, w_end, {"request.seq": i + 1}),
                        _span(trace, sid(), w_id, "queue", w_start + MS // 10, w_start + 2 * MS),
                        _span(trace, sid(), w_id, "forward", w_start + 2 * MS, w_end - MS // 10)]
        r_end = w_end + MS // 2
        out["router"] += [_span(trace, r_id, g_post, "request", r_start, r_end, {"request.seq": i + 1}),
                          _span(trace, r_post, r_id, "POST", r_start + MS // 2, r_end - MS // 10, kind=3)]
        g_end = r_end + MS // 2
        out["gateway"] += [_span(trace, g_id, None, "request", t, g_end, {"request.seq": i + 1}),
                           _span(trace, sid(), g_id, "download", t + MS // 20, t + int(8.2 * MS)),
                           _span(trace, g_post, g_id, "POST", t + int(8.5 * MS), g_end - MS // 10, kind=3)]
    lines = [{"resourceSpans": [{"resource": _resource(name, f"{name}-0"), "scopeSpans": [{"spans": spans}]}]}
             for name, spans in out.items()]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("shape, cause, stage, first", [
    ({"slow_forwards": True}, "forward", "forward", f"--service {WORKER}: the service POST calls"),
    ({"router_wait": 150.0}, "call", "POST", "--service router: the calling service"),
    ({"gateway_wait": 150.0}, "call", "POST", "--service gateway: the calling service"),
], ids=["worker forward", "router waits", "gateway waits"])
def test_a_chain_of_calls_of_one_name(engine: Any, tmp_path: Path, shape: dict[str, Any], cause: str,
                                      stage: str, first: str) -> None:
    """A tester's chain, every hop an httpx ``POST``: the gateway's POST calls router requests
    whose own POSTs share its name, so it was read as pooled with a stage of theirs and ranked:
    "other (stage: POST)" for the worker's slow forwards. The router's POSTs are calls
    themselves, so the name is no stage of the router's: the worker's forward is the verdict.
    Each hop's own time is judged apart, and the advice names the service that waits (or, for
    the worker's swing, the end of the chain); the same in ClickHouse."""
    path = chain(tmp_path / "chain.jsonl", **shape)
    spans = load_paths([path]).spans
    found = remote_calls(group_spans(spans).requests, spans)
    assert sorted((c.caller, c.service, c.calls, c.spans, c.callee_stage) for c in found) == [
        ("gateway", "router", N, N, False), ("router", WORKER, N, N, False)]
    v = _file(path)["verdict"]
    assert (v["cause"], v["stage"]) == (cause, stage)
    assert first in v["advice"][0]
    waits = [e for e in v["evidence"] if "but its own time outside them" in e]
    assert len(waits) == (cause == "call")  # (only the hop that waits)
    assert _sql(engine, path)["verdict"] == v


@pytest.mark.parametrize("service, called", [("gateway", "router"), ("router", WORKER), (WORKER, None)])
def test_a_chain_picked_by_service_leaves_out_its_own_calls_only(engine: Any, tmp_path: Path,
                                                                 service: str, called: str | None) -> None:
    """``--service`` on the chain: the picked service's own call into the next hop is the call
    left out (not the router's call into the worker, seen from the gateway; not the gateway's
    call into the router, seen from the router); the worker calls none. File and ClickHouse."""
    path = chain(tmp_path / "chain.jsonl", slow_forwards=True)
    want = [] if called is None else [("POST", called, N, N)]

    def key(calls: Sequence[Call]) -> list[tuple[str, str, int, int]]:
        return [(c.stage, c.service, c.calls, c.spans) for c in calls]
    assert key(pick_service(load_paths([path]), service).calls_left_out) == want
    tables = Tables(database=f"i{next(_dbs)}")
    assert import_files(engine, tables, [path]).problems == []
    assert key(fetch_aggregates(engine, tables, AggregateQuery(service=service)).calls_left_out) == want


def test_a_fan_out_started_in_one_nanosecond_sets_the_same_requests_apart(engine: Any,
                                                                         tmp_path: Path) -> None:
    """A tester's: a gateway's first call fans out to two worker requests started in the same
    nanosecond, both paying the 1.5 s cold start. The file report set the second apart as behind
    the cold one; ClickHouse ordered the tie the other way and kept it warm (a 1.5 s forward spike,
    another verdict). Ties now go by trace, the cold request first, then span id, in both."""
    path = gateway_calls_worker(tmp_path / "tie.jsonl", hops=2, fanout=4, fanout_gap_ms=0.0,
                                pool_ms=POOL_MS)
    want = _file(path)
    apart = [(a["seq"], a["reason"]) for a in want["set_apart"]]
    assert {(k, "behind_cold_start") for k in (2, 3, 4)} <= set(apart)  # (listed in one order)
    got = _sql(engine, path)
    assert [(a["seq"], a["reason"]) for a in got["set_apart"]] == apart
    assert got["verdict"] == want["verdict"]


@pytest.mark.parametrize("pool_ms, read_ms, side", [(200.0, 0.0, "before"), (0.0, 200.0, "after")])
def test_where_the_calls_own_time_swings_is_said_in_both_reports(
        engine: Any, tmp_path: Path, pool_ms: float, read_ms: float, side: str) -> None:
    """A tester's: the caller's own time was said to swing, with every place it might wait in the
    advice (a pool, connecting, the called server, reading the response). Whether it swings before
    the called requests start (a pool's wait) or after they end (reading the response) is now
    read from the spans (:func:`otel_stages.analysis.calls.own_side`), in both reports."""
    path = gateway_calls_worker(tmp_path / f"{side}.jsonl", pool_ms=pool_ms, read_ms=read_ms)
    want = _file(path)
    v = want["verdict"]
    assert (v["cause"], v["stage"]) == ("call", "POST")
    line = next(e for e in v["evidence"] if e.startswith("POST is a call into"))
    assert ("; it swings before the called requests start" in line) is (side == "before")
    assert ("; it swings after they end" in line) is (side == "after")
    text = advice.CALL_OWN_BEFORE if side == "before" else advice.CALL_OWN_AFTER
    assert text.format(stage="POST") in v["advice"]
    assert advice.CALL_OWN.format(stage="POST") not in v["advice"]
    assert _sql(engine, path)["verdict"] == v


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
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    worker = [s for line in lines for rs in line.get("resourceSpans", [])
              if rs["resource"] == _resource(WORKER, "wk-0") for ss in rs["scopeSpans"] for s in ss["spans"]]
    requests = sorted((s for s in worker if s["name"] == "request"), key=lambda s: int(s["startTimeUnixNano"]))
    moved_ids = {r["spanId"] for r in requests[1::2]}
    moved = [s for s in worker if s["spanId"] in moved_ids or s["parentSpanId"] in moved_ids]
    for line in lines:
        for rs in line.get("resourceSpans", []):
            for ss in rs["scopeSpans"]:
                ss["spans"] = [s for s in ss["spans"] if s not in moved]
    lines.append({"resourceSpans": [{"resource": _resource("xocr-worker", "ocr-0"),
                                     "scopeSpans": [{"spans": moved}]}]})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


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
    want, got = _file(path, GATEWAY), _sql(engine, path, GATEWAY)
    assert want["problems"] == got["problems"] == []
    assert got["gpu"] == want["gpu"] and got["verdict"] == want["verdict"]
    if host != "gw-0-node":
        worker = _file(path, WORKER)
        assert (worker["verdict"]["cause"], worker["problems"]) == ("gpu_busy", [])
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
