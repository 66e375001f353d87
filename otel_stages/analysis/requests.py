"""Group stage spans into requests.

A *request* is the parent span of the stage spans (DESIGN.md section 2). Stage spans are found by
name: the standard stage names (``semconv.STANDARD_STAGES``), plus every sibling of those (custom
stages), plus the children of spans named ``semconv.SPAN_REQUEST``. Attributes are never needed to
find a request; they only add detail (image size, ``request.seq``, ``request.cold_start``).

When the parent span is absent (not exported, dropped, or in another file), stage spans whose
parent is missing are grouped by trace id and the request's total is the first stage start to the
last stage end.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from otel_stages import semconv
from otel_stages.analysis.model import AttributeValue, Span

_STANDARD = frozenset(semconv.STANDARD_STAGES)


@dataclass(frozen=True)
class Request:
    """One inference request, built from its stage spans.

    ``span_id`` is the request span's id (``None`` when that span is missing). ``total_ms`` is the
    request span's duration, else first stage start .. last stage end. ``stages_ms`` maps stage
    name -> ms (a repeated stage name is summed). ``image_width``/``image_height`` are pixels and
    ``image_bytes`` encoded bytes, read from stage spans (then the request span), ``None`` when
    absent. ``seq`` is ``request.seq`` or the 1-based order within the process. ``cold`` marks the
    first request of a process (see :func:`find_requests`). ``spans`` are the stage spans.
    """

    trace_id: str
    span_id: str | None
    start_ns: int
    total_ms: float
    stages_ms: dict[str, float]
    image_width: int | None = None
    image_height: int | None = None
    image_bytes: int | None = None
    error: bool = False
    seq: int | None = None
    cold: bool = False
    resource: dict[str, AttributeValue] = field(default_factory=dict)
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    spans: tuple[Span, ...] = ()

    @property
    def pixels(self) -> int | None:
        """Image width * height in pixels, or ``None`` when either is unknown."""
        if self.image_width is None or self.image_height is None:
            return None
        return self.image_width * self.image_height

    def stage_attribute(self, stage: str, key: str) -> AttributeValue:
        """The attribute ``key`` of the first span of ``stage`` that has it, else ``None``."""
        for span in self.spans:
            if span.name == stage and key in span.attributes:
                return span.attributes[key]
        return None

    def stage_windows_ns(self, stage: str) -> list[tuple[int, int]]:
        """``(start_ns, end_ns)`` of every span of ``stage`` in this request."""
        return [(s.start_ns, s.end_ns) for s in self.spans if s.name == stage]


def process_key(resource: dict[str, AttributeValue]) -> str:
    """The process a resource belongs to: ``service.instance.id``, else ``service.name``, else ``""``."""
    for key in (semconv.SERVICE_INSTANCE_ID, semconv.SERVICE_NAME):
        value = resource.get(key)
        if value not in (None, ""):
            return f"{key}={value}"
    return ""


def find_requests(spans: Iterable[Span]) -> list[Request]:
    """Group ``spans`` into :class:`Request` records, sorted by start time.

    Duplicate spans (same trace and span id) count once. Cold requests: where any request of a
    process carries ``request.cold_start``, that attribute decides; else where requests carry
    ``request.seq``, seq 1 is cold; else the earliest request of each process (keyed by
    ``service.instance.id``, else ``service.name``) is cold. So a file that starts mid-process
    (no seq 1) has no cold request.
    """
    by_id: dict[tuple[str, str], Span] = {}
    for span in spans:
        by_id.setdefault((span.trace_id, span.span_id), span)
    unique = list(by_id.values())
    children: dict[tuple[str, str], list[Span]] = defaultdict(list)
    for span in unique:
        if span.parent_span_id is not None:
            children[(span.trace_id, span.parent_span_id)].append(span)

    groups: dict[tuple[str, str | None], list[Span]] = {}
    for parent_key, kids in children.items():
        parent = by_id.get(parent_key)
        if parent is not None and parent.name in _STANDARD:
            continue  # detail spans nested inside a stage, not a request
        named_request = parent is not None and parent.name == semconv.SPAN_REQUEST
        if not named_request and not any(k.name in _STANDARD for k in kids):
            continue
        if parent is not None:
            groups[parent_key] = kids
        else:  # parent not exported: fall back to the trace
            groups.setdefault((parent_key[0], None), []).extend(kids)
    for span in unique:  # stage spans that are roots themselves: one request per trace
        if span.parent_span_id is None and span.name in _STANDARD:
            groups.setdefault((span.trace_id, None), []).append(span)

    requests = [
        _build(by_id.get(key) if key[1] is not None else None, key[0], kids)
        for key, kids in groups.items()
    ]
    requests.sort(key=lambda r: (r.start_ns, r.trace_id))
    return _mark_cold(requests)


def _first_int(spans: Sequence[Span], key: str) -> int | None:
    for span in spans:
        value = span.attributes.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return None


def _build(request_span: Span | None, trace_id: str, kids: list[Span]) -> Request:
    kids = sorted(kids, key=lambda s: (s.start_ns, s.name))
    stages_ms: dict[str, float] = {}
    for span in kids:
        stages_ms[span.name] = stages_ms.get(span.name, 0.0) + span.duration_ms
    if request_span is not None:
        start_ns, total_ms = request_span.start_ns, request_span.duration_ms
        attributes, resource = dict(request_span.attributes), request_span.resource
    else:
        start_ns = kids[0].start_ns
        total_ms = (max(s.end_ns for s in kids) - start_ns) / 1e6
        attributes, resource = {}, kids[0].resource
    # image attributes: decode span first (its contract), then any stage, then the request span
    ordered = sorted(kids, key=lambda s: s.name != semconv.STAGE_DECODE)
    if request_span is not None:
        ordered.append(request_span)
    seq = attributes.get(semconv.REQUEST_SEQ)
    return Request(
        trace_id=trace_id,
        span_id=request_span.span_id if request_span is not None else None,
        start_ns=start_ns,
        total_ms=total_ms,
        stages_ms=stages_ms,
        image_width=_first_int(ordered, semconv.IMAGE_WIDTH),
        image_height=_first_int(ordered, semconv.IMAGE_HEIGHT),
        image_bytes=_first_int(ordered, semconv.IMAGE_SIZE),
        error=any(s.error for s in kids) or bool(request_span and request_span.error),
        seq=int(seq) if isinstance(seq, int) and not isinstance(seq, bool) else None,
        resource=dict(resource),
        attributes=attributes,
        spans=tuple(kids),
    )


def _mark_cold(requests: list[Request]) -> list[Request]:
    by_process: dict[str, list[int]] = defaultdict(list)
    for i, req in enumerate(requests):
        by_process[process_key(req.resource)].append(i)
    out = list(requests)
    for indices in by_process.values():
        group = [requests[i] for i in indices]
        flags = [r.attributes.get(semconv.REQUEST_COLD_START) for r in group]
        if any(isinstance(f, bool) for f in flags):
            cold = [f is True for f in flags]
        elif any(r.seq is not None for r in group):
            cold = [r.seq == 1 for r in group]  # no seq 1 here: the run started before the file
        else:
            cold = [i == 0 for i in range(len(group))]  # already sorted by start time
        for order, (i, req, is_cold) in enumerate(zip(indices, group, cold), start=1):
            out[i] = replace(req, cold=is_cold, seq=req.seq if req.seq is not None else order)
    return out
