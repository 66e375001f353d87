"""request()/stage(): span trees, timing on the span clock, errors, decorators, no-op mode."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

import otel_stages as ots
from otel_stages import semconv, sequence
from otel_stages._runtime import RUNTIME
from otel_stages.clock import Clock


def test_request_and_stages_form_a_tree(captured):
    with ots.request(request_id="r-1"):
        with ots.stage("download"):
            pass
        with ots.stage("decode", **{semconv.IMAGE_SIZE: 123}) as span:
            span.set_attribute(semconv.IMAGE_WIDTH, 640)
    req = captured.one("request")
    children = captured.children(req)
    assert [c.name for c in children] == ["download", "decode"]
    assert all(c.context.trace_id == req.context.trace_id for c in children)
    assert captured.one("decode").attributes[semconv.IMAGE_SIZE] == 123
    assert captured.one("decode").attributes[semconv.IMAGE_WIDTH] == 640
    assert req.attributes[semconv.REQUEST_ID] == "r-1"


def test_request_is_child_of_enclosing_http_server_span(captured):
    tracer = RUNTIME.tracer
    with tracer.start_as_current_span("POST /infer", kind=trace.SpanKind.SERVER):
        with ots.request():
            with ots.stage("forward"):
                pass
    server, req = captured.one("POST /infer"), captured.one("request")
    assert req.parent.span_id == server.context.span_id
    assert captured.one("forward").parent.span_id == req.context.span_id


def test_seq_and_cold_start(captured, monkeypatch):
    monkeypatch.setattr(sequence, "_SEQUENCE", sequence._Sequence())
    for _ in range(3):
        with ots.request():
            pass
    ots.mark_cold_start()  # e.g. the model was reloaded
    with ots.request():
        pass
    with ots.request(cold_start=False):
        pass
    reqs = captured.by_name("request")
    assert [r.attributes[semconv.REQUEST_SEQ] for r in reqs] == [1, 2, 3, 4, 5]
    assert [r.attributes[semconv.REQUEST_COLD_START] for r in reqs] == [True, False, False, True, False]


def test_span_times_come_from_the_injected_monotonic_clock(captured_fake_clock):
    captured, fake_time = captured_fake_clock
    with ots.request():
        with ots.stage("decode"):
            fake_time.advance_ms(12.5)
        fake_time.advance_ms(1)
    decode, req = captured.one("decode"), captured.one("request")
    assert decode.end_time - decode.start_time == 12_500_000
    assert req.end_time - req.start_time == 13_500_000
    assert decode.start_time == 1_700_000_000_000_000_000  # anchored once to wall time


def test_clock_ignores_wall_clock_steps():
    wall = [1_000_000_000_000]
    mono = [0]
    clock = Clock(monotonic_ns=lambda: mono[0], wall_ns=lambda: wall[0])
    t0 = clock.now_ns()
    wall[0] -= 3_600_000_000_000  # NTP steps the clock back an hour
    mono[0] += 5_000_000
    assert clock.now_ns() - t0 == 5_000_000


def test_exception_recorded_and_reraised_unchanged(captured):
    class Boom(RuntimeError):
        pass

    err = Boom("model exploded")
    with pytest.raises(Boom) as info:
        with ots.request():
            with ots.stage("forward"):
                raise err
    assert info.value is err
    fwd = captured.one("forward")
    assert fwd.status.status_code is StatusCode.ERROR
    assert "model exploded" in fwd.status.description
    assert fwd.attributes[semconv.ERROR_TYPE] == "test_exception_recorded_and_reraised_unchanged.<locals>.Boom"
    assert [e.name for e in fwd.events] == ["exception"]
    assert captured.one("request").status.status_code is StatusCode.ERROR


def test_decorator_on_function_coroutine_generator_and_async_generator(captured):
    @ots.stage("resize")
    def sync_fn(x):
        return x * 2

    @ots.stage("forward")
    async def coro(x):
        await asyncio.sleep(0)
        return x + 1

    @ots.stage("decode")
    def gen(n):
        for i in range(n):
            with ots.stage("chunk"):
                pass
            yield i

    @ots.stage("download")
    async def agen(n):
        for i in range(n):
            yield i

    async def consume():
        return [i async for i in agen(3)]

    assert sync_fn(2) == 4
    assert asyncio.run(coro(1)) == 2
    assert list(gen(2)) == [0, 1]
    assert asyncio.run(consume()) == [0, 1, 2]
    assert sorted(captured.names()) == sorted(["resize", "forward", "chunk", "chunk", "decode", "download"])
    decode = captured.one("decode")
    assert all(c.parent.span_id == decode.context.span_id for c in captured.by_name("chunk"))
    # Each call gets its own span.
    sync_fn(1)
    assert len(captured.by_name("resize")) == 2


def test_generator_span_records_error_thrown_inside(captured):
    @ots.stage("decode")
    def gen():
        yield 1
        raise KeyError("bad chunk")

    g = gen()
    assert next(g) == 1
    with pytest.raises(KeyError):
        next(g)
    assert captured.one("decode").status.status_code is StatusCode.ERROR


def test_generator_closed_early_is_not_an_error(captured):
    @ots.stage("decode")
    def gen():
        yield from range(10)

    g = gen()
    next(g)
    g.close()
    assert captured.one("decode").status.status_code is StatusCode.UNSET


def test_queue_handoff_parents_spans_across_threads(captured):
    work: queue.Queue = queue.Queue()
    done = threading.Event()
    seen_thread = {}

    def executor():
        token = work.get()
        with ots.dequeue(token):
            with ots.stage("forward"):
                seen_thread["id"] = threading.get_ident()
        done.set()

    t = threading.Thread(target=executor)
    t.start()
    with ots.request():
        work.put(ots.enqueue_token(depth=4))
        assert done.wait(5)
    t.join(5)
    req = captured.one("request")
    q, fwd = captured.one("queue"), captured.one("forward")
    assert q.parent.span_id == req.context.span_id
    assert fwd.parent.span_id == req.context.span_id
    assert q.attributes[semconv.QUEUE_DEPTH] == 4
    assert q.end_time <= fwd.start_time
    assert seen_thread["id"] != threading.get_ident()


def test_batch_stage_opens_one_forward_per_request(captured):
    tokens = []
    for _ in range(3):
        with ots.request():
            tokens.append(ots.enqueue_token())
    batch = ots.dequeue_batch(tokens)
    with pytest.raises(RuntimeError):
        with batch.stage("forward") as spans:
            assert len(spans) == 3
            raise RuntimeError("CUDA OOM")
    reqs = captured.by_name("request")
    fwds = captured.by_name("forward")
    assert {f.parent.span_id for f in fwds} == {r.context.span_id for r in reqs}
    assert all(f.attributes[semconv.BATCH_SIZE] == 3 for f in fwds)
    assert len({f.start_time for f in fwds}) == 1 and len({f.end_time for f in fwds}) == 1
    assert all(f.status.status_code is StatusCode.ERROR for f in fwds)
    assert len(captured.by_name("queue")) == 3


def test_disabled_is_a_no_op(captured):
    RUNTIME.enabled = False
    try:
        with ots.request() as req_span:
            with ots.stage("decode") as span:
                span.set_attribute("x", 1)  # must be accepted and ignored
        assert not req_span.is_recording()
        assert captured.spans == []
    finally:
        RUNTIME.enabled = True


def test_stage_end_hook_sees_span_before_end_and_failures_do_not_break_caller(captured, monkeypatch, caplog):
    seen = []

    def hook(span, name, start_ns, end_ns):
        span.set_attribute("hooked", True)
        seen.append((name, end_ns >= start_ns))

    def broken(span, name, start_ns, end_ns):
        raise RuntimeError("hook bug")

    RUNTIME.add_stage_end_hook(hook)
    RUNTIME.add_stage_end_hook(broken)
    monkeypatch.delenv("PYTEST_CURRENT_TEST")  # production policy: log once, continue
    try:
        with caplog.at_level(logging.WARNING, logger="otel_stages"):
            with ots.stage("forward"):
                pass
            with ots.stage("forward"):
                pass
    finally:
        RUNTIME.remove_stage_end_hook(hook)
        RUNTIME.remove_stage_end_hook(broken)
    assert seen == [("forward", True), ("forward", True)]
    assert all(s.attributes["hooked"] for s in captured.by_name("forward"))
    assert sum("hook bug" in r.getMessage() for r in caplog.records) == 1  # logged once
