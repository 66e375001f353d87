"""``configure()``: the only place that builds OpenTelemetry SDK providers and exporters.

With no OTLP endpoint set, the embedded default writes OTLP/JSON lines (the official
``opentelemetry-exporter-otlp-json-file`` exporter, the format of the Collector's ``file``
exporter) under ``data_dir``: ``traces-<instance>.jsonl`` and ``metrics-<instance>.jsonl``, one
pair per process. With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, spans and metrics go over OTLP, gRPC
or HTTP per ``OTEL_EXPORTER_OTLP_PROTOCOL``. Spans always pass through a ``BatchSpanProcessor``
(export never runs on the request path); providers flush at interpreter exit.

One configuration at a time: a second ``configure()`` shuts down what the first one built (see
:func:`configure` for the OpenTelemetry globals and for ``fork()``).
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from otel_stages import propagation, sampling, semconv
from otel_stages._runtime import RUNTIME, scoped_tracer
from otel_stages.config import ConfigurationError, Settings, resolve
from otel_stages.request_log import RequestLogProcessor

logger = logging.getLogger("otel_stages")


class _CountingSpanExporter(SpanExporter):
    """Delegates to ``inner`` and counts the batches it failed to export (a ``FAILURE`` result or
    an exception), so a dead collector shows up as a number instead of only as log lines."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.batches = 0
        self.failures = 0
        self.last_result: SpanExportResult | None = None
        self._lock = threading.Lock()

    def _record(self, result: SpanExportResult) -> None:
        with self._lock:
            self.batches += 1
            self.last_result = result
            if result is not SpanExportResult.SUCCESS:
                self.failures += 1

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:
            self._record(SpanExportResult.FAILURE)
            raise  # the batch processor logs it, as it would without this wrapper
        self._record(result)
        return result

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        if "timeout_millis" in inspect.getfullargspec(self.inner.shutdown).args:
            self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)  # type: ignore[call-arg]
        else:
            self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


@dataclass
class Telemetry:
    """What :func:`configure` built. ``destination`` says where telemetry goes, for humans:
    a folder path for the embedded files, else ``"<protocol> <endpoint>"``.

    ``trace_path`` / ``metrics_path`` are the OTLP/JSON files (``None`` when exporting over OTLP).
    :attr:`export_failures` counts span batches the exporter could not deliver.
    """

    settings: Settings
    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None
    destination: str
    trace_path: Path | None = None
    metrics_path: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    _span_exporter: _CountingSpanExporter | None = field(default=None, repr=False, compare=False)
    _gpu_readers: list[Any] = field(default_factory=list, repr=False, compare=False)
    _pid: int = field(default_factory=os.getpid, repr=False, compare=False)
    _shut_down: bool = field(default=False, repr=False, compare=False)
    _tracer: Any = field(default=None, repr=False, compare=False)

    @property
    def export_failures(self) -> int:
        """Span batches the configured exporter failed to export so far (``FAILURE`` results and
        exceptions; an OTLP exporter reports one only after its own retries gave up). 0 when
        telemetry is disabled. Read it after :meth:`force_flush` to judge a finished run."""
        return 0 if self._span_exporter is None else self._span_exporter.failures

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
        """Flush and stop the providers (also done automatically at interpreter exit, and by the
        next :func:`configure`). Idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        if self.tracer_provider is not None and RUNTIME.tracer is self._tracer:
            RUNTIME.tracer = RUNTIME.default_tracer  # not a shut-down provider that drops spans
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()

    def _describe(self) -> str:
        return f"service.name={self.settings.service_name!r}, {self.destination}"


_lock = threading.Lock()  # one configure() at a time (re-created in a forked child)
_last: Telemetry | None = None  # what the latest configure() built; the next one replaces it
_globals_from: Telemetry | None = None  # the configure() whose providers are the OTel globals


def configure(*, service_name: str | None = None, data_dir: str | os.PathLike[str] | None = None,
              endpoint: str | None = None, protocol: str | None = None,
              enabled: bool | None = None, log_requests: bool | None = None,
              metric_export_interval_s: float | None = None,
              gpu: str | None = None, gpu_interval_s: float | None = None,
              resource_attributes: dict[str, Any] | None = None,
              set_global: bool = True, propagate_context: bool | None = None,
              sample_ratio: float | None = None, slow_request_ms: float | None = None) -> Telemetry:
    """Build tracer and meter providers and point otel_stages' spans at them.

    Arguments override ``OTEL_STAGES_*`` env vars, which override standard ``OTEL_*`` ones
    (see :mod:`otel_stages.config`); ``gpu`` / ``gpu_interval_s`` control NVML sampling
    (:mod:`otel_stages.gpu`). ``set_global`` also installs the providers as the
    OpenTelemetry globals (so other instrumentation shares them). ``propagate_context`` (default
    on) keeps the request's context in thread pools (:mod:`otel_stages.propagation`);
    ``sample_ratio`` below 1 samples traces but keeps cold, failed and slow
    (``slow_request_ms``) requests (:mod:`otel_stages.sampling`).

    Calling it again replaces the previous configuration: once the new providers are built, the
    previous handle is shut down (flushed, its threads stopped) and an INFO line says so; a call
    that raises leaves the previous configuration in place (except GPU sampling, which a failing
    ``gpu='on'`` has already stopped: one GPU session per process). The OpenTelemetry globals can be set
    only once per process: a later ``configure(set_global=True)`` does not try again (one
    warning says so); the globals, and the providers behind them, keep the first configuration
    for other instrumentation, while otel_stages' own spans use the new one.

    ``fork()``: a child process inherits this configuration, its ``service.instance.id`` and its
    files; it is not rebuilt automatically (building exporters, gRPC channels and files inside a
    fork handler is not safe, and a child that only ``exec``s should not create any). The child
    logs one warning; call ``configure()`` again in each worker process (e.g. gunicorn's
    ``post_fork`` hook), which gives it its own instance id and files. OpenTelemetry globals set
    before ``fork()`` stay the parent's in the child (they cannot be set twice), so with
    ``set_global=True`` configure only in the workers, not before forking them.

    Raises :class:`~otel_stages.config.ConfigurationError` naming the setting and bad value, or
    when ``data_dir`` cannot be created. When disabled, returns a handle with no providers and
    every stage is a no-op.
    """
    arguments = {
        "service_name": service_name, "data_dir": None if data_dir is None else os.fspath(data_dir),
        "endpoint": endpoint, "protocol": protocol, "enabled": enabled,
        "log_requests": log_requests, "metric_export_interval_s": metric_export_interval_s,
        "gpu": gpu, "gpu_interval_s": gpu_interval_s,
        "propagate_context": propagate_context, "sample_ratio": sample_ratio,
        "slow_request_ms": slow_request_ms,
    }
    settings = resolve(arguments)
    with _lock:
        handle = _build(settings, resource_attributes, set_global)
        _replace(handle)
    return handle


def _build(settings: Settings, resource_attributes: dict[str, Any] | None,
           set_global: bool) -> Telemetry:
    global _globals_from
    if not settings.enabled:
        _serving(settings)
        RUNTIME.enabled = False
        return Telemetry(settings, None, None, destination="disabled")
    sampler = sampling.sampler_for(settings)  # raises before anything is built

    # A deployment's own instance id (OTEL_RESOURCE_ATTRIBUTES, e.g. the pod UID from the
    # downward API) or the caller's wins; a random one only fills the gap.
    given = {**Resource.create({}).attributes, **(resource_attributes or {})}
    instance_id = str(given.get(semconv.SERVICE_INSTANCE_ID) or uuid.uuid4().hex)
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

    counting = _CountingSpanExporter(span_exporter)
    tracer_provider = TracerProvider(resource=resource, sampler=sampler)
    tracer_provider.add_span_processor(sampling.processor_for(settings, BatchSpanProcessor(counting)))
    if settings.log_requests:
        tracer_provider.add_span_processor(RequestLogProcessor())
    reader = PeriodicExportingMetricReader(
        metric_exporter, export_interval_millis=settings.metric_export_interval_s * 1000)
    meter_provider = MeterProvider(resource=resource, metric_readers=[*gpu_readers, reader])

    handle.settings = settings
    handle.tracer_provider = tracer_provider
    handle.meter_provider = meter_provider
    handle._span_exporter = counting
    handle._gpu_readers = list(gpu_readers)
    if set_global:
        if _globals_from is None:
            trace.set_tracer_provider(tracer_provider)
            metrics.set_meter_provider(meter_provider)
            _globals_from = handle
        else:  # the SDK refuses a second set (and logs "Overriding ... is not allowed")
            logger.warning(
                "otel_stages.configure(set_global=True) ran again: OpenTelemetry's global tracer "
                "and meter providers can be set only once per process, so they keep the first "
                "configuration (%s) for other instrumentation; otel_stages' own spans use the new "
                "one (%s). Pass set_global=False to later configure() calls.",
                _globals_from._describe(), handle._describe())
    RUNTIME.enabled = True
    RUNTIME.tracer = handle._tracer = scoped_tracer(tracer_provider)
    _serving(settings)
    return handle


def _serving(settings: Settings) -> None:
    """Thread-pool context propagation follows the newest configuration (on unless disabled)."""
    if settings.enabled and settings.propagate_context:
        propagation.instrument()
    else:
        propagation.uninstrument()


def _replace(handle: Telemetry) -> None:
    """Make ``handle`` the current configuration and shut down the previous one.

    The providers behind the OpenTelemetry globals stay alive (other instrumentation still uses
    them); only their GPU reader stops, since GPU sampling follows the newest configuration.
    """
    global _last
    previous, _last = _last, handle
    if previous is None or previous is handle:
        return
    if previous is _globals_from:
        logger.info("otel_stages.configure() replaced the previous configuration (%s) with %s; "
                    "the previous providers stay up as the OpenTelemetry globals",
                    previous._describe(), handle._describe())
        for reader in previous._gpu_readers:
            reader.shutdown()
        previous._gpu_readers = []
        return
    logger.info("otel_stages.configure() replaced the previous configuration (%s) with %s; "
                "the previous one is shut down", previous._describe(), handle._describe())
    previous.shutdown()


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
    tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in instance_id[:8])  # file-safe
    stem = f"{stamp}-{os.getpid()}-{tag}"
    trace_path = folder / f"traces-{stem}.jsonl"
    metrics_path = folder / f"metrics-{stem}.jsonl"
    handle = Telemetry(settings, None, None, destination=str(folder.resolve()),
                       trace_path=trace_path, metrics_path=metrics_path)
    return FileSpanExporter(trace_path), FileMetricExporter(metrics_path), handle


def _after_fork_in_child() -> None:
    """The child inherited the parent's configuration: say so once (see :func:`configure`)."""
    global _lock
    _lock = threading.Lock()  # the parent may have forked while a configure() held it
    inherited = _last
    if inherited is None or inherited.tracer_provider is None or inherited._shut_down:
        return
    logger.warning("configure() ran before fork(): call otel_stages.configure() in each worker "
                   "process (e.g. gunicorn post_fork) so each gets its own service.instance.id "
                   "and files (until then pid %d exports under the instance id of pid %d, to %s)",
                   os.getpid(), inherited._pid, inherited.destination)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
