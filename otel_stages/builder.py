"""The span builder of deferred mode: turns queued stage records into spans on its own thread.

:class:`SpanBuilder` receives finished :class:`~otel_stages.deferred.DeferredScope` records in end
order (:meth:`SpanBuilder.submit`, on the request thread: a length check and a ``deque.append``)
and, every :data:`BUILD_INTERVAL_S` seconds or as soon as :data:`WAKE_AT_RECORDS` wait, starts
and ends their spans through the OpenTelemetry API with the recorded times. A record whose parent
(or link target) has no span yet starts that span first, with the parent's own start time and
start attributes, and ends it when the parent's record arrives; so spans end in the order the
stages ended, parents after children, as in live mode.

Bounded and counted: at most ``max_queue`` records wait (``queue_full`` drops past that),
records submitted after :meth:`SpanBuilder.shutdown` are ``already_shutdown`` drops, and records
still waiting at the shutdown deadline are ``shutdown_timeout`` drops, all through the
``drops`` counter given (``otel_stages.delivery.DropCounter``) and :attr:`SpanBuilder.dropped`.
Stages still open at shutdown are ended then, with ``otel_stages.interrupted=true``.

Thread-safety: :meth:`submit` from any thread (lock-free); building happens under one lock, on
the builder thread or in :meth:`flush` / :meth:`shutdown` on the caller's. OpenTelemetry API
only (the tracer it is given may come from any SDK setup).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span

from otel_stages import semconv
from otel_stages._runtime import RUNTIME, guard
from otel_stages.attributes import clean_attributes
from otel_stages.deferred import DeferredScope, parent_context_of, resolve_link

logger = logging.getLogger("otel_stages")

BUILD_INTERVAL_S = 0.2  #: seconds between builds when few records wait
#: records waiting that wake the builder before its interval (one cheap check per submit)
WAKE_AT_RECORDS = 1024
#: records that may wait at most (about 1 kB each plus their attribute values); more are dropped
#: and counted. At the target load of 6000 spans/s: 2.7 s of builder stall.
DEFAULT_MAX_QUEUE = 16_384

_GUARD_BUILD = guard("deferred span build")


class SpanBuilder:
    """Builds deferred records into spans of ``tracer`` (module docstring).

    ``drops``: an object with ``add_spans(reason, count)`` (a ``DropCounter``), or ``None``.
    ``interval_s``: build period. ``max_queue``: records that may wait. Starts its daemon thread
    at once (and again in a forked child, with nothing of the parent's).
    """

    def __init__(self, tracer: trace.Tracer, *, drops: Any = None,
                 interval_s: float = BUILD_INTERVAL_S, max_queue: int = DEFAULT_MAX_QUEUE,
                 wake_at: int = WAKE_AT_RECORDS) -> None:
        self.tracer = tracer
        self.drops = drops
        self.interval_s = interval_s
        self.max_queue = max_queue
        self.wake_at = min(wake_at, max_queue)
        #: Records not yet built, in end order (request threads append, the builder pops).
        self.queue: collections.deque[DeferredScope] = collections.deque()
        #: Records entered and not ended yet (ended as interrupted at shutdown).
        self.open: dict[DeferredScope, bool] = {}
        #: Records lost, by reason (also given to ``drops``).
        self.dropped: dict[str, int] = {}
        self.built = 0  #: spans ended so far
        #: True once :meth:`shutdown` began: records submitted later are dropped (counted)
        self.stopped = False
        self._start_thread()
        if hasattr(os, "register_at_fork"):
            ref = weakref.WeakMethod(self._after_fork)

            def after_fork() -> None:
                method = ref()
                if method is not None:
                    method()

            os.register_at_fork(after_in_child=after_fork)

    def _start_thread(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-stages-span-builder", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:
        """In a forked child: the parent's records are not the child's; a new thread builds."""
        self.queue.clear()
        self.open.clear()
        if not self.stopped:
            self._start_thread()

    # -- request thread ---------------------------------------------------------------------------
    def submit(self, record: DeferredScope) -> None:
        """Queue a finished record (called when its stage ends)."""
        queue = self.queue
        waiting = len(queue)
        if waiting >= self.wake_at:
            if self.stopped:
                self._drop(semconv.DROP_AFTER_SHUTDOWN, 1)
                return
            if waiting >= self.max_queue:
                self._drop(semconv.DROP_QUEUE_FULL, 1)
                return
            self._wake.set()
        elif self.stopped:
            self._drop(semconv.DROP_AFTER_SHUTDOWN, 1)
            return
        queue.append(record)

    def _drop(self, reason: str, count: int) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count
        if self.drops is not None:
            self.drops.add_spans(reason, count)

    # -- building ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self.stopped:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if not self.stopped:
                self.drain()

    def drain(self, deadline: float | None = None) -> bool:
        """Build every queued record now; ``deadline`` (``time.monotonic()``) bounds the work.
        Returns ``True`` when the queue was emptied."""
        with self._lock:
            queue = self.queue
            build = self._build
            while queue:
                if deadline is not None and time.monotonic() > deadline:
                    return False
                record = queue.popleft()
                with _GUARD_BUILD:  # one bad record must not stop the others
                    build(record)
        return True

    def _start(self, record: DeferredScope) -> Span:
        """``record``'s span, started now (parents and link targets first) if it has none."""
        span = record.span
        if span is not None:
            return span
        links = ([resolve_link(target, self._start) for target in record.links]
                 if record.links else None)
        context = parent_context_of(record, self._start)
        attributes = record.start_attributes()
        span = record.span = self.tracer.start_span(
            record.name, context=context, attributes=clean_attributes(attributes) if attributes else None,
            links=links, start_time=record.start_ns)
        return span

    def start_now(self, record: DeferredScope) -> Span:
        """``record``'s span, started now on the caller's thread if it has none yet (parents
        first), for a live span that must be its child. The builder still ends it."""
        with self._lock:
            return self._start(record)

    def _build(self, record: DeferredScope) -> None:
        span = self._start(record)
        record.replay(span)
        if record.interrupted:
            span.set_attribute(semconv.OTEL_STAGES_INTERRUPTED, True)
        span.end(end_time=record.end_ns)
        record.links = None  # resolved; the records they named can go
        self.built += 1

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Build what waits now, on the caller's thread; ``False`` when time ran out."""
        return self.drain(time.monotonic() + max(0.0, timeout_s))

    def shutdown(self, deadline: float) -> bool:
        """Stop the thread, end the stages still open (``otel_stages.interrupted=true``, now) and
        build everything by ``deadline`` (``time.monotonic()``); what is left is counted as
        ``shutdown_timeout``. Returns ``True`` when nothing was left. Idempotent."""
        if self.stopped:
            return True
        self.stopped = True
        self._wake.set()
        self._thread.join(max(0.0, min(deadline - time.monotonic(), self.interval_s + 1.0)))
        now = RUNTIME.clock.now_ns()
        interrupted = []
        for record in list(self.open):
            if self.open.pop(record, None) is not None:  # its own end lost the race: ours
                record.end_ns = max(now, record.start_ns)
                record.interrupted = True
                interrupted.append(record)
        interrupted.sort(key=_depth, reverse=True)  # children end before their parents
        self.queue.extend(interrupted)
        done = self.drain(deadline)
        if not done:
            left = len(self.queue)
            self.queue.clear()
            self._drop(semconv.DROP_SHUTDOWN_TIMEOUT, left)
        return done


def _depth(record: DeferredScope) -> int:
    depth = 0
    parent = record.parent
    while parent is not None:
        depth += 1
        parent = parent.parent
    return depth
