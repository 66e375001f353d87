"""``configure()``: the only place that builds OpenTelemetry SDK providers and exporters.

With no OTLP endpoint set, the embedded default writes OTLP/JSON lines (the official
``opentelemetry-exporter-otlp-json-file`` exporter, the format of the Collector's ``file``
exporter) under ``data_dir``: ``traces-<instance>.jsonl`` and ``metrics-<instance>.jsonl``, one
pair per process. With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, spans and metrics go over OTLP, gRPC
or HTTP per ``OTEL_EXPORTER_OTLP_PROTOCOL``. Spans always pass through a ``BatchSpanProcessor``
(export never runs on the request path); providers flush at interpreter exit.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from otel_stages import semconv
from otel_stages._runtime import RUNTIME
from otel_stages.config import ConfigurationError, Settings, resolve
from otel_stages.request_log import RequestLogProcessor

logger = logging.getLogger("otel_stages")


@dataclass
class Telemetry:
    """What :func:`configure` built. ``destination`` says where telemetry goes, for humans:
    a folder path for the embedded files, else ``"<protocol> <endpoint>"``.

    ``trace_path`` / ``metrics_path`` are the OTLP/JSON files (``None`` when exporting over OTLP).
    """

    settings: Settings
    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None
    destination: str
    trace_path: Path | None = None
    metrics_path: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export everything buffered now; ``True`` when all providers flushed in time."""
        ok = True
        if self.tracer_provider is not None:
            ok = self.tracer_provider.force_flush(timeout_millis) and ok
        if self.meter_provider is not None:
            ok = self.meter_provider.force_flush(timeout_millis) and ok
        return ok

    def add_span_file(self, path: Path) -> None:
        """Also write every span to ``path`` as OTLP/JSON lines (batch-exported, like the rest).

        For a local copy while exporting over OTLP (``otel-stages demo`` reports from it).
        Raises ``RuntimeError`` when telemetry is disabled (no tracer provider).
        """
        from opentelemetry.exporter.otlp.json.file import FileSpanExporter

        if self.tracer_provider is None:
            raise RuntimeError("telemetry is disabled: no tracer provider to copy spans from")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tracer_provider.add_span_processor(BatchSpanProcessor(FileSpanExporter(path)))

    def shutdown(self) -> None:
        """Flush and stop the providers (also done automatically at interpreter exit)."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def configure(*, service_name: str | None = None, data_dir: str | os.PathLike[str] | None = None,
              endpoint: str | None = None, protocol: str | None = None,
              enabled: bool | None = None, log_requests: bool | None = None,
              metric_export_interval_s: float | None = None,
              gpu: str | None = None, gpu_interval_s: float | None = None,
              resource_attributes: dict[str, Any] | None = None,
              set_global: bool = True) -> Telemetry:
    """Build tracer and meter providers and point otel_stages' spans at them.

    Arguments override ``OTEL_STAGES_*`` env vars, which override standard ``OTEL_*`` ones
    (see :mod:`otel_stages.config`); ``gpu`` / ``gpu_interval_s`` control NVML sampling
    (:mod:`otel_stages.gpu`). ``set_global`` also installs the providers as the
    OpenTelemetry globals (so other instrumentation shares them); the globals can be set only once
    per process, later calls still re-point otel_stages' own spans.

    Raises :class:`~otel_stages.config.ConfigurationError` naming the setting and bad value, or
    when ``data_dir`` cannot be created. When disabled, returns a handle with no providers and
    every stage is a no-op.
    """
    arguments = {
        "service_name": service_name, "data_dir": None if data_dir is None else os.fspath(data_dir),
        "endpoint": endpoint, "protocol": protocol, "enabled": enabled,
        "log_requests": log_requests, "metric_export_interval_s": metric_export_interval_s,
        "gpu": gpu, "gpu_interval_s": gpu_interval_s,
    }
    settings = resolve(arguments)
    RUNTIME.enabled = settings.enabled
    if not settings.enabled:
        return Telemetry(settings, None, None, destination="disabled")

    instance_id = uuid.uuid4().hex
    resource = Resource.create({
        semconv.SERVICE_NAME: settings.service_name,
        semconv.SERVICE_INSTANCE_ID: instance_id,
        **(resource_attributes or {}),
    })
    span_exporter, metric_exporter, handle = _exporters(settings, instance_id)
    gpu_readers: list[Any] = []
    if settings.gpu != "off":  # sampler thread + forward hook; NVML init runs off this thread
        from otel_stages.gpu import session as gpu_session

        metric_exporter, gpu_readers = gpu_session.start(settings, resource, metric_exporter)

    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    if settings.log_requests:
        tracer_provider.add_span_processor(RequestLogProcessor())
    reader = PeriodicExportingMetricReader(
        metric_exporter, export_interval_millis=settings.metric_export_interval_s * 1000)
    meter_provider = MeterProvider(resource=resource, metric_readers=[*gpu_readers, reader])

    handle.settings = settings
    handle.tracer_provider = tracer_provider
    handle.meter_provider = meter_provider
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    RUNTIME.tracer = tracer_provider.get_tracer(semconv.SCOPE_NAME)
    return handle


def _exporters(settings: Settings, instance_id: str) -> tuple[SpanExporter, MetricExporter, Telemetry]:
    if settings.endpoint is None:
        return _file_exporters(settings, instance_id)
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = settings.endpoint.startswith("http://")
        spans: SpanExporter = OTLPSpanExporter(endpoint=settings.endpoint, insecure=insecure)
        points: MetricExporter = OTLPMetricExporter(endpoint=settings.endpoint, insecure=insecure)
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HTTPMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HTTPSpanExporter,
        )

        base = settings.endpoint.rstrip("/")
        spans = HTTPSpanExporter(endpoint=f"{base}/v1/traces")
        points = HTTPMetricExporter(endpoint=f"{base}/v1/metrics")
    handle = Telemetry(settings, None, None, destination=f"OTLP {settings.protocol} {settings.endpoint}")
    return spans, points, handle


def _file_exporters(settings: Settings, instance_id: str) -> tuple[SpanExporter, MetricExporter, Telemetry]:
    from opentelemetry.exporter.otlp.json.file import FileMetricExporter, FileSpanExporter

    folder = settings.data_path
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"OTEL_STAGES_DATA_DIR / data_dir={settings.data_dir!r}: cannot create folder ({exc})"
        ) from None
    # One file pair per process: concurrent writers never interleave partial lines.
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    stem = f"{stamp}-{os.getpid()}-{instance_id[:8]}"
    trace_path = folder / f"traces-{stem}.jsonl"
    metrics_path = folder / f"metrics-{stem}.jsonl"
    handle = Telemetry(settings, None, None, destination=str(folder.resolve()),
                       trace_path=trace_path, metrics_path=metrics_path)
    return FileSpanExporter(trace_path), FileMetricExporter(metrics_path), handle
