"""Between a span's end and its destination: nothing lost without a count, nothing waited on
without a bound. Used only by :mod:`otel_stages.sdk` (this module imports the SDK).

What the OpenTelemetry SDK 1.45.1 does by itself, read from its source
(``opentelemetry/sdk/_shared_internal/__init__.py``, ``sdk/trace/__init__.py``,
``exporter/otlp/common/http.py``, ``exporter/otlp/proto/grpc/exporter.py``):

* ``BatchSpanProcessor.force_flush(timeout_millis)`` ignores the timeout (upstream issue #4568):
  it exports on the caller's thread until the queue is empty and returns ``True`` even when
  every batch failed. ``shutdown()`` takes no timeout (30 s inside) and ``TracerProvider``
  shuts processors down one after the other.
* A full queue drops the oldest span with one log line (de-duplicated per 20 s); the only count
  is the opt-in ``otel.sdk.processor.span.processed`` metric.
* The OTLP exporters give each export ``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s) including retries.
  Their ``shutdown()`` stops retry back-off; gRPC's also closes the channel, which cancels a call
  in flight, while HTTP's closes only idle connections (a request in flight runs to its timeout).
* ``PeriodicExportingMetricReader`` ignores its exporter's result.

So this module wraps, rather than replaces, those pieces:

* :class:`DropCounter` counts spans and metric points lost, by reason (``semconv.DROP_*``), and
  logs at most one line per period;
* :class:`CountingSpanExporter` / :class:`CountingMetricExporter` count what an export failed
  to deliver and can be *abandoned* at a shutdown deadline (the rest counted, the transport
  closed, later batches refused at once);
* :func:`count_queue_drops` hooks the batch processor's own accounting (the object the SDK
  reports ``queue_full`` and ``already_shutdown`` drops to), so the count is the SDK's, exact;
* :class:`OpenSpans` remembers started, unended spans (one dict insert and delete per span) so
  that shutdown can end them with ``otel_stages.interrupted=true`` instead of losing them;
* :func:`run_bounded` runs flush / shutdown steps on helper threads and stops waiting at a
  deadline.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from otel_stages import semconv

logger = logging.getLogger("otel_stages")

#: At most one "dropped" log line per this many seconds (the rest are summed into the next one).
LOG_PERIOD_S = 10.0
#: Open spans remembered at most (a span that is started and never ended would otherwise be kept
#: forever); beyond it new spans are not tracked, and that is logged once.
MAX_OPEN_SPANS = 100_000


def _after_fork_in_child(method: Callable[[], None]) -> None:
    """Run the bound ``method`` in a forked child while its object lives (held weakly, as the
    SDK does, so a replaced configuration can be collected)."""
    if not hasattr(os, "register_at_fork"):
        return
    ref = weakref.WeakMethod(method)

    def call() -> None:
        bound = ref()
        if bound is not None:
            bound()

    os.register_at_fork(after_in_child=call)


class DropCounter:
    """Spans and metric points that did not reach the destination, by reason. Thread-safe.

    ``describe`` names the destination in log lines. Counts are cumulative for this process
    (reset in a forked child, which starts with nothing of its own lost).
    """

    def __init__(self, describe: str, log_period_s: float = LOG_PERIOD_S) -> None:
        self.describe = describe
        self.log_period_s = log_period_s
        self._lock = threading.Lock()
        self.spans: dict[str, int] = dict.fromkeys(semconv.DROP_REASONS, 0)
        self.points: dict[str, int] = dict.fromkeys(semconv.DROP_REASONS, 0)
        self._unlogged_spans = 0
        self._unlogged_points = 0
        self._last_log = 0.0
        _after_fork_in_child(self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self.spans = dict.fromkeys(semconv.DROP_REASONS, 0)
        self.points = dict.fromkeys(semconv.DROP_REASONS, 0)
        self._unlogged_spans = self._unlogged_points = 0

    @property
    def total_spans(self) -> int:
        """All spans lost so far."""
        return sum(self.spans.values())

    @property
    def total_points(self) -> int:
        """All metric points lost so far."""
        return sum(self.points.values())

    def add_spans(self, reason: str, count: int) -> None:
        """Count ``count`` spans lost for ``reason``; may log (once per period)."""
        if count <= 0:
            return
        with self._lock:
            self.spans[reason] = self.spans.get(reason, 0) + count
            self._unlogged_spans += count
        self.log_if_due()

    def add_points(self, reason: str, count: int) -> None:
        """Count ``count`` metric points lost for ``reason``; may log (once per period)."""
        if count <= 0:
            return
        with self._lock:
            self.points[reason] = self.points.get(reason, 0) + count
            self._unlogged_points += count
        self.log_if_due()

    def log_if_due(self, force: bool = False) -> None:
        """Log the drops not yet logged, when the period has passed (or ``force``)."""
        now = time.monotonic()
        with self._lock:
            if not (self._unlogged_spans or self._unlogged_points):
                return
            if not force and now - self._last_log < self.log_period_s:
                return
            spans, points = self._unlogged_spans, self._unlogged_points
            self._unlogged_spans = self._unlogged_points = 0
            self._last_log = now
            detail = self.summary()
        logger.warning("otel_stages: %d spans and %d metric points dropped since the last report "
                       "(%s so far) on the way to %s", spans, points, detail, self.describe)

    def mark_logged(self) -> None:
        """Forget what is pending for the periodic line (a final summary was logged instead)."""
        with self._lock:
            self._unlogged_spans = self._unlogged_points = 0
            self._last_log = time.monotonic()

    def summary(self) -> str:
        """E.g. ``"spans: queue_full 90, export_failed 10; points: none"``."""
        def part(counts: dict[str, int]) -> str:
            return ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "none"
        return f"spans: {part(self.spans)}; points: {part(self.points)}"

    def observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        """Callback of the ``otel_stages.spans.dropped`` observable counter (cumulative, one
        series per ``error.type``). Also flushes a pending log line once per period."""
        self.log_if_due()
        return [Observation(count, {semconv.ERROR_TYPE: reason})
                for reason, count in self.spans.items() if count]


class _QueueAccount:
    """Stands in for the batch processor's metrics object (the SDK's ``ProcessorMetricsT``:
    ``register_queue_size`` / ``drop_items`` / ``finish_items``) and forwards to the original,
    so the SDK's own opt-in metrics keep working."""

    def __init__(self, inner: Any, drops: DropCounter, queue: Any) -> None:
        self.inner = inner
        self.drops = drops
        self.queue = queue

    def register_queue_size(self, get_queue_size: Callable[[], int]) -> None:
        self.inner.register_queue_size(get_queue_size)

    def drop_items(self, count: int, error_type: str = "queue_full") -> None:
        self.inner.drop_items(count, error_type)
        if error_type == "already_shutdown":
            self.drops.add_spans(semconv.DROP_AFTER_SHUTDOWN, count)
        elif len(self.queue) == self.queue.maxlen:
            # The SDK checked "full" before logging; the worker may have taken a batch since,
            # and then the append that follows drops nothing. Checking again here, right before
            # that append, leaves a window of a few bytecodes (see count_queue_drops).
            self.drops.add_spans(semconv.DROP_QUEUE_FULL, count)

    def finish_items(self, count: int) -> None:
        self.inner.finish_items(count)


def count_queue_drops(processor: BatchSpanProcessor, drops: DropCounter) -> Callable[[], int]:
    """Count ``processor``'s queue-full and after-shutdown drops in ``drops``; returns a function
    giving the number of spans waiting in its queue.

    Uses two private attributes of SDK 1.45.1's ``BatchProcessor`` (``_metrics``, ``_queue``;
    the version is pinned in pyproject and ``tests/test_delivery.py`` fails if they change): the
    public API offers no count of these drops. Precision: exact, except when an append to a full
    queue races the export thread taking a batch (or another thread's append) inside a window of
    a few bytecodes; then the count can be off by one span. Counting exactly would need a lock
    around every queue operation on the request path (measured: several times the cost of the
    append itself)."""
    batch = processor._batch_processor
    queue = batch._queue
    batch._metrics = _QueueAccount(batch._metrics, drops, queue)
    return lambda: len(queue)


class CountingSpanExporter(SpanExporter):
    """Delegates to ``inner``; counts batches, failed batches, and the spans in them as
    ``export_failed`` drops. :meth:`abandon` gives up at a shutdown deadline."""

    def __init__(self, inner: SpanExporter, drops: DropCounter) -> None:
        self.inner = inner
        self.drops = drops
        self.batches = 0
        self.failures = 0
        self._in_flight = 0
        self._abandoned = False
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        count = len(spans)
        with self._lock:
            if self._abandoned:  # counted by abandon() when it took the queue's measure
                return SpanExportResult.FAILURE
            self._in_flight += count
        result = SpanExportResult.FAILURE
        try:
            result = self.inner.export(spans)
        finally:  # an exception counts as a failure; the batch processor logs it
            self._settle(count, result is SpanExportResult.SUCCESS)
        return result

    def _settle(self, count: int, ok: bool) -> None:
        with self._lock:
            self._in_flight -= count
            if self._abandoned:
                return
            self.batches += 1
            if ok:
                return
            self.failures += 1
        self.drops.add_spans(semconv.DROP_EXPORT_FAILED, count)

    def abandon(self, queued: int) -> int:
        """Stop delivering: the ``queued`` spans and those in the export running now are counted
        as ``shutdown_timeout``; the exporter is shut down (which cancels a gRPC call in flight
        and ends retries); later batches fail at once. Returns the spans counted. A file write
        already under way cannot be cancelled and may still land: its spans are then both written
        and counted (counted rather than risk losing them silently)."""
        with self._lock:
            if self._abandoned:
                return 0
            self._abandoned = True
            lost = queued + self._in_flight
        self.drops.add_spans(semconv.DROP_SHUTDOWN_TIMEOUT, lost)
        _shutdown_quietly(self.inner)
        return lost

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        with self._lock:
            if self._abandoned:
                return  # already shut down by abandon()
        _shutdown_quietly(self.inner, timeout_millis)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _shutdown_quietly(exporter: Any, timeout_millis: float | None = None) -> None:
    import inspect

    try:
        if timeout_millis is not None and "timeout_millis" in inspect.signature(exporter.shutdown).parameters:
            exporter.shutdown(timeout_millis=timeout_millis)
        else:
            exporter.shutdown()
    except Exception as exc:  # noqa: BLE001 - shutting down must not raise
        logger.debug("exporter shutdown failed: %r", exc)


def count_points(metrics_data: MetricsData) -> int:
    """Data points in ``metrics_data``."""
    return sum(len(getattr(metric.data, "data_points", ()))
               for rm in metrics_data.resource_metrics for sm in rm.scope_metrics
               for metric in sm.metrics)


class CountingMetricExporter(MetricExporter):
    """Delegates to ``inner``; the points of a failed export are ``export_failed`` drops (the
    SDK's periodic reader ignores export results). After :meth:`abandon`, exports fail at once
    and their points count as ``shutdown_timeout``."""

    def __init__(self, inner: MetricExporter, drops: DropCounter) -> None:
        # The SDK's periodic reader reads these private fields of its exporter, so mirror them.
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self.inner = inner
        self.drops = drops
        self._in_flight = 0
        self._abandoned = False
        self._lock = threading.Lock()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        count = count_points(metrics_data)
        with self._lock:
            abandoned = self._abandoned
            if not abandoned:
                self._in_flight += count
        if abandoned:
            self.drops.add_points(semconv.DROP_SHUTDOWN_TIMEOUT, count)
            return MetricExportResult.FAILURE
        result = MetricExportResult.FAILURE
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        finally:
            with self._lock:
                self._in_flight -= count
                counted_by_abandon = self._abandoned
            if result is not MetricExportResult.SUCCESS and not counted_by_abandon:
                self.drops.add_points(semconv.DROP_EXPORT_FAILED, count)
        return result

    def abandon(self) -> int:
        """Count the points in the export running now as ``shutdown_timeout`` and shut the
        exporter down; returns that count."""
        with self._lock:
            if self._abandoned:
                return 0
            self._abandoned = True
            lost = self._in_flight
        self.drops.add_points(semconv.DROP_SHUTDOWN_TIMEOUT, lost)
        _shutdown_quietly(self.inner)
        return lost

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        with self._lock:
            if self._abandoned:
                return
        _shutdown_quietly(self.inner, timeout_millis)


class OpenSpans(SpanProcessor):
    """Remembers spans that started and have not ended (O(1) per span: a dict keyed by span id)
    so :meth:`end_all` can end them. Add it to the tracer provider *first*."""

    def __init__(self) -> None:
        self._open: dict[int, Span] = {}
        self._overflow_logged = False
        #: Called once, on the next span start, then cleared (e.g. the fork warning: only a
        #: child process that records spans has something to be warned about).
        self.notice: Callable[[], Any] | None = None
        _after_fork_in_child(self._forget)  # the parent's open spans are not the child's

    def _forget(self) -> None:
        self._open.clear()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self.notice is not None:
            notice, self.notice = self.notice, None
            notice()
        opened = self._open
        if len(opened) < MAX_OPEN_SPANS:
            opened[span.context.span_id] = span
        elif not self._overflow_logged:
            self._overflow_logged = True
            logger.warning("otel_stages: more than %d spans open at once; spans started from now "
                           "on are not ended for you at shutdown (are spans started and never "
                           "ended?)", MAX_OPEN_SPANS)

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is not None:
            self._open.pop(context.span_id, None)

    def __len__(self) -> int:
        return len(self._open)

    def end_all(self, end_ns: int) -> int:
        """End every open span at ``end_ns`` with ``otel_stages.interrupted=true``; returns how
        many were ended (each then goes through the processors like any other span)."""
        ended = 0
        for span in list(self._open.values()):
            if not span.is_recording():  # ended on its own thread meanwhile
                continue
            span.set_attribute(semconv.OTEL_STAGES_INTERRUPTED, True)
            span.end(end_time=max(end_ns, span.start_time or 0))
            ended += 1
        return ended

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def run_bounded(steps: Sequence[Callable[[], Any]], deadline: float,
                name: str) -> tuple[list[tuple[bool, Any]], list[threading.Thread]]:
    """Run each step on its own daemon thread; wait until ``deadline`` (``time.monotonic()``).
    Returns ``(finished, result)`` per step (a step that raised gives ``(True, exception)``) and
    the threads still running, which are left to finish on their own (daemon threads)."""
    results: list[tuple[bool, Any]] = [(False, None)] * len(steps)
    threads = []

    def runner(index: int, step: Callable[[], Any]) -> None:
        try:
            results[index] = (True, step())
        except Exception as exc:  # noqa: BLE001 - reported to the caller as a result
            results[index] = (True, exc)

    for index, step in enumerate(steps):
        thread = threading.Thread(target=runner, args=(index, step), name=name, daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return list(results), [t for t in threads if t.is_alive()]
