"""Wiring for ``configure()``: start the sampler, register the forward hook, build the reader.

One GPU session per process: a new ``configure()`` stops the previous session's sampler. In a
forked child the session restarts with a fresh NVML initialisation (NVML state and threads do not
survive ``fork()``). This module imports the OpenTelemetry SDK (via the reader); only
``otel_stages.sdk`` imports it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader
from opentelemetry.sdk.resources import Resource

from otel_stages._runtime import RUNTIME
from otel_stages.config import ConfigurationError
from otel_stages.gpu import nvml
from otel_stages.gpu.attribution import Attribution
from otel_stages.gpu.reader import GpuMetricReader
from otel_stages.gpu.sampler import DEFAULT_INIT_TIMEOUT_S, DEFAULT_READ_TIMEOUT_S, Sampler
from otel_stages.sample_export import SerializedExporter

MODES = ("auto", "on", "off")


def mode_of(value: Any) -> str:
    """Normalise the ``gpu`` setting: ``auto`` / ``on`` / ``off`` (``True`` / ``False`` accepted)."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    return str(value)


class GpuSession:
    """The sampler, its forward hook and its reader, for one ``configure()``.

    ``backend_factory`` builds a fresh backend (also after ``fork()``).
    """

    def __init__(self, backend_factory: Any, interval_s: float,
                 init_timeout_s: float = DEFAULT_INIT_TIMEOUT_S,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S) -> None:
        self.backend_factory = backend_factory
        self.interval_s = interval_s
        self.init_timeout_s = init_timeout_s
        self.read_timeout_s = read_timeout_s
        self.sampler = self._new_sampler()
        self.attribution = Attribution(self.sampler)
        self.reader: GpuMetricReader | None = None
        self._stopped = False

    def _new_sampler(self) -> Sampler:
        return Sampler(self.backend_factory(), interval_s=self.interval_s,
                       init_timeout_s=self.init_timeout_s, read_timeout_s=self.read_timeout_s)

    def start(self) -> GpuSession:
        """Start sampling in the background and attach the forward hook."""
        self.sampler.start()
        RUNTIME.add_stage_end_hook(self.attribution)
        return self

    def stop(self) -> None:
        """Detach the hook, stop and join the sampler, shut NVML down. Idempotent."""
        self._stopped = True
        RUNTIME.remove_stage_end_hook(self.attribution)
        # A call running longer than the read timeout is abandoned anyway: do not wait longer
        # (this also runs at interpreter exit, before the telemetry's own bounded shutdown).
        self.sampler.stop(timeout_s=min(5.0, self.read_timeout_s + 0.5))

    def restart_after_fork(self) -> None:
        """In a forked child: new backend and sampler (same settings), new threads."""
        if self._stopped:
            return
        nvml.reset_after_fork()
        RUNTIME.remove_stage_end_hook(self.attribution)
        self.sampler = self._new_sampler()
        self.attribution = Attribution(self.sampler)
        self.start()
        if self.reader is not None:
            self.reader.start_thread()


_current: GpuSession | None = None
_lock = threading.Lock()


def current() -> GpuSession | None:
    """The running session (``None`` when GPU sampling is off or not configured)."""
    return _current


def start(settings: Any, resource: Resource, exporter: MetricExporter,
          backend_factory: Any = nvml.NvmlBackend, *,
          resource_fn: Callable[[], Resource] | None = None,
          drops: Any = None) -> tuple[MetricExporter, list[MetricReader]]:
    """Called by ``configure()``: returns the exporter the SDK's periodic reader must use (shared
    with the GPU reader) and the readers to register *before* it. ``resource_fn`` gives the
    resource at export time (default: ``resource``); ``drops`` (a ``DropCounter``) is told about
    points lost.

    ``settings.gpu``: ``off`` -> ``(exporter, [])``; ``auto`` -> sampling starts in the
    background, a host without NVML logs one line and exports no GPU data; ``on`` -> waits for
    NVML init and raises :class:`ConfigurationError` when there is no GPU data to be had.
    """
    global _current
    mode = mode_of(settings.gpu)
    if mode == "off":
        return exporter, []
    session = GpuSession(backend_factory, settings.gpu_interval_s,
                         read_timeout_s=getattr(settings, "gpu_read_timeout_s", DEFAULT_READ_TIMEOUT_S))
    if mode == "on":
        session.sampler.log_unavailable = False
    with _lock:
        previous, _current = _current, session
    if previous is not None:
        previous.stop()
    session.start()
    if mode == "on" and not session.sampler.wait_ready(session.init_timeout_s + 1.0):
        reason = session.sampler.reason or "NVML init did not finish"
        session.stop()
        with _lock:
            if _current is session:
                _current = None
        raise ConfigurationError(f"OTEL_STAGES_GPU / gpu='on' (setting gpu): no GPU data: {reason} "
                                 "(use gpu='auto' to run on without GPU data)")
    shared = SerializedExporter(exporter)
    session.reader = GpuMetricReader(session, shared, resource_fn or resource,
                                     settings.metric_export_interval_s,
                                     on_dropped=None if drops is None else drops.add_points)
    return shared, [session.reader]


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    session = _current
    if session is not None:
        session.restart_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
