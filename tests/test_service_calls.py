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
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import advice, load_paths
from otel_stages.analysis.calls import remote_calls
from otel_stages.analysis.clickhouse import Tables, fetch_aggregates, import_files
from otel_stages.analysis.clickhouse_figures import report_dict
from otel_stages.analysis.clickhouse_sql import AggregateQuery
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.requests import group_spans
from otel_stages.analysis.services import no_request_line, pick_service
from otel_stages.cli import main
from tests.fleet_calls import GATEWAY_STAGES
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
        for name, ms, attrs in GATEWAY_STAGES:
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
