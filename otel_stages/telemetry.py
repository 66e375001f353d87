"""The handle :func:`otel_stages.configure` returns: what it built, and bounded flush / shutdown.

:class:`Telemetry` holds the providers and says where telemetry goes; its :meth:`~Telemetry.force_flush`
and :meth:`~Telemetry.shutdown` honour their timeouts against a dead or black-holed collector
(:func:`otel_stages.delivery.run_bounded`) and return ``False`` when something was lost; drops
are counted by reason (:class:`otel_stages.delivery.DropCounter`). Built only by
:mod:`otel_stages.sdk` (this module handles SDK objects).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_stages import semconv
from otel_stages._runtime import RUNTIME
from otel_stages.builder import SpanBuilder
from otel_stages.config import Settings
from otel_stages.delivery import (
    CountingMetricExporter,
    CountingSpanExporter,
    DropCounter,
    OpenSpans,
    run_bounded,
)
from otel_stages.json_lines import JsonLinesSpanExporter

logger = logging.getLogger("otel_stages")


@dataclass
class Telemetry:
    """What :func:`configure` built. ``destination`` says where telemetry goes, for humans:
    a folder path for the embedded files, else ``"<protocol> <endpoint>"``.

    ``trace_path`` / ``metrics_path`` are the OTLP/JSON files (``None`` when exporting over OTLP).
    :attr:`export_failures` counts span batches the exporter could not deliver;
    :attr:`dropped_spans` / :attr:`dropped_points` count what never arrived, and :attr:`drops`
    says why. Thread-safe.
    """

    settings: Settings
    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None
    destination: str
    trace_path: Path | None = None
    metrics_path: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    _span_exporter: CountingSpanExporter | None = field(default=None, repr=False, compare=False)
    _metric_exporter: CountingMetricExporter | None = field(default=None, repr=False, compare=False)
    _drops: DropCounter | None = field(default=None, repr=False, compare=False)
    _open_spans: OpenSpans | None = field(default=None, repr=False, compare=False)
    _queued_spans: Callable[[], int] = field(default=lambda: 0, repr=False, compare=False)
    _span_processors: list[SpanProcessor] = field(default_factory=list, repr=False, compare=False)
    _gpu_readers: list[Any] = field(default_factory=list, repr=False, compare=False)
    _signal_readers: list[Any] = field(default_factory=list, repr=False, compare=False)
    _pid: int = field(default_factory=os.getpid, repr=False, compare=False)
    _shut_down: bool = field(default=False, repr=False, compare=False)
    _shutdown_result: bool = field(default=True, repr=False, compare=False)
    _state_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _flushing: list[threading.Thread] = field(default_factory=list, repr=False, compare=False)
    _tracer: Any = field(default=None, repr=False, compare=False)
    _builder: SpanBuilder | None = field(default=None, repr=False, compare=False)

    @property
    def export_failures(self) -> int:
        """Span batches the configured exporter failed to export so far (``FAILURE`` results and
        exceptions; an OTLP exporter reports one only after its own retries gave up). 0 when
        telemetry is disabled. Read it after :meth:`force_flush` to judge a finished run."""
        return 0 if self._span_exporter is None else self._span_exporter.failures

    @property
    def dropped_spans(self) -> int:
        """Spans that will never reach the destination, counted so far in this process: queue
        full, export failed (after the exporter's retries), still queued or in flight when
        shutdown's time ran out, or ended after shutdown. 0 when disabled."""
        return 0 if self._drops is None else self._drops.total_spans

    @property
    def dropped_points(self) -> int:
        """Metric data points (GPU samples included) that will never reach the destination:
        failed exports, a full GPU sample buffer, or left over at the shutdown deadline."""
        return 0 if self._drops is None else self._drops.total_points

    @property
    def drops(self) -> dict[str, dict[str, int]]:
        """``{"spans": {reason: n}, "points": {reason: n}}`` with reasons
        ``semconv.DROP_REASONS`` (``queue_full``, ``export_failed``, ``shutdown_timeout``,
        ``already_shutdown``). A copy."""
        spans = dict.fromkeys(semconv.DROP_REASONS, 0)
        points = dict.fromkeys(semconv.DROP_REASONS, 0)
        if self._drops is not None:  # every reason present, 0 when nothing was lost that way
            spans.update(self._drops.spans)
            points.update(self._drops.points)
        return {"spans": spans, "points": points}

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export everything buffered now; waits at most ``timeout_millis``.

        ``True`` only when every provider finished in time *and* nothing was dropped meanwhile
        (the SDK's own flush returns ``True`` even when every batch failed). A flush that runs
        out of time goes on in the background; the next call waits for it first (at most one
        flush per handle runs at a time). With telemetry disabled there is nothing to flush:
        ``True``. After :meth:`shutdown`: ``False``."""
        if self._shut_down:
            return False
        if self.tracer_provider is None:
            return True
        deadline = time.monotonic() + max(0.0, timeout_millis) / 1000
        lost_before = self.dropped_spans + self.dropped_points
        with self._state_lock:
            running = [t for t in self._flushing if t.is_alive()]
        for thread in running:  # one flush at a time: wait for the one in progress first
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
        if self._builder is not None and not self._builder.drain(deadline):
            return False  # deferred stages ended so far become spans before the SDK flushes
        steps: list[Callable[[], Any]] = [lambda: self.tracer_provider.force_flush(timeout_millis)]  # type: ignore[union-attr]
        if self.meter_provider is not None:
            steps.append(lambda: self.meter_provider.force_flush(timeout_millis))  # type: ignore[union-attr]
        outcome, still_running = run_bounded(steps, deadline, "otel-stages-flush")
        with self._state_lock:
            self._flushing = still_running
        finished = all(done and result is True for done, result in outcome)
        return finished and self.dropped_spans + self.dropped_points == lost_before

    def add_span_file(self, path: Path) -> None:
        """Also write every span to ``path`` as OTLP/JSON lines (batch-exported, like the rest).

        For a local copy while exporting over OTLP (``otel-stages demo`` reports from it).
        Raises ``RuntimeError`` when telemetry is disabled (no tracer provider).
        """
        if self.tracer_provider is None:
            raise RuntimeError("telemetry is disabled: no tracer provider to copy spans from")
        path.parent.mkdir(parents=True, exist_ok=True)
        processor = BatchSpanProcessor(JsonLinesSpanExporter(path))
        self.tracer_provider.add_span_processor(processor)
        self._span_processors.append(processor)

    def shutdown(self, timeout_millis: int | None = None) -> bool:
        """End the spans still open (``otel_stages.interrupted=true``), export what is buffered
        and stop the providers, waiting at most ``timeout_millis`` (default: the
        ``shutdown_timeout_s`` setting, 5 s). Also run at interpreter exit and by the next
        :func:`configure`.

        ``True`` when everything was delivered. Otherwise what could not be is counted
        (:attr:`dropped_spans`, :attr:`dropped_points`), one warning says how much and where to,
        and an export still in flight is abandoned (a gRPC call is cancelled; an HTTP request
        runs out its own timeout on a daemon thread). Idempotent: later calls return the first
        result at once.
        """
        with self._state_lock:
            if self._shut_down:
                return self._shutdown_result
            self._shut_down = True
        if self.tracer_provider is None:
            return True
        if RUNTIME.tracer is self._tracer:
            RUNTIME.tracer = RUNTIME.default_tracer  # not a shut-down provider that drops spans
        if self._builder is not None and RUNTIME.deferred is self._builder:
            RUNTIME.deferred = None  # new stages are live ones on that tracer
        timeout_s = (self.settings.shutdown_timeout_s if timeout_millis is None
                     else max(0.0, timeout_millis) / 1000)
        started = time.monotonic()
        ok = self._shutdown_until(started + timeout_s)
        self._shutdown_result = ok
        if self._drops is not None and (not ok or self._drops.total_spans or self._drops.total_points):
            self._drops.mark_logged()  # this line replaces any pending periodic one
            logger.warning(
                "otel_stages: shut down %s in %.1f s (limit %.1f s); %d spans and %d metric points "
                "in total were not delivered in this process (%s)", self._describe(),
                time.monotonic() - started, timeout_s, self.dropped_spans, self.dropped_points,
                self._drops.summary())
        return ok

    def _shutdown_until(self, deadline: float) -> bool:
        assert self.tracer_provider is not None
        lost_before = self.dropped_spans + self.dropped_points
        if self._builder is not None:  # deferred stages first: built, or ended as interrupted
            self._builder.shutdown(deadline)
        if self._open_spans is not None:
            self._open_spans.end_all(RUNTIME.clock.now_ns())
        # Each processor on its own thread: one stuck exporter must not stop the others.
        steps: list[Callable[[], Any]] = [p.shutdown for p in self._span_processors]
        steps.append(self.tracer_provider.shutdown)  # processors others added; ours return at once
        if self.meter_provider is not None:
            remaining_ms = max(0.0, deadline - time.monotonic()) * 1000
            steps.append(lambda: self.meter_provider.shutdown(timeout_millis=remaining_ms))  # type: ignore[union-attr]
        outcome, _running = run_bounded(steps, deadline, "otel-stages-shutdown")
        finished = all(done for done, _result in outcome)
        if not finished:
            if self._span_exporter is not None:
                self._span_exporter.abandon(self._queued_spans())
            if self._metric_exporter is not None:
                self._metric_exporter.abandon()
            for reader in [*self._gpu_readers, *self._signal_readers]:
                reader.abandon()
        return finished and self.dropped_spans + self.dropped_points == lost_before

    def _describe(self) -> str:
        return f"service.name={self.settings.service_name!r}, {self.destination}"

