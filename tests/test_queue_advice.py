"""The queue verdict's advice follows what requests wait for and the GPU's headroom
(otel_stages.analysis.advice.for_queue): a tester's batching service (Poisson arrivals, one
executor taking up to 8 queued requests when free, the GPU at 95 % during each batch) got "lower the
batch fill timeout or the max batch size" and "raise executor concurrency if the GPU has headroom",
while its own Batches section said batches filled in 0.2 ms after the executor was free and the GPU
evidence said 95 %: a smaller batch lowers throughput, and there was no headroom. The ClickHouse
report does not read batch spans: it says so, and hedges a queue verdict only."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import advice, diagnose, load_paths
from otel_stages.analysis.clickhouse import connect, parse_url
from otel_stages.analysis.clickhouse_issues import NOT_CHECKED
from tests import odd_inputs
from tests.test_clickhouse_issues import STABLE, edited, named, reports


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    with connect(parse_url(f"chdb:{tmp_path_factory.mktemp('chdb')}")) as eng:
        yield eng

MS = 1_000_000
_attr = odd_inputs._attr


def _span(trace: str, sid: str, parent: str | None, name: str, start: int, end: int,
          attrs: dict[str, Any] | None = None, links: list[dict[str, str]] | None = None) -> dict[str, Any]:
    out = {"traceId": trace, "spanId": sid, "parentSpanId": parent or "", "name": name, "kind": 1,
           "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
           "attributes": [_attr(k, v) for k, v in (attrs or {}).items()], "status": {}}
    if links:
        out["links"] = links
    return out


def _service(path: Path, *, rate_per_s: float, fill_wait_ms: float, gpu_busy: float) -> Path:
    """200 requests arriving at ``rate_per_s`` (Poisson), 20 ms of preprocessing, then one executor:
    when free it waits up to ``fill_wait_ms`` after the first queued request for more (at most 8),
    then runs the batch (forward 40 + 12 per request ms, one ``batch`` span linking its members);
    the GPU reads ``gpu_busy`` during batches, 3 % between them (a point every 20 ms)."""
    r = random.Random(11)
    hx = lambda n: "".join(r.choice("0123456789abcdef") for _ in range(n))  # noqa: E731
    t, reqs = odd_inputs.BASE_NS, []
    for _ in range(200):
        t += int(r.expovariate(rate_per_s) * 1e9)
        reqs.append({"t0": t, "enq": t + int((20 + r.random()) * MS)})
    free, k, batches = odd_inputs.BASE_NS, 0, []
    while k < len(reqs):
        start = max(free, reqs[k]["enq"])
        if start == reqs[k]["enq"]:  # the executor was idle: wait for the batch to fill
            start += int(fill_wait_ms * MS)
        members = [q for q in reqs[k:k + 8] if q["enq"] <= start]
        k += len(members)
        end = start + int((40 + 12 * len(members) + r.random()) * MS)
        batches.append((start, end, members))
        free = end + int(0.2 * MS)
    lines = []
    for start, end, members in batches:
        batch_trace, batch_id = hx(32), hx(16)
        for q in members:
            q.update(trace=hx(32), rid=hx(16), start=start, end=end, size=len(members))
        lines.append([_span(batch_trace, batch_id, None, "batch", start, end, {"batch.size": len(members)},
                            [{"traceId": q["trace"], "spanId": q["rid"]} for q in members])])
    for seq, q in enumerate(reqs, 1):
        trace, rid = q["trace"], q["rid"]
        pre = q["t0"] + 50_000
        lines.append([
            _span(trace, rid, None, "request", q["t0"], q["end"] + 100_000,
                  {"request.seq": seq, "request.cold_start": seq == 1}),
            _span(trace, hx(16), rid, "download", pre, pre + 5 * MS),
            _span(trace, hx(16), rid, "decode", pre + 5 * MS, pre + 15 * MS,
                  {"image.width": 1024, "image.height": 768}),
            _span(trace, hx(16), rid, "resize", pre + 15 * MS, q["enq"]),
            _span(trace, hx(16), rid, "queue", q["enq"], q["start"]),
            _span(trace, hx(16), rid, "forward", q["start"], q["end"], {"batch.size": q["size"]})])
    points, tt = [], odd_inputs.BASE_NS
    while tt < batches[-1][1]:
        busy = any(s <= tt < e for s, e, _ in batches)
        points.append({"timeUnixNano": str(tt), "asDouble": gpu_busy if busy else 0.03,
                       "attributes": [_attr("hw.id", "GPU-0"), _attr("hw.type", "gpu")]})
        tt += 20 * MS
    resource = {"attributes": [_attr("service.name", "vlm"), _attr("service.instance.id", "p0")]}
    with path.open("w") as f:
        for spans in lines:
            f.write(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
                {"scope": {"name": "otel_stages"}, "spans": spans}]}]}) + "\n")
        f.write(json.dumps({"resourceMetrics": [{"resource": resource, "scopeMetrics": [
            {"scope": {"name": "otel_stages.gpu"}, "metrics": [
                {"name": "hw.gpu.utilization", "unit": "1", "gauge": {"dataPoints": points}}]}]}]}) + "\n")
    return path


def test_a_busy_executor_on_a_busy_gpu_is_told_to_add_capacity(tmp_path: Path) -> None:
    report = diagnose(load_paths([_service(tmp_path / "busy.jsonl", rate_per_s=30, fill_wait_ms=0,
                                           gpu_busy=0.95)])).to_dict()
    verdict = report["verdict"]
    assert (verdict["cause"], report["gpu"]["level"]) == ("queue", "high")
    assert report["batches"]["fill_ms"]["median_ms"] < 1.0
    assert verdict["advice"][0].startswith("requests wait for the executor, not for batches to fill")
    assert verdict["advice"][1].startswith("the GPU is busy during forward (95% mean over all")
    assert not [a for a in verdict["advice"] if "max batch size" in a or "raise executor" in a]
    assert any(e.startswith("batches filled in") for e in verdict["evidence"])  # the advice's ground
    assert any(e.startswith("GPU utilization during") for e in verdict["evidence"])


def test_batches_waiting_to_fill_on_an_idle_gpu_are_told_to_fill_sooner(tmp_path: Path) -> None:
    report = diagnose(load_paths([_service(tmp_path / "fill.jsonl", rate_per_s=12, fill_wait_ms=60,
                                           gpu_busy=0.2)])).to_dict()
    verdict = report["verdict"]
    assert (verdict["cause"], report["gpu"]["level"]) == ("queue", "low")
    assert verdict["advice"][0].startswith("requests wait for batches to fill")
    assert "lower the batch fill timeout (max wait) or the max batch size" in verdict["advice"][0]
    assert verdict["advice"][1].startswith("the GPU has headroom during forward")


@pytest.mark.parametrize("fill_ms, waits_for_fill", [(2.4, False), (2.5, True)])
def test_batch_fill_share_threshold(fill_ms: float, waits_for_fill: bool) -> None:
    assert advice.BATCH_FILL_MIN_SHARE == 0.25
    first = advice.for_queue("none", "", fill_ms, 10.0)[0]
    assert first.startswith("requests wait for batches to fill") is waits_for_fill


@pytest.mark.parametrize("level, smaller, concurrency", [
    ("high", False, False), ("medium", True, True), ("low", True, True), ("thin", True, True),
    ("none", True, True)])
def test_headroom_decides_concurrency_and_smaller_batches(level: str, smaller: bool, concurrency: bool) -> None:
    for fill in (None, 9.0):  # no batch spans read (ClickHouse), or batches waiting to fill
        lines = advice.for_queue(level, "50% during the forwards", fill, 10.0)
        assert ("max batch size" in lines[0]) is smaller
        assert ("raise executor concurrency" in lines[1]) is concurrency
        assert lines[-1] == advice.QUEUE_DEPTH


def test_clickhouse_says_batch_spans_are_unread_and_hedges_a_queue_verdict(engine, tmp_path: Path) -> None:
    got, want = reports(engine, _service(tmp_path / "busy.jsonl", rate_per_s=30, fill_wait_ms=0,
                                         gpu_busy=0.95))
    assert got["verdict"]["cause"] == want["verdict"]["cause"] == "queue"
    (line,) = [p for p in got["problems"] if p.startswith(NOT_CHECKED)]
    assert line.startswith(NOT_CHECKED + "batch spans (")
    assert got["verdict"]["tentative"] and not want["verdict"]["tentative"]
    assert got["verdict"]["advice"][0].startswith("requests wait for the batch/executor: if batches")
    assert got["verdict"]["advice"][1:] == want["verdict"]["advice"][1:]  # the GPU's headroom alike


def test_batch_spans_do_not_hedge_another_verdict(engine, tmp_path: Path) -> None:
    def batch(i: int, spans: list[dict[str, Any]]) -> None:
        request = named(spans, "request")
        forward = named(spans, "forward")
        spans.append({**forward, "traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "parentSpanId": "",
                      "name": "batch", "links": [{"traceId": request["traceId"], "spanId": request["spanId"]}]})
    got, want = reports(engine, edited(STABLE, tmp_path / "stable_batches.jsonl", batch))
    assert got["verdict"] == want["verdict"] and want["verdict"]["cause"] == "stable"
    assert any(p.startswith(NOT_CHECKED + "batch spans (30 spans)") for p in got["problems"])


def test_overlapping_executors_leave_the_fill_unread(tmp_path: Path) -> None:
    """Two executors in one process: a batch's fill then runs from its first enqueue (the
    Batches section says so), which cannot tell a batch filling from a busy executor; the advice
    was "lower the batch fill timeout" for a service without one (a tester's)."""
    from otel_stages.analysis.batching import BatchSummary
    from otel_stages.analysis.diagnosis import _with_batches
    from tests.test_decision import figures, stage

    fig = figures(stage("queue", 40.0, explains=0.9), total_swing=40.0)
    summary = BatchSummary(batches=2, sizes={2: 2}, wait_ms=[12.0, 13.0], fill_ms=[11.0, 12.0],
                           call_ms=[50.0, 50.0], unmatched_members=0, overlapping_executors=False)
    assert _with_batches(fig, summary).batch_fill_ms == 11.5
    overlapping = BatchSummary(**{**summary.__dict__, "overlapping_executors": True})
    assert _with_batches(fig, overlapping).batch_fill_ms is None


def test_queue_as_co_suspect_is_hedged_in_clickhouse_too() -> None:
    from otel_stages.analysis.clickhouse_gaps import BATCHES_UNREAD, gaps_caveat
    from otel_stages.analysis.verdict import Verdict

    line = NOT_CHECKED + BATCHES_UNREAD + " (3 spans): ..."
    for advice_lines, hedged in ((["forward: x", "queue: requests wait ..."], True), (["forward: x"], False)):
        verdict = Verdict("gpu_busy", "forward", ["e"], list(advice_lines))
        gaps_caveat(verdict, [line])
        assert verdict.tentative is hedged


# --- the slow requests' wait (a tester: a lock held 250 ms of every 0.7 s in the executor) ------


@pytest.mark.parametrize("fill_p95_ms, executor", [(2.4, True), (2.5, False)])
def test_the_p95s_decide_what_the_slow_requests_wait_for(fill_p95_ms: float, executor: bool) -> None:
    # the medians say "batches fill" (3.0 ms of a 2.9 ms wait); the p95s (the swing) may not
    first = advice.for_queue("none", "", 3.0, 2.9, fill_p95_ms, 10.0)[0]
    assert first.startswith("the slow requests wait for the executor") is executor
    assert first.startswith("requests wait for batches to fill") is not executor


def test_without_p95s_the_medians_decide() -> None:
    assert advice.for_queue("none", "", 3.0, 2.9)[0].startswith("requests wait for batches to fill")
    assert advice.for_queue("none", "", 3.0, 2.9, None, 10.0)[0].startswith(
        "requests wait for batches to fill")


def test_a_stalled_executor_is_no_fill_timeout(tmp_path: Path) -> None:
    """Batches fill in ~1 ms; one batch in five waits 200 ms for the executor (a stall before
    the call): the slow requests' wait is the executor's, though the median wait is the fill."""
    from otel_stages.analysis.batching import BatchSummary
    from otel_stages.analysis.decision import decide
    from otel_stages.analysis.diagnosis import _with_batches
    from tests.test_decision import figures, stage

    fig = figures(stage("queue", 150.0, explains=0.9), total_swing=150.0)
    waits = [1.0 + (200.0 if i % 5 == 0 else 0.0) for i in range(50)]
    summary = BatchSummary(batches=50, sizes={1: 50}, wait_ms=waits, fill_ms=[1.0] * 50,
                           call_ms=[5.0] * 50, unmatched_members=0, overlapping_executors=False)
    v = decide(_with_batches(fig, summary))
    assert v.cause == "queue"
    assert v.advice[0].startswith("the slow requests wait for the executor")
    assert not any("lower the batch fill timeout" in a for a in v.advice)
    assert any("(p95 201.0 ms) from enqueue to pickup" in e for e in v.evidence)


@pytest.mark.parametrize("fill_p95_ms, fill", [(2.4, False), (2.5, True)])
def test_slow_requests_waiting_for_a_fill_are_told_the_fill_timeout(fill_p95_ms: float, fill: bool) -> None:
    # a tester's: bursts keep the typical request waiting for the executor (0.6 ms fill of a
    # 19.5 ms wait), lone requests wait the 300 ms fill timeout (the p95s): the timeout is the swing
    first = advice.for_queue("none", "", 0.6, 19.5, fill_p95_ms, 10.0)[0]
    assert first.startswith("the slow requests wait for batches to fill") is fill
    assert ("lower the batch fill timeout" in first) is fill
    assert first.startswith("requests wait for the executor, not for batches") is not fill
