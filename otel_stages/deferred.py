"""Deferred span mode: the request thread records timestamps and attributes; spans come later.

``configure(span_mode="deferred")`` (``OTEL_STAGES_SPAN_MODE=deferred``) makes :func:`stage` and
:func:`request` return a :class:`DeferredScope`: entering it takes the start time and notes the
parent, leaving it takes the end time and queues the record; a
:class:`~otel_stages.builder.SpanBuilder` thread turns queued records into the same spans live
mode makes (same names, parents, attributes, events, links, status and times, through the
OpenTelemetry API with explicit start and end times) a fraction of a second later. The request
thread pays a few attribute stores instead of span creation (``benchmarks/overhead.py``).

What it gives up, and when to use it:

* **Other libraries' spans cannot nest under a deferred stage.** A deferred stage has no span (no
  span id) while it runs, so it is never OpenTelemetry's *current span*: an HTTP client, database
  or framework span started inside it becomes a child of the live span around the request (e.g.
  the HTTP server span), not of the stage; ``trace.get_current_span()`` inside a stage returns
  that outer span; and trace context injected into outgoing calls (``traceparent``) names the
  outer span. Deferred stages nest under each other and under the live span current when the
  outermost one started; a deferred stage inside another library's live span that is itself
  inside a deferred stage becomes a child of the deferred one.
* ``span.get_span_context()`` on what ``with stage() as span`` yields is invalid (the ids do not
  exist yet); ``set_attribute(s)``, ``add_event``, ``add_link``, ``set_status``,
  ``record_exception``, ``update_name`` and ``is_recording`` work as on a live span and are
  replayed on it, in order. Events without a timestamp get the span clock's time of the call.
* Spans reach processors and exporters later (the builder runs every
  :data:`~otel_stages.builder.BUILD_INTERVAL_S` s, sooner when many records wait); samplers see
  the same start attributes as in live mode. The per-stage signals (:mod:`otel_stages.signals`)
  are read on the request thread when the stage ends (thread CPU time is per thread) and set on
  the span when it is built, so they equal live mode's. Records waiting to be built hold their attribute
  values (pass values, not objects you change afterwards); an exception is formatted when its
  stage ends, as in live mode.
* ``gpu.cuda_stage`` makes a live span (its GPU-time resolution needs the span); inside a
  deferred stage, that stage's span (and its parents') is started there and then, on the request
  thread, so the live span has its parent (:meth:`SpanBuilder.start_now`).

Use it when span creation on the request thread is a measurable share of the request (many
short stages, a CPU-bound service, tight latency budgets) and the stages are leaves or contain
only other otel_stages stages. Keep ``live`` when you need other instrumentation's spans inside
your stages or the stage's trace context in outgoing calls.

Spans still open at shutdown are ended as ``otel_stages.interrupted=true`` as in live mode;
records the builder cannot take (its queue full, or after shutdown) are counted as dropped spans.
OpenTelemetry API only.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Mapping, Sequence
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN_CONTEXT, Link, Span, SpanContext, Status, StatusCode
from opentelemetry.util import types

from otel_stages import semconv
from otel_stages._runtime import RECORD_KEY, RUNTIME, guard
from otel_stages.attributes import exception_attributes, status_message
from otel_stages.frames import _GENERATOR_CODE, _driven_by_contextlib
from otel_stages.sequence import next_request, request_attributes
from otel_stages.signals import capture as _capture
from otel_stages.stages import (
    _NOT_ERRORS,
    Scope,
    _new_request,
    register_deferred,
    run_end_hooks,
    start_signals,
)

if TYPE_CHECKING:
    from otel_stages.builder import SpanBuilder


_GUARD_START = guard("deferred stage start")
_GUARD_END = guard("deferred stage end")
_GUARD_DETACH = guard("context detach")
_GUARD_SIGNALS = guard("stage signals")
_on_start = _capture.on_start
_finish_fields = _capture.finish_fields
_cpu_only_ns = _capture.cpu_only_ns
_cpu_fields = _capture.cpu_fields
_get_current = otel_context.get_current
_attach = otel_context.attach
_detach = otel_context.detach
_set_value = otel_context.set_value

# Replayed calls (DeferredScope._ops entries start with one of these). OP_SIGNALS: the stage's
# signal attributes and events (otel_stages.signals.finish_fields, read on the request thread when
# the stage ended), set as otel_stages.signals.on_finish sets them on a live span; OP_CPU: the same
# when thread CPU time was all there was (capture.cpu_only_ns: the fields are made when built).
OP_ATTRIBUTE, OP_EVENT, OP_STATUS, OP_LINK, OP_NAME, OP_SIGNALS, OP_CPU = range(7)


def exception_event(exc: BaseException) -> dict[str, Any]:
    """The attributes the SDK's ``record_exception`` gives the event that
    :func:`otel_stages.record_error` records (type, capped message and stack trace, escaped)."""
    kind = type(exc)
    module, qualname = kind.__module__, kind.__qualname__
    event = {semconv.EXCEPTION_TYPE: f"{module}.{qualname}" if module and module != "builtins" else qualname}
    event.update(exception_attributes(exc))
    event[semconv.EXCEPTION_ESCAPED] = "False"
    return event


class DeferredScope(Scope, Span):
    """One deferred stage: a context manager and decorator like :class:`otel_stages.stages.StageScope`
    that is also the :class:`~opentelemetry.trace.Span` its block sees (module docstring).

    Fields the builder reads once the record is queued: ``name``, ``attributes`` (start
    attributes, cleaned when built), ``start_ns`` / ``end_ns`` (span-clock ns), ``parent`` (the
    enclosing deferred record) or ``parent_context`` (the OpenTelemetry context to parent on),
    ``links`` (``Link`` objects or records, resolved when built), the call log, ``interrupted``.
    Fields a record rarely sets are class attributes until it does (``opentelemetry.trace.Span``
    has no ``__slots__``, so records have an instance dict anyway): a new record sets two.
    """

    parent: DeferredScope | None = None
    parent_context: otel_context.Context | None = None
    links: Sequence[Any] | None = None
    builder: SpanBuilder | None = None
    start_ns = 0
    end_ns: int | None = None  #: set when it ended (by its stage or by shutdown)
    span: Span | None = None  #: the built span (the builder's)
    interrupted = False
    _ops: list[tuple[Any, ...]] | None = None
    _token: Token[otel_context.Context] | None = None
    #: :func:`otel_stages.signals.on_start` readings (``None``: signals off)
    _signals: _capture.State | None = None
    #: A request takes its sequence number on entry (DeferredRequest).
    _is_request = False

    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self.name = name
        self.attributes = attributes

    def start_attributes(self) -> Mapping[str, Any]:
        """The attributes the span starts with (what a sampler sees), not yet cleaned."""
        return self.attributes

    # -- recording: the hot path ----------------------------------------------------------------
    # Failures go to the guard through ``except`` (its hot-path form: otel_stages._runtime.guard).
    def _enter_at(self, frame: Any) -> Span:
        """Record the start; ``frame`` is the caller's (a generator's ``with`` does not attach)."""
        try:
            if self._is_request:
                self._take_sequence()
            context = _get_current()
            record = context.get(RECORD_KEY)  # Context is a dict
            if record is None:
                self.parent_context = context
            else:
                self.parent = record  # type: ignore[assignment]  # only records are stored there
            builder = self.builder = RUNTIME.deferred
            if builder is not None:
                builder.open[self] = True  # ended as interrupted if still here at shutdown
            if not frame.f_code.co_flags & _GENERATOR_CODE or _driven_by_contextlib(frame):
                self._token = _attach(_set_value(RECORD_KEY, self, context))
            clock = RUNTIME.clock
            self.start_ns = clock.monotonic_ns() + clock.offset_ns  # last: times the block only
            if _capture._enabled:  # issue 13's readings, right after the start time
                try:
                    self._signals = _on_start()
                except Exception as exc:  # noqa: BLE001 - the guard's hot-path form
                    _GUARD_SIGNALS.failed(exc)
        except Exception as exc:  # noqa: BLE001 - the guard's hot-path form
            self._abandon()
            _GUARD_START.failed(exc)
        return self

    def __enter__(self) -> Span:
        return self._enter_at(sys._getframe(1))

    async def __aenter__(self) -> Span:
        return self._enter_at(sys._getframe(1))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is not None or RUNTIME.stage_end_hooks or self.end_ns is not None:
                self._close(exc)  # the general path
                return
            try:
                clock = RUNTIME.clock
                end_ns = clock.monotonic_ns() + clock.offset_ns  # first: times the block only
                state = self._signals
                if state is not None:
                    self._signal_fields(state, end_ns)
            finally:  # the context is restored whatever failed
                token = self._token
                if token is not None:
                    self._token = None
                    _detach(token)
            builder = self.builder
            if builder is not None and builder.open.pop(self, None) is not None:
                self.end_ns = end_ns  # shutdown did not end it first
                queue = builder.queue
                if len(queue) < builder.wake_at and not builder.stopped:
                    queue.append(self)  # SpanBuilder.submit's common case
                else:
                    builder.submit(self)
        except Exception as error:  # noqa: BLE001 - the guard's hot-path form
            _GUARD_END.failed(error)

    def _take_sequence(self) -> None:
        raise NotImplementedError  # DeferredRequest

    def _abandon(self) -> None:
        """A failed start: restore the context, forget the record, make its end a no-op."""
        self.end_ns = 0
        token = self._token
        if token is not None:
            self._token = None
            _detach(token)
        builder = self.builder
        if builder is not None:
            builder.open.pop(self, None)

    def _signal_fields(self, state: _capture.State, end_ns: int) -> None:
        """Read the stage's signals now, on its own thread (thread CPU time is per thread), and
        log them for the builder: what :func:`otel_stages.signals.on_finish` sets on a live span
        (the attributes made when built when CPU time is all there is)."""
        try:
            cpu_ns = _cpu_only_ns(state)
            op: tuple[Any, ...] = ((OP_CPU, cpu_ns, end_ns) if cpu_ns is not None
                                   else (OP_SIGNALS, _finish_fields(state, self.start_ns, end_ns)))
        except Exception as exc:  # noqa: BLE001 - the guard's hot-path form
            _GUARD_SIGNALS.failed(exc)
            return
        ops = self._ops
        if ops is None:
            self._ops = [op]
        else:
            ops.append(op)

    # -- the general path (generator wrappers, handoff, errors, hooks) --------------------
    def _open(self, parent: otel_context.Context | None = None, start_ns: int | None = None,
              links: Sequence[Any] | None = None) -> Span:
        with _GUARD_START:
            if self._is_request:
                self._take_sequence()
            context = _get_current() if parent is None else parent
            record = context.get(RECORD_KEY)  # Context is a dict
            if record is None:
                self.parent_context = context
            else:
                self.parent = record  # type: ignore[assignment]  # only records are stored there
            if links:
                self.links = links
            builder = self.builder = RUNTIME.deferred
            if builder is not None:
                builder.open[self] = True  # ended as interrupted if still here at shutdown
            if start_ns is None:
                clock = RUNTIME.clock
                start_ns = clock.monotonic_ns() + clock.offset_ns
            self.start_ns = start_ns
            self._signals = start_signals()
        return self

    def _attach(self) -> None:
        self._token = _attach(_set_value(RECORD_KEY, self))

    def _detach(self) -> None:
        token, self._token = self._token, None
        if token is not None:
            with _GUARD_DETACH:
                _detach(token)

    def _close(self, exc: BaseException | None, end_ns: int | None = None) -> None:
        with _GUARD_END:
            try:
                if self.end_ns is not None:  # ended already: end(), or interrupted at shutdown
                    return
                if end_ns is None:
                    clock = RUNTIME.clock
                    end_ns = clock.monotonic_ns() + clock.offset_ns
                state = self._signals
                if state is not None:
                    self._signal_fields(state, end_ns)
                if RUNTIME.stage_end_hooks:
                    run_end_hooks(self, self.name, self.start_ns, end_ns)
                if exc is not None and not isinstance(exc, _NOT_ERRORS):
                    self._record_error(exc, end_ns)
            finally:  # the context is restored whatever failed
                token = self._token
                if token is not None:
                    self._token = None
                    _detach(token)
            builder = self.builder
            if builder is not None and builder.open.pop(self, None) is not None:
                self.end_ns = end_ns  # shutdown did not end it first
                builder.submit(self)

    def _record_error(self, exc: BaseException, end_ns: int) -> None:
        """What :func:`otel_stages.record_error` does on a live span, as calls to replay."""
        ops = self._ops
        if ops is None:
            ops = self._ops = []
        ops.append((OP_EVENT, "exception", exception_event(exc), end_ns))
        ops.append((OP_STATUS, Status(StatusCode.ERROR, status_message(exc)), None))
        ops.append((OP_ATTRIBUTE, semconv.ERROR_TYPE, type(exc).__qualname__))

    # -- opentelemetry.trace.Span: calls recorded for the builder to replay -----------------------
    def _log(self, op: tuple[Any, ...]) -> None:
        ops = self._ops
        if ops is None:
            self._ops = [op]
        else:
            ops.append(op)

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        self._log((OP_ATTRIBUTE, key, value))

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        for key, value in attributes.items():
            self._log((OP_ATTRIBUTE, key, value))

    def add_event(self, name: str, attributes: types.Attributes = None,
                  timestamp: int | None = None) -> None:
        if timestamp is None:
            timestamp = RUNTIME.clock.now_ns()
        self._log((OP_EVENT, name, attributes, timestamp))

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        self._log((OP_LINK, context, attributes))

    def update_name(self, name: str) -> None:
        self._log((OP_NAME, name))

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self._log((OP_STATUS, status, description))

    def record_exception(self, exception: BaseException, attributes: types.Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        """As the SDK's ``Span.record_exception`` (stack trace formatted now, uncapped)."""
        kind = type(exception)
        module, qualname = kind.__module__, kind.__qualname__
        event: dict[str, Any] = {
            semconv.EXCEPTION_TYPE: f"{module}.{qualname}" if module and module != "builtins" else qualname,
            semconv.EXCEPTION_MESSAGE: str(exception),
            semconv.EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exception)),
            semconv.EXCEPTION_ESCAPED: str(escaped),
        }
        if attributes:
            event.update(attributes)
        self.add_event("exception", event, timestamp)

    def is_recording(self) -> bool:
        return self.end_ns is None

    def get_span_context(self) -> SpanContext:
        """Invalid: the span and its ids are made later (module docstring)."""
        return INVALID_SPAN_CONTEXT

    def end(self, end_time: int | None = None) -> None:
        """End the stage now (or at ``end_time``), as ``span.end()`` does on a live span."""
        self._close(None, end_time)

    def replay(self, span: Span) -> None:
        """Apply the recorded calls to ``span`` (the builder, before ending it), in call order."""
        for op in self._ops or ():
            kind = op[0]
            if kind == OP_ATTRIBUTE:
                span.set_attribute(op[1], op[2])
            elif kind == OP_EVENT:
                span.add_event(op[1], op[2], timestamp=op[3])
            elif kind == OP_STATUS:
                span.set_status(op[1], op[2])
            elif kind == OP_CPU:  # as otel_stages.signals.on_finish does
                span.set_attributes(_cpu_fields(op[1], self.start_ns, op[2])[0])
            elif kind == OP_SIGNALS:
                attributes, events = op[1]
                span.set_attributes(attributes)
                for name, event_attributes, time_ns in events:
                    span.add_event(name, event_attributes, timestamp=time_ns)
            elif kind == OP_LINK:
                span.add_link(op[1], op[2])
            else:
                span.update_name(op[1])


class DeferredRequest(DeferredScope):
    """The deferred request scope: takes ``request.seq`` / ``request.cold_start`` when entered."""

    _is_request = True
    sequence = (0, False)

    def __init__(self, name: str, attributes: dict[str, Any], request_id: str | None = None,
                 cold_start: bool | None = None) -> None:
        self.name = name
        self.attributes = attributes
        self.request_id = request_id
        self.cold_start = cold_start

    def _take_sequence(self) -> None:
        self.sequence = next_request()  # the order requests start in, as in live mode

    def start_attributes(self) -> Mapping[str, Any]:
        return request_attributes(self.attributes, self.request_id, self.cold_start, self.sequence)

    def _fresh(self) -> Scope:
        return _new_request(self.name, self.attributes, None, self.cold_start)


register_deferred(DeferredScope, DeferredRequest)


def recorded(name: str, attributes: dict[str, Any], parent: otel_context.Context, start_ns: int,
             end_ns: int, links: Sequence[Any] | None = None) -> None:
    """Queue a span for work that is already over (a queue wait): child of ``parent``'s record or
    span, from ``start_ns`` to ``end_ns`` (span-clock ns). No hooks or signals run (the work did not
    run here). A no-op outside deferred mode."""
    builder = RUNTIME.deferred
    if builder is None:
        return
    record = DeferredScope(name, attributes)
    found = parent.get(RECORD_KEY)
    if found is None:
        record.parent_context = parent
    else:
        record.parent = found  # type: ignore[assignment]  # only records are stored there
    record.links = links
    record.start_ns, record.end_ns = start_ns, end_ns
    builder.submit(record)


def resolve_link(target: Any, start: Any) -> Link:
    """A ``Link`` for ``target``: a ``Link`` as is, a record through ``start(record)`` (its span,
    started if need be)."""
    if isinstance(target, DeferredScope):
        return Link(start(target).get_span_context())
    return target  # type: ignore[no-any-return]


def parent_context_of(record: DeferredScope, start: Any) -> otel_context.Context:
    """The context ``record``'s span starts in: its parent record's span (started through
    ``start``) or the OpenTelemetry context current when it was opened."""
    if record.parent is not None:
        return trace.set_span_in_context(start(record.parent))
    return record.parent_context if record.parent_context is not None else otel_context.Context()
