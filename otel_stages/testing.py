"""In-memory capture helpers for tests (yours and ours).

``with capture_spans() as captured:`` points otel_stages' stages at a private SDK tracer provider
with an in-memory exporter and a synchronous processor, so finished spans are readable right
after the block, with no sleeps and no global provider touched::

    with capture_spans() as captured:
        with otel_stages.request():
            with otel_stages.stage("decode"):
                ...
    assert captured.names() == ["decode", "request"]
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_stages import signals
from otel_stages._runtime import RUNTIME, scoped_tracer
from otel_stages.clock import Clock


@dataclass
class CapturedSpans:
    """Finished spans recorded inside :func:`capture_spans`, in end order."""

    exporter: InMemorySpanExporter
    provider: TracerProvider

    @property
    def spans(self) -> list[ReadableSpan]:
        """All finished spans so far (a copy)."""
        return list(self.exporter.get_finished_spans())

    def names(self) -> list[str]:
        """Span names in end order."""
        return [s.name for s in self.spans]

    def by_name(self, name: str) -> list[ReadableSpan]:
        """Finished spans called ``name``."""
        return [s for s in self.spans if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        """The single finished span called ``name``; ``AssertionError`` if not exactly one."""
        found = self.by_name(name)
        assert len(found) == 1, f"expected one {name!r} span, got {len(found)}: {self.names()}"
        return found[0]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        """Finished spans whose parent is ``parent``."""
        return [s for s in self.spans
                if s.parent is not None and s.parent.span_id == parent.context.span_id]


@contextmanager
def capture_spans(clock: Clock | None = None, *, signals_on: bool = False) -> Iterator[CapturedSpans]:
    """Record otel_stages spans in memory for the duration of the block.

    ``clock`` replaces the span clock inside the block (inject a fake for exact timings).
    ``signals_on``: also record the per-stage signals (:mod:`otel_stages.signals`: thread CPU
    time, GC pauses, event-loop lag). Off by default here, so that captured spans are the same
    on every run (CPU time never is, and means nothing against a fake clock).
    Restores the previous tracer, clock, enabled flag and signals setting afterwards.
    """
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = (RUNTIME.tracer, RUNTIME.enabled, RUNTIME.clock)
    saved_signals = signals.is_enabled()
    RUNTIME.tracer = scoped_tracer(provider)
    RUNTIME.enabled = True
    signals.enable(signals_on)
    if clock is not None:
        RUNTIME.clock = clock
    try:
        yield CapturedSpans(exporter, provider)
    finally:
        RUNTIME.tracer, RUNTIME.enabled, RUNTIME.clock = saved
        signals.enable(saved_signals)
        provider.shutdown()


@contextmanager
def capture_metrics() -> Iterator[tuple[MeterProvider, InMemoryMetricReader]]:
    """A private meter provider with an in-memory reader: call ``reader.get_metrics_data()``."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        yield provider, reader
    finally:
        provider.shutdown()
