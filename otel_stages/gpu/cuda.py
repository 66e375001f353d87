"""CUDA-aware forward timing, and mapping PyTorch CUDA devices to NVML UUIDs.

A model call on a CUDA device returns as soon as its kernels are *queued*: the host-side span
can end long before the GPU finishes. :func:`cuda_stage` records CUDA events around the block
and sets ``gpu.device_time_ms`` (GPU time between the events, ms) on the span, in one of two
modes:

- ``"events"`` (default): nothing waits on the request thread. The span's end time is taken
  when the block returns (host time); a resolver thread waits for the end event, sets the
  device time and only then ends the span (with that host end time). A device time longer than
  the span means GPU work spilled past the forward.
- ``"sync"``: synchronise on the end event before the span ends, so the span covers the time
  until the results are ready (what a caller reading the outputs experiences).

PyTorch is only used when it is already imported (nothing heavy is imported here); without it,
or without CUDA, :func:`cuda_stage` is a plain :func:`otel_stages.stage` (logged once).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import uuid as uuid_module
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from otel_stages import semconv
from otel_stages._runtime import guard
from otel_stages.stages import StageScope

logger = logging.getLogger("otel_stages.gpu")

MODES = ("events", "sync")


def _torch() -> Any:
    return sys.modules.get("torch")  # only when the application already imported it


@lru_cache(maxsize=64)
def torch_device_uuid(ordinal: int) -> str | None:
    """The UUID (as CUDA prints it, without ``GPU-``) of PyTorch CUDA device ``ordinal``, or
    ``None`` when PyTorch is not imported or has no such device. CUDA ordinals follow
    ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``; NVML indices do not, hence UUIDs."""
    torch = _torch()
    if torch is None:
        return None
    try:
        raw = torch.cuda.get_device_properties(ordinal).uuid
        data = getattr(raw, "bytes", None)
        return str(uuid_module.UUID(bytes=bytes(data))) if data is not None else str(raw)
    except Exception:  # noqa: BLE001 - no CUDA, bad ordinal, old PyTorch: no mapping
        return None


def torch_current_uuid() -> str | None:
    """UUID of the calling thread's current PyTorch CUDA device, when PyTorch has initialised
    CUDA (never initialises it)."""
    torch = _torch()
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        return torch_device_uuid(torch.cuda.current_device())
    except Exception:  # noqa: BLE001
        return None


def _default_events() -> Callable[[], Any] | None:
    torch = _torch()
    try:
        if torch is not None and torch.cuda.is_available():
            return lambda: torch.cuda.Event(enable_timing=True)
    except Exception:  # noqa: BLE001
        pass
    return None


class _Resolver:
    """Waits for end events on its own thread, then finishes the spans (FIFO)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="otel-stages-cuda-timing", daemon=True)
        self._thread.start()

    def submit(self, span: Any, start_event: Any, end_event: Any, end_ns: int) -> None:
        self._queue.put((span, start_event, end_event, end_ns))

    def flush(self, timeout_s: float) -> bool:
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout_s)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            span, start_event, end_event, end_ns = item
            try:
                end_event.synchronize()  # blocks this thread only (PyTorch releases the GIL)
                span.set_attribute(semconv.GPU_DEVICE_TIME_MS, round(start_event.elapsed_time(end_event), 4))
            except Exception as exc:  # noqa: BLE001 - telemetry must not break the service
                _log_once("resolve", "CUDA device time unavailable: %r", exc)
            finally:
                span.end(end_time=end_ns)


_GUARD_START = guard("cuda_stage start")
_GUARD_END = guard("cuda_stage end")
_resolver: _Resolver | None = None
_resolver_lock = threading.Lock()
_logged: set[str] = set()


def _log_once(key: str, message: str, *args: Any) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.info(message, *args)


def _get_resolver() -> _Resolver:
    global _resolver
    with _resolver_lock:
        if _resolver is None:
            _resolver = _Resolver()
            atexit.register(flush)  # before the tracer provider's own exit flush (LIFO)
        return _resolver


def flush(timeout_s: float = 10.0) -> bool:
    """Wait until every ``events``-mode span submitted so far has ended; ``True`` when done."""
    resolver = _resolver
    return True if resolver is None else resolver.flush(timeout_s)


def _after_fork_in_child() -> None:
    global _resolver, _resolver_lock
    _resolver, _resolver_lock = None, threading.Lock()  # the thread did not survive the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def cuda_stage(name: str = semconv.STAGE_FORWARD, /, *, mode: str = "events", stream: Any = None,
               event_factory: Callable[[], Any] | None = None, **attributes: Any) -> Iterator[Any]:
    """A stage span that also measures GPU time with CUDA events (see the module docstring).

    ``mode``: ``"events"`` or ``"sync"``; ``stream``: the CUDA stream the model runs on
    (default: the current stream); ``event_factory``: returns an object with ``record(stream)``,
    ``synchronize()`` and ``elapsed_time(other) -> ms`` (default ``torch.cuda.Event(
    enable_timing=True)``; injectable for tests). Yields the span. Raises ``ValueError`` for an
    unknown mode; exceptions from the block are recorded and re-raised unchanged.
    """
    if mode not in MODES:
        raise ValueError(f"cuda_stage mode={mode!r}: expected one of {', '.join(MODES)}")
    factory = event_factory or _default_events()
    scope = StageScope(name, attributes)
    span = scope._open()
    events: tuple[Any, Any] | None = None
    if factory is None:
        _log_once("no-cuda", "cuda_stage: PyTorch with CUDA not available; %s spans carry host "
                  "time only", name)
    elif scope._span is not None:
        with _GUARD_START:
            created = (factory(), factory())
            created[0].record(stream)
            events = created
    scope._attach()
    error: BaseException | None = None
    try:
        yield span
    except BaseException as exc:
        error = exc
        raise
    finally:
        scope._detach()
        if events is None or scope._span is None:
            scope._close(error)
        else:
            _finish(scope, events, mode, stream, error)


def _finish(scope: StageScope, events: tuple[Any, Any], mode: str, stream: Any,
            error: BaseException | None) -> None:
    span = scope._span
    if span is None:
        return
    with _GUARD_END:
        events[1].record(stream)
        if mode == "sync":
            events[1].synchronize()
            span.set_attribute(semconv.GPU_DEVICE_TIME_MS, round(events[0].elapsed_time(events[1]), 4))
            scope._close(error)
            return
        # events: end time and hooks now, on the request thread; the span ends when resolved
        end_ns = scope._finish(span, error)
        scope._span = None
        _get_resolver().submit(span, events[0], events[1], end_ns)
    if scope._span is not None:  # the guard caught a failure before the span was handed over
        scope._close(error)
