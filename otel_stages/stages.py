"""``request()`` and ``stage()``: spans for one inference request and its stages (OTel API only).

Both work as context managers and as decorators (sync functions, coroutines, generators and async
generators). Times come from the span clock (:mod:`otel_stages.clock`) and are passed explicitly,
so stage durations are monotonic. An exception inside a stage is recorded on the span (exception
event, status ERROR, ``error.type``) and re-raised unchanged. Failures of the telemetry itself are
logged once and never reach the caller (:class:`otel_stages._runtime.guard`).

What a call makes depends on :attr:`otel_stages._runtime.Runtime.mode`, read per call (so a
decorator applied before ``configure()`` follows it):

* ``OFF``: a shared no-op per stage name (nothing allocated, nothing recorded);
* ``LIVE`` (the default): :class:`StageScope`, a span started and made current on entry;
* ``DEFERRED``: a record of timestamps and attributes, built into the same span later
  (:mod:`otel_stages.deferred`).

The hot path of a live stage is :meth:`StageScope.__enter__` / :meth:`StageScope.__exit__`: one
guarded block each, no per-stage lookups beyond the runtime's attributes. The per-stage signals
(:mod:`otel_stages.signals`: thread CPU time, GC pauses, event-loop lag) are read right after the
start time is taken (:func:`otel_stages.signals.on_start`, kept in the scope's ``_signals`` slot)
and set on the span right after the end time is taken, before the stage-end hooks and the error
(:func:`otel_stages.signals.on_finish`); with ``configure(signals=False)`` a stage pays one flag
test for them.

Nothing here imports the OpenTelemetry SDK: a service with its own SDK setup can use these as is.
"""

from __future__ import annotations

import functools
import inspect
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextvars import Token
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation import _SPAN_KEY

from otel_stages import semconv
from otel_stages._runtime import DEFERRED, LIVE, RECORD_KEY, RUNTIME, guard
from otel_stages.attributes import clean_attributes, clean_value, exception_attributes, status_message
from otel_stages.frames import _GENERATOR_CODE, _driven_by_contextlib, wrap_async_generator, wrap_generator
from otel_stages.sequence import next_request
from otel_stages.signals import capture as _capture

F = TypeVar("F", bound=Callable[..., Any])

_NOT_ERRORS = (GeneratorExit, StopIteration, StopAsyncIteration)

_GUARD_START = guard("stage start")
_GUARD_END = guard("stage end")
_GUARD_DETACH = guard("context detach")
#: Signal failures are logged apart from the span's: the span is still made and ended.
_GUARD_SIGNALS = guard("stage signals")
_on_start = _capture.on_start
_on_finish = _capture.on_finish
_getframe = sys._getframe
_INTERNAL = SpanKind.INTERNAL
_REQUEST_SEQ = semconv.REQUEST_SEQ
_REQUEST_COLD_START = semconv.REQUEST_COLD_START
_set_span_in_context = trace.set_span_in_context
_Context = otel_context.Context


def _api_context() -> tuple[Callable[[], otel_context.Context],
                            Callable[[otel_context.Context], Token[otel_context.Context]],
                            Callable[[Token[otel_context.Context]], None]]:
    """``(get_current, attach, detach)`` for the hot path: the ``ContextVar`` methods behind the
    OpenTelemetry API's own functions when the API runs its default runtime context
    (``opentelemetry/context/contextvars_context.py``: ``attach`` is ``set``, ``get_current``
    ``get``, ``detach`` ``reset``; one C call instead of three Python frames), else the API's
    functions (``OTEL_PYTHON_CONTEXT`` names another runtime context). Read once, at import, as
    the API reads its own (``opentelemetry.context._RUNTIME_CONTEXT``)."""
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    if type(runtime) is ContextVarsRuntimeContext:
        var = runtime._current_context
        return var.get, var.set, var.reset
    return otel_context.get_current, otel_context.attach, otel_context.detach


_get_current, _attach, _reset = _api_context()
#: The API's detach: logs "Failed to detach context" and returns (what a failed ``_reset`` falls
#: back to, so a bad token is reported as the API reports it).
_api_detach = otel_context.detach


def _detach(token: Token[otel_context.Context]) -> None:
    """``otel_context.detach(token)``, through the ContextVar when it can (see _api_context)."""
    try:
        _reset(token)
    except Exception:  # noqa: BLE001 - the API's own handling: it logs the failure and goes on
        _api_detach(token)


def start_signals() -> _capture.State | None:
    """The stage's signal readings at its start (:func:`otel_stages.signals.on_start`), or
    ``None`` when signals are off or reading them failed (logged through the guard)."""
    if not _capture._enabled:
        return None
    try:
        return _on_start()
    except Exception as exc:  # noqa: BLE001 - the guard's hot-path form
        _GUARD_SIGNALS.failed(exc)
    return None

class Scope:
    """What :func:`stage` and :func:`request` return: a context manager (sync and async) that
    yields the stage's :class:`~opentelemetry.trace.Span` (an invalid, no-op span when telemetry
    is off; a record taking the same calls in deferred mode), and a decorator that opens a fresh
    stage per call of a function, coroutine, generator or async generator.

    One scope object is entered once (the no-op one excepted).
    """

    __slots__ = ()

    name: str
    attributes: dict[str, Any]

    def _fresh(self) -> Scope:
        """A new scope for one decorated call, of the kind the current mode makes."""
        return _new_stage(self.name, self.attributes)

    # -- protocol used by the generator wrappers and handoff ---------------------------------------
    def _open(self, parent: otel_context.Context | None = None, start_ns: int | None = None,
              links: Sequence[Any] | None = None) -> Span:
        raise NotImplementedError

    def _attach(self) -> None:
        raise NotImplementedError

    def _detach(self) -> None:
        raise NotImplementedError

    def _close(self, exc: BaseException | None, end_ns: int | None = None) -> None:
        raise NotImplementedError

    def __enter__(self) -> Span:
        raise NotImplementedError

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Span:
        raise NotImplementedError

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)

    # -- decorator ------------------------------------------------------------------------------
    def __call__(self, fn: F) -> F:
        if inspect.isasyncgenfunction(fn):
            return wrap_async_generator(fn, self._fresh)  # type: ignore[return-value]
        if inspect.isgeneratorfunction(fn):
            return wrap_generator(fn, self._fresh)  # type: ignore[return-value]
        fresh = self._fresh
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with fresh():
                    return await fn(*args, **kwargs)
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with fresh():
                return fn(*args, **kwargs)
        return wrapper  # type: ignore[return-value]


def _exit_nothing(exc_type: type[BaseException] | None, exc: BaseException | None,
                  tb: TracebackType | None) -> None:
    """A no-op scope's ``__exit__``: nothing to end, the exception (if any) propagates."""


class _NoopScope(Scope):
    """Telemetry off: records nothing. One shared object per stage name (``_NOOPS``); stateless,
    so it can be entered by any number of threads and blocks at once."""

    __slots__ = ("attributes", "name")

    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self.name = name
        self.attributes = attributes

    # The cheapest pair measured (instructions per ``with`` block under callgrind, BENCHMARKS.md):
    # ``__enter__`` is a weak reference to INVALID_SPAN (a module-level singleton, never freed):
    # calling it returns the span (for ``as span``) without a Python frame; ``__exit__`` is a
    # plain function returning None (so the block's exception propagates unchanged), cheaper than
    # any C callable that takes three arguments (``"".format`` parses its format string).
    __enter__ = staticmethod(weakref.ref(INVALID_SPAN))  # type: ignore[assignment]
    __exit__ = staticmethod(_exit_nothing)

    async def __aenter__(self) -> Span:
        return INVALID_SPAN

    def _open(self, parent: otel_context.Context | None = None, start_ns: int | None = None,
              links: Sequence[Any] | None = None) -> Span:
        return INVALID_SPAN

    def _attach(self) -> None:
        pass

    def _detach(self) -> None:
        pass

    def _close(self, exc: BaseException | None, end_ns: int | None = None) -> None:
        pass


_NOOPS: dict[str, _NoopScope] = {}
_MAX_NOOPS = 1024  # distinct stage names kept; past that each call makes its own (names are few)


def _noop(name: str, attributes: dict[str, Any]) -> _NoopScope:
    if attributes:  # kept for a decorator that may run after telemetry is turned on
        return _NoopScope(name, attributes)
    scope = _NOOPS.get(name)
    if scope is None:
        scope = _NoopScope(name, attributes)
        if len(_NOOPS) < _MAX_NOOPS:
            _NOOPS[name] = scope
    return scope


class StageScope(Scope):
    """A live span around a block or a call: started on entry (parent: the current span) and made
    current, ended on exit. See :class:`Scope`.

    One class for stages and requests (:func:`request` sets ``_request``): the hot methods then
    see one type, so CPython's specialised attribute loads keep hitting (a subclass sharing them
    would miss on every request span).
    """

    __slots__ = ("_request", "_signals", "_span", "_start_ns", "_token", "attributes", "name")

    def __init__(self, name: str, attributes: dict[str, Any],
                 request: tuple[str | None, bool | None] | None = None) -> None:
        self.name = name
        self.attributes = attributes
        #: ``None`` for a stage; for a request span ``(request_id, cold_start)`` as given to
        #: :func:`request` (the start attributes then carry ``request.seq`` and the rest).
        self._request = request
        self._span: Span | None = None
        self._token: Token[otel_context.Context] | None = None
        self._start_ns = 0
        self._signals: _capture.State | None = None

    @property
    def request_id(self) -> str | None:
        """``request_id`` as given to :func:`request` (``None`` for a stage)."""
        return None if self._request is None else self._request[0]

    @property
    def cold_start(self) -> bool | None:
        """``cold_start`` as given to :func:`request` (``None``: from the request sequence)."""
        return None if self._request is None else self._request[1]

    def _fresh(self) -> Scope:
        if self._request is None:
            return _new_stage(self.name, self.attributes)
        return _new_request(self.name, self.attributes, None, self._request[1])

    # -- span lifecycle (generator wrappers, handoff, cuda_stage) ---------------------------------
    def _start_attributes(self) -> Mapping[str, Any]:
        """The span's start attributes, cleaned; a request's take the next sequence number."""
        request = self._request
        if request is None:
            attributes = self.attributes
            return clean_attributes(attributes) if attributes else attributes
        return _request_attributes(self.attributes, request)

    def _open(self, parent: otel_context.Context | None = None, start_ns: int | None = None,
              links: Sequence[Any] | None = None) -> Span:
        self._span = None
        if not RUNTIME.mode:  # scopes made directly (handoff, cuda_stage) follow the switch too
            return INVALID_SPAN
        with _GUARD_START:  # telemetry must not break inference
            attributes = self._start_attributes()  # before the clock starts
            if parent is None and RUNTIME.mode == DEFERRED:  # a live span in a deferred stage
                parent = _deferred_parent()
            if start_ns is None:
                clock = RUNTIME.clock
                start_ns = clock.monotonic_ns() + clock.offset_ns
            self._start_ns = start_ns
            self._signals = start_signals()
            self._span = span = RUNTIME.tracer.start_span(
                self.name, context=parent, attributes=attributes, links=links, start_time=start_ns)
            return span
        return INVALID_SPAN

    def _attach(self) -> None:
        if self._span is not None:
            self._token = _attach(_set_span_in_context(self._span, _get_current()))

    def _detach(self) -> None:
        token, self._token = self._token, None
        if token is not None:
            with _GUARD_DETACH:
                _detach(token)

    def _close(self, exc: BaseException | None, end_ns: int | None = None) -> None:
        span = self._span
        if span is None:
            return
        self._span = None
        with _GUARD_END:
            span.end(end_time=self._finish(span, exc, end_ns))

    def _finish(self, span: Span, exc: BaseException | None, end_ns: int | None = None) -> int:
        """Everything before ``span.end``: take the end time (now unless given), set the signals,
        run the stage-end hooks, record ``exc`` (unless it is generator control flow). Returns the
        end time (span-clock ns)."""
        if end_ns is None:
            clock = RUNTIME.clock
            end_ns = clock.monotonic_ns() + clock.offset_ns
        state = self._signals
        if state is not None:
            try:
                _on_finish(span, state, self._start_ns, end_ns)
            except Exception as error:  # noqa: BLE001 - the guard's hot-path form
                _GUARD_SIGNALS.failed(error)
        if RUNTIME.stage_end_hooks:
            run_end_hooks(span, self.name, self._start_ns, end_ns)
        if exc is not None and not isinstance(exc, _NOT_ERRORS):
            record_error(span, exc, end_ns)
        return end_ns

    # -- context manager: the hot path ----------------------------------------------------------
    # What the raw SDK does per span (start_span, attach, detach, end) plus the span clock, in one
    # Python frame each way. Measured (BENCHMARKS.md, instruction counts under callgrind) and cut:
    # the current context is read once and passed on (start_span, its sampler and
    # set_span_in_context would each read it again); the context is read, set and reset on the
    # OpenTelemetry API's own ContextVar (_api_context: Python frames less each way); the
    # span is put in the context as ``trace.set_span_in_context`` does; ``start_span`` and
    # ``end`` take positional arguments in the API's order (a keyword call misses CPython's
    # specialised call path); the clock's function is loaded as an attribute, not called as a
    # method (a slot holding a builtin misses the method-call specialisation). Failures go to the
    # guard through ``except`` (the guard's hot-path form: see otel_stages._runtime.guard).
    def __enter__(self, _frame: Any = None) -> Span:
        """Start the span and make it current; ``_frame``: the frame whose block this is (the
        caller's when not given; a generator's ``with`` does not make it current)."""
        frame = _getframe(1) if _frame is None else _frame
        try:
            request = self._request
            attributes: Mapping[str, Any]
            if request is None:
                attributes = self.attributes
                if attributes:
                    attributes = clean_attributes(attributes)  # before the clock starts
            else:
                attributes = _request_attributes(self.attributes, request)
            context = _get_current()
            clock = RUNTIME.clock
            monotonic_ns = clock.monotonic_ns
            self._start_ns = start_ns = monotonic_ns() + clock.offset_ns
            if _capture._enabled:  # issue 13's readings, right after the start time
                try:
                    self._signals = _on_start()
                except Exception as exc:  # noqa: BLE001 - the guard's hot-path form
                    self._signals = None
                    _GUARD_SIGNALS.failed(exc)
            else:
                self._signals = None
            self._span = span = RUNTIME.tracer.start_span(self.name, context, _INTERNAL, attributes,
                                                          None, start_ns)
            if not frame.f_code.co_flags & _GENERATOR_CODE or _driven_by_contextlib(frame):
                values = context.copy()  # trace.set_span_in_context(span, context), inlined
                values[_SPAN_KEY] = span  # as its set_value builds it
                self._token = _attach(_Context(values))
            return span
        except Exception as exc:  # noqa: BLE001 - the guard's hot-path form: telemetry must not break inference
            _GUARD_START.failed(exc)
        return INVALID_SPAN

    async def __aenter__(self) -> Span:
        return self.__enter__(_getframe(1))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Returns None: never swallows the caller's exception (and type checkers know it).
        span = self._span
        if span is None:
            return
        self._span = None
        try:
            try:
                clock = RUNTIME.clock
                monotonic_ns = clock.monotonic_ns
                end_ns = monotonic_ns() + clock.offset_ns
                state = self._signals
                if state is not None:
                    try:
                        _on_finish(span, state, self._start_ns, end_ns)
                    except Exception as error:  # noqa: BLE001 - the guard's hot-path form
                        _GUARD_SIGNALS.failed(error)
                if RUNTIME.stage_end_hooks:  # keyed by stage name: run_end_hooks picks this one's
                    run_end_hooks(span, self.name, self._start_ns, end_ns)
                if exc is not None and not isinstance(exc, _NOT_ERRORS):
                    record_error(span, exc, end_ns)
            finally:  # the context is restored whatever failed
                token = self._token
                if token is not None:
                    self._token = None
                    try:
                        _reset(token)
                    except Exception:  # noqa: BLE001 - the API's own handling: logs, goes on
                        _api_detach(token)
            span.end(end_ns)
        except Exception as error:  # noqa: BLE001 - the guard's hot-path form
            _GUARD_END.failed(error)


def _request_attributes(attributes: dict[str, Any],
                        request: tuple[str | None, bool | None]) -> dict[str, Any]:
    """A live request span's start attributes, cleaned, with the next sequence number
    (:func:`otel_stages.sequence.request_attributes`, inlined: a request is a sixth of the spans
    of a typical request)."""
    seq, cold = next_request()
    request_id, cold_start = request
    if cold_start is not None:
        cold = cold_start
    if attributes:
        attrs = dict(clean_attributes(attributes))
        attrs[_REQUEST_SEQ] = seq
        attrs[_REQUEST_COLD_START] = cold
    else:
        attrs = {_REQUEST_SEQ: seq, _REQUEST_COLD_START: cold}
    if request_id is not None:
        attrs[semconv.REQUEST_ID] = clean_value(request_id, key=semconv.REQUEST_ID)
    return attrs


def _deferred_parent() -> otel_context.Context | None:
    """The current context with the innermost deferred stage's span in it (started now if need
    be: otel_stages.builder.SpanBuilder.start_now), or ``None`` when no deferred stage is open."""
    current = _get_current()
    record = current.get(RECORD_KEY)  # Context is a dict
    builder = RUNTIME.deferred
    if record is None or builder is None:
        return None
    return trace.set_span_in_context(builder.start_now(record), current)


def run_end_hooks(span: Any, name: str, start_ns: int, end_ns: int) -> None:
    """Run the stage-end hooks registered for ``name`` (each behind its own guard: one bad hook
    must not skip the others)."""
    table = RUNTIME.stage_end_hooks
    if not table:
        return
    hooks = table.get(name) or table.get(None)
    if hooks:
        for hook, hook_guard in hooks:
            with hook_guard:
                hook(span, name, start_ns, end_ns)


# Deferred mode's scope classes. otel_stages.deferred builds on this module and registers them
# when imported (the package imports it; a SpanBuilder, the way into deferred mode, needs it).
def register_deferred(stage_class: Any, request_class: Any) -> None:
    """Called by :mod:`otel_stages.deferred` with its scope classes."""
    global DeferredScope, DeferredRequest
    DeferredScope, DeferredRequest = stage_class, request_class


DeferredScope: Any = None
DeferredRequest: Any = None


def _new_stage(name: str, attributes: dict[str, Any]) -> Scope:
    mode = RUNTIME.mode
    if mode == LIVE:
        return StageScope(name, attributes)
    if mode == DEFERRED:
        return DeferredScope(name, attributes)  # type: ignore[no-any-return]
    return _noop(name, attributes)


def _new_request(name: str, attributes: dict[str, Any], request_id: str | None,
                 cold_start: bool | None) -> Scope:
    mode = RUNTIME.mode
    if mode == LIVE:
        return StageScope(name, attributes, (request_id, cold_start))
    if mode == DEFERRED:
        return DeferredRequest(name, attributes, request_id, cold_start)  # type: ignore[no-any-return]
    if request_id is None and cold_start is None:
        return _noop(name, attributes)
    return _NoopRequest(name, attributes, request_id, cold_start)


class _NoopRequest(_NoopScope):
    """A no-op request scope that keeps ``request_id`` / ``cold_start`` for its decorator."""

    __slots__ = ("cold_start", "request_id")

    def __init__(self, name: str, attributes: dict[str, Any], request_id: str | None,
                 cold_start: bool | None) -> None:
        super().__init__(name, attributes)
        self.request_id = request_id
        self.cold_start = cold_start

    def _fresh(self) -> Scope:
        return _new_request(self.name, self.attributes, None, self.cold_start)


def stage(name: str, /, **attributes: Any) -> Scope:
    """Open a span named ``name`` (``download``, ``decode``, ``resize``, ``queue``, ``forward``
    or a custom stage) as a child of the current span.

    ``attributes`` are set at start (keys with dots can be passed as ``**{"image.size": n}``).
    Use ``with stage("decode") as span:`` or ``@stage("forward")`` on a function, coroutine,
    generator or async generator. Exceptions propagate unchanged after being recorded.
    """
    mode = RUNTIME.mode
    if not mode:  # off: the shared no-op of this name, nothing else (cf. _noop)
        if not attributes:
            try:
                return _NOOPS[name]
            except KeyError:
                pass
        return _noop(name, attributes)
    if mode == LIVE:  # StageScope(name, attributes) without the __init__ frame: same fields
        scope = _new_object(StageScope)
        scope.name = name
        scope.attributes = attributes
        scope._request = None
        scope._span = None
        scope._token = None
        return scope
    record = _new_object(DeferredScope)  # DeferredScope(name, attributes), as above
    record.name = name
    record.attributes = attributes
    return record  # type: ignore[no-any-return]


_new_object = object.__new__


def request(name: str = semconv.SPAN_REQUEST, /, *, request_id: str | None = None,
            cold_start: bool | None = None, **attributes: Any) -> Scope:
    """Open the request span: the parent of the stage spans of one inference request.

    It is a child of the current span when there is one (e.g. an HTTP server span). Sets
    ``request.seq`` (1-based, per process), ``request.cold_start`` (``True`` for the first
    request of the process or after :func:`mark_cold_start`, unless ``cold_start`` is given) and
    ``request.id`` when ``request_id`` is given (the trace id already identifies the request
    otherwise). Works as context manager and decorator.
    """
    mode = RUNTIME.mode
    if not mode and not attributes and request_id is None and cold_start is None:
        try:
            return _NOOPS[name]  # off: the shared no-op, as in stage()
        except KeyError:
            pass
    if mode == LIVE:  # StageScope(name, attributes, (request_id, cold_start)) without __init__
        scope = _new_object(StageScope)
        scope.name = name
        scope.attributes = attributes
        scope._request = (request_id, cold_start)
        scope._span = None
        scope._token = None
        return scope
    return _new_request(name, attributes, request_id, cold_start)


def record_error(span: Span, exc: BaseException, timestamp_ns: int | None = None) -> None:
    """Record ``exc`` on ``span`` the standard way: exception event, status ERROR, ``error.type``.

    The message in the status and the event, and the event's stack trace, are capped
    (:mod:`otel_stages.attributes`). ``timestamp_ns``: the event's time (span-clock ns; the
    stages pass their end time), else the SDK's wall clock now."""
    span.record_exception(exc, attributes=exception_attributes(exc), timestamp=timestamp_ns)
    span.set_status(Status(StatusCode.ERROR, status_message(exc)))
    span.set_attribute(semconv.ERROR_TYPE, type(exc).__qualname__)
