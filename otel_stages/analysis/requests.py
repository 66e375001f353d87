"""Group stage spans into requests; count what cannot be a request as incomplete.

A *request* is the parent span of the stage spans (DESIGN.md section 2). Stage spans are found by
name: the standard stage names (``semconv.STANDARD_STAGES``), plus every sibling of those (custom
stages), plus the children of spans named ``semconv.SPAN_REQUEST``. Attributes are never needed to
find a request; they only add detail (image size, ``request.seq``, ``request.cold_start``).

A custom stage that itself holds stage spans (``request -> preprocess -> decode, resize``) is a
*group*, not a request: the request is the outermost parent reached by walking up from the stage
spans through custom stages only. The group's leaf stage spans count toward that request; the
group's own span is not a stage row (its time is its children's; time inside the group but outside
its children is untraced time, like gaps in the request span). Spans named ``request`` are never a
group, and the walk stops at any span that is not a stage (an HTTP server span above the request
span, another service's span), so requests stay apart.

*Incomplete*: stage spans whose parent span never arrived (lost context, spans dropped by a full
export queue, fire-and-forget work, a file not read) and stage spans at the root of their trace
(no request span above them) are never requests: they are counted as :class:`Incomplete` and
named in ``problems``. Their times would otherwise enter the statistics as requests of their own.

Per request, each stage span counts only for the part that lies inside the request span (work
that outlives its request is not request latency); ``unaccounted_ms`` is the request time covered
by no stage span. Stages that stick out of their request, or overlap each other (so that their
shares add up to more than the request), are named in ``problems`` (for a request a stage map
made, by the map: :mod:`otel_stages.analysis.stage_map_checks` names the map's stages); stage
spans that lie wholly outside their request span (count 0 ms) are named apart, with clock skew
between hosts as the likely cause.

Span names that carry per-request data are handled by :mod:`otel_stages.analysis.naming`.
Everything here is linear in the number of spans (plus a sort of each request's few stages).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import msgspec

from otel_stages import semconv
from otel_stages.analysis.clickhouse_rows import go_float
from otel_stages.analysis.image_formats import canonical_format
from otel_stages.analysis.model import AttributeValue, Span
from otel_stages.analysis.naming import Naming, per_request_names
from otel_stages.analysis.span_issues import (
    OVERLAP_TOLERANCE_MS,
    IdClashes,
    StageIssues,
    same_span,
)

_STANDARD = frozenset(semconv.STANDARD_STAGES)
_MAPPED = semconv.STAGE_MAP_SOURCE



class Request(msgspec.Struct, frozen=True, gc=False):
    """One inference request, built from its request span and stage spans.

    ``span_id`` is the request span's id; ``total_ms`` its duration. ``stages_ms`` maps stage
    name -> ms inside the request span (a repeated stage name is summed; groups are left out, their
    children counted). ``unaccounted_ms`` is request time covered by no stage span.
    ``image_width``/``image_height`` are pixels and ``image_bytes`` encoded bytes,
    ``image_format`` the Pillow format and ``prompt_tokens`` the prompt length in tokens, read from
    stage spans (decode first), then groups, then the request span; ``None`` when absent (or 0
    or less). ``seq`` is ``request.seq`` from the request span, ``None`` without one (or 0 or
    less; never invented). ``cold``
    marks the first request of a process (see :func:`find_requests`). ``spans`` are the leaf stage
    spans (renamed where their names were per-request), ``groups`` the custom stage spans that
    hold other stage spans.
    """

    trace_id: str
    span_id: str
    start_ns: int
    total_ms: float
    stages_ms: dict[str, float]
    unaccounted_ms: float = 0.0
    image_width: int | None = None
    image_height: int | None = None
    image_bytes: int | None = None
    image_format: str | None = None
    prompt_tokens: int | None = None
    error: bool = False
    seq: int | None = None
    cold: bool = False
    resource: dict[str, AttributeValue] = msgspec.field(default_factory=dict)
    attributes: dict[str, AttributeValue] = msgspec.field(default_factory=dict)
    spans: tuple[Span, ...] = ()
    groups: tuple[Span, ...] = ()
    #: failed: the request span's status is ERROR (stage errors the service caught do not count)
    #: for a failed request: ``error.type`` of the request span or a failed stage span, else the
    #: ``exception.type`` of an exception event on them (OTel semantic conventions); else ``None``
    error_type: str | None = None
    #: tokens generated (``semconv.OUTPUT_TOKENS_NAMES``: vLLM's completion tokens), ``None``
    #: when absent; a language model's work grows with it as with the prompt
    output_tokens: int | None = None
    #: the most a standard stage span ends after the request span, ms (0 when none does): a request
    #: span that closes before its work (a streamed response), or a stage on a clock ahead
    after_ms: float = 0.0
    #: the most a standard stage span starts before the request span, ms (0 when none does): a
    #: stage on a clock behind the request's, or a request span started after its work began
    before_ms: float = 0.0

    @property
    def end_ns(self) -> int:
        """End of the request span, ns."""
        return self.start_ns + round(self.total_ms * 1e6)

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


@dataclass(frozen=True)
class Incomplete:
    """Stage spans that belong to no request: ``missing_parent_id`` is the id of the parent that
    never arrived (``None``: the stage spans are roots of their trace). ``stages`` their names,
    ``duration_ms`` first start to last end, ``process`` the :func:`process_key` of their resource."""

    trace_id: str
    missing_parent_id: str | None
    stages: tuple[str, ...]
    duration_ms: float
    process: str = ""


@dataclass
class Grouping:
    """What :func:`group_spans` found: ``requests`` sorted by start, ``incomplete`` units and
    ``problems`` (sentences about incomplete traces, naming, overlapping or out-of-parent stages)."""

    requests: list[Request]
    incomplete: list[Incomplete] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: requests with a stage span wholly outside their request span (clock skew between hosts)
    detached_requests: int = 0
    #: the counts and examples behind the stage and span-id sentences of ``problems``
    issues: StageIssues = field(default_factory=StageIssues)
    clashes: IdClashes = field(default_factory=IdClashes)


def process_key(resource: dict[str, AttributeValue]) -> str:
    """The process a resource belongs to, as ``key=value`` parts joined by commas (those set;
    ``""`` with none): ``service.namespace``, ``service.name``, then ``service.instance.id``, or
    without one ``host.name`` and ``process.pid``. So
    ``service.name=svc-x,service.instance.id=pod-7``,
    ``service.namespace=shop,service.name=svc-x,service.instance.id=pod-7``,
    ``service.name=svc-x,host.name=gpu-1``, or ``service.name=svc-x,host.name=gpu-1,process.pid=41``.

    OpenTelemetry's resource conventions make ``service.instance.id`` unique per instance of one
    ``(service.namespace, service.name)`` pair: the triplet is the process, and two services may
    share an instance id (a pod name or ``$HOSTNAME`` used by both containers of a pod), so the
    id alone would fold them into one run with one cold start. Servers that do not set it (one
    process per host) are told apart by their host, so two hosts' processes of one service keep
    their own cold starts and GPUs, and by their ``process.pid`` where it is set (a server's
    worker processes on one host, gunicorn's, each load the model and pay their own cold start;
    OpenTelemetry's Java and Node SDKs set it by default). The ClickHouse SQL writes the same key
    (:func:`otel_stages.analysis.clickhouse_sql.process_label`).
    """
    instance = resource.get(semconv.SERVICE_INSTANCE_ID)
    last = ((semconv.HOST_NAME, semconv.PROCESS_PID) if instance in (None, "")
            else (semconv.SERVICE_INSTANCE_ID,))
    return ",".join(f"{key}={attribute_text(value)}"
                    for key in (semconv.SERVICE_NAMESPACE, semconv.SERVICE_NAME, *last)
                    if (value := resource.get(key)) not in (None, ""))


def attribute_text(value: AttributeValue) -> str:
    """A resource attribute as text, as the Collector's ClickHouse exporter stores it
    (``pcommon.Value.AsString``: ``true`` / ``false`` for booleans, a double in ES6 form, so a
    ``process.pid`` sent as ``4100.0`` is ``4100``), so that the file report and the ClickHouse
    report name a process alike, and a process's spans and metric points whose resources write
    one number as an int and a double are one process."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_float(value)
    return str(value)


def process_keys(requests: Iterable[Request]) -> list[str]:
    """:func:`process_key` of each request's resource, in order; computed once per distinct
    resource (loaders share one resource dict per process)."""
    known: dict[int, str] = {}
    out = []
    for req in requests:
        resource = req.resource
        key = known.get(id(resource))
        if key is None:
            key = known[id(resource)] = process_key(resource)
        out.append(key)
    return out


def find_requests(spans: Iterable[Span]) -> list[Request]:
    """The requests of :func:`group_spans` (incomplete units and problems dropped)."""
    return group_spans(spans).requests


def group_spans(spans: Iterable[Span]) -> Grouping:
    """Group ``spans`` into :class:`Request` records (sorted by start) and :class:`Incomplete`
    units, with problems. Duplicate spans (same trace and span id) count once; where the
    duplicates differ (another name, parent or times) the ids clash, and ``problems`` says so.

    Cold requests: where any request of a process carries ``request.cold_start``, that attribute
    decides; else where requests carry ``request.seq``, seq 1 is cold; else the earliest request
    of each process (:func:`process_key`: its service and ``service.instance.id``, else its
    service and ``host.name``) is cold. So a file that starts mid-process (no seq 1) has no cold
    request. Never raises.

    Linear: spans are bucketed by trace (a request and its stages share a trace, so in whatever
    order lines and files hold them they meet there), and each trace is grouped with small dicts
    of its own, freed as soon as it is done.
    """
    by_trace: dict[str, list[Span]] = {}
    for span in spans:
        bucket = by_trace.get(span.trace_id)
        if bucket is None:
            by_trace[span.trace_id] = [span]
        else:
            bucket.append(span)
    units: list[_Unit] = []
    roots: list[Span] = []
    clashes = IdClashes()
    for bucket in by_trace.values():
        _trace_units(bucket, units, roots, clashes)
    del by_trace
    naming = per_request_names([k for unit in units for k in unit[2]])

    out = Grouping(requests=[], problems=[*naming.problems, *clashes.problems()])
    issues = StageIssues()
    mapped = StageIssues()  # stage-map requests: the map names their overlaps and stick-outs
    orphans: list[Incomplete] = []
    for trace_id, request_id, leaves, groups, request_span in units:
        named = _renamed(leaves, naming)
        if not named:
            continue
        if request_span is None:
            orphans.append(_incomplete(trace_id, request_id, named + groups))
        elif (trace_id, request_id) in clashes.ids:  # merged requests: their stages stick out
            out.requests.append(_build(request_span, named, groups, StageIssues()))
        else:
            out.requests.append(_build(request_span, named, groups,
                                       mapped if _MAPPED in named[0].attributes else issues))
    issues.add_detached(mapped)
    out.incomplete = orphans + [_incomplete(s.trace_id, None, [s]) for s in roots]
    out.requests.sort(key=_by_start)
    out.requests = _mark_cold(out.requests)
    out.problems.extend(_incomplete_problems(out.incomplete))
    out.problems.extend(issues.problems())
    out.detached_requests = issues.detached_requests
    out.issues, out.clashes = issues, clashes
    return out


# (trace id, request span id, leaf stage spans, group spans, the request span or None: never read)
_Unit = tuple[str, str, list[Span], list[Span], "Span | None"]
#: (requests of one trace started in the same nanosecond: by span id, as the SQL orders them)
_by_start = attrgetter("start_ns", "trace_id", "span_id")


def _trace_units(spans: list[Span], units: list[_Unit], roots: list[Span], clashes: IdClashes) -> None:
    """The requests (and would-be requests whose span never arrived) of one trace into ``units``,
    its stage spans without any parent into ``roots``; span ids used by two different spans are
    counted in ``clashes``."""
    by_id = {s.span_id: s for s in reversed(spans)}  # the first of duplicates wins
    if len(by_id) != len(spans):  # duplicates: keep the first of each, in order
        first: dict[str, Span] = {}
        for span in spans:
            kept = first.setdefault(span.span_id, span)
            if kept is not span and not same_span(kept, span):
                clashes.add(kept, span)
        spans = list(first.values())
    children: dict[str, list[Span]] = {}
    top: list[Span] = []
    for span in spans:
        parent_id = span.parent_span_id
        if parent_id is None:
            if span.name in _STANDARD:
                top.append(span)
            continue
        kids = children.get(parent_id)
        if kids is None:
            children[parent_id] = [span]
        else:
            kids.append(span)

    # stage parents: spans (present or not) whose children are stage spans
    parents: dict[str, list[Span]] = {}
    for parent_id, kids in children.items():
        parent = by_id.get(parent_id)
        if parent is not None:
            if parent.name in _STANDARD:
                continue  # detail spans nested inside a stage, not a request
            if parent.name == semconv.SPAN_REQUEST:
                parents[parent_id] = kids
                continue
        for kid in kids:
            if kid.name in _STANDARD or kid.attributes.get(semconv.STAGE_NAME) in _STANDARD:
                parents[parent_id] = kids
                break
    if top:
        roots.extend(s for s in top if s.span_id not in parents)
    if not parents:
        return
    trace_id = spans[0].trace_id
    if len(parents) == 1:  # the usual trace: one request span (or its missing id) and its stages
        ((parent_id, kids),) = parents.items()
        parent = by_id.get(parent_id)
        if parent is not None and parent.parent_span_id == parent_id:  # a span its own parent
            kids = [k for k in kids if k.span_id != parent_id]
        units.append((trace_id, parent_id, kids, [], parent))
        return

    # each stage parent belongs to the request found by walking up through groups
    members: dict[str, tuple[list[Span], list[Span]]] = {}
    for parent_id, kids in parents.items():
        root = _owner(parent_id, by_id, parents)
        entry = members.get(root)
        if entry is None:
            entry = members[root] = ([], [])
        entry[0].extend(k for k in kids if k.span_id not in parents)
        if root != parent_id:
            entry[1].append(by_id[parent_id])
    for root, (leaves, groups) in members.items():
        units.append((trace_id, root, leaves, groups, by_id.get(root)))


def trace_members(spans: list[Span]) -> list[tuple[Span | None, list[Span]]]:
    """The requests of one trace's ``spans`` as :func:`group_spans` finds them, each as its
    request span (``None`` when it never arrived: an incomplete unit) and its members: its stage
    spans (as recorded, before any per-request renaming) and its custom stage groups. Spans of no
    request (an HTTP server span above a request, stage spans at the trace's root) are in none.
    Linear in the spans; never raises."""
    units: list[_Unit] = []
    _trace_units(spans, units, [], IdClashes())
    return [(request_span, [*leaves, *groups]) for _, _, leaves, groups, request_span in units]


def _renamed(leaves: list[Span], naming: Naming) -> list[Span]:
    if not naming.renamed:
        return leaves
    out = []
    for span in leaves:
        name = naming.name_of(span)
        if name is not None:
            out.append(span if name == span.name else msgspec.structs.replace(span, name=name))
    return out


def _incomplete(trace_id: str, missing: str | None, spans: Sequence[Span]) -> Incomplete:
    start = min(s.start_ns for s in spans)
    end = max(s.end_ns for s in spans)
    names = tuple(sorted({s.name for s in spans}))
    return Incomplete(trace_id, missing, names, (end - start) / 1e6, process_key(spans[0].resource))


def orphans_line(count: int, example: Incomplete) -> str:
    """The sentence for ``count`` units whose parent span never arrived, naming ``example``."""
    from otel_stages.analysis.units import duration

    return (
        f"{count} incomplete trace{'s' if count != 1 else ''} left out: stage spans"
        " whose parent span never arrived (lost context, spans dropped by a full export queue,"
        " fire-and-forget work, or a file not read); counted under counts.incomplete, not as"
        f" requests (e.g. trace {example.trace_id}: {', '.join(example.stages)},"
        f" {duration(example.duration_ms)})"
    )


def roots_line(count: int, example: Incomplete) -> str:
    """The sentence for ``count`` stage spans at the root of their trace, naming ``example``."""
    return (
        f"{count} stage span{'s' if count != 1 else ''} with no request span above"
        " (root of the trace) left out as incomplete: wrap each request's stages in"
        f" otel_stages.request() (e.g. trace {example.trace_id}: {', '.join(example.stages)})"
    )


def _incomplete_problems(units: list[Incomplete]) -> list[str]:
    problems = []
    orphans = [u for u in units if u.missing_parent_id is not None]
    if orphans:
        problems.append(orphans_line(len(orphans), orphans[0]))
    roots = [u for u in units if u.missing_parent_id is None]
    if roots:
        problems.append(roots_line(len(roots), roots[0]))
    return problems


def _owner(span_id: str, by_id: dict[str, Span], parents: dict[str, list[Span]]) -> str:
    """The request a stage parent belongs to (span ids of one trace): walk up while the span is a
    custom stage (a child of another stage parent) that is not named ``request``; stop at
    anything else."""
    seen: set[str] = set()
    while span_id not in seen:
        seen.add(span_id)
        span = by_id.get(span_id)
        if span is None or span.name == semconv.SPAN_REQUEST or span.parent_span_id is None:
            return span_id
        if span.parent_span_id not in parents:
            return span_id
        span_id = span.parent_span_id
    return span_id  # a parent cycle (malformed ids): stop where it closes


#: Integer attributes outside a signed 64-bit int are unusable (absent): OTLP's ``intValue`` is
#: an int64, and ClickHouse's ``toInt64OrZero`` reads such values (and NaN, infinities,
#: fractions) as absent too, so both reports see the same inputs.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


#: A number written as text, as ClickHouse's ``toInt64OrNull`` / ``toFloat64OrNull`` read it: the
#: Collector's ``clickhouse`` exporter stores every attribute as text (``Map(String, String)``),
#: so the SQL reads ``"1280"`` as 1280 whatever its OTLP type; the file report reads such text
#: alike (:func:`usable_int`, :func:`usable_float`), so both give one answer. ASCII digits only,
#: no spaces, no ``_`` (which Python's ``int()`` would take).
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def usable_int(value: object) -> int | None:
    """``value`` as an int: an int in the int64 range, a finite whole float in it, or text of an
    int in it (:data:`_INT_TEXT`: ``"1280"``, ``"+5"``); ``None`` for anything else (bools, NaN,
    infinities, fractions, huge numbers, other text)."""
    if isinstance(value, str) and _INT_TEXT.fullmatch(value):
        value = int(value)
    if type(value) is int:
        return value if INT64_MIN <= value <= INT64_MAX else None
    if isinstance(value, float) and value.is_integer() and INT64_MIN <= value < 2.0**63:
        return int(value)
    return None


def usable_float(value: object) -> float | None:
    """``value`` as a finite float: an int or float (not a bool), or text of a number
    (:data:`_FLOAT_TEXT`: ``"0.93"``, ``"1e3"``); ``None`` for anything else."""
    if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value):
        value = float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def usable_bool(value: object) -> bool | None:
    """``value`` as a bool: a bool, or the text ``"true"`` / ``"false"`` (how the ``clickhouse``
    exporter stores a bool, and how the SQL reads it); ``None`` for anything else."""
    if isinstance(value, bool):
        return value
    return {"true": True, "false": False}.get(value) if isinstance(value, str) else None


def positive_int(value: object) -> int | None:
    """``value`` as an int above 0 (:func:`usable_int`), else ``None``: image sizes in pixels and
    bytes, and ``request.seq`` (1-based), where 0 or less cannot be real and the SQL reads it as
    unknown too."""
    number = usable_int(value)
    return number if number is not None and number > 0 else None


def _first_int(attributes: Sequence[dict[str, AttributeValue]], key: str,
               read: Callable[[object], int | None] = usable_int) -> int | None:
    """The first int under ``key`` in ``attributes`` that ``read`` (:func:`usable_int`,
    :func:`positive_int`) accepts."""
    for attrs in attributes:
        value = read(attrs.get(key))
        if value is not None:
            return value
    return None


#: An ``image.format``: a name (Pillow's ``JPEG``, ``png``, a MIME type ``image/webp``); a number,
#: an array, a bool or NaN written as text (the ClickHouse exporter's text of a non-string value:
#: ``3``, ``["png"]``, ``true``) is none, in both reports
#: (:func:`otel_stages.analysis.clickhouse_sql.format_text` in the SQL).
FORMAT_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9_.+/-]*")
#: Text of non-string values that :data:`FORMAT_TEXT` would take.
NOT_FORMATS = ("true", "false", "NaN")
#: What the library's own decode span writes when Pillow names no format
#: (:func:`otel_stages.imaging.decode`), any case: no format (one cohort with the requests that
#: recorded none).
NO_FORMAT = "UNKNOWN"


#: The blanks left out around a format (ASCII whitespace: a ``file --mime-type`` line's newline),
#: as the SQL's ``trimBoth`` does (:func:`otel_stages.analysis.clickhouse_sql.format_text`).
FORMAT_BLANKS = " \t\n\r\x0b\x0c"


def usable_format(value: object) -> str | None:
    """``value`` as an image format (:data:`FORMAT_TEXT`, not :data:`NOT_FORMATS`), named as
    Pillow names it (:func:`~otel_stages.analysis.image_formats.canonical_format`: ``image/jpeg``
    and ``jpeg`` read as ``JPEG``), else ``None`` (:data:`NO_FORMAT` too); a MIME type's
    parameters (``image/jpeg; q=0.9``) and surrounding blanks are left out first. The one place
    the file report reads a format, as :func:`otel_stages.analysis.clickhouse_sql.format_text`
    is in the SQL."""
    if not isinstance(value, str):
        return None
    value = value.split(";", 1)[0].strip(FORMAT_BLANKS)
    if FORMAT_TEXT.fullmatch(value) and value not in NOT_FORMATS and value.upper() != NO_FORMAT:
        return canonical_format(value)
    return None


def _first_format(attributes: Sequence[dict[str, AttributeValue]], key: str) -> str | None:
    """The first usable format (:func:`usable_format`) under ``key`` in ``attributes``."""
    for attrs in attributes:
        value = usable_format(attrs.get(key))
        if value is not None:
            return value
    return None


_WIDTH, _HEIGHT, _SIZE, _FORMAT, _TOKENS = (semconv.IMAGE_WIDTH, semconv.IMAGE_HEIGHT,
                                            semconv.IMAGE_SIZE, semconv.IMAGE_FORMAT,
                                            semconv.PROMPT_TOKENS)


def _inputs(attributes: list[dict[str, AttributeValue]]
            ) -> tuple[int | None, int | None, int | None, str | None, int | None]:
    """Image width, height, bytes, format and prompt tokens: each the first usable value in
    ``attributes`` (:func:`_first_int`, :func:`_first_format`; sizes above 0, :func:`positive_int`).
    The dicts merged, the first one's value winning, answer the usual case at once; an odd value
    (a float, a bool, an explicit None, an empty format, an int past int64 or not above 0) sends
    that key through the walk over the dicts."""
    merged: dict[str, AttributeValue] = {}
    for attrs in reversed(attributes):
        merged.update(attrs)
    get = merged.get
    width, height, size, image_format, tokens = (get(_WIDTH), get(_HEIGHT), get(_SIZE),
                                                 get(_FORMAT), get(_TOKENS))
    if (type(width) is not int or not 0 < width <= INT64_MAX) and (width is not None
                                                                   or _WIDTH in merged):
        width = _first_int(attributes, _WIDTH, positive_int)
    if (type(height) is not int or not 0 < height <= INT64_MAX) and (height is not None
                                                                     or _HEIGHT in merged):
        height = _first_int(attributes, _HEIGHT, positive_int)
    if (type(size) is not int or not 0 < size <= INT64_MAX) and (size is not None
                                                                 or _SIZE in merged):
        size = _first_int(attributes, _SIZE, positive_int)
    usable = usable_format(image_format)
    if usable is None and (image_format is not None or _FORMAT in merged):
        image_format = _first_format(attributes, _FORMAT)
    elif usable is not None:
        image_format = usable  # without a MIME type's parameters
    if (type(tokens) is not int or not INT64_MIN <= tokens <= INT64_MAX) and (tokens is not None
                                                                              or _TOKENS in merged):
        tokens = _first_int(attributes, _TOKENS)
    return width, height, size, image_format, tokens


# ties by span id: two decode spans starting together give the same image size here and in the SQL
_by_start_name = attrgetter("start_ns", "name", "span_id")


def _build(request_span: Span, leaves: list[Span], groups: list[Span], issues: StageIssues) -> Request:
    """One request from its span and stage spans (``leaves`` is sorted in place)."""
    leaves.sort(key=_by_start_name)
    if len(groups) > 1:
        groups = sorted(groups, key=_by_start_name)
    lo, hi = request_span.start_ns, request_span.end_ns
    stages_ms: dict[str, float] = {}
    covered = 0
    inside_sum = 0
    cursor, cursor_name = lo, ""
    worst_outside, example = 0, ""
    worst_after = 0
    worst_before = 0
    detached = 0
    # Failed when the request span says so (the exception escaped request(), or record_error):
    # a stage error the service caught and answered anyway (a retried download, a cancelled
    # sub-task) leaves the request a success, with the failed attempt's time in its stages.
    error = request_span.error
    # where the image attributes come from: decode spans first (their contract), then the other
    # stages in time order, groups, the request span
    attributes: list[dict[str, AttributeValue]] = []
    others: list[dict[str, AttributeValue]] = []
    for span in leaves:  # runs once per span of a million: min()/max() calls spelled out
        span_start, span_end, name = span.start_ns, span.end_ns, span.name
        if span.attributes:
            (attributes if name == semconv.STAGE_DECODE else others).append(span.attributes)
        start = span_start if span_start > lo else lo
        end = span_end if span_end < hi else hi
        inside = end - start if end > start else 0
        outside = (span_end - span_start) - inside
        if inside == 0 and outside > 0 and (span_start >= hi or span_end <= lo):
            # wholly outside: not a stage that outlived its request but one on another clock
            detached += 1
            if not issues.detached_example:
                off = (span_start - hi) if span_start >= hi else (lo - span_end)
                where = "after the request ended" if span_start >= hi else "before the request began"
                issues.detached_example = (f"{name} in trace {span.trace_id}"
                                           f" {'starts' if span_start >= hi else 'ends'}"
                                           f" {off / 1e6:.1f} ms {where}")
            outside = 0
        if span_end - hi > worst_after and name in _STANDARD:  # wholly after too: streamed on
            worst_after = span_end - hi  # (custom stages after the answer are work after it)
        if lo - span_start > worst_before and name in _STANDARD:  # wholly before too: a clock behind
            worst_before = lo - span_start
        if outside > worst_outside:
            worst_outside = outside
            example = f"{name} in trace {span.trace_id}"
        before = stages_ms.get(name)
        stages_ms[name] = inside / 1e6 if before is None else before + inside / 1e6
        if inside == 0:
            continue
        inside_sum += inside
        if start < cursor and (cursor - start) / 1e6 > OVERLAP_TOLERANCE_MS and not issues.overlap_example:
            issues.overlap_example = f"{cursor_name} and {name} in trace {span.trace_id}"
        covered += end - (start if start > cursor else cursor) if end > cursor else 0
        if end > cursor:
            cursor, cursor_name = end, name
    if detached:
        issues.detached += detached
        issues.detached_requests += 1
    if worst_outside / 1e6 > OVERLAP_TOLERANCE_MS:
        issues.outside += 1
        if worst_outside / 1e6 > issues.outside_max_ms:
            issues.outside_max_ms, issues.outside_example = worst_outside / 1e6, example
    if (inside_sum - covered) / 1e6 > OVERLAP_TOLERANCE_MS:
        issues.overlap += 1
    total_ms = request_span.duration_ms
    attributes += others
    if groups:
        attributes += [s.attributes for s in groups if s.attributes]
    if request_span.attributes:
        attributes.append(request_span.attributes)
    width, height, size, image_format, tokens = _inputs(attributes)
    if tokens is None:  # vLLM writes the older name (semconv.PROMPT_TOKENS_NAMES)
        tokens = _first_of(attributes, semconv.PROMPT_TOKENS_NAMES[1:])
    seq = request_span.attributes.get(semconv.REQUEST_SEQ)
    return Request(
        request_span.trace_id,
        request_span.span_id,
        lo,
        total_ms,
        stages_ms,
        max(0.0, total_ms - covered / 1e6),
        width,
        height,
        size,
        image_format,
        tokens,
        error,
        positive_int(seq),
        False,
        request_span.resource,
        request_span.attributes,
        tuple(leaves),
        tuple(groups),
        _error_type(request_span, leaves) if error else None,
        _first_of(attributes, semconv.OUTPUT_TOKENS_NAMES),
        worst_after / 1e6,
        worst_before / 1e6,
    )


def _first_of(attributes: Sequence[dict[str, AttributeValue]], names: Sequence[str]) -> int | None:
    """The first usable integer under any of ``names`` (one idea's names, preferred first)."""
    for name in names:
        value = _first_int(attributes, name)
        if value is not None:
            return value
    return None


def _error_type(request_span: Span, leaves: Sequence[Span]) -> str | None:
    """The first ``error.type``, else ``exception.type`` of an exception event, on the request span
    and then its failed stage spans."""
    failed = [request_span, *(s for s in leaves if s.error)]
    for span in failed:
        value = span.attributes.get(semconv.ERROR_TYPE)
        if isinstance(value, str) and value:
            return value
    for span in failed:
        for event in span.events:
            value = event.attributes.get(semconv.EXCEPTION_TYPE)
            if isinstance(value, str) and value:
                return value
    return None


def _mark_cold(requests: list[Request]) -> list[Request]:
    by_process: dict[str, list[int]] = defaultdict(list)
    for i, key in enumerate(process_keys(requests)):
        by_process[key].append(i)
    out = list(requests)
    for indices in by_process.values():
        group = [requests[i] for i in indices]
        flags = [usable_bool(r.attributes.get(semconv.REQUEST_COLD_START)) for r in group]
        if any(f is not None for f in flags):
            cold = [f is True for f in flags]
        elif any(r.seq is not None for r in group):
            cold = [r.seq == 1 for r in group]  # no seq 1 here: the run started before the file
        else:
            cold = [i == 0 for i in range(len(group))]  # already sorted by start time
        for i, is_cold in zip(indices, cold):
            if is_cold:
                out[i] = msgspec.structs.replace(requests[i], cold=True)
    return out
