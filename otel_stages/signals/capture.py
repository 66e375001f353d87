"""Per-stage capture: thread CPU time, GC pauses and event-loop lag of one stage span.

The stage hot path makes two calls, both on the thread that runs the stage::

    state = on_start()                          # right after the stage's start time is read
    ...                                         # the user's work
    on_finish(span, state, start_ns, end_ns)    # in the finish step, before span.end()

(:func:`finish_fields` returns the attributes and events instead, for a span that is only created
when the stage ends; deferred span mode first asks :func:`cpu_only_ns`, which reads only the CPU
clock when that is all there is to report, and leaves :func:`cpu_fields` to the span builder.)
``start_ns`` / ``end_ns`` are the span's own times (span clock).

What it costs when nothing happens: a ``time.thread_time_ns()`` at each end (a system call:
CLOCK_THREAD_CPUTIME_ID has no vDSO fast path), a C call that returns the thread's running asyncio
loop (``None`` off a loop), one integer compare for GC, and two ``set_attribute`` calls (one per
value: the SDK's ``set_attributes`` re-validates its mapping and costs more). GC collections
(:mod:`~otel_stages.signals.gcwatch`) and loop lag (:mod:`~otel_stages.signals.loop`) add work only
to stages during which they happened.
``benchmarks/overhead.py`` measures it (rows ``live`` against ``live_no_signals``; the opt-in
run-queue wait, two ``/proc/thread-self/schedstat`` reads more, as ``live_run_queue``).

Attributes written (``otel_stages.semconv``): ``thread.cpu_time_ms`` and
``thread.cpu_utilization`` (left out when the stage ended on another thread than it started:
then the two readings are of different clocks; and on an event loop that turned during the
stage (:attr:`LoopMonitor.turns <otel_stages.signals.loop.LoopMonitor.turns>`): it awaited, and
the thread's CPU time then includes other tasks' work);
``otel_stages.thread.run_queue_wait_ms`` with them when ``configure(run_queue=True)``
(:mod:`~otel_stages.signals.runqueue`; left out likewise, and when the two readings are of
different threads' files); ``otel_stages.gc.pause_ms`` and
``otel_stages.gc.collections`` when collections ran (one whose stop callback has not run when the
stage ends counts up to the stage's end if it has collected already, else not at all), with one
``cpython.gc.pause`` event per collection of at least :data:`GC_EVENT_MIN_MS` (at most
:data:`MAX_GC_EVENTS`; ``otel_stages.gc.in_progress`` on the first kind); on the loop's
thread ``otel_stages.event_loop.lag_ms`` / ``otel_stages.event_loop.held_ms`` (see
:mod:`~otel_stages.signals.loop`; a lag of 0 is written only on a stage whose CPU time is left out
for having yielded: the analysis reads a missing lag as 0 only on a span with CPU time).
"""

from __future__ import annotations

from asyncio import _get_running_loop
from time import thread_time_ns
from typing import Any

from otel_stages import semconv
from otel_stages._runtime import RUNTIME
from otel_stages.signals.gcwatch import GC_LOG, finished
from otel_stages.signals.loop import HOLD_MIN_NS, LoopMonitor, monitor_for
from otel_stages.signals.runqueue import read as _read_run_queue

#: Collections at least this long become a ``cpython.gc.pause`` span event; shorter ones (most
#: gen-0 collections take tens of µs) are only summed into ``otel_stages.gc.pause_ms``.
GC_EVENT_MIN_MS = 1.0
_GC_EVENT_MIN_NS = int(GC_EVENT_MIN_MS * 1e6)
#: At most this many ``cpython.gc.pause`` events per span (the sum attribute counts them all).
MAX_GC_EVENTS = 16
#: Thread CPU time may exceed the span's duration by this much (the two clocks are read a few
#: µs apart); more means the stage ended on another thread, and the CPU time is left out.
_CPU_SLACK_NS = 1_000_000

#: What :func:`on_start` returns: ``(gc seq, loop monitor or None, its turns, its lag ns,
#: thread CPU ns, run-queue reading or None)``; ``None`` when signals are off.
State = tuple[int, "LoopMonitor | None", int, int, int, "tuple[int, int] | None"]
#: ``(name, attributes, time_ns)`` of one span event
Event = tuple[str, dict[str, Any], int]

_enabled = True
#: Per-thread run-queue wait (:mod:`~otel_stages.signals.runqueue`): opt-in, two reads a stage.
_run_queue = False


def enable_run_queue(on: bool = True) -> None:
    """Turn the run-queue wait attribute on (``configure(run_queue=True)``) or off (default)."""
    global _run_queue
    _run_queue = on


def enable(on: bool = True) -> None:
    """Turn per-stage signals on (``configure(signals=True)``, the default) or off."""
    global _enabled
    _enabled = on


def is_enabled() -> bool:
    """Whether stages record signals."""
    return _enabled


def on_start() -> State | None:
    """Readings at stage start; pass the result to :func:`on_finish`. ``None`` when off."""
    if not _enabled:
        return None
    loop = _get_running_loop()
    queued = _read_run_queue() if _run_queue else None
    if loop is None:
        return (GC_LOG.seq, None, 0, 0, thread_time_ns(), queued)
    monitor = monitor_for(loop)
    return (GC_LOG.seq, monitor, monitor.turns, monitor.lag_base_ns(RUNTIME.clock.now_ns()),
            thread_time_ns(), queued)


def finish_fields(state: State | None, start_ns: int,
                  end_ns: int) -> tuple[dict[str, Any], list[Event]] | None:
    """The attributes and span events for a stage that ran from ``start_ns`` to ``end_ns``
    (span-clock ns) given its :func:`on_start` ``state``; ``None`` when signals were off."""
    if state is None:
        return None
    # run-queue first: a system call's return is where the scheduler preempts, and a wait after
    # thread_time_ns() returned would be counted though it came after the stage's end
    queued = None if state[5] is None else _read_run_queue()
    cpu_ns = thread_time_ns() - state[4]
    wall_ns = end_ns - start_ns
    attributes: dict[str, Any] = {}
    monitor = state[1]
    # On an event loop that turned meanwhile the stage awaited, and the loop's thread ran other
    # tasks' work too: its CPU time is not the stage's own, so it is left out.
    shared = monitor is not None and monitor.turns != state[2]
    if 0 <= cpu_ns <= wall_ns + _CPU_SLACK_NS and not shared:
        attributes[semconv.THREAD_CPU_TIME_MS] = cpu_ns / 1e6
        attributes[semconv.THREAD_CPU_UTILIZATION] = min(1.0, cpu_ns / wall_ns) if wall_ns > 0 else 1.0
        if state[5] is not None and queued is not None:
            _run_queue_field(state[5], queued, wall_ns, attributes)
    events: list[Event] = []  # (cpu_fields must stay what this gives when only the CPU counts)
    if GC_LOG.seq != state[0]:
        _gc_fields(state[0], start_ns, end_ns, attributes, events)
    if monitor is not None:
        held = monitor.turns == state[2] and wall_ns >= HOLD_MIN_NS
        # lag counted plus the pending tick's lateness so far, at the end minus at the start:
        # the lateness inside the stage's own window, whether or not the tick ran before it ended;
        # a stage that held the loop made that lateness itself, so only what the ticks counted
        end_base = monitor.lag_ns if held else monitor.lag_base_ns(end_ns)
        lag_ns = min(end_base - state[3], wall_ns)
        if lag_ns > 0:
            attributes[semconv.EVENT_LOOP_LAG_MS] = lag_ns / 1e6
        elif shared:  # no CPU time to show that signals were on: a lag of 0 is known, not absent
            attributes[semconv.EVENT_LOOP_LAG_MS] = 0.0
        if held:
            attributes[semconv.EVENT_LOOP_HELD_MS] = wall_ns / 1e6
    return attributes, events


def cpu_only_ns(state: State) -> int | None:
    """The thread CPU time since :func:`on_start` (ns, read now), when that is all
    :func:`finish_fields` would report now: no collection started since and not on an event loop.
    ``None`` otherwise: call :func:`finish_fields`. Then ``cpu_fields(cpu_ns, start_ns, end_ns)``,
    later and on any thread, equals ``finish_fields(state, start_ns, end_ns)`` now."""
    if GC_LOG.seq != state[0] or state[1] is not None or state[5] is not None:
        return None
    return thread_time_ns() - state[4]


def cpu_fields(cpu_ns: int, start_ns: int, end_ns: int) -> tuple[dict[str, Any], list[Event]]:
    """What :func:`finish_fields` returns for a stage with ``cpu_ns`` of thread CPU time (from
    :func:`cpu_only_ns`) and nothing else to report."""
    wall_ns = end_ns - start_ns
    attributes: dict[str, Any] = {}
    if 0 <= cpu_ns <= wall_ns + _CPU_SLACK_NS:
        attributes[semconv.THREAD_CPU_TIME_MS] = cpu_ns / 1e6
        attributes[semconv.THREAD_CPU_UTILIZATION] = min(1.0, cpu_ns / wall_ns) if wall_ns > 0 else 1.0
    return attributes, []


def _run_queue_field(start: tuple[int, int], now: tuple[int, int], wall_ns: int,
                     attributes: dict[str, Any]) -> None:
    """``otel_stages.thread.run_queue_wait_ms`` from the readings at start and end, when both
    are of the same thread's file (same fd) and the wait fits in the stage."""
    if now[0] != start[0]:
        return
    waited_ns = now[1] - start[1]
    if 0 <= waited_ns <= wall_ns + _CPU_SLACK_NS:
        attributes[semconv.THREAD_RUN_QUEUE_WAIT_MS] = waited_ns / 1e6


def _gc_fields(seq: int, start_ns: int, end_ns: int, attributes: dict[str, Any],
               events: list[Event]) -> None:
    pauses = GC_LOG.since(seq)
    total_ns = 0
    for pause in pauses:
        gc_start, gc_end, generation, _ = pause
        open_end = gc_end < 0  # the collector was switched out in a callback
        if open_end and not finished(pause):
            continue  # ... before collecting: this stage ran meanwhile, it was not paused
        if open_end:  # ... after collecting: it held this stage up to some time before its end
            gc_end = end_ns
        overlap = min(gc_end, end_ns) - max(gc_start, start_ns)
        if overlap > 0:
            total_ns += overlap
        if gc_end - gc_start >= _GC_EVENT_MIN_NS and len(events) < MAX_GC_EVENTS:
            event = {semconv.CPYTHON_GC_GENERATION: generation,
                     semconv.GC_DURATION_MS: (gc_end - gc_start) / 1e6}
            if open_end:
                event[semconv.GC_IN_PROGRESS] = True
            events.append((semconv.EVENT_GC_PAUSE, event, gc_start))
    attributes[semconv.GC_PAUSE_MS] = total_ns / 1e6
    attributes[semconv.GC_COLLECTIONS] = len(pauses)


def on_finish(span: Any, state: State | None, start_ns: int, end_ns: int) -> None:
    """Set what :func:`finish_fields` gives on ``span`` (an OpenTelemetry API span, still
    recording). Call before ``span.end()``."""
    fields = finish_fields(state, start_ns, end_ns)
    if fields is None:
        return
    attributes, events = fields
    set_attribute = span.set_attribute  # per key: the SDK's set_attributes(mapping) costs more
    for key, value in attributes.items():  # than the calls it saves (it re-validates the mapping)
        set_attribute(key, value)
    for name, event_attributes, time_ns in events:
        span.add_event(name, event_attributes, timestamp=time_ns)
