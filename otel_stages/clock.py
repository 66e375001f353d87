"""The span clock: a monotonic clock anchored once to wall time.

Span start/end times are taken from ``time.monotonic_ns()`` plus one wall-clock offset captured
when the :class:`Clock` is created. Durations therefore never go negative and never jump when
NTP or an operator adjusts the system clock, while timestamps still read as Unix nanoseconds for
backends. GPU samples are converted onto the same base (:meth:`Clock.from_unix_ns`,
:meth:`Clock.from_monotonic_ns`) so they line up with spans.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Clock:
    """Anchored monotonic clock. Thread-safe (immutable after construction).

    ``monotonic_ns`` / ``wall_ns`` are injectable for tests. ``now_ns() == monotonic_ns() +
    offset_ns``; hot paths read the two attributes instead of calling :meth:`now_ns` (one Python
    call less per timestamp).
    """

    __slots__ = ("monotonic_ns", "offset_ns")

    def __init__(self, monotonic_ns: Callable[[], int] = time.monotonic_ns,
                 wall_ns: Callable[[], int] = time.time_ns) -> None:
        #: The monotonic source (``time.monotonic_ns`` unless injected), nanoseconds.
        self.monotonic_ns = monotonic_ns
        mono0 = monotonic_ns()
        wall0 = wall_ns()
        #: Offset such that now_ns() == wall time at anchoring, then advances monotonically.
        self.offset_ns = wall0 - mono0

    def now_ns(self) -> int:
        """Current span-clock time: Unix-epoch nanoseconds, monotonic non-decreasing."""
        return self.monotonic_ns() + self.offset_ns

    def from_monotonic_ns(self, monotonic_ns: int) -> int:
        """Convert a ``time.monotonic_ns()`` reading into span-clock nanoseconds."""
        return monotonic_ns + self.offset_ns

    def from_unix_ns(self, unix_ns: int, wall_ns: Callable[[], int] = time.time_ns) -> int:
        """Convert a wall-clock (Unix epoch) reading into span-clock nanoseconds.

        Corrects for any wall-clock adjustment since anchoring by comparing the wall clock and the
        span clock now; exact when the wall clock was not stepped between the reading and now.
        """
        return unix_ns + (self.now_ns() - wall_ns())


#: The process-wide clock every stage uses.
DEFAULT_CLOCK = Clock()
