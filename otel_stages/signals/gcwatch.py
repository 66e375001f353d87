"""Garbage-collector pauses on the span clock, from ``gc.callbacks``.

:func:`install` appends one callback to ``gc.callbacks`` (CPython calls it with ``"start"`` and
``"stop"`` around every collection, on the thread that triggered it, holding the GIL). It records
each collection's start and end (span-clock ns) and generation in a ring of :data:`RING`
entries and counts collections in :attr:`GcLog.seq`. A stage reads ``seq`` at its start and end:
the collections numbered in between are the ones that ran while it was open (a collection
already running when the stage started cannot be: the stage's start ran Python, which the
collector does not let happen), so a stage during which nothing was collected pays one integer
compare. Cost per collection: two clock reads and a
tuple store (about 1-2 µs, against tens of µs for the smallest gen-0 collection).
"""

from __future__ import annotations

import gc
from typing import Any

from otel_stages._runtime import RUNTIME, guard

#: Collections kept (a power of two). A stage that saw more than this many collections counts the
#: newest ones only (and says how many there were).
RING = 256
_MASK = RING - 1
_GUARD = guard("gc pause callback")

#: ``(start_ns, end_ns, generation, done_before)`` of one collection: ``end_ns`` -1 while it runs;
#: ``done_before``: ``gc.get_stats()[generation]["collections"]`` at its start (-1: not read)
Pause = tuple[int, int, int, int]


class GcLog:
    """The ring of recent collections. ``seq`` counts collections since :func:`install`, from
    their *start*: the collection numbered ``k`` is in ``ring[k & (RING - 1)]`` as
    ``(start_ns, end_ns, generation)``, ``end_ns`` -1 while it runs, until ``RING`` newer ones
    replace it. Written only by the collecting thread; readers copy what they need.

    The times bracket the collection as the callbacks see it. Python code in a callback can hand
    the GIL to another thread (a thread switch is checked at calls), so the bracket may include a
    few ms in which other threads ran before or after the collection proper. A stage can even end
    while a collection is open (the collector was switched out in a callback): :func:`finished`
    tells whether the collection proper already ran (CPython counts it in ``gc.get_stats()``
    before the stop callbacks), read at the start of generation 1 and 2 collections only (gen-0
    ones last µs).
    """

    __slots__ = ("ring", "seq")

    def __init__(self) -> None:
        self.seq = 0
        self.ring: list[Pause] = [(0, 0, -1, -1)] * RING

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` entry (``phase`` ``"start"`` / ``"stop"``)."""
        with _GUARD:
            now = RUNTIME.clock.now_ns()
            if phase == "start":
                generation = int(info.get("generation", -1))
                done = gc.get_stats()[generation]["collections"] if generation > 0 else -1
                seq = self.seq + 1
                self.ring[seq & _MASK] = (now, -1, generation, done)
                self.seq = seq  # visible at once: a stage that ends meanwhile sees it
            else:
                start_ns, _, generation, done = self.ring[self.seq & _MASK]
                self.ring[self.seq & _MASK] = (start_ns, now, generation, done)

    def since(self, seq: int) -> list[Pause]:
        """The collections started after number ``seq`` (at most :data:`RING`), oldest first;
        ``end_ns`` is -1 for one still running."""
        now = self.seq
        first = max(seq + 1, now - RING + 1)
        ring = self.ring
        return [ring[k & _MASK] for k in range(first, now + 1)]


GC_LOG = GcLog()


def finished(pause: Pause) -> bool:
    """Whether an open collection (``end_ns`` -1) has run already (its stop callback has not)."""
    generation, done = pause[2], pause[3]
    return done >= 0 and gc.get_stats()[generation]["collections"] > done


def install() -> None:
    """Start recording collections (idempotent)."""
    if GC_LOG.callback not in gc.callbacks:
        gc.callbacks.append(GC_LOG.callback)


def uninstall() -> None:
    """Stop recording collections (no error when not installed)."""
    while GC_LOG.callback in gc.callbacks:
        gc.callbacks.remove(GC_LOG.callback)


def installed() -> bool:
    """Whether collections are being recorded."""
    return GC_LOG.callback in gc.callbacks
