"""Export GPU samples through the configured metric exporter, each point at its sample time.

:class:`GpuMetricReader` is a :class:`~otel_stages.sample_export.SampleReader` (which says why
SDK instruments do not fit): one gauge per row of :data:`otel_stages.gpu.metrics.SPECS`, one
``NumberDataPoint`` per sample with ``time_unix_nano`` = the sample's span-clock time. Its
shutdown joins the sampler before NVML is shut down and exports the last points. This module
imports the OpenTelemetry SDK; only ``otel_stages.sdk`` imports it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import Gauge, Metric, MetricExporter, MetricsData, NumberDataPoint
from opentelemetry.sdk.resources import Resource

from otel_stages.gpu import metrics
from otel_stages.gpu.backend import Device
from otel_stages.gpu.store import PendingPoint
from otel_stages.sample_export import SampleReader, SerializedExporter, metrics_data

__all__ = ["GpuMetricReader", "SerializedExporter", "to_metrics_data"]


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
    return metrics_data(out, resource)


class GpuMetricReader(SampleReader):
    """Drains the sampler's points every ``export_interval_s`` and at flush / shutdown.

    ``session`` provides ``sampler`` (with ``store`` and ``devices``) and ``stop()``; it is read
    on every export, so a sampler restarted after ``fork()`` is picked up. ``resource`` is a
    :class:`Resource` or a function returning the current one, called at each export.
    ``on_dropped(reason, count)``: see :class:`~otel_stages.sample_export.SampleReader`.
    """

    what = "GPU samples"
    thread_name = "otel-stages-gpu-export"
    logger = logging.getLogger("otel_stages.gpu")

    def __init__(self, session: Any, exporter: MetricExporter,
                 resource: Resource | Callable[[], Resource], export_interval_s: float,
                 on_dropped: Callable[[str, int], None] | None = None) -> None:
        super().__init__(exporter, resource if callable(resource) else (lambda: resource),
                         export_interval_s, on_dropped)
        self._session = session
        self.start_thread()

    def _drain(self) -> list[Any]:
        return list(self._session.sampler.store.drain())

    def _dropped_total(self) -> int:
        return int(self._session.sampler.store.dropped)

    def _to_data(self, points: list[Any], resource: Resource) -> MetricsData:
        return to_metrics_data(points, {d.uuid: d for d in self._session.sampler.devices}, resource)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Take a fresh sampler pass (waiting for init, bounded), then export."""
        self._session.sampler.flush(timeout_millis / 2000)
        return self.export_now(timeout_millis / 2)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Stop exporting, stop the sampler (joined before nvmlShutdown), export what is left."""
        self._stop.set()
        self._session.stop()
        self.export_now(timeout_millis / 2)
