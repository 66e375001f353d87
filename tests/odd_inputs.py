"""Odd OTLP/JSON trace files, as a fresh-eyes tester wrote them to break ``otel-stages report``
(issue 7 follow-up): each function writes one file of OTLP/JSON lines (one
``ExportTraceServiceRequest`` per line, the Collector ``file`` exporter's shape: ``resourceSpans``
-> ``scopeSpans`` -> ``spans`` with hex ids and string ``*UnixNano`` times, as in
opentelemetry-proto's ``trace/v1/trace.proto`` JSON mapping) and returns its path. Seeded, so each
file is the same on every run."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BASE_NS = 1_790_000_000_000_000_000
STD = ["download", "decode", "resize", "queue", "forward"]
Stages = list[tuple[str, float]]


def _hex(n: int, r: random.Random) -> str:
    return "".join(r.choice("0123456789abcdef") for _ in range(n))


def _attr(k: str, v: object) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"key": k, "value": {"boolValue": v}}
    if isinstance(v, int):
        return {"key": k, "value": {"intValue": str(v)}}
    if isinstance(v, float):
        return {"key": k, "value": {"doubleValue": v}}
    return {"key": k, "value": {"stringValue": v}}


def request(r: random.Random, t0: int, stages: Stages, seq: int,
            req_attrs: dict[str, object] | None = None) -> tuple[list[dict[str, Any]], int]:
    """A request span with its stage spans back to back (50 µs in), and its end time."""
    trace, rsid = _hex(32, r), _hex(16, r)
    spans = []
    t = t0 + 50_000
    for name, ms in stages:
        spans.append({"traceId": trace, "spanId": _hex(16, r), "parentSpanId": rsid, "name": name,
                      "kind": 1, "startTimeUnixNano": str(t), "endTimeUnixNano": str(t + int(ms * 1e6)),
                      "attributes": [], "status": {}})
        t += int(ms * 1e6)
    end = t + 50_000
    req = {"traceId": trace, "spanId": rsid, "name": "request", "kind": 1,
           "startTimeUnixNano": str(t0), "endTimeUnixNano": str(end),
           "attributes": [_attr("request.seq", seq)]
           + [_attr(k, v) for k, v in (req_attrs or {}).items()], "status": {}}
    return [req, *spans], end


def write(path: Path, rows: Sequence[list[dict[str, Any]]]) -> Path:
    """One line per request, resource ``svc`` / instance ``i1``."""
    resource = {"attributes": [_attr("service.name", "svc"), _attr("service.instance.id", "i1")]}
    with path.open("w") as f:
        for spans in rows:
            f.write(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
                {"scope": {"name": "otel_stages"}, "spans": spans}]}]}) + "\n")
    return path


def normal(i: int, r: random.Random) -> Stages:
    """The tester's steady pipeline: about 5 / 10 / 4 / 2 / 100 ms."""
    return [("download", 5 + r.random()), ("decode", 10 + r.random()),
            ("resize", 4 + r.random() * 0.5), ("queue", 2 + r.random() * 0.3),
            ("forward", 100 + r.random() * 3)]


def run(n: int, fn: Callable[[int, random.Random], Stages] = normal, seed: int = 1,
        gap_ms: float = 100) -> list[list[dict[str, Any]]]:
    """``n`` requests of ``fn(i, rng)`` stages, ``gap_ms`` apart, seq 1..n."""
    r = random.Random(seed)
    t, out = BASE_NS, []
    for i in range(n):
        spans, end = request(r, t, fn(i, r), i + 1)
        out.append(spans)
        t = end + int(gap_ms * 1e6)
    return out


def shift(rows: list[list[dict[str, Any]]], name: str, ns: int) -> list[list[dict[str, Any]]]:
    """Move every ``name`` span by ``ns`` (a stage recorded on a host whose clock is off)."""
    for spans in rows:
        for s in spans:
            if s["name"] == name:
                s["startTimeUnixNano"] = str(int(s["startTimeUnixNano"]) + ns)
                s["endTimeUnixNano"] = str(int(s["endTimeUnixNano"]) + ns)
    return rows


def clock_skew(path: Path, ns: int = 2_000_000_000) -> Path:
    """forward spans ``ns`` later than their request (another host's clock ahead)."""
    return write(path, shift(run(30), "forward", ns))


def zero_dur(path: Path) -> Path:
    """Every stage 0 ms; the request spans 100 µs."""
    return write(path, run(30, lambda i, r: [(s, 0.0) for s in STD]))


def dup_ids_one_trace(path: Path) -> Path:
    """30 requests sharing one trace id and one request span id."""
    rows = run(30)
    for spans in rows:
        for s in spans:
            s["traceId"] = "ab" * 16
            if s["name"] == "request":
                s["spanId"] = "a" * 16
            else:
                s["parentSpanId"] = "a" * 16
    return write(path, rows)


def dup_lines(path: Path) -> Path:
    """Every line written twice (a collector retry)."""
    return write(path, [spans for spans in run(30) for _ in range(2)])


def mostly_failed(path: Path, failed_every: int = 6) -> Path:
    """Requests fail (status ERROR, message ``boom``) except every ``failed_every``-th."""
    rows = run(30, lambda i, r: normal(i, r) if i % failed_every else normal(i, r)[:2])
    for i, spans in enumerate(rows):
        if i % failed_every:
            spans[0]["status"] = {"code": 2, "message": "boom"}
    return write(path, rows)


def anti_corr(path: Path) -> Path:
    """decode and forward offset each other: the total stays constant."""
    def anti(i: int, r: random.Random) -> Stages:
        s = normal(i, r)
        x = 50 * r.random()
        s[1], s[4] = ("decode", 10 + x), ("forward", 150 - x)
        return s
    return write(path, run(30, anti, seed=8))


def missing_stages(path: Path) -> Path:
    """download absent from every other request."""
    return write(path, run(30, lambda i, r: normal(i, r)[1:] if i % 2 else normal(i, r)))


def idle_gap(path: Path) -> Path:
    """60 s idle before seq 21, whose forward takes 400 ms."""
    r, out, t = random.Random(2), [], BASE_NS
    for i in range(30):
        st = normal(i, r)
        if i == 20:
            st[4] = ("forward", 400.0)
            t += 60 * 10**9
        spans, end = request(r, t, st, i + 1)
        out.append(spans)
        t = end + 100_000_000
    return write(path, out)


def cold_attr_conflict(path: Path) -> Path:
    """request.cold_start is true on seq 6 only; seq 1 (slow forward) says false."""
    r, out, t = random.Random(2), [], BASE_NS
    for i in range(30):
        st = normal(i, r)
        if i == 0:
            st[4] = ("forward", 1500.0)
        spans, end = request(r, t, st, i + 1, req_attrs={"request.cold_start": i == 5})
        out.append(spans)
        t = end + 100_000_000
    return write(path, out)


def cold_failed_first(path: Path) -> Path:
    """seq 1 failed (OOM); seq 2's forward took 2000 ms."""
    rows = run(30, lambda i, r: normal(i, r) if i > 1 else [*normal(i, r)[:4], ("forward", 2000.0)])
    rows[0][0]["status"] = {"code": 2, "message": "OOM"}
    return write(path, rows)
