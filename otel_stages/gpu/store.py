"""Bounded in-memory sample storage: recent points per (device, metric) for attribution, and the
points not yet exported.

Times are span-clock nanoseconds; values are in exported units (0..1, bytes, W, Cel).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Point:
    """One sample: ``time_ns`` on the span clock, ``value`` in the metric's exported unit."""

    time_ns: int
    value: float | int


@dataclass(frozen=True, slots=True)
class PendingPoint:
    """A sample waiting for export: which device (``hw.id``) and metric it belongs to."""

    uuid: str
    metric: str
    point: Point


class SampleStore:
    """Ring buffers of recent points plus an export queue. Thread-safe (one short lock).

    ``capacity``: points kept per (device, metric) for window queries (oldest dropped first);
    ``max_pending``: points kept for export when nobody drains them (oldest dropped first,
    counted in :attr:`dropped`). Points must be added in time order per series.
    """

    def __init__(self, capacity: int = 4096, max_pending: int = 200_000) -> None:
        self._capacity = capacity
        self._series: dict[tuple[str, str], deque[Point]] = {}
        self._pending: deque[PendingPoint] = deque(maxlen=max_pending)
        self._lock = threading.Lock()
        self.dropped = 0
        self.total = 0

    def add(self, uuid: str, metric: str, points: list[Point]) -> None:
        """Add time-ordered ``points`` to one series (merged in order when older than its tail:
        an instant reading can precede ring entries the driver reports late)."""
        if not points:
            return
        with self._lock:
            series = self._series.get((uuid, metric))
            if series is None:
                series = self._series[(uuid, metric)] = deque(maxlen=self._capacity)
            if series and series[-1].time_ns > points[0].time_ns:
                tail: list[Point] = []
                while series and series[-1].time_ns > points[0].time_ns:
                    tail.append(series.pop())
                points = sorted([*reversed(tail), *points], key=lambda p: p.time_ns)
                series.extend(points)
                points = [p for p in points if p not in tail]
            else:
                series.extend(points)
            overflow = len(self._pending) + len(points) - (self._pending.maxlen or 0)
            if overflow > 0:
                self.dropped += overflow
            self._pending.extend(PendingPoint(uuid, metric, p) for p in points)
            self.total += len(points)

    def latest(self, uuid: str, metric: str) -> Point | None:
        """The newest point of a series, or ``None``."""
        with self._lock:
            series = self._series.get((uuid, metric))
            return series[-1] if series else None

    def window(self, uuid: str, metric: str, start_ns: int, end_ns: int) -> list[Point]:
        """Points with ``start_ns <= time_ns <= end_ns``, oldest first.

        Scans back from the newest point, so the cost is the points inside and after the window
        (windows asked for are recent: the forward that just ended).
        """
        out: list[Point] = []
        with self._lock:
            series = self._series.get((uuid, metric))
            if not series:
                return out
            for point in reversed(series):
                if point.time_ns < start_ns:
                    break
                if point.time_ns <= end_ns:
                    out.append(point)
        out.reverse()
        return out

    def last_at_or_before(self, uuid: str, metric: str, t_ns: int) -> Point | None:
        """The newest point with ``time_ns <= t_ns``, or ``None``."""
        with self._lock:
            series = self._series.get((uuid, metric))
            if not series:
                return None
            for point in reversed(series):
                if point.time_ns <= t_ns:
                    return point
        return None

    def drain(self) -> list[PendingPoint]:
        """Take every point not yet exported (each point is handed out once)."""
        with self._lock:
            out = list(self._pending)
            self._pending.clear()
        return out
