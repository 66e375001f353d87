"""Keep the request's trace context in work handed to thread pools (OpenTelemetry API only).

Python does not carry ``contextvars`` into a ``concurrent.futures`` worker thread, so a ``decode``
stage run through ``ThreadPoolExecutor.submit`` or ``loop.run_in_executor`` would start a trace of
its own (and the report would count it as a request). OpenTelemetry's maintained threading
instrumentation (``opentelemetry-instrumentation-threading``, same release train as the pinned
SDK) fixes that: it captures the context in ``ThreadPoolExecutor.submit`` and ``Thread.start``
and attaches it in the worker. That covers ``executor.submit``/``map``, ``loop.run_in_executor``
(which calls ``submit`` on the caller's side) and ``threading.Thread``/``Timer``;
``asyncio.to_thread`` and ``asyncio`` tasks copy the context by themselves. It uses the context
API only, so it works with any SDK setup: a service with its own SDK calls :func:`instrument`
(or ``ThreadingInstrumentor().instrument()``, or runs under ``opentelemetry-instrument``).
Process pools are not covered (pass an :func:`otel_stages.enqueue_token`-style carrier instead).

``configure()`` calls :func:`instrument` unless ``propagate_context`` is off
(``OTEL_STAGES_PROPAGATE_CONTEXT=false``), and :func:`uninstrument` when a later ``configure()``
turns it off. A thread started inside a request keeps that request's context for its whole life:
a long-lived worker thread should clear it (``context.attach(Context())``) or be started outside
requests.
"""

from __future__ import annotations

import threading

from opentelemetry.instrumentation.threading import ThreadingInstrumentor

_lock = threading.Lock()
_ours = False  # True while the instrumentation is on because instrument() turned it on


def instrument() -> None:
    """Turn context propagation into thread pools on (idempotent; a no-op if someone else,
    e.g. ``opentelemetry-instrument``, already did)."""
    global _ours
    with _lock:
        instrumentor = ThreadingInstrumentor()
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument()
            _ours = True


def uninstrument() -> None:
    """Turn it off again, only if :func:`instrument` turned it on (another owner's stays)."""
    global _ours
    with _lock:
        instrumentor = ThreadingInstrumentor()
        if _ours and instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
        _ours = False


def is_instrumented() -> bool:
    """Whether work submitted to thread pools keeps the caller's context now."""
    return bool(ThreadingInstrumentor().is_instrumented_by_opentelemetry)
