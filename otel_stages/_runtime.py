"""Process-wide state shared by the instrumentation modules (OpenTelemetry API only).

Holds the tracer the stages use, the on/off switch and the span mode (:attr:`Runtime.mode`), the
span clock, the stage-end hooks keyed by stage name (how the GPU sampler attaches per-forward
figures), and the "log once, never break the caller" error policy
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

from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_stages import semconv
from otel_stages._version import __version__
from otel_stages.clock import DEFAULT_CLOCK, Clock

logger = logging.getLogger("otel_stages")

#: Called just before a stage span ends: ``hook(span, name, start_ns, end_ns)``. Must be cheap and
#: must not raise (failures are logged once and ignored). Called on the thread that ran the stage.
#: ``span`` is the live span, or in deferred mode the stage's record, which takes the same
#: ``set_attribute`` / ``set_attributes`` / ``add_event`` calls.
StageEndHook = Callable[[Any, str, int, int], None]

#: The OpenTelemetry context key under which the innermost open deferred stage travels (with the
#: context, so thread-pool propagation, ``asyncio`` and ``enqueue_token`` carry it like a span).
RECORD_KEY = otel_context.create_key("otel_stages.deferred_stage")

#: :attr:`Runtime.mode` values: telemetry off (stages are shared no-ops), spans made on the request
#: thread (``live``), spans built later from recorded timestamps (``deferred``).
OFF, LIVE, DEFERRED = 0, 1, 2


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
        self._enabled: bool = _env_enabled()
        self._deferred: Any = None
        #: ``OFF``, ``LIVE`` or ``DEFERRED``: what :func:`otel_stages.stage` makes now. Derived
        #: from :attr:`enabled` and :attr:`deferred` (set those, not this).
        self.mode: int = LIVE if self._enabled else OFF
        #: The tracer of OpenTelemetry's global provider (a proxy until one is set): what the
        #: stages use when no configure() is active, e.g. in a service with its own SDK setup.
        self.default_tracer: trace.Tracer = scoped_tracer(trace.get_tracer_provider())
        self.tracer: trace.Tracer = self.default_tracer
        #: Re-raise internal errors instead of logging them: ``None`` means "under pytest"
        #: (``PYTEST_CURRENT_TEST`` set), so bugs surface in tests; a test of the log-once
        #: policy sets ``False``.
        self.reraise: bool | None = None
        self.clock: Clock = DEFAULT_CLOCK
        #: Stage-end hooks by stage name, each with its guard; the entry for a name also holds
        #: the hooks registered for every stage, and key ``None`` holds those alone (for names
        #: without hooks of their own). Empty when there are none, so a stage pays one truth test.
        self.stage_end_hooks: dict[str | None, tuple[tuple[StageEndHook, guard], ...]] = {}
        self._hooks: list[tuple[StageEndHook, str | None]] = []
        self._reported: set[str] = set()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether stages record anything (``False``: every stage is a shared no-op)."""
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._enabled = bool(value)
        self._update_mode()

    @property
    def deferred(self) -> Any:
        """The span builder of deferred mode (:class:`otel_stages.builder.SpanBuilder`), or
        ``None`` for live spans."""
        return self._deferred

    @deferred.setter
    def deferred(self, builder: Any) -> None:
        self._deferred = builder
        self._update_mode()

    def _update_mode(self) -> None:
        self.mode = OFF if not self._enabled else DEFERRED if self._deferred is not None else LIVE

    def add_stage_end_hook(self, hook: StageEndHook, stage: str | None = None) -> None:
        """Register ``hook`` to run before stage spans end: only those named ``stage``, or every
        stage when ``stage`` is ``None`` (idempotent)."""
        with self._lock:
            if (hook, stage) not in self._hooks:
                self._hooks.append((hook, stage))
                self._rebuild_hooks()

    def remove_stage_end_hook(self, hook: StageEndHook) -> None:
        """Unregister a hook added with :meth:`add_stage_end_hook`, for every stage name it was
        registered for (no error if absent)."""
        with self._lock:
            self._hooks = [(h, s) for h, s in self._hooks if h is not hook]
            self._rebuild_hooks()

    def _rebuild_hooks(self) -> None:
        guards = {id(h): guard(f"stage end hook {h!r}") for h, _ in self._hooks}
        names = {s for _, s in self._hooks}
        table = {name: tuple((h, guards[id(h)]) for h, s in self._hooks if s is None or s == name)
                 for name in names}
        self.stage_end_hooks = {k: v for k, v in table.items() if v}  # replaced, never mutated

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

    A third form exists for the stage start and end blocks only (``stages.py``, ``deferred.py``):
    ``try: ... except Exception as exc: GUARD.failed(exc)``. It applies the same policy; a
    ``with`` block costs two Python calls more per use, measured at 2.1 % of a live span's whole
    cost (``BENCHMARKS.md``), and the live stage's budget over the plain SDK is 5 %.
    """

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    #: ``NoneType()``: a C callable returning None, so entering a guard runs no Python frame (one
    #: is entered at every stage's start and end).
    __enter__: staticmethod[[], None] = staticmethod(type(None))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        RUNTIME.internal_error(self.where, exc)
        return True

    def failed(self, exc: Exception) -> None:
        """The policy for ``exc`` caught by ``except Exception`` on the stages' hot path (see the
        class docstring): what leaving the ``with`` block with ``exc`` does."""
        RUNTIME.internal_error(self.where, exc)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)
            return None

        return wrapper  # type: ignore[return-value]
