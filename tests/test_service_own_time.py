"""A call's own time (its span less the requests it calls: the caller's wait), read with and
without ``--service``, and chains of calls (gateway -> router -> worker); file report and
ClickHouse report alike. The recordings: :func:`tests.test_service_calls.gateway_calls_worker`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import advice, load_paths
from otel_stages.analysis.calls import remote_calls
from otel_stages.analysis.clickhouse import Tables, fetch_aggregates, import_files
from otel_stages.analysis.clickhouse_sql import AggregateQuery
from otel_stages.analysis.cohorts import CohortKeys, set_apart_and_warmup
from otel_stages.analysis.model import Call
from otel_stages.analysis.requests import group_spans
from otel_stages.analysis.services import pick_service
from tests.test_clickhouse_issues import _dbs, engine
from tests.test_service_calls import (
    BASE_NS,
    GATEWAY,
    MS,
    WORKER,
    N,
    _file,
    _resource,
    _span,
    _sql,
    gateway_calls_worker,
)

__all__ = ["engine"]  # the chDB fixture


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
