"""Export GPU samples through the configured metric exporter, each point at its sample time.

Why not SDK instruments: the OpenTelemetry Python SDK stamps every gauge point with the
*collection* time and keeps only the last value per attribute set per collection, so with an
export every 10 s and samples every 0.2 s, 49 of 50 samples would be lost and the survivor
would carry the wrong time. Instead :class:`GpuMetricReader`, a :class:`MetricReader` registered
on the same :class:`MeterProvider`, builds ``MetricsData`` itself: one gauge per row of
:data:`otel_stages.gpu.metrics.SPECS`, one ``NumberDataPoint`` per sample with
``time_unix_nano`` = the sample's span-clock time, and hands it to the same exporter the SDK's
periodic reader uses (OTLP/JSON file or OTLP). Being a reader of the provider, it is flushed by
``MeterProvider.force_flush`` and shut down (sampler joined, NVML shut down, last points
exported) by ``MeterProvider.shutdown``, which also runs at interpreter exit.

It ignores the SDK's own instruments (``DropAggregation`` for every kind), so nothing is
exported twice. This module imports the OpenTelemetry SDK; only ``otel_stages.sdk`` imports it.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
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
    Gauge,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.view import DropAggregation
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_stages import semconv
from otel_stages.gpu import metrics
from otel_stages.gpu.backend import Device
from otel_stages.gpu.store import PendingPoint

logger = logging.getLogger("otel_stages.gpu")

_ALL_INSTRUMENTS = (Counter, UpDownCounter, Histogram, _Gauge, ObservableCounter,
                    ObservableUpDownCounter, ObservableGauge)


def to_metrics_data(points: Sequence[PendingPoint], devices: dict[str, Device],
                    resource: Resource) -> MetricsData:
    """One gauge per metric (table order), one data point per sample (time order), attributes
    ``hw.id`` / ``hw.type`` / ``hw.vendor`` / ``hw.model``. Unknown metric names are skipped."""
    grouped: dict[str, list[PendingPoint]] = defaultdict(list)
    for p in points:
        grouped[p.metric].append(p)
    attributes: dict[str, dict[str, str]] = {}
    out: list[Metric] = []
    for spec in metrics.SPECS:
        samples = sorted(grouped.get(spec.name, ()), key=lambda p: (p.uuid, p.point.time_ns))
        if not samples:
            continue
        data_points = []
        for p in samples:
            attrs = attributes.get(p.uuid)
            if attrs is None:
                device = devices.get(p.uuid)
                attrs = attributes[p.uuid] = metrics.device_attributes(
                    p.uuid, device.name if device is not None else "")
            data_points.append(NumberDataPoint(attributes=attrs, start_time_unix_nano=0,
                                               time_unix_nano=p.point.time_ns, value=p.point.value))
        out.append(Metric(name=spec.name, description=spec.description, unit=spec.unit,
                          data=Gauge(data_points=data_points)))
    from otel_stages._version import __version__

    scope = InstrumentationScope(semconv.SCOPE_NAME, __version__)
    return MetricsData(resource_metrics=[ResourceMetrics(
        resource=resource, scope_metrics=[ScopeMetrics(scope=scope, metrics=out, schema_url="")],
        schema_url="")])


class SerializedExporter(MetricExporter):
    """The configured exporter, shared by the SDK's periodic reader and :class:`GpuMetricReader`;
    ``export`` calls never overlap (the exporter contract). Shutdown is left to the periodic
    reader (registered after the GPU reader, so it shuts down last)."""

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


class GpuMetricReader(MetricReader):
    """Drains the sampler's points every ``export_interval_s`` and at flush / shutdown.

    ``session`` provides ``sampler`` (with ``store`` and ``devices``) and ``stop()``; it is read
    on every export, so a sampler restarted after ``fork()`` is picked up. ``resource`` is a
    :class:`Resource` or a function returning the current one, called at each export (after
    ``fork()`` the SDK gives the child a new ``service.instance.id``: its GPU points carry it).
    ``on_dropped(reason, count)`` is told about points lost: a full sample buffer
    (``queue_full``) and, via :meth:`abandon`, points left at a shutdown deadline.
    """

    def __init__(self, session: Any, exporter: MetricExporter,
                 resource: Resource | Callable[[], Resource], export_interval_s: float,
                 on_dropped: Callable[[str, int], None] | None = None) -> None:
        super().__init__(preferred_aggregation={cls: DropAggregation() for cls in _ALL_INSTRUMENTS})
        self._session = session
        self._exporter = exporter
        self._resource: Callable[[], Resource] = (
            resource if callable(resource) else (lambda: resource))
        self._interval_s = export_interval_s
        self._on_dropped = on_dropped
        self._dropped_seen = 0
        self._abandoned = False
        self._stop = threading.Event()
        self._export_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.start_thread()

    def start_thread(self) -> None:
        """(Re)start the export thread (also in a forked child, where threads are gone)."""
        self._stop = threading.Event()
        self._export_lock = threading.Lock()
        self._thread = threading.Thread(target=self._ticker, name="otel-stages-gpu-export", daemon=True)
        self._thread.start()

    def _ticker(self) -> None:
        stop = self._stop
        while not stop.wait(self._interval_s):
            self.export_now()

    def _count_overflow(self, store: Any) -> None:
        dropped = store.dropped
        if dropped < self._dropped_seen:  # a new store (sampler restarted after fork)
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
            sampler = self._session.sampler
            self._count_overflow(sampler.store)
            points = sampler.store.drain()
            if not points:
                return True
            devices = {d.uuid: d for d in sampler.devices}
            try:
                data = to_metrics_data(points, devices, self._resource())
                result = self._exporter.export(data, timeout_millis=timeout_millis)
            except Exception as exc:  # noqa: BLE001 - telemetry must not break the service
                logger.warning("exporting %d GPU samples failed: %r", len(points), exc)
                return False
            return result == MetricExportResult.SUCCESS

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                         **kwargs: Any) -> None:
        """SDK instruments are dropped for this reader: nothing to do."""

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Take a fresh sampler pass (waiting for init, bounded), then export."""
        self._session.sampler.flush(timeout_millis / 2000)
        return self.export_now(timeout_millis / 2)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Stop exporting, stop the sampler (joined before nvmlShutdown), export what is left."""
        self._stop.set()
        self._session.stop()
        self.export_now(timeout_millis / 2)

    def abandon(self) -> int:
        """At a shutdown deadline: stop, and count the points still waiting in the sampler's
        store as ``shutdown_timeout`` drops (an export in flight is counted by the exporter).
        Returns that count."""
        self._stop.set()
        self._abandoned = True
        points = self._session.sampler.store.drain()
        if self._on_dropped is not None:
            self._on_dropped(semconv.DROP_SHUTDOWN_TIMEOUT, len(points))
        return len(points)

