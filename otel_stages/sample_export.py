"""Export a background sampler's readings as metrics, each point at the time it was taken.

Why not SDK instruments: the OpenTelemetry Python SDK stamps every gauge point with the
*collection* time and keeps only the last value per attribute set per collection, so with an
export every 10 s and samples every 0.2 s, 49 of 50 samples would be lost and the survivor would
carry the wrong time. A :class:`SampleReader` is a ``MetricReader`` registered on the same
``MeterProvider`` that builds ``MetricsData`` itself and hands it to the exporter the SDK's
periodic reader uses (shared through :class:`SerializedExporter`). Being a reader of the
provider, it is flushed by ``MeterProvider.force_flush`` and shut down by
``MeterProvider.shutdown`` (which also runs at interpreter exit). It ignores the SDK's own
instruments (``DropAggregation`` for every kind), so nothing is exported twice.

Subclasses: :class:`otel_stages.gpu.reader.GpuMetricReader` (NVML samples) and
:class:`otel_stages.signals.session.CgroupMetricReader` (cgroup CPU counters). This module
imports the OpenTelemetry SDK; only setup code (``otel_stages.sdk`` and what it wires) imports it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
    _Gauge,
)
from opentelemetry.sdk.metrics.export import (
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.view import DropAggregation
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_stages import semconv
from otel_stages._version import __version__

_ALL_INSTRUMENTS = (Counter, UpDownCounter, Histogram, _Gauge, ObservableCounter,
                    ObservableUpDownCounter, ObservableGauge)


def metrics_data(metrics: Sequence[Metric], resource: Resource) -> MetricsData:
    """``metrics`` under one resource and the library's versioned instrumentation scope."""
    scope = InstrumentationScope(semconv.SCOPE_NAME, __version__)
    return MetricsData(resource_metrics=[ResourceMetrics(
        resource=resource, scope_metrics=[ScopeMetrics(scope=scope, metrics=list(metrics),
                                                       schema_url="")],
        schema_url="")])


class SerializedExporter(MetricExporter):
    """The configured exporter, shared by the SDK's periodic reader and the sample readers;
    ``export`` calls never overlap (the exporter contract). Shutdown is left to the periodic
    reader (registered after the sample readers, so it shuts down last)."""

    def __init__(self, inner: MetricExporter) -> None:
        # The SDK's periodic reader reads these private fields of its exporter, so mirror them.
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self.inner = inner
        self._lock = threading.Lock()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        with self._lock:
            return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class SampleReader(MetricReader):
    """Drains a sampler's points every ``export_interval_s`` (on its own thread) and at flush /
    shutdown, and exports them. ``resource`` is called at each export (after ``fork()`` the SDK
    gives the child a new ``service.instance.id``: its points carry it). ``on_dropped(reason,
    count)`` is told about points lost: a full sample buffer (``queue_full``) and, via
    :meth:`abandon`, points left at a shutdown deadline.

    A subclass provides :meth:`_drain`, :meth:`_dropped_total`, :meth:`_to_data`, ``what``
    (for log lines) and ``thread_name``."""

    what = "samples"
    thread_name = "otel-stages-sample-export"
    logger = logging.getLogger("otel_stages")

    def __init__(self, exporter: MetricExporter, resource: Callable[[], Resource],
                 export_interval_s: float,
                 on_dropped: Callable[[str, int], None] | None = None) -> None:
        super().__init__(preferred_aggregation={cls: DropAggregation() for cls in _ALL_INSTRUMENTS})
        self._exporter = exporter
        self._resource = resource
        self._interval_s = export_interval_s
        self._on_dropped = on_dropped
        self._dropped_seen = 0
        self._abandoned = False
        self._stop = threading.Event()
        self._export_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _drain(self) -> list[Any]:
        raise NotImplementedError

    def _dropped_total(self) -> int:
        """Points the sampler's buffer has dropped so far (restarts at 0 with a new buffer)."""
        raise NotImplementedError

    def _to_data(self, points: list[Any], resource: Resource) -> MetricsData:
        raise NotImplementedError

    def start_thread(self) -> None:
        """(Re)start the export thread (also in a forked child, where threads are gone)."""
        self._stop = threading.Event()
        self._export_lock = threading.Lock()
        self._thread = threading.Thread(target=self._ticker, name=self.thread_name, daemon=True)
        self._thread.start()

    def _ticker(self) -> None:
        stop = self._stop
        while not stop.wait(self._interval_s):
            self.export_now()

    def _count_overflow(self) -> None:
        dropped = self._dropped_total()
        if dropped < self._dropped_seen:  # a new buffer (sampler restarted after fork)
            self._dropped_seen = 0
        if self._on_dropped is not None and dropped > self._dropped_seen:
            self._on_dropped(semconv.DROP_QUEUE_FULL, dropped - self._dropped_seen)
        self._dropped_seen = dropped

    def export_now(self, timeout_millis: float = 10_000) -> bool:
        """Export every point not yet exported; ``True`` on success or when there was none.
        Failed exports are counted by the exporter (``CountingMetricExporter``)."""
        with self._export_lock:
            if self._abandoned:
                return False
            self._count_overflow()
            points = self._drain()
            if not points:
                return True
            try:
                data = self._to_data(points, self._resource())
                result = self._exporter.export(data, timeout_millis=timeout_millis)
            except Exception as exc:  # noqa: BLE001 - telemetry must not break the service
                self.logger.warning("exporting %d %s failed: %r", len(points), self.what, exc)
                return False
            return result == MetricExportResult.SUCCESS

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                         **kwargs: Any) -> None:
        """SDK instruments are dropped for this reader: nothing to do."""

    def _halt(self) -> None:
        """Stop sampling without waiting (at a shutdown deadline); default: nothing to stop."""

    def abandon(self) -> int:
        """At a shutdown deadline: stop, and count the points still waiting in the sampler's
        buffer as ``shutdown_timeout`` drops (an export in flight is counted by the exporter).
        Returns that count."""
        self._stop.set()
        self._halt()
        self._abandoned = True
        points = self._drain()
        if self._on_dropped is not None:
            self._on_dropped(semconv.DROP_SHUTDOWN_TIMEOUT, len(points))
        return len(points)
