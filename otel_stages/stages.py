"""``request()`` and ``stage()``: spans for one inference request and its stages (OTel API only).

Both work as context managers and as decorators (sync functions, coroutines, generators and async
generators). Times come from the span clock (:mod:`otel_stages.clock`) and are passed explicitly,
so stage durations are monotonic. An exception inside a stage is recorded on the span (exception
event, status ERROR, ``error.type``) and re-raised unchanged. Failures of the telemetry itself are
logged once and never reach the caller (:class:`otel_stages._runtime.guard`).

Nothing here imports the OpenTelemetry SDK: a service with its own SDK setup can use these as is.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from contextvars import Token
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from otel_stages import semconv, signals
from otel_stages._runtime import RUNTIME, guard
from otel_stages.attributes import clean_attributes, exception_attributes, status_message

F = TypeVar("F", bound=Callable[..., Any])

_NOT_ERRORS = (GeneratorExit, StopIteration, StopAsyncIteration)

_GUARD_START = guard("stage start")
_GUARD_END = guard("stage end")
_GUARD_DETACH = guard("context detach")

# A ``with stage()`` block in a generator that yields inside it: see StageScope.__enter__.
_GENERATOR_CODE = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


def _contextlib_entries() -> frozenset[object]:
    """Code objects that drive a generator as a context manager (``@contextmanager``)."""
    import contextlib

    return frozenset({contextlib._GeneratorContextManager.__enter__.__code__,
                      contextlib._AsyncGeneratorContextManager.__aenter__.__code__})


_CONTEXTLIB_ENTRIES = _contextlib_entries()


def _driven_by_contextlib(frame: Any) -> bool:
    """Whether generator ``frame`` runs a ``with stage()`` block it may make current.

    Not when the generator is iterated by someone else: the block stays open across ``yield``, so
    the consumer would see the stage as its current span between items, and a generator closed
    from another task or thread would detach a context token made in a different context
    ("Failed to detach context"). The span is still timed and parented; stages nested in such a
    block become its siblings. A generator driven by ``@contextmanager`` is entered and left by
    one ``with`` statement, so its block is current as usual. (Callers test the cheap
    ``co_flags & _GENERATOR_CODE`` first: this runs only for generator frames.)
    """
    caller = frame.f_back
    return caller is not None and caller.f_code in _CONTEXTLIB_ENTRIES


class _Sequence:
    """1-based request counter for this process; restarts after ``fork()`` (a new process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._counter = itertools.count(1)
        self._cold_pending = False

    def next(self) -> tuple[int, bool]:
        """Return ``(seq, cold)`` for a new request."""
        with self._lock:
            seq = next(self._counter)
            cold = seq == 1 or self._cold_pending
            self._cold_pending = False
        return seq, cold

    def mark_cold(self) -> None:
        with self._lock:
            self._cold_pending = True


_SEQUENCE = _Sequence()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_SEQUENCE._reset)


def mark_cold_start() -> None:
    """Flag the *next* request as a cold start (call after loading or reloading a model)."""
    _SEQUENCE.mark_cold()


class StageScope:
    """One span around a block or a call. Returned by :func:`stage` and :func:`request`.

    As a context manager it yields the OpenTelemetry :class:`~opentelemetry.trace.Span` (an
    invalid, no-op span when telemetry is disabled) so the block can add attributes. One
    ``StageScope`` object is entered once; used as a decorator it opens a fresh span per call.
    """

    __slots__ = ("_signals", "_span", "_start_ns", "_token", "attributes", "name")

    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self.name = name
        self.attributes = attributes
        self._span: Span | None = None
        self._token: Token[otel_context.Context] | None = None
        self._start_ns = 0
        self._signals: signals.capture.State | None = None

    # -- span lifecycle -------------------------------------------------------------------------
    def _start_attributes(self) -> dict[str, Any]:
        return self.attributes

    def _open(self, parent: otel_context.Context | None = None, start_ns: int | None = None,
              links: Sequence[trace.Link] | None = None) -> Span:
        if not RUNTIME.enabled:
            return trace.INVALID_SPAN
        self._span = None
        with _GUARD_START:  # telemetry must not break inference
            attributes = clean_attributes(self._start_attributes())  # before the clock starts
            self._start_ns = RUNTIME.clock.now_ns() if start_ns is None else start_ns
            self._signals = signals.on_start()  # issue 13: thread CPU, GC and loop readings
            self._span = RUNTIME.tracer.start_span(
                self.name, context=parent, attributes=attributes, links=links,
                start_time=self._start_ns)
            return self._span
        return trace.INVALID_SPAN

    def _close(self, exc: BaseException | None, end_ns: int | None = None) -> None:
        span = self._span
        if span is None:
            return
        self._span = None
        with _GUARD_END:
            span.end(end_time=self._finish(span, exc, end_ns))

    def _finish(self, span: Span, exc: BaseException | None, end_ns: int | None = None) -> int:
        """Everything before ``span.end``: record ``exc`` (unless it is generator control flow)
        and run the stage-end hooks. Returns the end time (span-clock ns, now unless given)."""
        end_ns = RUNTIME.clock.now_ns() if end_ns is None else end_ns
        signals.on_finish(span, self._signals, self._start_ns, end_ns)  # issue 13
        if exc is not None and not isinstance(exc, _NOT_ERRORS):
            record_error(span, exc)
        for hook in RUNTIME.stage_end_hooks:
            with guard(f"stage end hook {hook!r}"):  # one bad hook must not skip the others
                hook(span, self.name, self._start_ns, end_ns)
        return end_ns

    def _attach(self) -> None:
        if self._span is not None:
            self._token = otel_context.attach(trace.set_span_in_context(self._span))

    def _detach(self) -> None:
        token, self._token = self._token, None
        if token is not None:
            with _GUARD_DETACH:
                otel_context.detach(token)

    # -- context manager ------------------------------------------------------------------------
    def __enter__(self) -> Span:
        span = self._open()
        if self._span is not None:
            frame = sys._getframe(1)
            if not frame.f_code.co_flags & _GENERATOR_CODE or _driven_by_contextlib(frame):
                self._attach()
        return span

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Returns None: never swallows the caller's exception (and type checkers know it).
        self._detach()
        self._close(exc)

    async def __aenter__(self) -> Span:
        span = self._open()
        if self._span is not None:
            frame = sys._getframe(1)
            if not frame.f_code.co_flags & _GENERATOR_CODE or _driven_by_contextlib(frame):
                self._attach()
        return span

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)

    # -- decorator ------------------------------------------------------------------------------
    def _fresh(self) -> StageScope:
        return type(self)(self.name, self.attributes)

    def __call__(self, fn: F) -> F:
        if inspect.isasyncgenfunction(fn):
            return _wrap_async_generator(fn, self._fresh)  # type: ignore[return-value]
        if inspect.isgeneratorfunction(fn):
            return _wrap_generator(fn, self._fresh)  # type: ignore[return-value]
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with self._fresh():
                    return await fn(*args, **kwargs)
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._fresh():
                return fn(*args, **kwargs)
        return wrapper  # type: ignore[return-value]


class RequestScope(StageScope):
    """The parent span of one inference request; sets ``request.seq`` / ``request.cold_start``."""

    __slots__ = ("cold_start", "request_id")

    def __init__(self, name: str, attributes: dict[str, Any], request_id: str | None = None,
                 cold_start: bool | None = None) -> None:
        super().__init__(name, attributes)
        self.request_id = request_id
        self.cold_start = cold_start

    def _start_attributes(self) -> dict[str, Any]:
        seq, cold = _SEQUENCE.next()
        attrs = dict(self.attributes)
        attrs[semconv.REQUEST_SEQ] = seq
        attrs[semconv.REQUEST_COLD_START] = cold if self.cold_start is None else self.cold_start
        if self.request_id is not None:
            attrs[semconv.REQUEST_ID] = self.request_id
        return attrs

    def _fresh(self) -> RequestScope:
        return RequestScope(self.name, self.attributes, None, self.cold_start)


def stage(name: str, /, **attributes: Any) -> StageScope:
    """Open a span named ``name`` (``download``, ``decode``, ``resize``, ``queue``, ``forward``
    or a custom stage) as a child of the current span.

    ``attributes`` are set at start (keys with dots can be passed as ``**{"image.size": n}``).
    Use ``with stage("decode") as span:`` or ``@stage("forward")`` on a function, coroutine,
    generator or async generator. Exceptions propagate unchanged after being recorded.
    """
    return StageScope(name, attributes)


def request(name: str = semconv.SPAN_REQUEST, /, *, request_id: str | None = None,
            cold_start: bool | None = None, **attributes: Any) -> RequestScope:
    """Open the request span: the parent of the stage spans of one inference request.

    It is a child of the current span when there is one (e.g. an HTTP server span). Sets
    ``request.seq`` (1-based, per process), ``request.cold_start`` (``True`` for the first
    request of the process or after :func:`mark_cold_start`, unless ``cold_start`` is given) and
    ``request.id`` when ``request_id`` is given (the trace id already identifies the request
    otherwise). Works as context manager and decorator.
    """
    return RequestScope(name, attributes, request_id, cold_start)


def record_error(span: Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span`` the standard way: exception event, status ERROR, ``error.type``.

    The message in the status and the event, and the event's stack trace, are capped
    (:mod:`otel_stages.attributes`)."""
    span.record_exception(exc, attributes=exception_attributes(exc))
    span.set_status(Status(StatusCode.ERROR, status_message(exc)))
    span.set_attribute(semconv.ERROR_TYPE, type(exc).__qualname__)


def _wrap_generator(fn: Callable[..., Any], new_scope: Callable[[], StageScope]) -> Callable[..., Any]:
    """The span covers the generator's whole life; its context is active only while it runs."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        scope = new_scope()
        scope._open()
        error: BaseException | None = None
        gen = fn(*args, **kwargs)
        try:
            method, value = gen.send, None
            while True:
                scope._attach()
                try:
                    item = method(value)
                except StopIteration as stop:
                    return stop.value
                finally:
                    scope._detach()
                try:
                    method, value = gen.send, (yield item)
                except GeneratorExit:
                    gen.close()
                    raise
                except BaseException as thrown:  # noqa: BLE001 - forwarded into the generator
                    method, value = gen.throw, thrown
        except BaseException as exc:
            error = exc
            raise
        finally:
            scope._close(error)

    return wrapper


def _wrap_async_generator(fn: Callable[..., Any],
                          new_scope: Callable[[], StageScope]) -> Callable[..., Any]:
    """Async twin of :func:`_wrap_generator` (``asend`` / ``athrow`` are forwarded)."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        scope = new_scope()
        scope._open()
        error: BaseException | None = None
        agen = fn(*args, **kwargs)
        try:
            method, value = agen.asend, None
            while True:
                scope._attach()
                try:
                    item = await method(value)
                except StopAsyncIteration:
                    return
                finally:
                    scope._detach()
                try:
                    method, value = agen.asend, (yield item)
                except GeneratorExit:
                    await agen.aclose()
                    raise
                except BaseException as thrown:  # noqa: BLE001 - forwarded into the generator
                    method, value = agen.athrow, thrown
        except BaseException as exc:
            error = exc
            raise
        finally:
            scope._close(error)

    return wrapper
