"""Asyncio event-loop lag, attributed to the stage spans that ran on the loop's thread.

A :class:`LoopMonitor` is a timer on the loop: every :data:`INTERVAL_S` it runs, notes how late it
ran (the *lag*: the loop was busy with something else when the timer was due) and schedules
itself again. It costs one timer callback per interval (about 50 a second, a few µs each) and
nothing per stage; stages read its two counters.

A stage that starts on a thread running an event loop (:func:`monitor_for` is called with that
loop, which starts its monitor the first time) records at its end:

* the lag measured while it was open (``otel_stages.event_loop.lag_ms``): how long the loop was
  held by other work while this stage waited on it;
* ``otel_stages.event_loop.held_ms`` when no tick ran during the stage although at least one
  was due (the stage lasted more than :data:`HOLD_MIN_NS`): the stage itself kept the loop from
  running anything else. A stage that awaits lets the timer run (the timer is due before the
  awaited result resumes the task: asyncio wakes a task through ``call_soon``, one loop turn
  after the timers due at the same time), so only synchronous work on the loop counts as holding.

Holds shorter than the interval are not attributed (their lag is still counted). Several loops in
one process (one per thread) each get their own monitor.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from otel_stages._runtime import RUNTIME, guard

#: Seconds between monitor ticks: the resolution of the lag measurement.
INTERVAL_S = 0.02
INTERVAL_NS = int(INTERVAL_S * 1e9)
#: A stage on the loop's thread that saw no tick in a window this long held the loop: one tick
#: was due inside it, plus 5 ms for timer and scheduling slack.
HOLD_MIN_NS = INTERVAL_NS + 5_000_000
#: Lateness below this is timer and selector slack on an idle loop, not a blocked loop.
LAG_MIN_NS = 2_000_000

_GUARD = guard("event loop monitor")


class LoopMonitor:
    """The lag timer of one event loop. ``ticks`` counts timer runs; ``lag_ns`` sums the lateness
    of the late ones (span-clock ns). Both only grow; read and written on the loop's thread."""

    __slots__ = ("__weakref__", "_due_ns", "_loop", "lag_ns", "ticks")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._loop: Any = weakref.ref(loop)
        except TypeError:  # a loop type without weak references: hold it (one per loop)
            self._loop = lambda: loop
        self.ticks = 0
        self.lag_ns = 0
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
            self._due_ns = now + INTERVAL_NS
            loop.call_later(INTERVAL_S, self._tick)


# Loops are keyed by id(); the monitor holds the loop weakly, the loop's timer holds the monitor,
# so a closed loop's monitor goes away with it.
_MONITORS: weakref.WeakValueDictionary[int, LoopMonitor] = weakref.WeakValueDictionary()


def monitor_for(loop: asyncio.AbstractEventLoop) -> LoopMonitor:
    """The monitor of ``loop``, started on first use. Call on the loop's own thread."""
    monitor = _MONITORS.get(id(loop))
    if monitor is None or monitor.loop is not loop:
        monitor = _MONITORS[id(loop)] = LoopMonitor(loop)
    return monitor
