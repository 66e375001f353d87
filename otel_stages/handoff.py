"""Cross-thread hand-off: the ``queue`` span, and stages of a batch run on an executor thread.

The producer (the request's thread) calls :func:`enqueue_token` right before putting work on a
queue; the token carries the request's OpenTelemetry context, the enqueue time on the span clock
and the queue depth. The consumer calls :func:`dequeue` (one item) or :func:`dequeue_batch`
(several) when it picks work up: that records a ``queue`` span from the enqueue time to now under
the right request, and makes later stages (``forward``) children of that same request even though
they run on another thread. A batch's model call is one ``batch`` span linked to its members
(:meth:`Batch.stage`). Both span modes (:mod:`otel_stages.deferred`): in deferred mode the token's
context carries the request's record instead of its span. OpenTelemetry API only.

Results and errors go back to the waiting requests through whatever the queue carries (a
``concurrent.futures.Future`` per item in :mod:`otel_stages.demo.worker`); telemetry never does it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import INVALID_SPAN, Link, Span, get_current_span

from otel_stages import semconv
from otel_stages._runtime import DEFERRED, RECORD_KEY, RUNTIME, guard
from otel_stages.attributes import clean_attributes
from otel_stages.deferred import DeferredScope, recorded
from otel_stages.stages import _new_stage

_ROOT = otel_context.Context()  # an empty context: a span started in it is a trace root
_GUARD_LINKS = guard("batch span links")


@dataclass(frozen=True, slots=True)
class QueueToken:
    """What crosses the queue with a work item.

    ``context``: the producer's OpenTelemetry context (holds the request span, or in deferred
    mode the request's record); ``enqueued_ns``: span-clock nanoseconds at enqueue; ``depth``:
    items already waiting, or None.
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
    mode = RUNTIME.mode
    if not mode:
        return
    attrs = dict(attributes)
    if token.depth is not None:
        attrs[semconv.QUEUE_DEPTH] = token.depth
    end_ns = max(picked_ns, token.enqueued_ns)
    if mode == DEFERRED:  # already over: queued for building at once (no hooks: not run here)
        recorded(semconv.STAGE_QUEUE, attrs, token.context, token.enqueued_ns, end_ns)
        return
    span = RUNTIME.tracer.start_span(semconv.STAGE_QUEUE, context=token.context,
                                     attributes=clean_attributes(attrs),
                                     start_time=token.enqueued_ns)
    span.end(end_time=end_ns)


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

    Returned by :func:`dequeue_batch`. Each :meth:`stage` is one model call on the whole batch: one
    ``batch`` span (``batch.size``, a span link to every member request) plus one span per request
    (each a child of its own request, same start and end, ``batch.size`` set, a link back to the
    ``batch`` span). The ``batch`` span is a root of its own trace, or a child of ``parent`` when
    given (the executor's own span), never of a member request: a batch belongs to all of them.
    """

    def __init__(self, tokens: Sequence[QueueToken], parent: otel_context.Context | None = None) -> None:
        self.tokens = tuple(tokens)
        self.parent = parent
        #: The ``batch`` span of the running :meth:`stage` (``INVALID_SPAN`` outside it or when
        #: telemetry is off).
        self.span: Span = INVALID_SPAN

    @property
    def size(self) -> int:
        """Number of items in the batch."""
        return len(self.tokens)

    def _member_links(self) -> list[Any]:
        """One link per distinct member request (what was current at enqueue): a ``Link``, or in
        deferred mode the member's record (the builder links to its span)."""
        links: dict[Any, Any] = {}
        for token in self.tokens:
            record = token.context.get(RECORD_KEY)  # Context is a dict
            if record is not None:
                links.setdefault(id(record), record)
                continue
            ctx = get_current_span(token.context).get_span_context()
            if ctx.is_valid:
                links.setdefault((ctx.trace_id, ctx.span_id), Link(ctx))
        return list(links.values())

    @contextmanager
    def stage(self, name: str, /, **attributes: Any) -> Iterator[list[Span]]:
        """Open stage ``name`` (usually ``forward``) for the batch; yields the member spans (one per
        token, in token order). Inside the block the ``batch`` span is the current span (see the
        class docstring), so spans the model code makes are its children.

        An exception in the block is recorded on the ``batch`` span and every member span and
        re-raised unchanged; give it to every waiting request (e.g. ``future.set_exception``).
        """
        attrs = {semconv.BATCH_SIZE: self.size, **attributes}
        start_ns = RUNTIME.clock.now_ns()  # one model call: one window for every span
        batch = _new_stage(semconv.SPAN_BATCH, attrs)
        opened: Span = INVALID_SPAN
        with _GUARD_LINKS:
            opened = batch._open(parent=self.parent if self.parent is not None else _ROOT,
                                 start_ns=start_ns, links=self._member_links())
        back: list[Any] | None = None
        if isinstance(opened, DeferredScope):
            back = [opened]  # resolved to the batch span's context when built
        elif opened.get_span_context().is_valid:
            back = [Link(opened.get_span_context())]
        scopes = [_new_stage(name, attrs) for _ in self.tokens]
        spans = [scope._open(parent=token.context, start_ns=start_ns, links=back)
                 for scope, token in zip(scopes, self.tokens)]
        self.span = opened
        batch._attach()
        error: BaseException | None = None
        try:
            yield spans
        except BaseException as exc:
            error = exc
            raise
        finally:
            end_ns = RUNTIME.clock.now_ns()
            batch._detach()
            for scope in scopes:
                scope._close(error, end_ns=end_ns)
            batch._close(error, end_ns=end_ns)
            self.span = INVALID_SPAN


def dequeue_batch(tokens: Sequence[QueueToken], *, parent: otel_context.Context | None = None,
                  **attributes: Any) -> Batch:
    """Consumer side for a batch: record every item's ``queue`` span now; return a :class:`Batch`.

    ``attributes`` are added to each queue span. ``parent``: the context whose span the ``batch``
    spans become children of (e.g. ``opentelemetry.context.get_current()`` inside the executor's
    own span); by default each ``batch`` span starts a trace of its own.
    """
    picked_ns = RUNTIME.clock.now_ns()
    for token in tokens:
        _record_queue_span(token, picked_ns, attributes)
    return Batch(tokens, parent)
