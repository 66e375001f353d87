"""A gateway whose ``POST`` calls the requests of one or more worker services (a tester's
generator, kept as written): each gateway request (``download``, ``decode``, ``resize``, then
``POST``) calls the worker ``route(i)`` picks, or each of ``fan_workers`` at once; each worker's
``request`` (``queue``, ``forward``) under the POST span, or under the worker's HTTP server span
(``server_span``); each worker's first request cold (``request.cold_start``, ``cold_ms``), then its
``warmup`` forwards, then ``fwd`` ms (every ``slow_every``-th ``slow_ms``); GPU points per worker.
OTLP/JSON lines as the Collector's file exporter writes them."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from tests.odd_inputs import _attr as attr

BASE_NS = 1_790_000_000_000_000_000
#: The gateway's own stages before its POST: (name, ms, attributes).
GATEWAY_STAGES: tuple[tuple[str, float, dict[str, Any]], ...] = (
    ("download", 8.0, {}),
    ("decode", 12.0, {"image.width": 1024, "image.height": 768, "image.size": 150_000,
                      "image.format": "JPEG"}),
    ("resize", 3.0, {}))
MS = 10**6


def resource(service: str, instance: str) -> dict[str, Any]:
    return {"attributes": [attr("service.name", service), attr("service.instance.id", instance),
                           attr("host.name", f"{instance}-node")]}


def make(path: Any, n: int = 40, workers: list[dict[str, Any]] | None = None,
         route: Callable[[int], int | None] | None = None, server_span: bool = False, fanout: int = 1,
         retry_every: int = 0, gw_cold_ms: float = 0.0, gw_warmup: Sequence[float] = (), seed: int = 7,
         gpu: bool = True, call_name: str = "POST", gap_ms: int = 1000, pool_every: int = 0,
         pool_ms: float = 0.0, fan_workers: list[int] | None = None) -> Any:
    """workers: list of dict(name, cold_ms, warmup=[ms...], fwd=50, slow_every=4, slow_ms=250).
    route(i) -> index of worker for gateway request i (or None: the POST reaches nothing recorded).
    fan_workers: list of worker indexes for fan-out (one request to each)."""
    r = random.Random(seed)
    def nid():
        return f"{r.getrandbits(64):016x}"
    workers = workers or [dict(name="vlm-worker", cold_ms=1500.0)]
    route = route or (lambda i: 0)
    gw = []
    wspans = {w["name"]: [] for w in workers}
    wseq = {w["name"]: 0 for w in workers}
    points = {w["name"]: [] for w in workers}
    for i in range(n):
        trace = f"{r.getrandbits(128):032x}"
        t = BASE_NS + i * gap_ms * MS
        rid = nid()
        stages = []
        c = t + MS // 20
        for name, ms, attrs in GATEWAY_STAGES:
            ms += r.uniform(-0.2, 0.2)
            if name == "decode":
                ms += gw_cold_ms if i == 0 else 0.0
                ms += gw_warmup[i - 1] if 0 < i <= len(gw_warmup) else 0.0
            stages.append({"traceId": trace, "spanId": nid(), "parentSpanId": rid, "name": name,
                           "kind": 1, "startTimeUnixNano": str(c), "endTimeUnixNano": str(c + int(ms * MS)),
                           "attributes": [attr(k, v) for k, v in attrs.items()], "status": {}})
            c += int(ms * MS) + MS // 50
        post = nid()
        targets = []
        if fan_workers is not None and fanout > 1:
            targets = list(fan_workers)
        else:
            w = route(i)
            if w is not None:
                targets = [w] * fanout
        retry = bool(retry_every) and i % retry_every == 2 and targets and fanout == 1
        wait = pool_ms if (pool_every and i % pool_every == 1) else 0.0
        s0 = c + MS // 2 + int(wait * MS)
        cur = s0
        ends = []
        for j, wi in enumerate(targets + ([targets[0]] if retry else [])):
            w = workers[wi]
            wn = w["name"]
            wseq[wn] += 1
            seq = wseq[wn]
            fails = retry and j == 0
            if seq == 1:
                fwd = w.get("cold_ms", 1500.0)
            elif seq - 1 <= len(w.get("warmup", ())):
                fwd = w["warmup"][seq - 2]
            elif w.get("slow_every") and seq % w["slow_every"] == 2:
                fwd = w.get("slow_ms", 250.0) + (seq % 3) * 20
            else:
                fwd = w.get("fwd", 50.0) + r.uniform(-1, 1)
            if fails:
                fwd = w.get("fail_ms", 300.0)
            start = cur
            if fanout > 1:
                start = s0 + j * MS
            above = post
            if server_span:
                sid = nid()
                took = 2.0 + fwd + 0.2
                wspans[wn].append({"traceId": trace, "spanId": sid, "parentSpanId": post,
                                   "name": "POST /infer", "kind": 2, "startTimeUnixNano": str(start),
                                   "endTimeUnixNano": str(start + int((took + 0.6) * MS)),
                                   "attributes": [], "status": {}})
                above = sid
                start += MS // 10
            wid = nid()
            q = start + MS // 10
            took = 2.0 + fwd + 0.2
            req = {"traceId": trace, "spanId": wid, "parentSpanId": above, "name": "request", "kind": 1,
                   "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + int(took * MS)),
                   "attributes": [attr("request.seq", seq)] + ([attr("request.cold_start", True)] if seq == 1 else []),
                   "status": {"code": 2, "message": "timeout"} if fails else {}}
            wspans[wn] += [req,
                {"traceId": trace, "spanId": nid(), "parentSpanId": wid, "name": "queue", "kind": 1,
                 "startTimeUnixNano": str(q), "endTimeUnixNano": str(q + 2 * MS), "attributes": [], "status": {}},
                {"traceId": trace, "spanId": nid(), "parentSpanId": wid, "name": "forward", "kind": 1,
                 "startTimeUnixNano": str(q + 2 * MS), "endTimeUnixNano": str(q + int((2 + fwd) * MS)),
                 "attributes": [attr("batch.size", 1)], "status": {"code": 2} if fails else {}}]
            f0, f1 = q + 2 * MS, q + int((2 + fwd) * MS)
            points[wn] += [(f, 0.9 + r.uniform(-0.03, 0.03)) for f in range(f0 + 2 * MS, f1, 10 * MS)]
            points[wn] += [(f1 + 20 * MS, 0.02)]
            e = start + int((took + (0.6 if server_span else 0)) * MS)
            ends.append(e)
            cur = e + MS
        pend = max(ends) + 2 * MS if targets else c + int((55.0 + r.uniform(-0.5, 0.5)) * MS)
        stages.append({"traceId": trace, "spanId": post, "parentSpanId": rid, "name": call_name, "kind": 3,
                       "startTimeUnixNano": str(c), "endTimeUnixNano": str(pend),
                       "attributes": [attr("http.request.method", "POST")], "status": {}})
        end = pend + MS // 10
        gw += [{"traceId": trace, "spanId": rid, "parentSpanId": "", "name": "request", "kind": 2,
                "startTimeUnixNano": str(t), "endTimeUnixNano": str(end),
                "attributes": [attr("request.seq", i + 1)] + ([attr("request.cold_start", True)] if i == 0 else []),
                "status": {}}, *stages]
    lines = [{"resourceSpans": [{"resource": resource("gateway", "gw-0"),
                                 "scopeSpans": [{"scope": {"name": "otel_stages"}, "spans": gw}]}]}]
    for k, w in enumerate(workers):
        wn = w["name"]
        if wspans[wn]:
            lines.append({"resourceSpans": [{"resource": resource(wn, f"{wn}-0"),
                                             "scopeSpans": [{"scope": {"name": "otel_stages"}, "spans": wspans[wn]}]}]})
        if gpu and points[wn]:
            lines.append({"resourceMetrics": [{"resource": resource(wn, f"{wn}-0"), "scopeMetrics": [{"metrics": [
                {"name": "hw.gpu.utilization", "unit": "1", "gauge": {"dataPoints": [
                    {"timeUnixNano": str(tp), "asDouble": v,
                     "attributes": [attr("hw.id", f"GPU-{k}"), attr("hw.type", "gpu")]} for tp, v in points[wn]]}}]}]}]})
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    return path
