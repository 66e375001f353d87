"""Serving: 64 concurrent requests through thread pools, asyncio and the batching worker keep each
stage under its own request; the batch span links exactly its members; generators held across
``yield`` leave no wrong current span and no detach errors."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import otel_stages as ots
from otel_stages import propagation, semconv
from otel_stages._runtime import RUNTIME, scoped_tracer
from otel_stages.demo.worker import InferenceWorker

N = 64


@pytest.fixture(autouse=True)
def no_span_left_active():
    yield
    assert not trace.get_current_span().get_span_context().is_valid, "a span was left current"


@pytest.fixture
def propagating():
    """Thread-pool context propagation on for the test (as configure() does by default)."""
    was_on = propagation.is_instrumented()
    propagation.instrument()
    yield
    if not was_on:
        propagation.uninstrument()


def _stage_parents_are_own_requests(captured, stage_names):
    requests = {r.context.span_id: r for r in captured.by_name("request")}
    assert len(requests) == N
    for name in stage_names:
        spans = captured.by_name(name)
        assert len(spans) == N, name
        parents = Counter(s.parent.span_id if s.parent else None for s in spans)
        assert set(parents) == set(requests), f"{name}: a stage outside its request"
        assert set(parents.values()) == {1}, f"{name}: two stages under one request"
        for span in spans:
            assert span.context.trace_id == requests[span.parent.span_id].context.trace_id


def _decode(tag: int) -> int:
    with ots.stage(semconv.STAGE_DECODE, tag=tag):
        return tag


def test_64_threads_submit_to_a_pool_and_every_decode_stays_in_its_request(captured, propagating):
    start = threading.Barrier(N)

    with ThreadPoolExecutor(max_workers=4) as decoders:
        def handle(tag: int) -> int:
            start.wait(5)  # all 64 requests in flight together
            with ots.request(tag=tag):
                return decoders.submit(_decode, tag).result()

        with ThreadPoolExecutor(max_workers=N) as requests:
            assert sorted(requests.map(handle, range(N))) == list(range(N))
    _stage_parents_are_own_requests(captured, [semconv.STAGE_DECODE])
    by_id = {r.context.span_id: r for r in captured.by_name("request")}
    for decode in captured.by_name("decode"):  # the right request, not just some request
        assert by_id[decode.parent.span_id].attributes["tag"] == decode.attributes["tag"]


def test_without_propagation_a_pooled_stage_is_an_orphan(captured):
    """The failure the threading instrumentation fixes (so the test above can fail)."""
    propagation.uninstrument()
    if propagation.is_instrumented():
        pytest.skip("thread-pool propagation was turned on by someone other than otel_stages")
    with ThreadPoolExecutor(max_workers=1) as pool:
        with ots.request():
            pool.submit(_decode, 1).result()
    assert captured.one("decode").parent is None


def test_64_asyncio_tasks_run_in_executor_and_to_thread_stay_in_their_requests(captured, propagating):
    async def handle(tag: int) -> None:
        loop = asyncio.get_running_loop()
        async with ots.request(tag=tag):
            await loop.run_in_executor(None, _decode, tag)
            await asyncio.to_thread(_resize, tag)
            await asyncio.sleep(0)
            async with ots.stage(semconv.STAGE_FORWARD):
                await asyncio.sleep(0)

    def _resize(tag: int) -> None:
        with ots.stage(semconv.STAGE_RESIZE, tag=tag):
            pass

    async def main() -> None:
        await asyncio.gather(*(handle(i) for i in range(N)))

    asyncio.run(main())
    _stage_parents_are_own_requests(
        captured, [semconv.STAGE_DECODE, semconv.STAGE_RESIZE, semconv.STAGE_FORWARD])


def _model(pixels: np.ndarray, prompt_ids: np.ndarray) -> np.ndarray:
    return pixels.reshape(len(pixels), -1).sum(axis=1, keepdims=True) + prompt_ids[:, :1]


def test_64_requests_through_the_batcher_each_batch_links_exactly_its_members(captured, propagating):
    start = threading.Barrier(N)
    with InferenceWorker(_model, max_batch=8, max_wait_ms=20) as worker:
        def handle(tag: int) -> float:
            start.wait(5)
            with ots.request(tag=tag):
                pixels = np.full((3, 2, 2), tag, np.float32)
                return float(worker.infer(pixels, np.array([1, 0], np.int64))[0])

        with ThreadPoolExecutor(max_workers=N) as pool:
            results = list(pool.map(handle, range(N)))
    assert results == [12.0 * tag + 1 for tag in range(N)]  # each caller got its own row back
    _stage_parents_are_own_requests(captured, [semconv.STAGE_QUEUE, semconv.STAGE_FORWARD])

    batches = {b.context.span_id: b for b in captured.by_name(semconv.SPAN_BATCH)}
    assert len(batches) == len(worker.batch_sizes) and sum(worker.batch_sizes) == N
    assert max(worker.batch_sizes) > 1  # 64 callers at once really batched
    requests = {r.context.span_id: r for r in captured.by_name("request")}
    members: dict[int, set[int]] = {b: set() for b in batches}
    for fwd in captured.by_name(semconv.STAGE_FORWARD):
        (back,) = fwd.links  # each forward links to its one batch span
        members[back.context.span_id].add(fwd.parent.span_id)
        batch = batches[back.context.span_id]
        assert (fwd.start_time, fwd.end_time) == (batch.start_time, batch.end_time)
        assert fwd.attributes[semconv.BATCH_SIZE] == batch.attributes[semconv.BATCH_SIZE]
    for span_id, batch in batches.items():
        assert batch.parent is None  # a trace of its own, never a member request's child
        assert batch.context.trace_id not in {r.context.trace_id for r in requests.values()}
        linked = {link.context.span_id for link in batch.links}
        assert linked == members[span_id]  # exactly its members, no more, no less
        assert batch.attributes[semconv.BATCH_SIZE] == len(linked)
        for link in batch.links:
            assert link.context.trace_id == requests[link.context.span_id].context.trace_id


def test_batch_error_reaches_every_waiting_request_and_every_span(captured):
    def broken(pixels: np.ndarray, prompt_ids: np.ndarray) -> np.ndarray:
        raise MemoryError("CUDA out of memory")

    with InferenceWorker(broken, max_batch=4, max_wait_ms=50) as worker:
        futures = []
        for _ in range(3):
            with ots.request():
                futures.append(worker.submit(np.zeros((3, 1, 1), np.float32), np.zeros(1, np.int64)))
        for future in futures:
            with pytest.raises(MemoryError, match="CUDA out of memory"):
                future.result(timeout=5)
    batch = captured.one(semconv.SPAN_BATCH)
    assert batch.status.status_code is StatusCode.ERROR
    assert all(f.status.status_code is StatusCode.ERROR for f in captured.by_name("forward"))


def test_batch_span_is_a_root_even_in_a_thread_started_inside_a_request(captured, propagating):
    """With propagation on, a thread started by the first request carries that request's context:
    the batch span must still not become its child."""
    tokens, done, inherited = [], threading.Event(), []

    def executor() -> None:
        done.wait(5)
        inherited.append(trace.get_current_span())  # the first request's, inherited
        with ots.dequeue_batch(tokens).stage("forward"):
            pass

    with ots.request():
        thread = threading.Thread(target=executor)
        thread.start()
        tokens.append(ots.enqueue_token())
    with ots.request():
        tokens.append(ots.enqueue_token())
    done.set()
    thread.join(5)
    batch = captured.one(semconv.SPAN_BATCH)
    assert inherited[0].get_span_context() == captured.by_name("request")[0].context
    assert batch.parent is None
    assert len(batch.links) == 2


def test_batch_span_is_a_child_of_the_executors_span_when_given(captured):
    with ots.request():
        token = ots.enqueue_token()
    with RUNTIME.tracer.start_as_current_span("executor loop") as executor:
        batch = ots.dequeue_batch([token, token], parent=otel_context.get_current())
        with batch.stage("forward") as spans:
            assert trace.get_current_span() is batch.span  # model code nests under the batch
            with ots.stage("h2d_copy"):
                pass
    span = captured.one(semconv.SPAN_BATCH)
    assert span.parent.span_id == executor.get_span_context().span_id
    assert len(spans) == 2 and len(span.links) == 1  # two items of one request: one link
    assert captured.one("h2d_copy").parent.span_id == span.context.span_id


def test_service_with_its_own_sdk_gets_propagation_without_configure():
    """No configure(): the service's own provider; propagation is context-API only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = RUNTIME.tracer, RUNTIME.enabled
    RUNTIME.tracer, RUNTIME.enabled = scoped_tracer(provider), True
    was_on = propagation.is_instrumented()
    propagation.instrument()
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            with ots.request():
                pool.submit(_decode, 7).result()
    finally:
        RUNTIME.tracer, RUNTIME.enabled = saved
        if not was_on:
            propagation.uninstrument()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["decode"].parent.span_id == spans["request"].context.span_id


def test_configure_turns_propagation_on_and_the_setting_turns_it_off(tmp_path, monkeypatch):
    from otel_stages.sdk import configure

    was_on = propagation.is_instrumented()
    telemetry = configure(data_dir=tmp_path, gpu="off", set_global=False)
    try:
        assert propagation.is_instrumented()
        monkeypatch.setenv("OTEL_STAGES_PROPAGATE_CONTEXT", "false")
        telemetry = configure(data_dir=tmp_path, gpu="off", set_global=False)
        assert not propagation.is_instrumented()
        monkeypatch.setenv("OTEL_STAGES_PROPAGATE_CONTEXT", "sometimes")
        with pytest.raises(ots.ConfigurationError, match="OTEL_STAGES_PROPAGATE_CONTEXT='sometimes'"):
            configure(data_dir=tmp_path, gpu="off", set_global=False)
    finally:
        telemetry.shutdown()
        if was_on:
            propagation.instrument()


# -- generators held across yield --------------------------------------------------------------

def test_async_generator_with_block_closed_by_another_task(captured, caplog):
    async def tokens():
        async with ots.stage(semconv.STAGE_FORWARD):
            for i in range(3):
                yield i

    seen = []

    async def consume(gen) -> None:
        async for _ in gen:
            seen.append(trace.get_current_span())
            break

    async def main() -> None:
        async with ots.request() as request_span:
            gen = tokens()
            await asyncio.create_task(consume(gen))
            await asyncio.create_task(gen.aclose())  # closed from another task
            assert seen == [request_span]  # not `forward`: the consumer's span is its own

    with caplog.at_level(logging.ERROR, logger="opentelemetry.context"):
        asyncio.run(main())
    assert not [r for r in caplog.records if "detach" in r.getMessage()]
    fwd, req = captured.one("forward"), captured.one("request")
    assert fwd.parent.span_id == req.context.span_id


def test_sync_generator_with_block_closed_on_another_thread(captured, caplog):
    def tokens():
        with ots.stage(semconv.STAGE_FORWARD):
            yield from range(3)

    with caplog.at_level(logging.ERROR, logger="opentelemetry.context"):
        with ots.request() as request_span:
            gen = tokens()
            next(gen)
            assert trace.get_current_span() is request_span
            closer = threading.Thread(target=gen.close)
            closer.start()
            closer.join(5)
    assert not [r for r in caplog.records if "detach" in r.getMessage()]
    assert captured.one("forward").parent.span_id == captured.one("request").context.span_id


def test_contextmanager_generator_still_makes_its_stage_current(captured):
    import contextlib

    @contextlib.contextmanager
    def traced():
        with ots.stage("model") as span:
            yield span

    @contextlib.asynccontextmanager
    async def atraced():
        async with ots.stage("amodel") as span:
            yield span

    async def main() -> None:
        async with atraced() as span:
            assert trace.get_current_span() is span

    with traced() as span:
        assert trace.get_current_span() is span
    asyncio.run(main())
