"""Stage maps: other servers' traces as otel-stages stages, without re-instrumenting. Pure.

A stage map (a small YAML or JSON file, or a built-in one by name: :data:`BUILTIN`) says which
span is one request and where each stage's time comes from. :func:`apply_stage_map` turns a
:class:`Recording` into one whose requests are ``request`` spans with standard stage children, so
the rest of the analysis (grouping, statistics, verdict) runs unchanged.

File format (every key but ``about``/``layout`` required)::

    name: triton                  # shown in the report
    about: one line on what this maps
    request: InferRequest         # span name, or a list of names: each such span is one request
    layout: end                   # attribute stages: laid back to back ending at the request's
                                  # end (``end``, the default) or starting at its start (``start``)
    stages:                       # in pipeline order; a stage name may repeat (times add up)
      - {stage: queue, from_event: QUEUE_START, to_event: COMPUTE_START}  # between two events
      - {stage: forward, span: compute}                                   # a whole span
      - {stage: queue, attribute: gen_ai.latency.time_in_queue, unit: s}  # a duration attribute
      - {stage: forward, attribute: gen_ai.latency.e2e, minus: gen_ai.latency.time_to_first_token}
      - {stage: input_processing, rest: true}   # the request time the attribute stages leave

A server whose versions write different attributes gets ``variants`` instead of ``stages``: a
list of ``{name, about, layout, stages}``, tried in order for each request; the first whose
attribute stages all find their attributes (and that gives a stage) maps it. The built-in
``vllm`` map has one for vLLM's V1 engine and one for its V0 engine.

Where each kind looks, inside one request (the request span and every span below it):

- ``from_event`` / ``to_event``: every span holding ``from_event`` starts a stage at that event;
  it ends at the first ``to_event`` at or after it on the same span or on one of its direct
  children that does not hold ``from_event`` itself (Triton records ``COMPUTE_START`` on the
  ``compute`` child of the model span that holds ``QUEUE_START``; a nested model's own events
  never close its parent's). A ``from_event`` without its ``to_event``, on a span with no
  child holding ``from_event`` (a Triton ensemble's span has no ``COMPUTE_START``: its steps'
  spans hold the pairs), is a step that started and never finished: the request's stage times
  are unknown, so the request is left out of the timings (neither warm nor failed) and counted
  in a problem, with the rule's ``unfinished`` text saying what that means for the server
  (Triton: cancelled or timed out in the queue, or answered from its response cache, for which
  it records no event and sets no span status, so the trace cannot tell a failure from a hit).
- ``span``: every span of that name becomes the stage (its start and end).
- ``attribute``: a number on the request span, in ``unit`` (``s``, ``ms``, ``us``, ``ns``), less
  the ``minus`` attribute(s) where given (vLLM V0 has only times since arrival, so its prefill is
  ``time_to_first_token - time_in_queue``). Every attribute stage of a variant is required: a
  request without one of them (or with a negative duration) does not match the variant, because
  the missing time would silently land in the ``rest`` stage. A request no variant matches is
  left out and counted in a problem naming the missing attributes.

The mapped request keeps its span id, trace id, attributes and resource; it is renamed
``request`` and widened to cover its stages (Triton receives the request body before it starts
the request span). The spans below it are replaced by the stage spans (ids derived from the
request's), each with ``semconv.STAGE_MAP_SOURCE`` saying where its time came from. A request span
the map gives no stage for is left as it was and named in a problem.

The report lists a map's stages in the map's order (:meth:`StageMap.stage_order`, merged into
the standard order by :func:`otel_stages.analysis.stats.pipeline_order`), not alphabetically.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from otel_stages import semconv
from otel_stages.analysis.model import Recording, Span

#: Built-in maps, by the name ``--stage-map`` takes (files in ``otel_stages/data/stage_maps``).
BUILTIN: tuple[str, ...] = ("triton", "vllm")
#: Nanoseconds per unit of an ``attribute`` stage.
UNIT_NS: dict[str, int] = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
LAYOUTS: tuple[str, ...] = ("end", "start")

_Key = tuple[str, str]
_MAP_KEYS = {"name", "about", "request", "layout", "stages", "variants"}
_VARIANT_KEYS = {"name", "about", "layout", "stages"}
_RULE_KEYS = {"stage", "span", "from_event", "to_event", "attribute", "minus", "unit", "rest",
              "unfinished"}


class StageMapError(ValueError):
    """A stage map that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True)
class StageRule:
    """One ``stages`` entry: exactly one of ``span``, ``from_event``+``to_event``, ``attribute``
    (with ``unit`` and optional ``minus``) or ``rest`` is set. ``unfinished`` (with
    ``from_event``) says what a ``from_event`` without its ``to_event`` means."""

    stage: str
    span: str | None = None
    from_event: str | None = None
    to_event: str | None = None
    attribute: str | None = None
    minus: tuple[str, ...] = ()
    unit: str = "s"
    rest: bool = False
    unfinished: str = ""

    def source(self) -> str:
        """Where this stage's time comes from, for ``semconv.STAGE_MAP_SOURCE``."""
        if self.span:
            return f"span {self.span}"
        if self.from_event:
            return f"events {self.from_event} -> {self.to_event}"
        if self.attribute:
            less = "".join(f" - {m}" for m in self.minus)
            return f"attribute {self.attribute}{less} ({self.unit})"
        return "request time outside the other stages"

    def attributes(self) -> tuple[str, ...]:
        """The request-span attributes this rule reads (empty unless an ``attribute`` stage)."""
        return (self.attribute, *self.minus) if self.attribute else ()


@dataclass(frozen=True)
class Variant:
    """One way the server writes its spans: ``stages`` (pipeline order) laid out by ``layout``."""

    name: str
    stages: tuple[StageRule, ...]
    layout: str = "end"
    about: str = ""


@dataclass(frozen=True)
class StageMap:
    """A parsed stage map (see the module docstring): one or more :class:`Variant`, tried in
    order per request. A map written with plain ``stages`` has one variant named after it."""

    name: str
    request: frozenset[str]
    variants: tuple[Variant, ...]
    about: str = ""

    def attribute_keys(self) -> frozenset[str]:
        """The request-span attributes the ``attribute`` stages read (a loader must keep them)."""
        return frozenset(a for v in self.variants for r in v.stages for a in r.attributes())

    def stage_order(self) -> tuple[str, ...]:
        """The stage names in the map's order (first appearance over the variants), for the
        report's tables."""
        return tuple(dict.fromkeys(r.stage for v in self.variants for r in v.stages))


@dataclass
class MapSummary:
    """What :func:`apply_stage_map` did: requests mapped (and by which variant), request spans
    left as they were, and the problems to show."""

    name: str
    mapped: int = 0
    unmapped: int = 0
    problems: list[str] = field(default_factory=list)
    #: requests mapped per variant name (every variant, 0 where unused); reported for a map with
    #: more than one variant
    by_variant: dict[str, int] = field(default_factory=dict)
    variants: int = 1

    def to_dict(self) -> dict[str, object]:
        """JSON form: ``{"name", "requests_mapped", "requests_unmapped"}``, plus ``"variants"``
        (``{variant name: requests mapped}``, every variant) for a map with more than one."""
        out: dict[str, object] = {
            "name": self.name, "requests_mapped": self.mapped, "requests_unmapped": self.unmapped}
        if self.variants > 1:
            out["variants"] = dict(self.by_variant)
        return out


# --- loading ---------------------------------------------------------------------------------------


def load_stage_map(name_or_path: str) -> StageMap:
    """A built-in map by name (:data:`BUILTIN`) or a YAML/JSON file. Raises :class:`StageMapError`
    naming the file and what is wrong (unreadable, not YAML, a missing or unknown key)."""
    if name_or_path in BUILTIN:
        ref = resources.files("otel_stages") / "data" / "stage_maps" / f"{name_or_path}.yaml"
        return parse_stage_map(ref.read_text(encoding="utf-8"), where=f"built-in map {name_or_path}")
    path = Path(name_or_path)
    if not path.is_file():
        raise StageMapError(
            f"{name_or_path}: no such stage map file (built-in maps: {', '.join(BUILTIN)})"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StageMapError(f"{path}: cannot read ({exc})") from None
    return parse_stage_map(text, where=str(path))


def parse_stage_map(text: str, *, where: str = "stage map") -> StageMap:
    """Parse a stage map's YAML (or JSON, which YAML reads too). Raises :class:`StageMapError`."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise StageMapError(f"{where}: not YAML or JSON ({exc})") from None
    if not isinstance(doc, Mapping):
        raise StageMapError(f"{where}: expected a mapping with name, request and stages")
    unknown = set(doc) - _MAP_KEYS
    if unknown:
        raise StageMapError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        raise StageMapError(f"{where}: 'name' must be a non-empty string")
    request = doc.get("request")
    names = [request] if isinstance(request, str) else request
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise StageMapError(f"{where}: 'request' must be a span name or a list of span names")
    layout = _layout(doc.get("layout", "end"), where)
    if ("stages" in doc) == ("variants" in doc):
        raise StageMapError(f"{where}: give either 'stages' or 'variants' (a list of stage lists)")
    if "stages" in doc:
        variants: tuple[Variant, ...] = (
            Variant(name.strip(), _rules(doc.get("stages"), where), layout),)
    else:
        variants = _variants(doc.get("variants"), layout, where)
    about = doc.get("about", "")
    return StageMap(name.strip(), frozenset(names), variants, str(about or ""))


def _layout(layout: Any, where: str) -> str:
    if layout not in LAYOUTS:
        raise StageMapError(f"{where}: 'layout' must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    return str(layout)


def _variants(raw: Any, layout: str, where: str) -> tuple[Variant, ...]:
    if not isinstance(raw, list) or not raw:
        raise StageMapError(f"{where}: 'variants' must be a non-empty list")
    out: list[Variant] = []
    for i, item in enumerate(raw):
        here = f"{where}: variants[{i}]"
        if not isinstance(item, Mapping):
            raise StageMapError(f"{here}: expected a mapping with name and stages")
        unknown = set(item) - _VARIANT_KEYS
        if unknown:
            raise StageMapError(f"{here}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            raise StageMapError(f"{here}: 'name' must be a non-empty string")
        if any(v.name == name.strip() for v in out):
            raise StageMapError(f"{here}: variant name {name.strip()!r} is used twice")
        rules = _rules(item.get("stages"), here)
        about = item.get("about", "")
        out.append(Variant(name.strip(), rules, _layout(item.get("layout", layout), here),
                           str(about or "")))
    return tuple(out)


def _rules(raw: Any, where: str) -> tuple[StageRule, ...]:
    if not isinstance(raw, list) or not raw:
        raise StageMapError(f"{where}: 'stages' must be a non-empty list")
    rules = tuple(_rule(item, f"{where}: stages[{i}]") for i, item in enumerate(raw))
    if sum(r.rest for r in rules) > 1:
        raise StageMapError(f"{where}: at most one stage may be 'rest: true'")
    return rules


def _rule(item: Any, where: str) -> StageRule:
    if not isinstance(item, Mapping):
        raise StageMapError(f"{where}: expected a mapping such as {{stage: queue, span: wait}}")
    unknown = set(item) - _RULE_KEYS
    if unknown:
        raise StageMapError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    stage = item.get("stage")
    if not isinstance(stage, str) or not stage.strip():
        raise StageMapError(f"{where}: 'stage' must be a non-empty string")
    if stage == semconv.SPAN_REQUEST:
        raise StageMapError(f"{where}: a stage cannot be named {semconv.SPAN_REQUEST!r}")
    kinds = [k for k in ("span", "from_event", "attribute", "rest") if item.get(k)]
    if len(kinds) != 1:
        raise StageMapError(
            f"{where}: give exactly one of span, from_event (+ to_event), attribute (+ unit) or"
            f" rest: true (got {', '.join(kinds) or 'none'})"
        )
    strings = {k: item.get(k) for k in ("span", "from_event", "to_event", "attribute", "unfinished")}
    for key, value in strings.items():
        if value is not None and not (isinstance(value, str) and value):
            raise StageMapError(f"{where}: {key!r} must be a non-empty string")
    if item.get("from_event") and not item.get("to_event"):
        raise StageMapError(f"{where}: from_event needs a to_event")
    if item.get("to_event") and not item.get("from_event"):
        raise StageMapError(f"{where}: to_event needs a from_event")
    if item.get("unfinished") and not item.get("from_event"):
        raise StageMapError(f"{where}: 'unfinished' goes with from_event")
    unit = item.get("unit", "s")
    if unit not in UNIT_NS:
        raise StageMapError(f"{where}: 'unit' must be one of {', '.join(UNIT_NS)}, not {unit!r}")
    if "unit" in item and not item.get("attribute"):
        raise StageMapError(f"{where}: 'unit' goes with 'attribute'")
    minus = item.get("minus", ())
    minus = [minus] if isinstance(minus, str) else minus
    if not isinstance(minus, (list, tuple)) or not all(isinstance(m, str) and m for m in minus):
        raise StageMapError(f"{where}: 'minus' must be an attribute name or a list of them")
    if minus and not item.get("attribute"):
        raise StageMapError(f"{where}: 'minus' goes with 'attribute'")
    rest = item.get("rest", False)
    if not isinstance(rest, bool):
        raise StageMapError(f"{where}: 'rest' must be true or false")
    return StageRule(
        stage=stage.strip(),
        span=strings["span"],
        from_event=strings["from_event"],
        to_event=strings["to_event"],
        attribute=strings["attribute"],
        minus=tuple(minus),
        unit=unit,
        rest=rest,
        unfinished=strings["unfinished"] or "",
    )


# --- applying --------------------------------------------------------------------------------------


def apply_stage_map(stage_map: StageMap, recording: Recording) -> tuple[Recording, MapSummary]:
    """``recording`` with every request span of the map replaced as the module docstring says.

    Pure: returns a new :class:`Recording` (metrics and problems carried over, the map's own
    problems appended) and a :class:`MapSummary`. Spans outside mapped requests are kept as they
    are.
    """
    summary = MapSummary(stage_map.name, variants=len(stage_map.variants),
                         by_variant={v.name: 0 for v in stage_map.variants})
    by_id: dict[_Key, Span] = {}
    for span in recording.spans:
        by_id.setdefault((span.trace_id, span.span_id), span)
    children: dict[_Key, list[Span]] = defaultdict(list)
    for span in by_id.values():
        if span.parent_span_id is not None:
            children[(span.trace_id, span.parent_span_id)].append(span)

    replaced: set[_Key] = set()
    added: list[Span] = []
    unmapped_why: dict[str, int] = defaultdict(int)
    requests = [s for s in by_id.values() if s.name in stage_map.request]
    for req in sorted(requests, key=lambda s: (s.start_ns, s.trace_id)):
        subtree = _subtree(req, children, stage_map.request)
        stages, variant_or_why = _stages(stage_map, req, subtree, children)
        if not stages:
            summary.unmapped += 1
            unmapped_why[variant_or_why] += 1
            continue
        summary.mapped += 1
        summary.by_variant[variant_or_why] = summary.by_variant.get(variant_or_why, 0) + 1
        replaced.update((s.trace_id, s.span_id) for s in subtree)
        start = min([req.start_ns, *(s.start_ns for s in stages)])
        end = max([req.end_ns, *(s.end_ns for s in stages)])
        added.append(
            msgspec.structs.replace(
                req,
                name=semconv.SPAN_REQUEST,
                start_ns=start,
                end_ns=end,
                error=req.error or any(s.error for s in subtree[1:]),
                events=(),
            )
        )
        added.extend(stages)

    if not requests:
        seen = sorted({s.name for s in by_id.values()})
        shown = ", ".join(seen[:8]) + (", ..." if len(seen) > 8 else "")
        other = suggest_stage_map(by_id.values())
        summary.problems.append(
            f"stage map {stage_map.name}: no span named {' or '.join(sorted(stage_map.request))}"
            f" (span names found: {shown or 'none'}); is this the right map?"
            + (f" These spans match --stage-map {other}." if other else "")
        )
    for why, count in sorted(unmapped_why.items()):
        summary.problems.append(
            f"stage map {stage_map.name}: {count} of {len(requests)} request span(s) left out of"
            f" the timings: {why}"
        )
    out = Recording(
        spans=[s for k, s in by_id.items() if k not in replaced] + added,
        metrics=list(recording.metrics),
        problems=[*recording.problems, *summary.problems],
    )
    return out, summary


def suggest_stage_map(spans: Iterable[Span]) -> str | None:
    """The built-in map (:data:`BUILTIN`) whose request span name the spans use, for a hint when
    a report without ``--stage-map`` finds no request; ``None`` when none does."""
    names = {s.name for s in spans}
    for builtin in BUILTIN:
        if load_stage_map(builtin).request & names:
            return builtin
    return None


def _subtree(
    req: Span, children: Mapping[_Key, list[Span]], request_names: frozenset[str]
) -> list[Span]:
    """``req`` first, then every span below it (not descending into another request span)."""
    out, stack = [req], [req]
    while stack:
        span = stack.pop()
        for kid in children.get((span.trace_id, span.span_id), []):
            if kid.name in request_names:
                continue
            out.append(kid)
            stack.append(kid)
    return out


def _stage_span(req: Span, index: int, rule: StageRule, start_ns: int, end_ns: int) -> Span:
    digest = hashlib.blake2b(f"{req.trace_id}/{req.span_id}/{index}".encode(), digest_size=8)
    return Span(
        trace_id=req.trace_id,
        span_id=digest.hexdigest(),
        parent_span_id=req.span_id,
        name=rule.stage,
        start_ns=start_ns,
        end_ns=max(start_ns, end_ns),
        attributes={semconv.STAGE_MAP_SOURCE: rule.source()},
        resource=req.resource,
    )


def _stages(
    stage_map: StageMap, req: Span, subtree: Sequence[Span], children: Mapping[_Key, list[Span]]
) -> tuple[list[Span], str]:
    """The stage spans of one request and the variant that gave them; or no spans and why."""
    why: list[tuple[str, str]] = []
    for variant in stage_map.variants:
        stages, reason = _variant_stages(variant, req, subtree, children)
        if stages:
            return stages, variant.name
        why.append((variant.name, reason))
    if len(why) == 1:
        return [], why[0][1]
    return [], "; ".join(f"not {name}: {reason}" for name, reason in why)


def _variant_stages(
    variant: Variant, req: Span, subtree: Sequence[Span], children: Mapping[_Key, list[Span]]
) -> tuple[list[Span], str]:
    out: list[Span] = []
    missing: list[str] = []  # attributes a stage needs that the request span lacks
    bad: list[str] = []  # attribute stages that are there but not a duration
    unfinished: list[str] = []
    timed: list[tuple[StageRule, int]] = []  # attribute stages: (rule, duration ns)
    for rule in variant.stages:
        if rule.span:
            for span in subtree[1:]:
                if span.name == rule.span:
                    out.append(_stage_span(req, len(out), rule, span.start_ns, span.end_ns))
        elif rule.from_event and rule.to_event:
            for start, end in _event_pairs(subtree, children, rule, unfinished):
                out.append(_stage_span(req, len(out), rule, start, end))
        elif rule.attribute:
            ns = _attribute_ns(req.attributes, rule, missing, bad)
            if ns is not None:
                timed.append((rule, ns))
    if unfinished:
        return [], unfinished[0]
    if missing:
        return [], "no attribute " + ", ".join(dict.fromkeys(missing)) + " on the request span"
    if bad:
        return [], bad[0]
    rest = next((r for r in variant.stages if r.rest), None)
    if timed:
        total = sum(ns for _, ns in timed)
        span_ns = req.end_ns - req.start_ns
        gap = max(0, span_ns - total)
        t = req.end_ns - total if variant.layout == "end" else req.start_ns
        if rest is not None and gap and variant.layout == "end":
            out.append(_stage_span(req, len(out), rest, req.start_ns, t))
        for rule, ns in timed:
            out.append(_stage_span(req, len(out), rule, t, t + ns))
            t += ns
        if rest is not None and gap and variant.layout == "start":
            out.append(_stage_span(req, len(out), rest, t, req.end_ns))
    if out:
        return out, ""
    wanted = [r.source() for r in variant.stages if not r.rest]
    return out, "none of " + "; ".join(wanted) + " found"


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _attribute_ns(
    attributes: Mapping[str, Any], rule: StageRule, missing: list[str], bad: list[str]
) -> int | None:
    """The rule's duration in ns (``attribute`` less ``minus``), or ``None`` with the reason
    appended to ``missing`` (absent) or ``bad`` (not a number, or negative)."""
    values: list[float] = []
    for key in rule.attributes():
        value = attributes.get(key)
        if value is None:
            missing.append(key)
            continue
        number = _number(value)
        if number is None:
            bad.append(f"{key} is not a number ({value!r})")
            continue
        values.append(number)
    if len(values) != len(rule.attributes()):
        return None
    duration = values[0] - sum(values[1:])
    if duration < 0:
        what = rule.source().removeprefix("attribute ")
        bad.append(f"{what} is negative ({duration:.6g})")
        return None
    return round(duration * UNIT_NS[rule.unit])


def _event_pairs(
    subtree: Sequence[Span],
    children: Mapping[_Key, list[Span]],
    rule: StageRule,
    unfinished: list[str],
) -> Iterable[tuple[int, int]]:
    start_name, end_name = rule.from_event, rule.to_event
    members = {(s.trace_id, s.span_id) for s in subtree}
    for span in subtree:
        starts = [e.time_ns for e in span.events if e.name == start_name]
        if not starts:
            continue
        kids = [k for k in children.get((span.trace_id, span.span_id), [])
                if (k.trace_id, k.span_id) in members]
        nested = [k for k in kids if any(e.name == start_name for e in k.events)]
        holders = [span] + [k for k in kids if k not in nested]
        ends = sorted(e.time_ns for s in holders for e in s.events if e.name == end_name)
        for start in starts:
            end = next((t for t in ends if t >= start), None)
            if end is None and nested:
                continue  # a Triton ensemble: its steps' spans hold their own pairs
            if end is None:
                meaning = f": {rule.unfinished}" if rule.unfinished else ""
                unfinished.append(
                    f"{start_name} without a later {end_name} (the {rule.stage} step never"
                    f" finished{meaning})"
                )
                continue
            yield start, end
