"""The inference worker: one queue and ONE batching executor thread in front of the model.

Request threads call :meth:`InferenceWorker.submit` (producer side): it captures an
:func:`otel_stages.enqueue_token` (the request's trace context, enqueue time, queue depth) and puts
``(token, pixels, prompt_ids, future)`` on the queue. The executor thread takes the first waiting
item, then keeps collecting until ``max_batch`` items or ``max_wait_ms`` after the first one,
calls :func:`otel_stages.dequeue_batch` (one ``queue`` span per request, enqueue -> pickup) and
runs the model once inside ``batch.stage("forward")``: one ``batch`` span for the model call (a
trace of its own, ``batch.size``, a link to every member request) and one ``forward`` span per
request (each a child of its own request, with ``batch.size`` and a link to the ``batch`` span).
Results, or the exception, go to every future of the batch. :meth:`close` (or leaving the
``with`` block) sends a sentinel and joins the thread.

Should the executor loop itself fail (a bug, not a model error), the worker fails every waiting
future and every later :meth:`~InferenceWorker.submit` with :class:`WorkerClosed` instead of
leaving producers blocked; :meth:`~InferenceWorker.infer` also waits with a timeout.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType

import numpy as np
from opentelemetry import context as otel_context

from otel_stages import QueueToken, dequeue_batch, enqueue_token, semconv

#: ``run(pixels [B, 3, S, S] float32, prompt_ids [B, T] int64) -> [B, ...]`` (e.g. Encoder.run)
ModelFn = Callable[[np.ndarray, np.ndarray], np.ndarray]

THREAD_NAME = "demo-executor"
THREAD_NAME_ATTR = semconv.THREAD_NAME  #: set on forward spans (and request spans)


@dataclass(frozen=True)
class _Item:
    token: QueueToken
    pixels: np.ndarray  # [3, S, S] float32
    prompt_ids: np.ndarray  # [T] int64
    future: Future[np.ndarray]


_STOP = object()


class WorkerClosed(RuntimeError):
    """:meth:`InferenceWorker.submit` after :meth:`InferenceWorker.close`, or after the executor
    thread died (then ``__cause__`` is what killed it)."""


class InferenceWorker:
    """Queue + one batching executor thread running ``model``.

    ``max_batch`` >= 1 items per model call; ``max_wait_ms`` >= 0 is how long the executor waits
    for more items after the first one of a batch (0 = take only what is already queued).
    ``submit`` is thread-safe; results come back as :class:`concurrent.futures.Future`.
    """

    def __init__(self, model: ModelFn, *, max_batch: int = 4, max_wait_ms: float = 4.0) -> None:
        if max_batch < 1 or not math.isfinite(max_wait_ms) or max_wait_ms < 0:
            raise ValueError(f"InferenceWorker: need max_batch >= 1 and a finite max_wait_ms >= 0, "
                             f"got {max_batch} and {max_wait_ms}")
        self._model = model
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self._queue: queue.Queue[object] = queue.Queue()
        self._closed = False
        self._died: BaseException | None = None  #: what killed the executor loop, if anything
        self._lock = threading.Lock()
        self.batch_sizes: list[int] = []  #: size of every batch run so far, in order
        self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self._thread.start()

    # -- producer side -------------------------------------------------------------------------
    def submit(self, pixels: np.ndarray, prompt_ids: np.ndarray) -> Future[np.ndarray]:
        """Queue one item: ``pixels`` float32 ``[3, S, S]``, ``prompt_ids`` int64 ``[T]``.

        Call inside the request's span (the ``queue`` and ``forward`` spans become its children).
        The future resolves to the model output row for this item, or raises what the model
        raised (:class:`WorkerClosed` if the executor thread dies first). Raises
        :class:`WorkerClosed` after :meth:`close` or once the executor thread has died.
        """
        future: Future[np.ndarray] = Future()
        with self._lock:  # no item may slip in behind the sentinel
            if self._died is not None:
                raise WorkerClosed(f"InferenceWorker executor thread died: {self._died!r}") from self._died
            if self._closed:
                raise WorkerClosed("InferenceWorker is closed")
            token = enqueue_token(depth=self._queue.qsize())
            self._queue.put(_Item(token, pixels, prompt_ids, future))
        return future

    def infer(self, pixels: np.ndarray, prompt_ids: np.ndarray, timeout_s: float = 60.0) -> np.ndarray:
        """:meth:`submit` and wait up to ``timeout_s`` for the result (``TimeoutError`` after)."""
        return self.submit(pixels, prompt_ids).result(timeout=timeout_s)

    # -- executor side ---------------------------------------------------------------------------
    def _collect(self, items: list[_Item]) -> bool:
        """Add up to ``max_batch - len(items)`` more items to ``items`` (which holds the batch's
        first) within ``max_wait_s``; ``True`` when the stop sentinel was seen."""
        deadline = time.monotonic() + self.max_wait_s
        while len(items) < self.max_batch:  # bounded by max_batch
            remaining = min(deadline - time.monotonic(), threading.TIMEOUT_MAX)
            try:
                nxt = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is _STOP:
                return True
            assert isinstance(nxt, _Item)
            items.append(nxt)
        return False

    def _loop(self) -> None:
        # A thread started inside a request inherits its context (thread-pool propagation is on):
        # the executor serves every request, so it runs in an empty one.
        otel_context.attach(otel_context.Context())
        items: list[_Item] = []
        try:
            stop = False
            while not stop:  # ends at the sentinel, which close() always sends
                first = self._queue.get()
                if first is _STOP:
                    break
                assert isinstance(first, _Item)
                items = [first]
                stop = self._collect(items)
                self._run_batch(items)
                items = []
        except BaseException as exc:  # noqa: BLE001 - a bug here must not leave callers waiting forever
            self._die(items, exc)

    def _die(self, items: list[_Item], exc: BaseException) -> None:
        """The loop failed: refuse new work, fail the batch in hand and everything queued."""
        with self._lock:
            self._died = exc
            self._closed = True
            pending = list(items)
            while True:  # bounded: submit() adds nothing once _closed is set
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Item):
                    pending.append(item)
        for item in pending:
            if not item.future.done():
                error = WorkerClosed(f"InferenceWorker executor thread died: {exc!r}")
                error.__cause__ = exc
                item.future.set_exception(error)

    def _run_batch(self, items: list[_Item]) -> None:
        live = [item for item in items if item.future.set_running_or_notify_cancel()]
        if not live:
            return
        batch = dequeue_batch([item.token for item in live])
        self.batch_sizes.append(batch.size)
        try:
            with batch.stage("forward", **{THREAD_NAME_ATTR: threading.current_thread().name}):
                pixels = np.stack([item.pixels for item in live])
                prompts = np.stack([item.prompt_ids for item in live])
                out = self._model(pixels, prompts)
                if len(out) != len(live):
                    raise RuntimeError(f"model returned {len(out)} rows for a batch of {len(live)}")
        except Exception as exc:  # noqa: BLE001 - every request of the batch gets the error, the worker lives on
            for item in live:
                item.future.set_exception(exc)
            return
        for item, row in zip(live, out):
            item.future.set_result(row)

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self, timeout_s: float = 30.0) -> None:
        """Stop accepting work, let the executor finish what is queued, join it (idempotent).

        Raises ``TimeoutError`` if the executor is still running after ``timeout_s``.
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"executor thread still running after {timeout_s} s")

    def __enter__(self) -> InferenceWorker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
