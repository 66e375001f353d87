"""Head sampling that keeps what matters (SDK side, used by :func:`otel_stages.configure`).

With ``sample_ratio`` below 1 a plain ratio sampler would drop the first request of a process,
the failed ones and the slow ones at the same rate as the rest: exactly the traces a latency
investigation needs. Two parts fix that, each deciding where the information exists:

* :class:`RequestSampler` decides at span start (the head). It keeps what a parent-based
  trace-id-ratio sampler keeps (a sampled parent, local or remote, is followed), and also a span
  that starts with ``request.cold_start=true`` (the first request of the process, known at the
  head) and a span linked to a sampled span (a ``batch`` of sampled requests). What it does not
  keep it *records* (``RECORD_ONLY``) instead of dropping: the span is timed but not exported.
* :class:`KeepProcessor` decides when the request ends, in this process: it holds the recorded,
  unsampled spans of each trace and exports them when the trace turns out to matter (a span
  with status ERROR, a request span or local root span lasting ``slow_request_ms`` or more, a
  cold start under an unsampled parent); otherwise it drops them when the trace's local root
  span ends. Spans it keeps late are exported with the sampled flag set (they *were* sampled, at
  the end). A ``batch`` span that was not kept goes along with any member request that is kept.

Each exported request span says why it was kept (``otel_stages.sampling.kept``: ``ratio``,
``parent``, ``cold``, ``slow``, ``error``; and ``otel_stages.sampling.ratio``), so a report can
tell the requests kept by the ratio alone (an unbiased sample) from those kept for what they
turned out to be. At the head only request spans and local roots kept by the ratio get them (a
dict copy on a kept span); a late keep adds them to the copy it exports anyway.

What only the collector's tail sampling can decide: whole-trace latency and errors that happen
in *other* services of the trace, and anything about a trace whose head (an upstream service)
already decided "not sampled" for its own spans. Downstream services called during a request
see the head decision (``traceparent`` flags), not the late one. The bundled collector config
tail-samples errors, slow traces and cold starts across services.

Memory: at most ``max_pending_spans`` recorded spans wait for a decision (the oldest waiting
trace is given up past that, counted in :attr:`KeepProcessor.overflow_traces`, warned once).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult, TraceIdRatioBased
from opentelemetry.trace import Link, SpanContext, SpanKind, StatusCode, TraceFlags, get_current_span
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from otel_stages import semconv
from otel_stages.config import ConfigurationError, Settings

logger = logging.getLogger("otel_stages")

#: Recorded spans waiting for a late decision, at most (about 1-2 kB each).
DEFAULT_MAX_PENDING_SPANS = 20_000
#: Decided traces remembered, so spans that end after their local root follow the decision.
DECIDED_MEMORY = 4096


class RequestSampler(Sampler):
    """Parent-based trace-id ratio at the head, keeping cold starts and batches of kept requests;
    records (``RECORD_ONLY``) instead of dropping so :class:`KeepProcessor` can keep it later.

    ``ratio`` 0..1 is the share of new traces kept at the head (``TraceIdRatioBased``).
    Thread-safe (no state).
    """

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio
        self._ratio = TraceIdRatioBased(ratio)

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None,
                      trace_state: TraceState | None = None) -> SamplingResult:
        parent_span = get_current_span(parent_context)
        parent = parent_span.get_span_context()
        state = parent.trace_state if parent.is_valid else None
        request = attributes is not None and semconv.REQUEST_SEQ in attributes
        if attributes and attributes.get(semconv.REQUEST_COLD_START) is True:
            return SamplingResult(Decision.RECORD_AND_SAMPLE,
                                  self._kept(attributes, semconv.KEPT_COLD) if request else attributes,
                                  state)
        if parent.is_valid and parent.trace_flags.sampled:
            if not request:
                return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, state)
            why = semconv.KEPT_PARENT
            if not parent.is_remote:  # the local root's reason (set below when kept by the ratio)
                held = getattr(parent_span, "attributes", None) or {}
                why = str(held.get(semconv.SAMPLING_KEPT, semconv.KEPT_PARENT))
            return SamplingResult(Decision.RECORD_AND_SAMPLE, self._kept(attributes, why), state)
        if links and any(link.context.trace_flags.sampled for link in links):
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, state)
        if parent.is_valid and not parent.is_remote:  # local parent not sampled: follow it
            recording = Decision.RECORD_ONLY if parent_span.is_recording() else Decision.DROP
            return SamplingResult(recording, attributes, state)
        head = self._ratio.should_sample(parent_context, trace_id, name, kind, attributes, links)
        if head.decision is Decision.RECORD_AND_SAMPLE:
            return SamplingResult(Decision.RECORD_AND_SAMPLE,
                                  self._kept(attributes, semconv.KEPT_RATIO), state)
        return SamplingResult(Decision.RECORD_ONLY, attributes, state)

    def _kept(self, attributes: Attributes, why: str) -> dict[str, Any]:
        """``attributes`` with why the span was kept and the ratio (a copy: the caller's stays)."""
        return {**(attributes or {}), semconv.SAMPLING_KEPT: why, semconv.SAMPLING_RATIO: self.ratio}

    def get_description(self) -> str:
        return f"RequestSampler{{ratio={self.ratio}}}"


@dataclass(eq=False)
class _Held:
    span: ReadableSpan
    exported: bool = False


@dataclass(eq=False)
class _Trace:
    held: list[_Held] = field(default_factory=list)
    keep: bool = False
    #: why it was kept late (``semconv.KEPT_SLOW`` / ``KEPT_ERROR`` / ``KEPT_COLD``), once kept
    why: str = ""


def _sampled_copy(span: ReadableSpan, why: str = "", ratio: float | None = None) -> ReadableSpan:
    """``span`` with the sampled flag set (what the exporting processor exports); a request span
    (``request.seq`` set) also says ``why`` it was kept, and the ``ratio``."""
    ctx = span.get_span_context()
    assert ctx is not None
    context = SpanContext(ctx.trace_id, ctx.span_id, ctx.is_remote,
                          TraceFlags(ctx.trace_flags | TraceFlags.SAMPLED), ctx.trace_state)
    attributes = span.attributes
    if why and attributes and semconv.REQUEST_SEQ in attributes:
        attributes = {**attributes, semconv.SAMPLING_KEPT: why}
        if ratio is not None:
            attributes[semconv.SAMPLING_RATIO] = ratio
    return ReadableSpan(name=span.name, context=context, parent=span.parent, resource=span.resource,
                        attributes=attributes, events=span.events, links=span.links,
                        kind=span.kind, status=span.status, start_time=span.start_time,
                        end_time=span.end_time, instrumentation_scope=span.instrumentation_scope)


class KeepProcessor(SpanProcessor):
    """Wraps the exporting processor ``inner`` (e.g. a ``BatchSpanProcessor``): sampled spans go
    straight to it; recorded, unsampled ones wait for their trace's decision (module docstring).

    ``slow_ms``: a request span (``request.seq`` set) or local root span at least this long
    keeps its trace. ``ratio``: the head sampler's, written beside why a request span was kept
    late (``None``: not written). Thread-safe: ``on_end`` may run on any thread; the lock is held
    only for dictionary work, never while ``inner`` runs.
    """

    def __init__(self, inner: SpanProcessor, slow_ms: float,
                 max_pending_spans: int = DEFAULT_MAX_PENDING_SPANS,
                 ratio: float | None = None) -> None:
        self.inner = inner
        self.slow_ns = int(slow_ms * 1e6)
        self.ratio = ratio
        self.max_pending_spans = max_pending_spans
        self.kept_late = 0  #: traces kept because they turned out to matter
        self.overflow_traces = 0  #: waiting traces given up because too many spans were waiting
        self._pending: OrderedDict[int, _Trace] = OrderedDict()
        self._decided: OrderedDict[int, str] = OrderedDict()  # why kept; "" dropped
        self._held = 0
        self._lock = threading.Lock()

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        ctx = span.get_span_context()
        if not ctx.trace_flags.sampled:  # a trace waiting for a decision: a kept span may end first
            with self._lock:
                if ctx.trace_id not in self._decided and ctx.trace_id not in self._pending:
                    self._pending[ctx.trace_id] = _Trace()
                    self._limit()
        self.inner.on_start(span, parent_context=parent_context)

    def _matters(self, span: ReadableSpan, root: bool) -> str:
        """Why ``span`` keeps its trace (``semconv.KEPT_*``), ``""`` when it does not."""
        if span.status.status_code is StatusCode.ERROR:
            return semconv.KEPT_ERROR
        attributes = span.attributes or {}
        if attributes.get(semconv.REQUEST_COLD_START) is True:
            return semconv.KEPT_COLD
        long = (span.end_time or 0) - (span.start_time or 0) >= self.slow_ns
        return semconv.KEPT_SLOW if long and (root or semconv.REQUEST_SEQ in attributes) else ""

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.get_span_context()
        if ctx is None:
            return
        out: list[ReadableSpan] = []
        if ctx.trace_flags.sampled:
            self.inner.on_end(span)
            if ctx.trace_id in self._pending:  # a kept span (a cold request) in a waiting trace
                with self._lock:
                    self._keep(ctx.trace_id, out, semconv.KEPT_COLD)
        else:
            parent = span.parent
            root = parent is None or parent.is_remote
            with self._lock:
                self._hold(span, ctx.trace_id, root, out)
        for kept in out:
            self.inner.on_end(kept)

    # -- under the lock --------------------------------------------------------------------------
    def _keep(self, trace_id: int, out: list[ReadableSpan], why: str) -> None:
        trace = self._pending.get(trace_id)
        if trace is None:
            return
        if not trace.keep:
            trace.keep, trace.why = True, why
            self.kept_late += 1
        for held in trace.held:
            if not held.exported:
                held.exported = True
                out.append(_sampled_copy(held.span, trace.why, self.ratio))
        self._held -= len(trace.held)
        trace.held = []

    def _hold(self, span: ReadableSpan, trace_id: int, root: bool, out: list[ReadableSpan]) -> None:
        decided = self._decided.get(trace_id)
        if decided is not None:  # ended after its local root: follow the decision
            if decided:
                out.append(_sampled_copy(span, decided, self.ratio))
            return
        trace = self._pending.get(trace_id)
        if trace is None:
            trace = self._pending[trace_id] = _Trace()
        held = _Held(span)
        trace.held.append(held)
        self._held += 1
        why = trace.why if trace.keep else self._matters(span, root)
        if why:
            self._keep(trace_id, out, why)
        if root:
            self._decide(trace_id, trace, held, out)
        self._limit()

    def _decide(self, trace_id: int, trace: _Trace, root: _Held, out: list[ReadableSpan]) -> None:
        """The local root ended: export or drop what waits; a batch root not kept waits on."""
        del self._pending[trace_id]
        self._held -= len(trace.held)
        self._decided[trace_id] = trace.why if trace.keep else ""
        if len(self._decided) > DECIDED_MEMORY:
            self._decided.popitem(last=False)
        if trace.keep or root.exported:
            return
        for link in root.span.links:  # a batch goes along with any member that is kept
            member = link.context.trace_id
            if self._decided.get(member):
                root.exported = True
                out.append(_sampled_copy(root.span))
                return
            waiting = self._pending.get(member)
            if waiting is not None:
                waiting.held.append(root)
                self._held += 1

    def _limit(self) -> None:
        # spans held, and traces waiting (a local root that never ends must not pile up either)
        limit = self.max_pending_spans
        while (self._held > limit or len(self._pending) > limit) and self._pending:
            _, trace = self._pending.popitem(last=False)
            self._held -= len(trace.held)
            self.overflow_traces += 1
            if self.overflow_traces == 1:
                logger.warning(
                    "otel_stages sampling: more than %d unsampled spans or traces waiting for a decision; "
                    "giving up the oldest waiting traces (counted in KeepProcessor.overflow_traces)",
                    limit)

    # -- lifecycle -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        with self._lock:
            self._pending.clear()
            self._held = 0
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def sampler_for(settings: Settings, environ: Any = None) -> Sampler | None:
    """The sampler ``configure()`` installs: ``None`` at ``sample_ratio == 1`` (the SDK's default,
    or ``OTEL_TRACES_SAMPLER``), else a :class:`RequestSampler`. Raises
    :class:`ConfigurationError` when ``OTEL_TRACES_SAMPLER`` is also set (two samplers cannot
    both apply)."""
    if settings.sample_ratio >= 1.0:
        return None
    environ = os.environ if environ is None else environ
    other = environ.get("OTEL_TRACES_SAMPLER", "").strip()
    if other:
        raise ConfigurationError(
            f"OTEL_STAGES_SAMPLE_RATIO / sample_ratio={settings.sample_ratio!r} and "
            f"OTEL_TRACES_SAMPLER={other!r} are both set: unset one (otel_stages' sampler keeps "
            "cold, failed and slow requests; OTEL_TRACES_SAMPLER replaces it)")
    return RequestSampler(settings.sample_ratio)


def processor_for(settings: Settings, exporting: SpanProcessor) -> SpanProcessor:
    """``exporting`` as is at ``sample_ratio == 1``, else wrapped in a :class:`KeepProcessor`."""
    if settings.sample_ratio >= 1.0:
        return exporting
    return KeepProcessor(exporting, settings.slow_request_ms, ratio=settings.sample_ratio)
