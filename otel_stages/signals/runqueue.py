"""Per-thread run-queue wait: how long the calling thread was runnable but waiting for a core.

Linux ``/proc/thread-self/schedstat`` (kernel ``Documentation/scheduler/sched-stats.rst``,
"/proc/<pid>/schedstat"; ``CONFIG_SCHED_INFO``) holds three numbers for the thread that reads it::

    <time spent on the cpu (ns)> <time spent waiting on a runqueue (ns)> <# of timeslices run>

Only the second, ``run_delay``, is read: the exact time this thread waited for a CPU, unlike CPU
pressure (which counts every task of the cgroup or host). The first is updated only at scheduler
events (stale while the task runs); thread CPU time comes from ``time.thread_time_ns()``.

The file is opened once per thread and kept open: an fd opened on ``/proc/thread-self/...`` reads
the thread that opened it, so each thread has its own (a :class:`threading.local`), read with
``os.pread(fd, 64, 0)`` (no seek, no Python file object: 1.7-6 µs a read on a shared VM, see
BENCHMARKS.md). The fd is closed when its thread exits (the thread-local value is dropped) and, in
a forked child, at once (an inherited fd still reads the parent's thread). No such file (not Linux,
a kernel without ``CONFIG_SCHED_INFO``, ``/proc`` not mounted): :func:`read` turns itself off and
says so once at INFO level.

Opt-in (``configure(run_queue=True)``, ``OTEL_STAGES_RUN_QUEUE``): two reads per stage.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref

logger = logging.getLogger("otel_stages.signals")

#: The file each thread opens (its own schedstat).
SCHEDSTAT_PATH = "/proc/thread-self/schedstat"

_available = True
_local = threading.local()


class _Handle:
    """One thread's open schedstat fd; closed when the thread's locals go (thread exit)."""

    __slots__ = ("__weakref__", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        self.close()


_handles: weakref.WeakSet[_Handle] = weakref.WeakSet()


def _open() -> _Handle | None:
    global _available
    try:
        fd = os.open(SCHEDSTAT_PATH, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        data = os.pread(fd, 64, 0)
        int(data.split()[1])
    except (OSError, ValueError, IndexError, AttributeError) as exc:
        if _available:
            _available = False
            logger.info("run-queue wait not recorded: %s cannot be read (%s; Linux with"
                        " CONFIG_SCHED_INFO needed)", SCHEDSTAT_PATH, exc)
        return None
    handle = _Handle(fd)
    _handles.add(handle)
    _local.handle = handle
    return handle


def read() -> tuple[int, int] | None:
    """``(fd, run_delay ns)`` of the calling thread now: the fd identifies the thread (a stage
    that ends on another thread reads another fd). ``None`` when unavailable (module
    docstring)."""
    handle = getattr(_local, "handle", None)
    if handle is None:
        if not _available:
            return None
        handle = _open()
        if handle is None:
            return None
    fd = handle.fd
    return fd, int(os.pread(fd, 64, 0).split()[1])


def available() -> bool:
    """Whether the file could be read (``True`` until a thread found it missing)."""
    return _available


def _reset(available: bool = True) -> None:
    """Close this process's fds and start over (after ``fork()``; tests)."""
    global _local, _available
    for handle in list(_handles):
        handle.close()
    _handles.clear()
    _local = threading.local()
    _available = available


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset)
