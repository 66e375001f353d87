"""otel_stages: per-stage OpenTelemetry tracing and latency diagnosis for multimodal inference.

Public verbs (the whole API; pinned by a test)::

    import otel_stages as ots

    ots.configure()                       # SDK setup: OTLP/JSON files, or OTLP if endpoint set
    with ots.request():                   # parent span of one inference request
        with ots.stage("decode") as span: # child span; also a decorator
            ...
        token = ots.enqueue_token(depth=q.qsize())   # producer side of a queue hand-off
    # worker thread:
    with ots.dequeue(token):              # records the queue span, enters the request's context
        with ots.stage("forward"): ...

``configure`` is imported lazily so that instrumented code importing ``otel_stages`` does not pull
in the OpenTelemetry SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from otel_stages._version import __version__ as __version__
from otel_stages.config import ConfigurationError
from otel_stages.handoff import Batch, QueueToken, dequeue, dequeue_batch, enqueue_token
from otel_stages.sequence import mark_cold_start
from otel_stages.stages import record_error, request, stage

if TYPE_CHECKING:
    from otel_stages.sdk import Telemetry, configure

__all__ = [
    "Batch",
    "ConfigurationError",
    "QueueToken",
    "Telemetry",
    "configure",
    "dequeue",
    "dequeue_batch",
    "enqueue_token",
    "mark_cold_start",
    "record_error",
    "request",
    "stage",
]


def __getattr__(name: str) -> Any:
    if name in ("configure", "Telemetry"):
        from otel_stages import sdk  # its import makes both plain attributes (_setup_imported)

        return getattr(sdk, name)
    raise AttributeError(f"module 'otel_stages' has no attribute {name!r}")


def _setup_imported(configure: Any, telemetry: Any) -> None:
    """Called by :mod:`otel_stages.sdk` once imported: ``configure`` and ``Telemetry`` become plain
    attributes and the module ``__getattr__`` above goes away. CPython (3.11) does not specialise
    attribute loads on a module that defines ``__getattr__``: every ``ots.stage`` would pay a
    generic lookup (measured: about a quarter of a disabled stage's own cost, BENCHMARKS.md)."""
    names = globals()
    names["configure"] = configure
    names["Telemetry"] = telemetry
    names.pop("__getattr__", None)
