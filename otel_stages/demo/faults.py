"""Faults the demo can inject (``otel-stages demo --fault NAME``), each making one mechanism of
``DESIGN.md`` section 3 happen for real, so that the report can be seen to name it.

* ``cpu-hog`` (:class:`CpuHog`): busy threads that compete with the pipeline for the cores in
  bursts (a batch job, a noisy neighbour, a thread pool sized for a bigger machine). Their work is
  SHA-256 over a buffer, which releases the GIL: real competition for cores, not for the GIL.
  Expected verdict ``cpu_contention``: the slow stages waited for a core.
* ``gc-storm`` (:class:`GcStorm`): a large heap of long-lived objects (caches, model metadata) plus
  a background component that keeps producing reference cycles (parsed documents with parent
  pointers, kept in a small cache and then dropped). The cycles survive into the oldest
  generation, so CPython runs full collections over the whole heap every few hundred ms, each
  holding the GIL for about 100 ms. Expected verdict ``gc_pause``.
* ``blocking-loop``: an asyncio front end (:mod:`otel_stages.demo.asyncfront`) that decodes and
  resizes on the event loop instead of in a thread, so one request's decode delays every other
  request waiting on the loop. Expected verdict ``event_loop_blocked``, with ``decode`` named as
  the stage that held the loop.
"""

from __future__ import annotations

import collections
import gc
import hashlib
import itertools
import os
import random
import threading
import time
from types import TracebackType
from typing import Any

CPU_HOG = "cpu-hog"
GC_STORM = "gc-storm"
BLOCKING_LOOP = "blocking-loop"
FAULTS = (CPU_HOG, GC_STORM, BLOCKING_LOOP)


class _Background:
    """Daemon threads running :meth:`_run` until the ``with`` block ends (joined on exit)."""

    name = "fault"

    def __init__(self, threads: int) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True,
                                          name=f"demo-{self.name}-{i}") for i in range(threads)]

    @property
    def threads(self) -> int:
        """How many background threads the fault runs."""
        return len(self._threads)

    def _run(self, index: int) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self) -> _Background:
        self._prepare()
        for thread in self._threads:
            thread.start()
        return self

    def _prepare(self) -> None:
        pass

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)


class CpuHog(_Background):
    """``threads`` busy threads (default: one per core), each busy for ``busy_ms`` then idle for
    ``idle_ms`` (both jittered 0.5-1.5x, seeded), so that the pipeline's stages sometimes run on a
    free core and sometimes wait for one. ``busy_fraction`` reports how much of the time they
    were busy (for the demo's progress line)."""

    name = "cpu-hog"

    def __init__(self, threads: int | None = None, *, busy_ms: float = 300.0,
                 idle_ms: float = 300.0, seed: int = 0) -> None:
        super().__init__(threads or os.cpu_count() or 2)
        self.busy_s, self.idle_s = busy_ms / 1000, idle_ms / 1000
        self.seed = seed
        self._busy = [0.0] * len(self._threads)
        self._started = time.perf_counter()

    def _run(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        data = os.urandom(1 << 18)  # 256 KiB: a few hundred µs of hashing with the GIL released
        while not self._stop.is_set():
            start = time.perf_counter()
            until = start + self.busy_s * rng.uniform(0.5, 1.5)
            while time.perf_counter() < until:
                hashlib.sha256(data).digest()
            self._busy[index] += time.perf_counter() - start
            self._stop.wait(self.idle_s * rng.uniform(0.5, 1.5))

    @property
    def busy_fraction(self) -> float:
        """Mean share of wall time the hog threads were busy so far (0..1)."""
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        return sum(self._busy) / (elapsed * len(self._busy))


class GcStorm(_Background):
    """A heap of ``live_objects`` long-lived containers, plus one thread that every ``every_ms``
    builds a ring of ``ring_size`` lists (a reference cycle: reference counting never frees it),
    keeps the newest ``keep`` rings in a cache and drops the oldest. The dropped rings have
    already been promoted to the oldest generation, so only a full collection frees them; with
    CPython's default thresholds one runs whenever the promoted objects reach a quarter of the
    long-lived ones, and walks the whole heap (about 100 ms for 500 000 objects). Building a
    ring takes a few ms: the collections, not the churn, are what stops the other threads.
    :attr:`collections` counts the full collections seen."""

    name = "gc-storm"

    def __init__(self, *, live_objects: int = 500_000, ring_size: int = 20_000,
                 every_ms: float = 50.0, keep: int = 8) -> None:
        super().__init__(1)
        self.live_objects = live_objects
        self.ring_size = ring_size
        self.every_s = every_ms / 1000
        self.keep = keep
        self._heap: list[Any] = []
        self.collections = 0

    def _prepare(self) -> None:
        # long-lived objects every full collection walks: dicts holding lists, as caches do
        self._heap = [{"id": i, "tags": [i]} for i in range(self.live_objects // 2)]
        gc.callbacks.append(self._count)

    def _count(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info.get("generation") == 2:
            self.collections += 1

    def _ring(self) -> list[Any]:
        nodes: list[list[Any]] = [[] for _ in range(self.ring_size)]
        for a, b in itertools.pairwise(nodes):
            a.append(b)
        nodes[-1].append(nodes[0])  # closes the cycle
        return nodes[0]

    def _run(self, index: int) -> None:
        cache: collections.deque[list[Any]] = collections.deque(maxlen=self.keep)
        while not self._stop.wait(self.every_s):
            cache.append(self._ring())

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        super().__exit__(exc_type, exc, tb)
        if self._count in gc.callbacks:
            gc.callbacks.remove(self._count)
        self._heap = []
