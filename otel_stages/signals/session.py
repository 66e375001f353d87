"""Wiring for ``configure()``: GC recording, and the cgroup / CPU pressure sampler exported as
metrics.

Like the GPU samples, each cgroup reading is exported at the time it was taken:
:class:`CgroupMetricReader` is a :class:`~otel_stages.sample_export.SampleReader` (which says
why SDK instruments do not fit), sharing the exporter the SDK's periodic reader uses.
Counters are cumulative monotonic sums, the limit a gauge (names in :mod:`otel_stages.semconv`);
the CPU pressure a sum in seconds with ``system.linux.pressure.stall_type=some``.
This module imports the OpenTelemetry SDK; only ``otel_stages.sdk`` imports it.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricExporter,
    MetricReader,
    MetricsData,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.resources import Resource

from otel_stages import semconv
from otel_stages.sample_export import SampleReader, SerializedExporter, metrics_data
from otel_stages.signals import capture, cgroup, gcwatch, pressure

logger = logging.getLogger("otel_stages.signals")

class MetricSpec(NamedTuple):
    """How one sampled series is exported: ``unit``, ``description``, ``counter`` (a cumulative
    monotonic sum, else a gauge), ``integer`` (``asInt`` points, else ``asDouble``) and the
    point ``attributes``."""

    unit: str
    description: str
    counter: bool
    integer: bool
    attributes: Mapping[str, str]


#: metric name -> how it is exported
METRICS: dict[str, MetricSpec] = {
    semconv.CONTAINER_CPU_THROTTLED_TIME: MetricSpec(
        semconv.UNIT_NANOSECONDS, "Aggregate time the cgroup was throttled (CPU quota used up)",
        True, True, {}),
    semconv.CONTAINER_CPU_PERIODS: MetricSpec(
        semconv.UNIT_PERIODS, "Number of CPU quota enforcement periods elapsed", True, True, {}),
    semconv.CONTAINER_CPU_THROTTLED_PERIODS: MetricSpec(
        semconv.UNIT_PERIODS, "Number of periods in which the cgroup hit its CPU quota", True, True,
        {}),
    semconv.CONTAINER_CPU_LIMIT: MetricSpec(
        semconv.UNIT_CPUS, "CPU quota of the cgroup, in CPUs", False, False, {}),
    semconv.SYSTEM_CPU_PRESSURE_TOTAL: MetricSpec(
        semconv.UNIT_SECONDS, "Total time tasks of the cgroup (else the host) were runnable but"
        " waiting for a CPU (Linux PSI cpu some total)", True, False,
        {semconv.SYSTEM_LINUX_PRESSURE_STALL_TYPE: semconv.PRESSURE_STALL_SOME}),
}

#: Where cgroup files are read (tests point it at a fake tree).
CGROUP_ROOT = Path("/")


def to_metrics_data(points: Sequence[cgroup.Point], start_ns: int, resource: Resource,
                    pressure_scope: str | None = None) -> MetricsData:
    """One metric per name (table order), one data point per sample (time order);
    ``pressure_scope`` (``cgroup`` | ``host``, :func:`otel_stages.signals.pressure.scope_of`)
    goes on the CPU pressure points as ``otel_stages.pressure.scope``."""
    grouped: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for name, time_ns, value in points:
        grouped[name].append((time_ns, value))
    out = []
    for name, spec in METRICS.items():
        samples = sorted(grouped.get(name, ()))
        if not samples:
            continue
        point_attributes = dict(spec.attributes)
        if name == semconv.SYSTEM_CPU_PRESSURE_TOTAL and pressure_scope is not None:
            point_attributes[semconv.PRESSURE_SCOPE] = pressure_scope
        data_points = [NumberDataPoint(attributes=point_attributes,
                                       start_time_unix_nano=start_ns if spec.counter else 0,
                                       time_unix_nano=t, value=int(v) if spec.integer else v)
                       for t, v in samples]
        data: Sum | Gauge = (Sum(data_points=data_points, is_monotonic=True,
                                 aggregation_temporality=AggregationTemporality.CUMULATIVE)
                             if spec.counter else Gauge(data_points=data_points))
        out.append(Metric(name=name, description=spec.description, unit=spec.unit, data=data))
    return metrics_data(out, resource)


class CgroupMetricReader(SampleReader):
    """Exports a :class:`~otel_stages.signals.cgroup.CgroupSampler`'s points every
    ``export_interval_s`` and at flush / shutdown (see
    :class:`~otel_stages.sample_export.SampleReader`)."""

    what = "cgroup samples"
    thread_name = "otel-stages-cgroup-export"
    logger = logging.getLogger("otel_stages.signals")

    def __init__(self, sampler: cgroup.CgroupSampler, exporter: MetricExporter,
                 resource: Callable[[], Resource], export_interval_s: float,
                 on_dropped: Callable[[str, int], None] | None = None) -> None:
        super().__init__(exporter, resource, export_interval_s, on_dropped)
        self.sampler = sampler
        self.start_thread()

    def start_thread(self) -> None:
        """(Re)start the sampler and the export thread (also in a forked child)."""
        self.sampler.start()
        super().start_thread()

    def _drain(self) -> list[Any]:
        return list(self.sampler.drain())

    def _dropped_total(self) -> int:
        return int(self.sampler.dropped)

    def _to_data(self, points: list[Any], resource: Resource) -> MetricsData:
        psi = self.sampler.pressure
        return to_metrics_data(points, self.sampler.start_ns, resource,
                               None if psi is None else pressure.scope_of(psi, CGROUP_ROOT))

    def _halt(self) -> None:
        self.sampler.stop(0.0)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Take a reading now, then export."""
        self.sampler.sample(flush=True)
        return self.export_now(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Stop sampling and exporting; export what is left."""
        self._stop.set()
        self.sampler.stop()
        self.sampler.sample(flush=True)
        self.export_now(timeout_millis / 2)


_current: CgroupMetricReader | None = None


def start(settings: Any, exporter: MetricExporter, resource_fn: Callable[[], Resource],
          drops: Any = None) -> tuple[MetricExporter, list[MetricReader]]:
    """Called by ``configure()``: turn per-stage signals on or off per ``settings.signals``,
    record GC pauses, and when a cgroup with CPU files or CPU pressure (PSI) is found, sample
    them on one thread. Returns the exporter
    the SDK's periodic reader must use (shared with the cgroup reader) and the readers to register
    before it."""
    global _current
    if _current is not None:  # one sampler per process: the newest configuration's
        _current.sampler.stop(0.0)
        _current = None
    if not settings.signals:
        capture.enable(False)
        capture.enable_run_queue(False)
        gcwatch.uninstall()
        return exporter, []
    capture.enable(True)
    capture.enable_run_queue(bool(getattr(settings, "run_queue", False)))
    gcwatch.install()
    found = cgroup.find(CGROUP_ROOT)
    psi = pressure.find(CGROUP_ROOT)
    if found is None and psi is None:
        return exporter, []
    shared = exporter if isinstance(exporter, SerializedExporter) else SerializedExporter(exporter)
    reader = CgroupMetricReader(
        cgroup.CgroupSampler(found, pressure=psi), shared, resource_fn,
        settings.metric_export_interval_s,
        on_dropped=None if drops is None else drops.add_points)
    _current = reader
    return shared, [reader]


def _after_fork_in_child() -> None:
    if _current is not None and not _current._stop.is_set():
        _current.start_thread()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
