"""Rules of the instrumentation and the report that a plausible change would break silently:
the queue span's exact window under a fake clock, the request counter after fork(), the URL-safe
base64 id fallback, and which GPU samples count for a forward span."""

from __future__ import annotations

import base64
import os

import pytest

import otel_stages as ots
from otel_stages import semconv, sequence
from otel_stages.analysis import MetricPoint, diagnose
from otel_stages.analysis.gpu import gpu_evidence
from otel_stages.analysis.otlp_json import normalize_id
from otel_stages.analysis.requests import find_requests
from tests.test_verdict import build, steady

WALL0 = 1_700_000_000_000_000_000  # the fake clock's wall anchor (tests/conftest.py)


def _snapshot(captured) -> list[dict]:
    """Finished spans as dicts: name, parent name, start/end relative to the first span (ns),
    attributes; ids replaced by names so the whole tree compares at once."""
    spans = captured.spans
    names = {s.context.span_id: s.name for s in spans}
    t0 = min(s.start_time for s in spans)
    return sorted(
        ({"name": s.name, "parent": names.get(s.parent.span_id) if s.parent else None,
          "start": s.start_time - t0, "end": s.end_time - t0, "attributes": dict(s.attributes)}
         for s in spans),
        key=lambda d: (d["start"], d["name"]),
    )


def test_queue_span_runs_from_enqueue_to_pickup_exactly(captured_fake_clock, monkeypatch):
    monkeypatch.setattr(sequence, "_SEQUENCE", sequence._Sequence())
    captured, clock = captured_fake_clock
    with ots.request():
        clock.advance_ms(2)  # the request's own work before the hand-off
        token = ots.enqueue_token(depth=3)
        clock.advance_ms(7)  # waiting in the queue
        with ots.dequeue(token):  # picked up here
            clock.advance_ms(1)
            with ots.stage(semconv.STAGE_FORWARD):
                clock.advance_ms(5)
    ms = 1_000_000
    assert captured.spans[0].start_time >= WALL0
    assert _snapshot(captured) == [
        {"name": "request", "parent": None, "start": 0, "end": 15 * ms,
         "attributes": {semconv.REQUEST_SEQ: 1, semconv.REQUEST_COLD_START: True}},
        {"name": "queue", "parent": "request", "start": 2 * ms, "end": 9 * ms,
         "attributes": {semconv.QUEUE_DEPTH: 3}},
        {"name": "forward", "parent": "request", "start": 10 * ms, "end": 15 * ms, "attributes": {}},
    ]


def test_batched_queue_spans_each_start_at_their_own_enqueue(captured_fake_clock):
    captured, clock = captured_fake_clock
    tokens = []
    for _ in range(2):
        with ots.request():
            tokens.append(ots.enqueue_token())
        clock.advance_ms(4)
    batch = ots.dequeue_batch(tokens)  # one pickup for both, 8 ms after the first enqueue
    with batch.stage(semconv.STAGE_FORWARD):
        clock.advance_ms(10)
    queues = sorted((s.start_time, s.end_time) for s in captured.by_name("queue"))
    first = queues[0][0]
    assert [(a - first, b - first) for a, b in queues] == [(0, 8_000_000), (4_000_000, 8_000_000)]
    forwards = {(s.start_time - first, s.end_time - first) for s in captured.by_name("forward")}
    assert forwards == {(8_000_000, 18_000_000)}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_request_counter_restarts_in_a_forked_child(captured):
    for _ in range(3):  # the parent is at seq 3 or more
        with ots.request():
            pass
    parent_seq = captured.by_name("request")[-1].attributes[semconv.REQUEST_SEQ]
    assert parent_seq >= 3
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe and exits at once
        try:
            seq, cold = sequence._SEQUENCE.next()
            os.write(write, f"{seq} {cold}".encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    answer = os.read(read, 64).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert answer == "1 True"  # a new process: seq 1, and its first request is cold
    with ots.request():
        pass
    assert captured.by_name("request")[-1].attributes[semconv.REQUEST_SEQ] == parent_seq + 1


@pytest.mark.parametrize("n_bytes", [8, 16])
def test_url_safe_base64_ids_decode(n_bytes):
    raw = bytes([0xFB, 0xFF] * (n_bytes // 2))  # encodes with '-' and '_' in the URL-safe alphabet
    text = base64.urlsafe_b64encode(raw).decode()
    assert "-" in text or "_" in text
    assert normalize_id(text, n_bytes) == raw.hex()
    assert normalize_id(base64.b64encode(raw).decode(), n_bytes) == raw.hex()
    with pytest.raises(ValueError):
        normalize_id("not an id!", n_bytes)


# --- which GPU samples count for a forward --------------------------------------------------------


def _idle_before(first_ns: int, count: int = 2000) -> list[MetricPoint]:
    """``count`` idle readings (0) in the second before ``first_ns``: the GPU is no busier between
    the forwards than during them, so the busy readings at their edges leave the readings lined up
    with the forwards (``gpu.falls``) and the edge is what these tests pin."""
    return [MetricPoint(semconv.HW_GPU_UTILIZATION, first_ns - 10**9 + i * (10**9 // count), 0.0)
            for i in range(count)]


def _edges(value_inside: float, value_outside: float, outside_ns: int) -> tuple[list, list]:
    telemetry = build(steady(25))
    requests = [r for r in find_requests(telemetry.spans) if not r.cold]
    points = _idle_before(min(s.start_ns for s in telemetry.spans))
    for r in requests:
        for start, end in r.stage_windows_ns(semconv.STAGE_FORWARD):
            points += [MetricPoint(semconv.HW_GPU_UTILIZATION, t, value_inside)
                       for t in (start, (start + end) // 2, end)]
            points += [MetricPoint(semconv.HW_GPU_UTILIZATION, t, value_outside)
                       for t in (start - outside_ns, end + outside_ns)]
    return requests, points


def test_gpu_samples_count_inside_the_forward_window_only():
    requests, points = _edges(0.1, 1.0, outside_ns=1)
    evidence = gpu_evidence(requests, points)
    # both ends count (3 samples per forward); 1 ns outside does not
    assert evidence.samples == 3 * len(requests)
    assert evidence.mean_utilization == pytest.approx(0.1)
    assert evidence.level == "low"


def test_busy_samples_just_outside_do_not_make_a_starved_forward_busy():
    telemetry = build(steady(25, forward=lambda i, r: 100.0 if i % 3 else 600.0))
    forwards = [s for s in telemetry.spans if s.name == semconv.STAGE_FORWARD]
    telemetry.metrics = [MetricPoint(semconv.HW_GPU_UTILIZATION, t, v)
                         for s in forwards
                         for t, v in ((s.start_ns, 0.05), ((s.start_ns + s.end_ns) // 2, 0.05),
                                      (s.end_ns, 0.05), (s.end_ns + 30_000_000, 1.0),
                                      (s.start_ns - 10_000_000, 1.0))]  # between requests
    telemetry.metrics += _idle_before(min(s.start_ns for s in telemetry.spans))
    report = diagnose(telemetry)
    assert (report.verdict.cause, report.gpu.level) == ("gpu_starved", "low")
