"""Garbage-collector pauses on the span clock, from ``gc.callbacks``.

:func:`install` appends one callback to ``gc.callbacks`` (CPython calls it with ``"start"`` and
``"stop"`` around every collection, on the thread that triggered it, holding the GIL). It records
each collection's start and end (span-clock ns) and generation in a ring of :data:`RING`
entries and counts collections in :attr:`GcLog.seq`. A stage reads ``seq`` at its start and end:
the collections numbered in between are the ones that ran while it was open, so a stage during
which nothing was collected pays one integer compare. Cost per collection: two clock reads and a
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

#: ``(start_ns, end_ns, generation)`` of one collection
Pause = tuple[int, int, int]


class GcLog:
    """The ring of recent collections. ``seq`` counts collections since :func:`install`; the
    collection numbered ``k`` is in ``ring[k & (RING - 1)]`` until ``RING`` newer ones replace it.
    Written only inside a collection (under the GIL); readers copy what they need."""

    __slots__ = ("_start_ns", "ring", "seq")

    def __init__(self) -> None:
        self.seq = 0
        self._start_ns = 0
        self.ring: list[Pause] = [(0, 0, -1)] * RING

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` entry (``phase`` ``"start"`` / ``"stop"``)."""
        with _GUARD:
            if phase == "start":
                self._start_ns = RUNTIME.clock.now_ns()
                return
            end_ns = RUNTIME.clock.now_ns()
            seq = self.seq + 1
            self.ring[seq & _MASK] = (self._start_ns, end_ns, int(info.get("generation", -1)))
            self.seq = seq

    def since(self, seq: int) -> list[Pause]:
        """The collections after number ``seq`` (at most :data:`RING`), oldest first."""
        now = self.seq
        first = max(seq + 1, now - RING + 1)
        ring = self.ring
        return [ring[k & _MASK] for k in range(first, now + 1)]


GC_LOG = GcLog()


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
