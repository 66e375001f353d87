"""Request numbering for this process: ``request.seq`` (1-based) and the cold-start flag.

The counter restarts after ``fork()`` (the child is a new process, whose first request is cold);
:func:`mark_cold_start` flags the next request as cold (after a model load or reload).
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from otel_stages import semconv


class _Sequence:
    """1-based request counter for this process; restarts after ``fork()`` (a new process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._counter = itertools.count(1)
        self._cold_pending = False

    def next(self) -> tuple[int, bool]:
        """Return ``(seq, cold)`` for a new request."""
        seq = next(self._counter)  # atomic under the GIL: no lock on the common path
        pending = self._cold_pending
        if not pending:
            return seq, seq == 1
        with self._lock:  # one request takes the pending flag
            cold = self._cold_pending
            self._cold_pending = False
        return seq, cold or seq == 1

    def mark_cold(self) -> None:
        with self._lock:
            self._cold_pending = True


_SEQUENCE = _Sequence()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_SEQUENCE._reset)


def mark_cold_start() -> None:
    """Flag the *next* request as a cold start (call after loading or reloading a model)."""
    _SEQUENCE.mark_cold()


def next_request() -> tuple[int, bool]:
    """``(request.seq, cold)`` for a request starting now (takes the next number)."""
    return _SEQUENCE.next()


def request_attributes(attributes: dict[str, Any], request_id: str | None,
                       cold_start: bool | None, sequence: tuple[int, bool]) -> dict[str, Any]:
    """A request span's start attributes: ``attributes`` plus ``request.seq``,
    ``request.cold_start`` and ``request.id`` (when given); ``sequence`` from
    :func:`next_request`."""
    seq, cold = sequence
    attrs = dict(attributes)
    attrs[semconv.REQUEST_SEQ] = seq
    attrs[semconv.REQUEST_COLD_START] = cold if cold_start is None else cold_start
    if request_id is not None:
        attrs[semconv.REQUEST_ID] = request_id
    return attrs
