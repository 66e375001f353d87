"""Cross-thread hand-off: the ``queue`` span, and stages of a batch run on an executor thread.

The producer (the request's thread) calls :func:`enqueue_token` right before putting work on a
queue; the token carries the request's OpenTelemetry context, the enqueue time on the span clock
and the queue depth. The consumer calls :func:`dequeue` (one item) or :func:`dequeue_batch`
(several) when it picks work up: that records a ``queue`` span from the enqueue time to now under
the right request, and makes later stages (``forward``) children of that same request even though
they run on another thread. OpenTelemetry API only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import Span

from otel_stages import semconv
from otel_stages._runtime import RUNTIME, guard
from otel_stages.stages import StageScope


@dataclass(frozen=True, slots=True)
class QueueToken:
    """What crosses the queue with a work item.

    ``context``: the producer's OpenTelemetry context (holds the request span);
    ``enqueued_ns``: span-clock nanoseconds at enqueue; ``depth``: items already waiting, or None.
    """

    context: otel_context.Context
    enqueued_ns: int
    depth: int | None = None


def enqueue_token(depth: int | None = None) -> QueueToken:
    """Capture the current context and time; call on the producer just before ``queue.put``.

    ``depth`` is the number of items already waiting (e.g. ``queue.qsize()``), recorded as
    ``queue.depth`` on the queue span.
    """
    return QueueToken(otel_context.get_current(), RUNTIME.clock.now_ns(), depth)


@guard("queue span")
def _record_queue_span(token: QueueToken, picked_ns: int, attributes: dict[str, Any]) -> None:
    if not RUNTIME.enabled:
        return
    attrs = dict(attributes)
    if token.depth is not None:
        attrs[semconv.QUEUE_DEPTH] = token.depth
    span = RUNTIME.tracer.start_span(semconv.STAGE_QUEUE, context=token.context,
                                     attributes=attrs, start_time=token.enqueued_ns)
    span.end(end_time=max(picked_ns, token.enqueued_ns))


@contextmanager
def dequeue(token: QueueToken, **attributes: Any) -> Iterator[None]:
    """Consumer side for one item: record its ``queue`` span, then run the block in its context.

    Inside the block, :func:`otel_stages.stage` spans are children of the producer's request.
    """
    _record_queue_span(token, RUNTIME.clock.now_ns(), attributes)
    attach_token = otel_context.attach(token.context)
    try:
        yield
    finally:
        otel_context.detach(attach_token)


class Batch:
    """Several requests' items processed together by one executor call.

    Returned by :func:`dequeue_batch`. :meth:`stage` opens one span per request (each a child of
    its own request, same start and end) with ``batch.size`` set, since one model call serves
    them all.
    """

    def __init__(self, tokens: Sequence[QueueToken]) -> None:
        self.tokens = tuple(tokens)

    @property
    def size(self) -> int:
        """Number of requests in the batch."""
        return len(self.tokens)

    @contextmanager
    def stage(self, name: str, /, **attributes: Any) -> Iterator[list[Span]]:
        """Open stage ``name`` in every request of the batch; yields the spans (one per token).

        An exception in the block is recorded on every span and re-raised unchanged.
        """
        attrs = {semconv.BATCH_SIZE: self.size, **attributes}
        scopes = [StageScope(name, attrs) for _ in self.tokens]
        start_ns = RUNTIME.clock.now_ns()  # one model call: one window for every request's span
        spans = [scope._open(parent=token.context, start_ns=start_ns)
                 for scope, token in zip(scopes, self.tokens)]
        error: BaseException | None = None
        try:
            yield spans
        except BaseException as exc:
            error = exc
            raise
        finally:
            end_ns = RUNTIME.clock.now_ns()
            for scope in scopes:
                scope._close(error, end_ns=end_ns)


def dequeue_batch(tokens: Sequence[QueueToken], **attributes: Any) -> Batch:
    """Consumer side for a batch: record every item's ``queue`` span now; return a :class:`Batch`.

    ``attributes`` are added to each queue span.
    """
    picked_ns = RUNTIME.clock.now_ns()
    for token in tokens:
        _record_queue_span(token, picked_ns, attributes)
    return Batch(tokens)

