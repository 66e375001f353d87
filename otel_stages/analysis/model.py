"""Source-neutral records the analysis works on.

Every loader (OTLP/JSON files, Jaeger, Tempo) turns its input into a :class:`Recording`; the rest
of :mod:`otel_stages.analysis` never sees a wire format. Times are integer nanoseconds on the
spans' clock (Unix epoch for OTLP), ids are lowercase hex strings.

A fleet's recording holds a million spans, so the records are compact and cheap to make: frozen
``msgspec.Struct`` classes (fixed slots, no per-instance ``__dict__``; built in C, 0.3 µs for a
Span against 3-4 µs for a frozen dataclass's ``__init__`` on the development host; not tracked by
the cyclic garbage collector, as they hold no cycles).
They construct, compare and print like dataclasses; to change a field use
``msgspec.structs.replace(span, name="decode")`` (``dataclasses.replace`` does not apply). Loaders
share one resource dict per process and one string per trace id, parent id, span name and
attribute key, and may keep only the attributes the analysis reads
(:mod:`otel_stages.analysis.selection`). Treat ``attributes`` and ``resource`` as read-only: they
can be shared between records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

AttributeValue = Any  # str | bool | int | float | list of those


class SpanEvent(msgspec.Struct, frozen=True, gc=False):
    """One span event (OTLP ``events[]``, a Jaeger ``logs[]`` entry): ``name`` at ``time_ns``
    (integer nanoseconds, the spans' clock) with its ``attributes``. NVIDIA Triton, for one,
    records its queue and compute steps as events (``QUEUE_START``, ``COMPUTE_START``...)."""

    name: str
    time_ns: int
    attributes: dict[str, AttributeValue] = msgspec.field(default_factory=dict)


class Span(msgspec.Struct, frozen=True, gc=False):
    """One finished span.

    ``start_ns`` / ``end_ns`` are integer nanoseconds; ``parent_span_id`` is ``None`` for a root.
    ``resource`` holds the resource attributes of the process that emitted it (``service.name``,
    ``service.instance.id``...). ``error`` is true when the span status is ERROR. ``events`` are
    the span's events in time order (empty when it has none). ``parent_follows_from`` is true when
    the parent relation came from a Jaeger/OpenTracing ``FOLLOWS_FROM`` reference rather than
    ``CHILD_OF`` (the parent does not wait for this span; Jaeger's waterfall still nests it there).
    ``links`` are the span links as ``(trace_id, span_id)`` pairs (a ``batch`` span links to its member
    requests, each member's ``forward`` back to the batch); empty when the source has none.
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue] = msgspec.field(default_factory=dict)
    resource: dict[str, AttributeValue] = msgspec.field(default_factory=dict)
    error: bool = False
    events: tuple[SpanEvent, ...] = ()
    parent_follows_from: bool = False
    links: tuple[tuple[str, str], ...] = ()

    @property
    def duration_ms(self) -> float:
        """Span duration in milliseconds (never negative for well-formed input)."""
        return (self.end_ns - self.start_ns) / 1e6


class MetricPoint(msgspec.Struct, frozen=True, gc=False):
    """One gauge / sum data point: ``value`` at ``time_ns`` (the time the sample was taken).

    ``attributes`` are the point attributes (``hw.id``...), ``resource`` the resource attributes.
    ``unit``: the metric's unit as its source declared it (OTLP ``unit``; ``""`` when the OTLP
    metric declared none), ``None`` where the source format carries no unit (a PromQL answer).
    One pointer per point: loaders share one string per metric.
    """

    name: str
    time_ns: int
    value: float
    attributes: dict[str, AttributeValue] = msgspec.field(default_factory=dict)
    resource: dict[str, AttributeValue] = msgspec.field(default_factory=dict)
    unit: str | None = None


@dataclass(frozen=True)
class Call:
    """A stage that calls into other requests: ``stage`` its name, ``service`` the called
    requests' ``service.name``, ``calls`` how many of its spans hold one, ``spans`` how many spans
    of that stage the requests read hold; ``shared_name`` when the called requests' service.name
    is the calling spans' own (one name for two services: ``--service`` cannot part them);
    ``callee_stage`` when some called request has a stage of the same name that is not itself a
    call (the calls and the callee's own spans are pooled under it; in a chain whose every hop is
    an httpx ``POST``, the middle service's POSTs are calls: no stage of its own). ``caller``: the
    calling spans' ``service.name`` (a name calls per pair of services). ``own_p5_ms`` /
    ``own_median_ms`` / ``own_p95_ms``:
    the percentiles (linear interpolation, as every stage's) of each span's own time, its duration
    less the time its called requests cover (their union within it: calls made at once count
    once), over the spans whose called requests are all steady (neither cold nor set apart)
    and (unless ``callee_stage``: those are the callees' own) the spans of that name that hold
    none (all their time own);
    ``callee_p5_ms`` / ``callee_p95_ms`` those of the covered time, over the former; ``None``
    where unread or no span qualifies. ``repeated``: of the former, the spans that hold more
    called requests than the fewest any holds (retries, or one call per item: the covered time
    then swings with the count); 0 when every span holds as many. ``each_p5_ms`` /
    ``each_p95_ms``: the percentiles of each successful called request's total over the former;
    ``before_p5_ms`` / ``before_p95_ms`` and ``after_p5_ms`` / ``after_p95_ms``: those of the own
    time before the first called request starts and after the last one ends, over the former
    (whether the called requests themselves swing, or only how many there are: a slow failed
    attempt before a retry is the retry's cost)."""

    stage: str
    service: str
    calls: int
    spans: int
    shared_name: bool = False
    callee_stage: bool = False
    own_p5_ms: float | None = None
    own_median_ms: float | None = None
    own_p95_ms: float | None = None
    callee_p5_ms: float | None = None
    callee_p95_ms: float | None = None
    repeated: int = 0
    each_p5_ms: float | None = None
    each_p95_ms: float | None = None
    caller: str = ""
    before_p5_ms: float | None = None
    before_p95_ms: float | None = None
    after_p5_ms: float | None = None
    after_p95_ms: float | None = None
    #: the trace ids of the calling spans whose called requests are not all steady (cold or set
    #: apart: the called service's cold start and warm-up), sorted
    unsteady_traces: tuple[str, ...] = ()

    @property
    def each_swing_ms(self) -> float | None:
        """``each_p95_ms - each_p5_ms`` (ms): how much each called request swings."""
        return _swing(self.each_p5_ms, self.each_p95_ms)

    @property
    def own_swing_ms(self) -> float | None:
        """``own_p95_ms - own_p5_ms`` (ms): how much the calls' own time swings."""
        return _swing(self.own_p5_ms, self.own_p95_ms)

    @property
    def before_swing_ms(self) -> float | None:
        """How much the own time before the called requests start swings (ms)."""
        return _swing(self.before_p5_ms, self.before_p95_ms)

    @property
    def after_swing_ms(self) -> float | None:
        """How much the own time after the called requests end swings (ms)."""
        return _swing(self.after_p5_ms, self.after_p95_ms)

    @property
    def callee_swing_ms(self) -> float | None:
        """``callee_p95_ms - callee_p5_ms`` (ms): how much the time the called requests cover
        swings."""
        return _swing(self.callee_p5_ms, self.callee_p95_ms)


def _swing(p5_ms: float | None, p95_ms: float | None) -> float | None:
    return None if p5_ms is None or p95_ms is None else p95_ms - p5_ms


@dataclass
class Recording:
    """What a loader produced: spans, metric points, and readable problems met on the way.

    ``problems`` are messages such as ``"traces.jsonl:12: not JSON (...)"``; the loader kept going.
    ``calls_left_out``: set by ``--service`` (:func:`otel_stages.analysis.services.pick_service`),
    the stages of the picked requests that call requests it left out, most calls first.
    """

    spans: list[Span] = field(default_factory=list)
    metrics: list[MetricPoint] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    calls_left_out: list[Call] = field(default_factory=list)

    def extend(self, other: Recording) -> None:
        """Append another load's spans, points and problems to this one (in place)."""
        self.spans.extend(other.spans)
        self.metrics.extend(other.metrics)
        self.problems.extend(other.problems)


