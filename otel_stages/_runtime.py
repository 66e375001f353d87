"""Process-wide state shared by the instrumentation modules (OpenTelemetry API only).

Holds the tracer the stages use, the on/off switch, the span clock, the stage-end hooks (how the
GPU sampler attaches per-forward figures) and the "log once, never break the caller" error policy.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from otel_stages import semconv
from otel_stages.clock import DEFAULT_CLOCK, Clock

logger = logging.getLogger("otel_stages")

#: Called just before a stage span ends: ``hook(span, name, start_ns, end_ns)``. Must be cheap and
#: must not raise (failures are logged once and ignored). Called on the thread that ran the stage.
StageEndHook = Callable[[Any, str, int, int], None]


def _env_enabled() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return os.environ.get("OTEL_STAGES_ENABLED", "true").strip().lower() not in ("0", "false", "no", "off")


class Runtime:
    """Mutable process state. Reads are lock-free (attribute loads); writes happen at setup."""

    def __init__(self) -> None:
        self.enabled: bool = _env_enabled()
        self.tracer: trace.Tracer = trace.get_tracer(semconv.SCOPE_NAME)  # proxy to the global
        self.clock: Clock = DEFAULT_CLOCK
        self.stage_end_hooks: tuple[StageEndHook, ...] = ()
        self._reported: set[str] = set()
        self._lock = threading.Lock()

    def add_stage_end_hook(self, hook: StageEndHook) -> None:
        """Register ``hook`` to run before every stage span ends (idempotent)."""
        with self._lock:
            if hook not in self.stage_end_hooks:
                self.stage_end_hooks = (*self.stage_end_hooks, hook)

    def remove_stage_end_hook(self, hook: StageEndHook) -> None:
        """Unregister a hook added with :meth:`add_stage_end_hook` (no error if absent)."""
        with self._lock:
            self.stage_end_hooks = tuple(h for h in self.stage_end_hooks if h is not hook)

    def internal_error(self, where: str, exc: BaseException) -> None:
        """Telemetry failed inside otel_stages: log once per ``where``, keep the caller running.

        Under pytest (``PYTEST_CURRENT_TEST`` set) the error is re-raised so bugs surface in tests.
        """
        if "PYTEST_CURRENT_TEST" in os.environ and not getattr(exc, "_otel_stages_expected", False):
            raise exc
        with self._lock:
            if where in self._reported:
                return
            self._reported.add(where)
        logger.warning("otel_stages: telemetry error in %s (further ones silenced): %r", where, exc,
                       exc_info=exc)


RUNTIME = Runtime()
