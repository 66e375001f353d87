"""analysis.batching: batch sizes, member waits and batch fill times from batch spans and their
links; span links read from real OTLP/JSON exporter output."""

from __future__ import annotations

import json

import msgspec
import pytest
from opentelemetry.exporter.otlp.json.file import FileSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import otel_stages as ots
from otel_stages import semconv
from otel_stages._runtime import RUNTIME, scoped_tracer
from otel_stages.analysis import diagnose, load_paths
from otel_stages.analysis.batching import summarize_batches
from otel_stages.analysis.model import Recording, Span
from otel_stages.analysis.otlp_json import parse_export_request
from otel_stages.render import render_text

MS = 1_000_000
PROC = {semconv.SERVICE_INSTANCE_ID: "worker-1"}
#: A realistic Unix time (2023): the report screens out spans that start before 2000.
BASE_NS = 1_700_000_000_000_000_000


def _request(n: int, enq_ms: float, picked_ms: float, resource=PROC) -> list[Span]:
    trace = f"{n:032x}"
    req = Span(trace, f"{n:016x}", None, "request", BASE_NS + int(enq_ms * MS), BASE_NS + int((picked_ms + 50) * MS),
               resource=resource)
    queue = Span(trace, f"{n + 1000:016x}", req.span_id, "queue", BASE_NS + int(enq_ms * MS), BASE_NS + int(picked_ms * MS),
                 resource=resource)
    return [req, queue]


def _batch(n: int, start_ms: float, end_ms: float, members: list[int], resource=PROC,
           size: int | None = None) -> Span:
    links = tuple((f"{m:032x}", f"{m:016x}") for m in members)
    return Span(f"{n + 5000:032x}", f"{n + 5000:016x}", None, semconv.SPAN_BATCH, BASE_NS + int(start_ms * MS),
                BASE_NS + int(end_ms * MS), attributes={semconv.BATCH_SIZE: size or len(members)},
                resource=resource, links=links)


def test_no_batch_spans_means_no_summary():
    assert summarize_batches(_request(1, 0, 5)) is None
    assert diagnose(Recording(spans=_request(1, 0, 5))).to_dict()["batches"] is None


def test_sizes_waits_and_fill_after_the_executor_was_free():
    spans = [*_request(1, 0, 10), *_request(2, 4, 10), *_request(3, 12, 40), *_request(4, 14, 40)]
    spans += [_batch(1, 10.5, 30, [1, 2]),  # executor idle: filled from the first enqueue (0 -> 10)
              _batch(2, 40.5, 60, [3, 4])]  # busy until 30: waited 12 -> 30 for it, filled 30 -> 40
    summary = summarize_batches(spans)
    assert summary is not None
    assert summary.sizes == {2: 2} and summary.mean_size == 2.0
    assert sorted(summary.wait_ms) == [6.0, 10.0, 26.0, 28.0]
    assert summary.fill_ms == [10.0, 10.0]
    assert summary.call_ms == [19.5, 19.5]
    assert summary.unmatched_members == 0 and not summary.overlapping_executors
    d = summary.to_dict()
    assert d["sizes"] == {"2": 2} and d["max_size"] == 2 and d["fill_ms"]["max_ms"] == 10.0


def test_busy_correction_not_applied_when_executors_overlap_or_across_processes():
    other = {semconv.SERVICE_INSTANCE_ID: "worker-2"}
    spans = [*_request(1, 0, 10), *_request(3, 12, 40, other)]
    spans += [_batch(1, 10.5, 30, [1]), _batch(2, 40.5, 60, [3], resource=other)]
    assert summarize_batches(spans).fill_ms == [10.0, 28.0]  # other process: not "busy until 30"
    spans = [*_request(1, 0, 10), *_request(2, 12, 40), *_request(3, 20, 25)]
    spans += [_batch(1, 10.5, 30, [1]), _batch(2, 40.5, 60, [2]), _batch(3, 25.5, 35, [3])]
    summary = summarize_batches(spans)
    assert summary.overlapping_executors
    assert summary.fill_ms == [10.0, 5.0, 28.0]  # each from its first enqueue


def test_links_to_requests_without_queue_spans_are_counted():
    spans = [*_request(1, 0, 10), _batch(1, 10.5, 30, [1, 77], size=2)]
    summary = summarize_batches(spans)
    assert summary.unmatched_members == 1 and summary.wait_ms == [10.0]
    assert "1 linked requests had no queue span" in "\n".join(summary.describe())


def test_report_json_and_text_carry_the_batches_section(tmp_path):
    spans = [*_request(1, 0, 10), *_request(2, 4, 10), _batch(1, 10.5, 30, [1, 2])]
    report = diagnose(Recording(spans=spans))
    assert report.to_dict()["batches"]["batches"] == 1
    text = render_text(report)
    assert "Batches:" in text and "1 batches, mean size 2.0, largest 2" in text


def test_links_round_trip_through_the_real_otlp_json_exporter(tmp_path):
    path = tmp_path / "traces.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(path)))
    saved = RUNTIME.tracer, RUNTIME.enabled
    RUNTIME.tracer, RUNTIME.enabled = scoped_tracer(provider), True
    try:
        tokens = []
        for _ in range(3):
            with ots.request():
                tokens.append(ots.enqueue_token())
        with ots.dequeue_batch(tokens).stage("forward"):
            pass
    finally:
        RUNTIME.tracer, RUNTIME.enabled = saved
        provider.shutdown()
    recording = load_paths([path])
    assert recording.problems == []
    by_name: dict[str, list[Span]] = {}
    for span in recording.spans:
        by_name.setdefault(span.name, []).append(span)
    (batch,) = by_name["batch"]
    assert set(batch.links) == {(r.trace_id, r.span_id) for r in by_name["request"]}
    assert all(f.links == ((batch.trace_id, batch.span_id),) for f in by_name["forward"])
    summary = summarize_batches(recording.spans)
    assert summary.sizes == {3: 1} and len(summary.wait_ms) == 3


@pytest.mark.parametrize("links", ["nope", [{"traceId": "xyz"}], [7]])
def test_malformed_links_make_the_span_a_problem_not_a_crash(links):
    span = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "2", "name": "batch",
            "startTimeUnixNano": "1", "endTimeUnixNano": "2", "links": links}
    request = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [span]}]}]}
    recording = parse_export_request(json.loads(json.dumps(request)))
    assert recording.spans == [] and len(recording.problems) == 1
    assert "link" in recording.problems[0]


def test_batches_holding_a_request_that_is_not_warm_give_no_wait_or_fill():
    """A tester's start-up burst: 20 requests arriving during a 3 s lazy model load waited ~3 s
    behind the cold batch; their waits made the p95 wait 3000 ms and the advice "the requests wait
    for the executor, not for batches to fill" while the warm swing was the 50 ms fill timeout.
    A batch with a cold or set-apart member now gives no wait and no fill."""
    spans = [*_request(1, 0, 3000), *_request(2, 1, 3000), *_request(3, 3100, 3150), *_request(4, 3120, 3150)]
    spans += [_batch(1, 3000.5, 3020, [1, 2]), _batch(2, 3150.5, 3170, [3, 4])]
    every = summarize_batches(spans)
    assert every is not None and max(every.wait_ms) == 3000.0 and every.aside_batches == 0
    summary = summarize_batches(spans, {(f"{2:032x}", f"{2:016x}")})  # request 2 set apart
    assert summary is not None
    assert sorted(summary.wait_ms) == [30.0, 50.0] and summary.fill_ms == [50.0]
    assert summary.batches == 2 and summary.aside_batches == 1
    assert summary.to_dict()["aside_batches"] == 1
    assert summary.describe()[-1] == ("1 batches holding a cold or set-apart request left out of the"
                                      " waits and fills")


def test_the_report_reads_the_warm_batches(tmp_path):
    """End to end: the first request of the process is cold and its batch partner waited behind
    it; the queue advice reads the warm batches' fill."""
    spans = []
    for i in range(40):
        enq = 0.0 if i < 2 else 3100.0 + 60 * i
        picked = 3000.0 if i < 2 else enq + 45.0
        spans += _request(i + 1, enq, picked)
    for b in range(20):
        members = [2 * b + 1, 2 * b + 2]
        start = 3000.5 if b == 0 else 3100.0 + 60 * (2 * b + 1) + 45.5
        spans.append(_batch(b + 1, start, start + 20, members))
    report = diagnose(Recording(spans=spans)).to_dict()
    assert report["batches"]["aside_batches"] >= 1
    assert report["batches"]["wait_ms"]["max_ms"] < 100.0


def test_a_failed_member_keeps_its_batch_waits(tmp_path):
    """A tester's: the oldest member of each batch that waited behind a slow one timed out; the
    failed member set its batch aside, so the waits that make the swing left the advice ("lower
    the fill timeout" beside a queue p95 of 250 ms). A failed member keeps its batch's waits."""
    spans = []
    for i in range(40):
        enq = 100.0 * i
        slow = i % 10 == 5
        picked = enq + (290.0 if slow else 20.0)
        spans += _request(i + 1, enq, picked)
        if slow:
            spans[-2] = msgspec.structs.replace(spans[-2], error=True)
    for i in range(40):
        start = 100.0 * i + (290.0 if i % 10 == 5 else 20.0) + 0.5
        spans.append(_batch(i + 1, start, start + 10, [i + 1]))
    report = diagnose(Recording(spans=spans)).to_dict()
    assert report["batches"]["aside_batches"] == 1  # (the first request: cold)
    assert report["batches"]["wait_ms"]["max_ms"] == 290.0
