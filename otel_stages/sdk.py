"""``configure()``: the only place that builds OpenTelemetry SDK providers and exporters.

With no OTLP endpoint set, the embedded default writes OTLP/JSON lines (the format of the
Collector's ``file`` exporter) under ``data_dir``: ``traces-<instance>.jsonl`` (spans through
:class:`otel_stages.json_lines.JsonLinesSpanExporter`: byte for byte what the official
``opentelemetry-exporter-otlp-json-file`` exporter writes, at a fraction of its CPU) and
``metrics-<instance>.jsonl`` (the official metric exporter), one pair per process. With
``OTEL_EXPORTER_OTLP_ENDPOINT`` set, spans and metrics go over OTLP, gRPC or HTTP per
``OTEL_EXPORTER_OTLP_PROTOCOL``. Spans always pass through a ``BatchSpanProcessor``
(export never runs on the request path); providers flush at interpreter exit, within
``shutdown_timeout_s`` (5 s by default) however the collector behaves.

Delivery is bounded and counted (:mod:`otel_stages.delivery`): :meth:`Telemetry.force_flush` and
:meth:`Telemetry.shutdown` honour their timeouts against a dead or black-holed collector and
return ``False`` when something was lost; spans and metric points that never arrive are counted
(:attr:`Telemetry.dropped_spans`, :attr:`Telemetry.dropped_points`, the
``otel_stages.spans.dropped`` metric, one log line per period); spans still open at shutdown are
ended and exported with ``otel_stages.interrupted=true``.

One configuration at a time: a second ``configure()`` shuts down what the first one built (see
:func:`configure` for the OpenTelemetry globals and for ``fork()``).
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource, ServiceInstanceIdResourceDetector
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator

import otel_stages as _package
from otel_stages import attributes, propagation, sampling, semconv, urls
from otel_stages._runtime import RUNTIME, scoped_tracer
from otel_stages._version import __version__
from otel_stages.builder import SpanBuilder
from otel_stages.config import ConfigurationError, Settings, resolve
from otel_stages.delivery import (
    CountingMetricExporter,
    CountingSpanExporter,
    DropCounter,
    OpenSpans,
    count_queue_drops,
    run_bounded,
)
from otel_stages.json_lines import JsonLinesSpanExporter
from otel_stages.request_log import RequestLogProcessor
from otel_stages.telemetry import Telemetry

__all__ = ["Telemetry", "configure"]

logger = logging.getLogger("otel_stages")

_lock = threading.Lock()  # one configure() at a time (re-created in a forked child)
_last: Telemetry | None = None  # what the latest configure() built; the next one replaces it
_globals_from: Telemetry | None = None  # the configure() whose providers are the OTel globals
_HANDLES: list[Telemetry] = []  # every handle built; those not shut down yet are at exit


class PrivateRandomIdGenerator(IdGenerator):
    """Random trace and span ids (all bits random, as the SDK's ``RandomIdGenerator``) drawn from
    a generator of their own, seeded from ``os.urandom`` and seeded again in every forked child.

    The SDK's generator draws from the global ``random`` module: a service that calls
    ``random.seed(...)`` (common in ML code, for reproducible sampling) would give every worker
    process the same trace ids, and the report would merge or drop their requests."""

    def __init__(self) -> None:
        self._random = random.Random(os.urandom(32))

    def reseed(self) -> None:
        """A fresh seed from ``os.urandom`` (after a fork, parent and child would repeat ids)."""
        self._random.seed(os.urandom(32))

    def generate_span_id(self) -> int:
        span_id = self._random.getrandbits(64)
        while span_id == trace.INVALID_SPAN_ID:
            span_id = self._random.getrandbits(64)
        return span_id

    def generate_trace_id(self) -> int:
        trace_id = self._random.getrandbits(128)
        while trace_id == trace.INVALID_TRACE_ID:
            trace_id = self._random.getrandbits(128)
        return trace_id

    def is_trace_id_random(self) -> bool:
        return True


#: The id generator of every provider ``configure()`` builds.
IDS = PrivateRandomIdGenerator()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=IDS.reseed)


def configure(*, service_name: str | None = None, data_dir: str | os.PathLike[str] | None = None,
              endpoint: str | None = None, protocol: str | None = None,
              enabled: bool | None = None, log_requests: bool | None = None,
              metric_export_interval_s: float | None = None,
              gpu: str | None = None, gpu_interval_s: float | None = None,
              resource_attributes: dict[str, Any] | None = None,
              set_global: bool = True, propagate_context: bool | None = None,
              sample_ratio: float | None = None, slow_request_ms: float | None = None,
              shutdown_timeout_s: float | None = None,
              attribute_value_length_limit: int | None = None,
              redact_query_keys: tuple[str, ...] | list[str] | None = None,
              gpu_read_timeout_s: float | None = None, span_mode: str | None = None,
              signals: bool | None = None, run_queue: bool | None = None) -> Telemetry:
    """Build tracer and meter providers and point otel_stages' spans at them.

    Arguments override ``OTEL_STAGES_*`` env vars, which override standard ``OTEL_*`` ones
    (see :mod:`otel_stages.config`); ``gpu`` / ``gpu_interval_s`` control NVML sampling
    (:mod:`otel_stages.gpu`); ``span_mode="deferred"`` moves span creation off the request thread
    (:mod:`otel_stages.deferred` says what that gives up); ``signals`` the per-stage CPU time, GC
    and event-loop signals and the cgroup throttling metrics (:mod:`otel_stages.signals`);
    ``run_queue`` (off by default) adds each stage thread's run-queue wait
    (:mod:`otel_stages.signals.runqueue`).
    ``set_global`` also installs the providers as the OpenTelemetry globals (so other
    instrumentation shares them).

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
        "gpu": gpu, "gpu_interval_s": gpu_interval_s, "gpu_read_timeout_s": gpu_read_timeout_s,
        "propagate_context": propagate_context, "sample_ratio": sample_ratio,
        "slow_request_ms": slow_request_ms,
        "shutdown_timeout_s": shutdown_timeout_s,
        "attribute_value_length_limit": attribute_value_length_limit,
        "redact_query_keys": redact_query_keys, "span_mode": span_mode, "signals": signals,
        "run_queue": run_queue,
    }
    settings = resolve(arguments)
    with _lock:
        handle = _build(settings, resource_attributes, set_global)
        _replace(handle)
    return handle


def _build(settings: Settings, resource_attributes: dict[str, Any] | None,
           set_global: bool) -> Telemetry:
    global _globals_from
    attributes.set_value_length_limit(settings.attribute_value_length_limit)
    urls.set_extra_sensitive_keys(settings.redact_query_keys)
    if not settings.enabled:
        _serving(settings)
        RUNTIME.enabled = False  # stages are no-ops: no signals are read either
        RUNTIME.deferred = None
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
    drops = DropCounter(handle._describe())
    counted_spans = CountingSpanExporter(span_exporter, drops)
    counted_points = CountingMetricExporter(metric_exporter, drops)
    # Our own exit handler shuts down within shutdown_timeout_s (the SDK's would wait 30 s and
    # more per processor); attribute values are capped at the same limit as ours (no marker there).
    limit = settings.attribute_value_length_limit
    tracer_provider = TracerProvider(resource=resource, sampler=sampler, shutdown_on_exit=False,
                                     id_generator=IDS,
                                     span_limits=SpanLimits(max_attribute_length=limit,
                                                            max_span_attribute_length=limit))
    open_spans = OpenSpans()  # first: it must see every start and end
    queue_size, batch_size = _batch_sizes(settings)
    batch = BatchSpanProcessor(counted_spans, max_queue_size=queue_size, max_export_batch_size=batch_size)
    queued_spans = count_queue_drops(batch, drops)
    span_processors: list[SpanProcessor] = [open_spans, sampling.processor_for(settings, batch)]
    if settings.log_requests:
        span_processors.append(RequestLogProcessor())
    for processor in span_processors:
        tracer_provider.add_span_processor(processor)

    shared_exporter: MetricExporter = counted_points
    gpu_readers: list[Any] = []
    if settings.gpu != "off":  # sampler thread + forward hook; NVML init runs off this thread
        from otel_stages.gpu import session as gpu_session

        # The resource is read at each export: after fork() the SDK gives the child a new
        # service.instance.id, and the child's GPU points must carry it like its spans do.
        shared_exporter, gpu_readers = gpu_session.start(
            settings, resource, counted_points, resource_fn=lambda: tracer_provider.resource,
            drops=drops)
    from otel_stages.signals import session as signals_session

    # GC pause recording and the cgroup sampler (its reader, like the GPU's, stops when a newer
    # configure() replaces this one, and counts what it loses at a shutdown deadline)
    shared_exporter, signal_readers = signals_session.start(
        settings, shared_exporter, resource_fn=lambda: tracer_provider.resource, drops=drops)
    reader = PeriodicExportingMetricReader(
        shared_exporter, export_interval_millis=settings.metric_export_interval_s * 1000)
    meter_provider = MeterProvider(resource=resource,
                                   metric_readers=[*gpu_readers, *signal_readers, reader],
                                   shutdown_on_exit=False)
    meter_provider.get_meter(semconv.SCOPE_NAME, __version__).create_observable_counter(
        semconv.SPANS_DROPPED, callbacks=[drops.observe], unit=semconv.UNIT_SPANS,
        description="Spans that never reached the exporter's destination, by error.type")

    handle.settings = settings
    handle.tracer_provider = tracer_provider
    handle.meter_provider = meter_provider
    handle._span_exporter = counted_spans
    handle._metric_exporter = counted_points
    handle._drops = drops
    handle._open_spans = open_spans
    handle._queued_spans = queued_spans
    handle._span_processors = span_processors
    handle._gpu_readers = list(gpu_readers)
    handle._signal_readers = list(signal_readers)
    _HANDLES.append(handle)
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
    RUNTIME.tracer = handle._tracer = scoped_tracer(tracer_provider)
    handle._builder = (SpanBuilder(handle._tracer, drops=drops) if settings.span_mode == "deferred"
                       else None)
    RUNTIME.deferred = handle._builder
    RUNTIME.enabled = True
    _serving(settings)
    return handle


#: Batch processor sizes for the embedded span file: four times the SDK's queue (slack for about
#: 1.4 s of export stall at 6000 spans/s, at most ~12 MB of finished spans) and twice its batch
#: (one write and flush per 1024 spans). benchmarks/exporter.py measures them.
FILE_MAX_QUEUE_SIZE = 8192
FILE_MAX_EXPORT_BATCH_SIZE = 1024
_BSP_SIZE_ENV = ("OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE")


def _batch_sizes(settings: Settings) -> tuple[int | None, int | None]:
    """``BatchSpanProcessor`` ``(max_queue_size, max_export_batch_size)``: ours for the embedded
    file unless ``OTEL_BSP_MAX_QUEUE_SIZE`` or ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` is set (then
    ``None``: the SDK reads both, as usual); the SDK's own over OTLP."""
    if settings.endpoint is not None or any(os.environ.get(var, "").strip() for var in _BSP_SIZE_ENV):
        return None, None
    return FILE_MAX_QUEUE_SIZE, FILE_MAX_EXPORT_BATCH_SIZE


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
        for reader in [*previous._gpu_readers, *previous._signal_readers]:
            reader.shutdown()
        previous._gpu_readers = []
        previous._signal_readers = []
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
    from opentelemetry.exporter.otlp.json.file import FileMetricExporter

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
    return JsonLinesSpanExporter(trace_path), FileMetricExporter(metrics_path), handle


def _after_fork_in_child() -> None:
    """The child inherited the parent's configuration: say once what that means (see
    :func:`configure`), when the child starts its first span: a child that records nothing (a
    multiprocessing worker, a subprocess helper) has nothing to be warned about."""
    global _lock
    _lock = threading.Lock()  # the parent may have forked while a configure() held it
    inherited = _last
    if inherited is None or inherited.tracer_provider is None or inherited._shut_down:
        return
    # The SDK's own fork handlers (run after this one) give the child's providers a new
    # service.instance.id from this detector, which keeps one id per pid: name it exactly.
    detected = ServiceInstanceIdResourceDetector().detect().attributes
    new_id = detected.get(semconv.SERVICE_INSTANCE_ID)
    old_id = inherited.tracer_provider.resource.attributes.get(semconv.SERVICE_INSTANCE_ID)
    where = ("the parent's files" if inherited.trace_path is not None
             else "the parent's OTLP endpoint")
    args = (os.getpid(), inherited._pid, new_id, inherited._pid, old_id, where,
            inherited.destination)

    def warn() -> None:
        logger.warning("configure() ran before fork(): pid %d inherited the configuration of pid"
                       " %d; the OpenTelemetry SDK gives its spans and metrics a new"
                       " service.instance.id %s (pid %d's: %s) but they still go to %s, %s. Call"
                       " otel_stages.configure() in each worker process (e.g. gunicorn post_fork)"
                       " for its own files and settings", *args)

    if inherited._open_spans is not None:
        inherited._open_spans.notice = warn
    else:  # no span pipeline of ours to wait for: say it now
        warn()


def _shutdown_at_exit() -> None:
    """Interpreter exit: shut down every live handle at once, each within its own
    ``shutdown_timeout_s`` (the SDK providers' own exit hooks are off: they had no bound), and
    the GPU sampler with them (its reader's shutdown stops it; this covers a session whose
    handle is gone)."""
    handles = [h for h in _HANDLES if not h._shut_down and h.tracer_provider is not None]
    steps: list[Callable[[], Any]] = [h.shutdown for h in handles]
    gpu_session = sys.modules.get("otel_stages.gpu.session")
    current = gpu_session.current() if gpu_session is not None else None
    if current is not None:
        steps.append(current.stop)
    if not steps:
        return
    limit_s = max((h.settings.shutdown_timeout_s for h in handles), default=5.0)
    run_bounded(steps, time.monotonic() + limit_s + 0.5, "otel-stages-exit")


atexit.register(_shutdown_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

# ``otel_stages.configure`` / ``otel_stages.Telemetry`` were lazy (the package's __getattr__, so
# that instrumented code does not import the SDK); now that it is imported they are plain names.
_package._setup_imported(configure, Telemetry)
