"""Group stage spans into requests.

A *request* is the parent span of the stage spans (DESIGN.md section 2). Stage spans are found by
name: the standard stage names (``semconv.STANDARD_STAGES``), plus every sibling of those (custom
stages), plus the children of spans named ``semconv.SPAN_REQUEST``. Attributes are never needed to
find a request; they only add detail (image size, ``request.seq``, ``request.cold_start``).

A custom stage that itself holds stage spans (``request -> preprocess -> decode, resize``) is a
*group*, not a request: the request is the outermost parent reached by walking up from the stage
spans through custom stages only (a custom stage is a sibling of a standard stage or a child of a
``request`` span, so groups may nest as long as each sits among stage spans). The group's leaf
stage spans count toward that request; the group's own span is not a stage row (its time is its
children's, so shares still add up to the total; time inside the group but outside its children is
untraced time, like gaps in the request span). Spans named ``request`` are never a group, and the
walk stops at any span that is not a stage (an HTTP server span above the request span, another
service's span), so requests stay apart.

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

_Key = tuple[str, str]  # (trace id, span id)


@dataclass(frozen=True)
class Request:
    """One inference request, built from its stage spans.

    ``span_id`` is the request span's id (``None`` when that span is missing). ``total_ms`` is the
    request span's duration, else first stage start .. last stage end. ``stages_ms`` maps stage
    name -> ms (a repeated stage name is summed; groups are left out, their children counted).
    ``image_width``/``image_height`` are pixels and ``image_bytes`` encoded bytes, read from stage
    spans (then groups, then the request span), ``None`` when absent. ``seq`` is ``request.seq``
    from the request span, ``None`` without one (never invented). ``cold`` marks the first request
    of a process (see :func:`find_requests`). ``spans`` are the leaf stage spans, ``groups`` the
    custom stage spans that hold other stage spans.
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
    groups: tuple[Span, ...] = ()

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
    by_id: dict[_Key, Span] = {}
    for span in spans:
        by_id.setdefault((span.trace_id, span.span_id), span)
    children: dict[_Key, list[Span]] = defaultdict(list)
    for span in by_id.values():
        if span.parent_span_id is not None:
            children[(span.trace_id, span.parent_span_id)].append(span)

    # stage parents: spans (present or not) whose children are stage spans
    parents: dict[_Key, list[Span]] = {}
    for key, kids in children.items():
        parent = by_id.get(key)
        if parent is not None and parent.name in _STANDARD:
            continue  # detail spans nested inside a stage, not a request
        if (parent is not None and parent.name == semconv.SPAN_REQUEST) or any(
            k.name in _STANDARD for k in kids
        ):
            parents[key] = kids

    # each stage parent belongs to the request found by walking up through groups
    members: dict[tuple[str, str | None], tuple[list[Span], list[Span]]] = {}
    for key, kids in parents.items():
        root = _owner(key, by_id, parents)
        leaves, groups = members.setdefault(
            root if root in by_id else (root[0], None), ([], [])
        )
        leaves.extend(k for k in kids if (k.trace_id, k.span_id) not in parents)
        if key != root:
            groups.append(by_id[key])
    for span in by_id.values():  # stage spans that are roots themselves: one request per trace
        if span.parent_span_id is None and span.name in _STANDARD:
            members.setdefault((span.trace_id, None), ([], []))[0].append(span)

    requests = [
        _build(by_id.get((key[0], key[1])) if key[1] else None, key[0], leaves, groups)
        for key, (leaves, groups) in members.items()
        if leaves
    ]
    requests.sort(key=lambda r: (r.start_ns, r.trace_id))
    return _mark_cold(requests)


def _owner(key: _Key, by_id: dict[_Key, Span], parents: dict[_Key, list[Span]]) -> _Key:
    """The request a stage parent belongs to: walk up while the span is a custom stage (a child
    of another stage parent) that is not named ``request``; stop at anything else."""
    seen: set[_Key] = set()
    while key not in seen:
        seen.add(key)
        span = by_id.get(key)
        if span is None or span.name == semconv.SPAN_REQUEST or span.parent_span_id is None:
            return key
        up = (span.trace_id, span.parent_span_id)
        if up not in parents:
            return key
        key = up
    return key  # a parent cycle (malformed ids): stop where it closes


def _first_int(spans: Sequence[Span], key: str) -> int | None:
    for span in spans:
        value = span.attributes.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return None


def _build(
    request_span: Span | None, trace_id: str, leaves: list[Span], groups: list[Span]
) -> Request:
    leaves = sorted(leaves, key=lambda s: (s.start_ns, s.name))
    groups = sorted(groups, key=lambda s: (s.start_ns, s.name))
    stages_ms: dict[str, float] = {}
    for span in leaves:
        stages_ms[span.name] = stages_ms.get(span.name, 0.0) + span.duration_ms
    if request_span is not None:
        start_ns, total_ms = request_span.start_ns, request_span.duration_ms
        attributes, resource = dict(request_span.attributes), request_span.resource
    else:
        every = leaves + groups
        start_ns = min(s.start_ns for s in every)
        total_ms = (max(s.end_ns for s in every) - start_ns) / 1e6
        attributes, resource = {}, leaves[0].resource
    # image attributes: decode span first (its contract), then any stage, groups, the request span
    ordered = sorted(leaves, key=lambda s: s.name != semconv.STAGE_DECODE) + groups
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
        error=any(s.error for s in ordered),
        seq=int(seq) if isinstance(seq, int) and not isinstance(seq, bool) else None,
        resource=dict(resource),
        attributes=attributes,
        spans=tuple(leaves),
        groups=tuple(groups),
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
        for i, is_cold in zip(indices, cold):
            out[i] = replace(requests[i], cold=is_cold)  # seq stays None when not recorded
    return out
