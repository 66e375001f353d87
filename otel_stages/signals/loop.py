"""Asyncio event-loop lag and holds, attributed to the stage spans that ran on the loop's thread.

A :class:`LoopMonitor` watches one loop in two ways:

* a timer: every :data:`INTERVAL_S` it runs, notes how late it ran (the *lag*: the loop was busy
  with something else when the timer was due) and schedules itself again. One timer callback per
  interval (about 50 a second, a few µs each).
* the loop's turns (:attr:`LoopMonitor.turns`): on CPython's selector event loops (the default
  on Linux and macOS) every iteration of the loop, ``BaseEventLoop._run_once`` in
  Lib/asyncio/base_events.py, calls ``self._selector.select(timeout)`` exactly once, then runs
  the callbacks that were ready *before* that call; a callback scheduled while they run runs
  only in a later iteration, "after another I/O poll" as the source says. A suspended task is
  resumed by such a callback: the done-callback of the future it awaits, which the future
  schedules with ``call_soon`` (``Future.__schedule_callbacks``, Lib/asyncio/futures.py), or,
  after a bare yield (``await asyncio.sleep(0)``), ``Task.__step`` rescheduled with ``call_soon``
  (Lib/asyncio/tasks.py). The monitor shadows the ``select`` method of the loop's
  ``_selector`` (set in ``BaseSelectorEventLoop.__init__``, Lib/asyncio/selector_events.py)
  with a function that adds one to :attr:`~LoopMonitor.turns` and calls the original; the
  selector object, and everything else the loop does with it (``register``, ``modify``,
  ``get_key``, ``close`` for ``add_reader`` and friends), stays as it was. One integer
  increment and one Python call per loop iteration, about 60 ns (``benchmarks/loop_turns.py``,
  BENCHMARKS.md). Checked against CPython 3.10 to 3.13's asyncio.

A stage that starts on a thread running an event loop (:func:`monitor_for` is called with that
loop, which starts its monitor the first time) reads ``turns`` at its start and end:

* the turns changed: the stage's coroutine yielded to the loop (it awaited something that
  suspended it), and the loop ran other work meanwhile. Its thread CPU time then includes other
  tasks' work and is left out (:mod:`~otel_stages.signals.capture`);
* the turns did not change and the stage lasted at least :data:`HOLD_MIN_NS`:
  ``otel_stages.event_loop.held_ms``. The stage ran from start to end inside one callback of the
  loop: nothing else on the loop could run. Exact on a selector loop, however starved the
  machine, where an awaiting stage resumed behind another task's blocking work is still seen to
  have yielded;
* the lag measured while it was open (``otel_stages.event_loop.lag_ms``): how long the loop was
  held by other work while this stage waited on it.

Where the loop has no ``_selector`` to count (uvloop, the Windows proactor loop, a custom loop
that overrides ``_run_once``, a selector whose type has ``__slots__``) ``turns`` counts the
timer's ticks instead, the heuristic used before: a stage during which no tick ran although one
was due held the loop. It errs where the stage awaited but the loop was held by other tasks'
work for all of the stage (its tick could not run either): such a stage is reported as holding,
and its CPU time kept. :attr:`LoopMonitor.exact` says which applies.

Holds shorter than :data:`HOLD_MIN_NS` are not attributed (their lag is still counted). Several
loops in one process (one per thread) each get their own monitor.
"""

from __future__ import annotations

import asyncio
import weakref
from asyncio.selector_events import BaseSelectorEventLoop
from typing import Any

from otel_stages._runtime import RUNTIME, guard

#: Seconds between monitor ticks: the resolution of the lag measurement.
INTERVAL_S = 0.02
INTERVAL_NS = int(INTERVAL_S * 1e9)
#: A stage on the loop's thread that did not yield to the loop for this long held it
#: (``otel_stages.event_loop.held_ms``). Where the monitor counts timer ticks (not exact) one tick
#: was due inside such a window, plus 5 ms for timer and scheduling slack; the same minimum on a
#: selector loop keeps one meaning for the attribute whichever way it was found.
HOLD_MIN_NS = INTERVAL_NS + 5_000_000
#: Lateness below this is timer and selector slack on an idle loop, not a blocked loop.
LAG_MIN_NS = 2_000_000

_GUARD = guard("event loop monitor")


class LoopMonitor:
    """The lag timer and turn counter of one event loop. ``ticks`` counts timer runs; ``lag_ns``
    sums the lateness of the late ones (span-clock ns); ``turns`` counts the loop's iterations
    (its ``select`` calls) where :attr:`exact`, else it follows ``ticks``. All only grow; read
    and written on the loop's thread."""

    __slots__ = ("__weakref__", "_due_ns", "_loop", "exact", "lag_ns", "ticks", "turns")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._loop: Any = weakref.ref(loop)
        except TypeError:  # a loop type without weak references: hold it (one per loop)
            self._loop = lambda: loop
        self.ticks = 0
        self.turns = 0
        self.lag_ns = 0
        #: whether ``turns`` counts the loop's iterations (a selector loop), not timer ticks
        self.exact = _count_turns(loop, self)
        self._due_ns = RUNTIME.clock.now_ns() + INTERVAL_NS
        loop.call_later(INTERVAL_S, self._tick)

    def lag_base_ns(self, now_ns: int) -> int:
        """:attr:`lag_ns` plus the lateness the pending tick has built up by ``now_ns`` (span
        clock): a counter that grows while the loop is held, whether or not the late tick has run
        yet. A stage's lag is this at its end minus this at its start: a stage that starts behind
        a blocked loop is not charged for the block, and one that ends before the late tick runs
        still sees the lateness inside its window."""
        return self.lag_ns + max(0, now_ns - self._due_ns)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The monitored loop (``None`` once it is gone)."""
        loop: asyncio.AbstractEventLoop | None = self._loop()
        return loop

    def _tick(self) -> None:
        with _GUARD:
            loop = self._loop()
            if loop is None or loop.is_closed():
                return
            now = RUNTIME.clock.now_ns()
            lag = now - self._due_ns
            if lag >= LAG_MIN_NS:
                self.lag_ns += lag
            self.ticks += 1
            if not self.exact:
                self.turns += 1
            self._due_ns = now + INTERVAL_NS
            loop.call_later(INTERVAL_S, self._tick)


def _counting_select(select: Any, monitor: LoopMonitor) -> Any:
    """``select`` (a selector's bound ``select``) adding one to ``monitor.turns`` per call."""
    def select_counted(timeout: float | None = None) -> Any:
        monitor.turns += 1
        return select(timeout)
    select_counted.__wrapped__ = select  # type: ignore[attr-defined]
    select_counted.__qualname__ = _COUNTED_NAME
    return select_counted


_COUNTED_NAME = "otel_stages.signals.loop.select_counted"
#: the iteration whose one ``select`` call per turn the count relies on (Lib/asyncio/base_events.py)
_RUN_ONCE = getattr(asyncio.BaseEventLoop, "_run_once", None)


def _count_turns(loop: asyncio.AbstractEventLoop, monitor: LoopMonitor) -> bool:
    """Count ``loop``'s iterations on ``monitor``; whether it could (a CPython selector loop with
    asyncio's own ``_run_once`` and a selector that takes an instance attribute).

    The loop's selector itself stays in place (``loop._selector`` is the same object: its type,
    its other methods and its private state are untouched): only its ``select`` is shadowed by
    an instance attribute that counts and calls the original. Measured against a proxy object
    around the selector, this costs the same as a proxy that lists the selector's methods and a
    third of one that forwards them through ``__getattr__`` (a type with ``__getattr__`` misses
    CPython 3.10/3.11's attribute fast paths on every ``select``: BENCHMARKS.md). A selector
    counted before (for a monitor since replaced) is not wrapped twice: its original ``select``
    is wrapped again for ``monitor``."""
    if not isinstance(loop, BaseSelectorEventLoop) or _RUN_ONCE is None \
            or getattr(type(loop), "_run_once", None) is not _RUN_ONCE:
        return False
    selector = getattr(loop, "_selector", None)
    select = getattr(selector, "select", None)
    if selector is None or not callable(select):
        return False  # closed, or something other than a selector
    if getattr(select, "__qualname__", None) == _COUNTED_NAME:
        select = select.__wrapped__
    try:
        selector.select = _counting_select(select, monitor)
    except AttributeError:  # a selector type with __slots__ (not the selectors module's)
        return False
    return True


# Loops are keyed by id(); the monitor holds the loop weakly, the loop's timer holds the monitor,
# so a closed loop's monitor goes away with it.
_MONITORS: weakref.WeakValueDictionary[int, LoopMonitor] = weakref.WeakValueDictionary()


def monitor_for(loop: asyncio.AbstractEventLoop) -> LoopMonitor:
    """The monitor of ``loop``, started on first use. Call on the loop's own thread."""
    monitor = _MONITORS.get(id(loop))
    if monitor is None or monitor.loop is not loop:
        monitor = _MONITORS[id(loop)] = LoopMonitor(loop)
    return monitor
