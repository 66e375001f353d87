"""Process-wide state shared by the instrumentation modules (OpenTelemetry API only).

Holds the tracer the stages use, the on/off switch, the span clock, the stage-end hooks (how the
GPU sampler attaches per-forward figures) and the "log once, never break the caller" error policy
(:class:`guard`, the one place that policy is written).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import trace

from otel_stages import semconv
from otel_stages._version import __version__
from otel_stages.clock import DEFAULT_CLOCK, Clock

logger = logging.getLogger("otel_stages")

#: Called just before a stage span ends: ``hook(span, name, start_ns, end_ns)``. Must be cheap and
#: must not raise (failures are logged once and ignored). Called on the thread that ran the stage.
StageEndHook = Callable[[Any, str, int, int], None]


def scoped_tracer(provider: trace.TracerProvider) -> trace.Tracer:
    """The tracer otel_stages' spans come from: scope ``otel_stages`` at the package version."""
    return provider.get_tracer(semconv.SCOPE_NAME, __version__)


def _env_enabled() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return os.environ.get("OTEL_STAGES_ENABLED", "true").strip().lower() not in ("0", "false", "no", "off")


class Runtime:
    """Mutable process state. Reads are lock-free (attribute loads); writes happen at setup."""

    def __init__(self) -> None:
        self.enabled: bool = _env_enabled()
        #: The tracer of OpenTelemetry's global provider (a proxy until one is set): what the
        #: stages use when no configure() is active, e.g. in a service with its own SDK setup.
        self.default_tracer: trace.Tracer = scoped_tracer(trace.get_tracer_provider())
        self.tracer: trace.Tracer = self.default_tracer
        #: Re-raise internal errors instead of logging them: ``None`` means "under pytest"
        #: (``PYTEST_CURRENT_TEST`` set), so bugs surface in tests; a test of the log-once
        #: policy sets ``False``.
        self.reraise: bool | None = None
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

        Re-raised instead when :attr:`reraise` says so (by default under pytest).
        """
        reraise = self.reraise
        if reraise or (reraise is None and "PYTEST_CURRENT_TEST" in os.environ):
            raise exc
        with self._lock:
            if where in self._reported:
                return
            self._reported.add(where)
        logger.warning("otel_stages: telemetry error in %s (further ones silenced): %r", where, exc,
                       exc_info=exc)


RUNTIME = Runtime()


F = TypeVar("F", bound=Callable[..., Any])


class guard:  # noqa: N801 - used like a function: ``with guard("queue span"):``
    """Context manager and decorator: an ``Exception`` inside is a failure of the telemetry itself.

    It is passed to :meth:`Runtime.internal_error` (logged once per ``where``, re-raised under
    pytest) and swallowed, so the caller's inference goes on; a decorated function then returns
    ``None``. ``BaseException``s that are not ``Exception`` (``KeyboardInterrupt``,
    ``SystemExit``) pass through. Create one per call site at import time (it holds no state).
    """

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        RUNTIME.internal_error(self.where, exc)
        return True

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)
            return None

        return wrapper  # type: ignore[return-value]
