"""Stage maps: other servers' traces as otel-stages stages, without re-instrumenting. Pure.

A stage map (a small YAML or JSON file, or a built-in one by name: :data:`BUILTIN`) says which
span is one request and where each stage's time comes from. :func:`apply_stage_map` turns a
:class:`Recording` into one whose requests are ``request`` spans with standard stage children, so
the rest of the analysis (grouping, statistics, verdict) runs unchanged.

The format (``request``, ``stages`` or ``variants``, the four kinds of stage) is described in
:mod:`otel_stages.analysis.stage_map_file`, which parses and loads maps; this module applies them.

The mapped request keeps its span id, trace id, attributes and resource; it is renamed ``request``
and widened to cover the stages timed from its own events (Triton receives the request body before
it starts the request span); a stage from a span below it that sticks out is not: only its part
inside counts, and :mod:`otel_stages.analysis.stage_map_checks` names it, with mapped stages that
overlap and map entries that matched nothing. The spans below it are replaced by the stage spans
(ids derived from the request's), each with ``semconv.STAGE_MAP_SOURCE`` saying where its time came
from. A request span the map cannot time (no stage found, an attribute missing, a step that never
finished) is left as it was, so it is no request of the report, and counted in a problem saying
why.

The report lists a map's stages in the map's order (:meth:`StageMap.stage_order`, merged into
the standard order by :func:`otel_stages.analysis.stats.pipeline_order`), not alphabetically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from otel_stages import semconv
from otel_stages.analysis.model import Call, Recording, Span
from otel_stages.analysis.stage_map_checks import (
    MAP_OVERLAP_TOLERANCE_MS,
    MapChecks,
    no_request_problem,
)
from otel_stages.analysis.stage_map_file import (
    BUILTIN,
    LAYOUTS,
    UNIT_NS,
    StageMap,
    StageMapError,
    StageRule,
    Variant,
    load_stage_map,
    parse_stage_map,
)
from otel_stages.analysis.stage_map_labels import label_stats, warm_requests
from otel_stages.analysis.stage_map_summary import MapSummary

__all__ = [
    "BUILTIN", "LAYOUTS", "MAP_OVERLAP_TOLERANCE_MS", "UNIT_NS", "MapSummary", "StageMap",
    "StageMapError", "StageRule", "Variant", "apply_stage_map", "load_stage_map",
    "parse_stage_map", "suggest_stage_map",
]

_Key = tuple[str, str]


# --- applying --------------------------------------------------------------------------------------


def apply_stage_map(stage_map: StageMap, recording: Recording) -> tuple[Recording, MapSummary]:
    """``recording`` with every request span of the map replaced as the module docstring says.

    Pure: returns a new :class:`Recording` (metrics and problems carried over, the map's own
    problems appended) and a :class:`MapSummary`. Spans outside mapped requests are kept as they
    are.
    """
    summary = MapSummary(stage_map.name, variants=len(stage_map.variants),
                         by_variant={v.name: 0 for v in stage_map.variants}, label=stage_map.label,
                         stage_map=stage_map)
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
    checks = MapChecks(stage_map)
    for req in sorted(requests, key=lambda s: (s.start_ns, s.trace_id)):
        subtree = _subtree(req, children, stage_map.request)
        stages, variant_or_why = _stages(stage_map, req, subtree, children, checks)
        if not stages:
            summary.unmapped += 1
            unmapped_why[variant_or_why] += 1
            continue
        summary.mapped += 1
        summary.by_variant[variant_or_why] = summary.by_variant.get(variant_or_why, 0) + 1
        replaced.update((s.trace_id, s.span_id) for s in subtree)
        # widened only by the request span's own events (Triton receives the body before it
        # starts InferRequest); a stage from a span below that sticks out is clipped and named
        own = [s for s in stages if s.attributes.get(_OWN)]
        stages = [_without_own(s) for s in stages]
        start = min([req.start_ns, *(s.start_ns for s in own)])
        end = max([req.end_ns, *(s.end_ns for s in own)])
        checks.add_request(req.trace_id, start, end, stages)
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
        summary.problems.append(no_request_problem(
            stage_map, [s.name for s in by_id.values()], suggest_stage_map(by_id.values())))
    for why, count in sorted(unmapped_why.items()):
        summary.problems.append(
            f"stage map {stage_map.name}: {count} of {len(requests)} request span(s) left out of"
            f" the timings: {why}"
        )
    if requests:
        summary.problems.extend(checks.problems(summary.by_variant, len(requests)))
        other = _unmatched_spans(stage_map.name, by_id.values(), {r.trace_id for r in requests})
        if other:
            summary.problems.append(other)
    out = Recording(
        spans=[s for k, s in by_id.items() if k not in replaced] + added,
        metrics=list(recording.metrics),
        problems=[*recording.problems, *summary.problems],
        calls_left_out=_mapped_calls(stage_map, recording.calls_left_out) if summary.mapped else
        list(recording.calls_left_out),
    )
    if stage_map.label and summary.mapped:
        summary.labels = label_stats(warm_requests(out), stage_map.label)
    return out, summary


def _mapped_calls(stage_map: StageMap, calls: Iterable[Call]) -> list[Call]:
    """``calls`` (:attr:`Recording.calls_left_out`, found under the spans' own names) under the
    stage the map times from their spans (``{stage: upstream, span: POST}``); one per stage where
    the map's variants name several; a call no span rule names is left as it is (its spans were
    mapped away or kept unmapped, as the map says)."""
    out: list[Call] = []
    for call in calls:
        stages = dict.fromkeys(r.stage for v in stage_map.variants for r in v.stages
                               if r.span == call.stage)
        out += [dataclasses.replace(call, stage=stage) for stage in stages] or [call]
    return out


def _unmatched_spans(name: str, spans: Iterable[Span], mapped_traces: set[str]) -> str | None:
    """The problem naming the spans in traces without a request span of the map (another server's
    files in the same folder), by ``service.name``; ``None`` when there are none."""
    by_service: dict[str, int] = defaultdict(int)
    others: list[Span] = []
    for span in spans:
        if span.trace_id not in mapped_traces:
            by_service[str(span.resource.get(semconv.SERVICE_NAME) or "unknown service")] += 1
            others.append(span)
    if not by_service:
        return None
    total = sum(by_service.values())
    named = ", ".join(f"{k}: {n}" for k, n in sorted(by_service.items(), key=lambda kv: (-kv[1],
                                                                                      kv[0])))
    return (f"stage map {name}: {total} span{'s' if total != 1 else ''} in traces without a"
            f" request span of the map, from {len(by_service)} service"
            f"{'s' if len(by_service) != 1 else ''} ({named}), were not mapped: they count only"
            " where they are otel-stages' own request spans; is another server's data in the"
            " same files?" + (f" Some match --stage-map {other}: report them apart with it."
                              if (other := suggest_stage_map(others)) not in (None, name) else ""))


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


# marks, while a request is mapped, a stage span from the request span's own events (removed
# before the span leaves this module)
_OWN = "\0own"


def _stage_span(req: Span, index: int, rule: StageRule, start_ns: int, end_ns: int,
                label: tuple[str, str] | None = None, own: bool = False) -> Span:
    digest = hashlib.blake2b(f"{req.trace_id}/{req.span_id}/{index}".encode(), digest_size=8)
    attributes: dict[str, Any] = {semconv.STAGE_MAP_SOURCE: rule.source()}
    if label is not None:
        attributes[label[0]] = label[1]
    if own:
        attributes[_OWN] = True
    return Span(
        trace_id=req.trace_id,
        span_id=digest.hexdigest(),
        parent_span_id=req.span_id,
        name=rule.stage,
        start_ns=start_ns,
        end_ns=max(start_ns, end_ns),
        attributes=attributes,
        resource=req.resource,
    )


def _without_own(span: Span) -> Span:
    if _OWN not in span.attributes:
        return span
    return msgspec.structs.replace(
        span, attributes={k: v for k, v in span.attributes.items() if k != _OWN})


class _Labels:
    """The map's ``label`` of the spans of one request: found on a span or its nearest ancestor
    inside the request."""

    def __init__(self, key: str | None, subtree: Sequence[Span]) -> None:
        self.key = key
        self._by_id = {s.span_id: s for s in subtree} if key else {}

    def of(self, span: Span) -> tuple[str, str] | None:
        if self.key is None:
            return None
        seen = 0
        node: Span | None = span
        while node is not None and seen < len(self._by_id) + 1:
            value = node.attributes.get(self.key)
            if value is not None and value != "":
                return self.key, str(value)
            node = self._by_id.get(node.parent_span_id) if node.parent_span_id else None
            seen += 1
        return None


def _claims(rule: StageRule, rules: Sequence[StageRule], label: tuple[str, str] | None) -> bool:
    """Whether ``rule`` takes a span or event pair labelled ``label``: a rule with ``when`` takes
    what it matches unless an earlier one with the same source and a ``when`` took it; a rule
    without ``when`` takes what no rule with the same source and a ``when`` matches."""
    value = None if label is None else label[1]
    same = [r for r in rules if (r.span, r.from_event, r.to_event)
            == (rule.span, rule.from_event, rule.to_event) and r.when]
    if rule.when:
        if not rule.matches(value):
            return False
        return next(r for r in same if r.matches(value)) is rule
    return not any(r.matches(value) for r in same)


# marks the reason of a variant whose attributes are there but no duration (NaN, a string)
_BAD = "\0bad:"


def _stages(
    stage_map: StageMap, req: Span, subtree: Sequence[Span], children: Mapping[_Key, list[Span]],
    checks: MapChecks,
) -> tuple[list[Span], str]:
    """The stage spans of one request and the variant that gave them; or no spans and why."""
    why: list[tuple[str, str]] = []
    labels = _Labels(stage_map.label, subtree)
    checks.see(req, subtree)
    for variant in stage_map.variants:
        matched: set[int] = set()
        stages, reason = _variant_stages(variant, req, subtree, children, labels, matched)
        checks.matched(variant.name, matched)
        if stages:
            return stages, variant.name
        if reason.startswith(_BAD):  # garbage in its attributes: no other variant may take it
            return [], reason.removeprefix(_BAD)
        why.append((variant.name, reason))
    if len(why) == 1:
        return [], why[0][1]
    return [], "; ".join(f"not {name}: {reason}" for name, reason in why)


def _variant_stages(
    variant: Variant, req: Span, subtree: Sequence[Span], children: Mapping[_Key, list[Span]],
    labels: _Labels, matched: set[int],
) -> tuple[list[Span], str]:
    """The stage spans of one variant (or none, and why); ``matched`` gets the index of every
    rule that found its span, events or attributes."""
    out: list[Span] = []
    missing: list[str] = []  # attributes a stage needs that the request span lacks
    bad: list[str] = []  # attribute stages that are there but not a duration
    unfinished: list[str] = []
    timed: list[tuple[StageRule, int]] = []  # attribute stages: (rule, duration ns)
    rules = variant.stages
    for i, rule in enumerate(rules):
        if rule.span:
            for span in subtree[1:]:
                if span.name == rule.span:
                    label = labels.of(span)
                    if _claims(rule, rules, label):
                        matched.add(i)
                        out.append(_stage_span(req, len(out), rule, span.start_ns, span.end_ns,
                                               label))
        elif rule.from_event and rule.to_event:
            for start, end, holder in _event_pairs(subtree, children, rule, unfinished):
                label = labels.of(holder)
                if _claims(rule, rules, label):
                    matched.add(i)
                    out.append(_stage_span(req, len(out), rule, start, end, label,
                                           own=holder is req))
        elif rule.attribute:
            ns = _attribute_ns(req.attributes, rule, missing, bad)
            if ns is not None:
                matched.add(i)
                timed.append((rule, ns))
    if unfinished:
        return [], unfinished[0]
    if missing:
        return [], "no attribute " + ", ".join(dict.fromkeys(missing)) + " on the request span"
    if bad:
        return [], _BAD + bad[0]
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


#: An ``attribute`` stage longer than this (seconds, after its ``unit``) is no duration but a
#: unit mix-up or garbage (``1e300``): no request runs for a day. Such a value, NaN or Infinity
#: leaves that request out of the timings, counted in a problem, as a non-number does.
MAX_ATTRIBUTE_DURATION_S = 86_400.0


def _number(value: Any) -> float | None:
    """``value`` as a finite float; ``None`` for a non-number, a bool, NaN, Infinity or an
    integer too large for a float."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            return None
        return number if math.isfinite(number) else None
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
            kind = ("not a finite number" if isinstance(value, (int, float))
                    and not isinstance(value, bool) else "not a number")
            bad.append(f"{key} is {kind} ({_shown(value)})")
            continue
        if abs(number) * UNIT_NS[rule.unit] > MAX_ATTRIBUTE_DURATION_S * 1e9:
            bad.append(f"{key} is not a plausible duration ({_shown(value)} {rule.unit}: over"
                       f" {MAX_ATTRIBUTE_DURATION_S:.0f} s)")
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


def _shown(value: Any) -> str:
    """A bad value for a problem line, short (a huge integer or string is cut)."""
    if isinstance(value, int) and abs(value) >= 10**12:  # no str(): huge ints raise there
        return f"an integer of about 10^{int(abs(value).bit_length() * math.log10(2))}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _event_pairs(
    subtree: Sequence[Span],
    children: Mapping[_Key, list[Span]],
    rule: StageRule,
    unfinished: list[str],
) -> Iterable[tuple[int, int, Span]]:
    """``(start ns, end ns, the span holding the start)`` of every pair of the rule's events."""
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
            yield start, end, span
