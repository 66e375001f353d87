"""Asyncio event-loop lag and holds, attributed to the stage spans that ran on the loop's thread.

A :class:`LoopMonitor` watches one loop in two ways:

* a timer: every :data:`INTERVAL_S` it runs, notes how late it ran (the *lag*: the loop was busy
  with something else when the timer was due) and schedules itself again. One timer callback per
  interval (about 50 a second, a few µs each).
* the loop's turns (:attr:`LoopMonitor.turns`): on CPython's selector event loops (the default
  on Linux and macOS) every iteration of the loop, ``BaseEventLoop._run_once`` in
  Lib/asyncio/base_events.py, calls ``self._selector.select(timeout)`` exactly once, then runs
  the callbacks that were ready *before* that call; a callback scheduled while they run (a
  suspended task's wake-up: ``Task.__step`` / ``__wakeup`` go through ``call_soon``) runs only in
  a later iteration, "after another I/O poll" as the source says. The monitor wraps the loop's
  ``_selector`` (set in ``BaseSelectorEventLoop.__init__``, Lib/asyncio/selector_events.py) in
  a thin proxy whose ``select`` adds one to :attr:`~LoopMonitor.turns` and delegates; every other
  attribute (``register``, ``modify``, ``get_key``, ``close`` ... used by ``add_reader`` and
  friends) passes through unchanged. One integer increment per loop iteration
  (``benchmarks/loop_turns.py``, BENCHMARKS.md).

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
that overrides ``_run_once``) ``turns`` counts the timer's ticks instead, the heuristic used
before: a stage during which no tick ran although one was due held the loop. It errs where the
stage awaited but the loop was held by other tasks' work for all of the stage (its tick could
not run either): such a stage is reported as holding, and its CPU time kept.
:attr:`LoopMonitor.exact` says which applies.

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


class _TurnCounter:
    """Stands in for a selector loop's ``_selector``: ``select`` counts the loop's iterations on
    its monitor, everything else is the wrapped selector's (a :mod:`selectors` selector: its
    methods are looked up on it, so this needs no list of them). Not a
    :class:`selectors.BaseSelector` subclass on purpose: that class's concrete ``close``,
    ``modify`` and ``get_key`` would shadow the wrapped selector's own."""

    __slots__ = ("monitor", "selector")

    def __init__(self, selector: Any, monitor: LoopMonitor) -> None:
        self.selector = selector
        self.monitor = monitor

    def select(self, timeout: float | None = None) -> Any:
        self.monitor.turns += 1
        return self.selector.select(timeout)

    def __getattr__(self, name: str) -> Any:  # only for names not defined here
        return getattr(self.selector, name)

    def __repr__(self) -> str:
        return f"<turn-counting {self.selector!r}>"


#: the iteration whose one ``select`` call per turn the count relies on (Lib/asyncio/base_events.py)
_RUN_ONCE = getattr(asyncio.BaseEventLoop, "_run_once", None)


def _count_turns(loop: asyncio.AbstractEventLoop, monitor: LoopMonitor) -> bool:
    """Wrap ``loop._selector`` to count ``loop``'s iterations on ``monitor``; whether it could (a
    CPython selector loop with asyncio's own ``_run_once``). A loop wrapped before (by a monitor
    that was replaced) is not wrapped twice: its counter now counts for ``monitor``."""
    if not isinstance(loop, BaseSelectorEventLoop) or _RUN_ONCE is None \
            or getattr(type(loop), "_run_once", None) is not _RUN_ONCE:
        return False
    selector = getattr(loop, "_selector", None)
    if isinstance(selector, _TurnCounter):
        selector.monitor = monitor
        return True
    if selector is None or not callable(getattr(selector, "select", None)):
        return False  # closed, or something other than a selector
    loop._selector = _TurnCounter(selector, monitor)  # type: ignore[attr-defined]
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
