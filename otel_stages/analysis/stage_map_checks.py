"""What a stage map got wrong on the data it was applied to, in words a map's author can act on.
Pure; used by :func:`otel_stages.analysis.stage_map.apply_stage_map`.

- **Entries that matched nothing**: a ``stages`` entry whose span, event pair or label never
  occurred in any request span (a typo, a span the server does not write, the wrong map) is named
  with what the data does have there and the nearest names (:func:`difflib.get_close_matches`).
- **Stages that overlap**: stages mapped from a span and its parent, or from spans that run at
  the same time, count the same time twice, so the shares add up to more than the request. Each
  pair of stages that overlaps by more than :data:`MAP_OVERLAP_TOLERANCE_MS` in a request is
  counted and named, with the share of request time counted twice. (The report takes the double
  count back out of the shares: :mod:`otel_stages.analysis.stage_overlap`.)
- **Stages that stick out of their request**: a stage span from a span below the request that
  reaches outside the request span counts only inside it (the request is widened only by its own
  events: Triton receives the body before it starts ``InferRequest``); counted and named.
(Each stage's time per label value, e.g. per Triton model, is
:mod:`otel_stages.analysis.stage_map_labels`.)
"""

from __future__ import annotations

import difflib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

from otel_stages.analysis.model import Span
from otel_stages.analysis.span_issues import OVERLAP_TOLERANCE_MS
from otel_stages.analysis.stage_map_file import StageMap, StageRule
from otel_stages.analysis.units import duration, pct

#: Mapped stages of one request may overlap (or stick out of it) by this much (ms) before it is a
#: problem: the same tolerance as the library's own stage spans (two threads' clocks, Jaeger's
#: microsecond times).
MAP_OVERLAP_TOLERANCE_MS = OVERLAP_TOLERANCE_MS
#: Names listed when saying what the data has (the JSON problems keep the same sentence).
MAX_NAMES_SHOWN = 8
#: Distinct names remembered per kind (span, event, attribute, label) while reading requests: per
#: request names (``GET /img/13``) must not grow the map's memory with the data.
MAX_NAMES_KEPT = 1000
#: :func:`difflib.get_close_matches` cutoff for "nearest" names: a typo (``infr`` for ``infer``
#: 0.89, ``perp`` for ``prep`` 0.75) passes; names that only share a word do not (difflib's default
#: 0.6 offers ``llm_request`` for ``InferRequest``, 0.61, and ``COMPUTE_END`` for
#: ``COMPUTE_START``, 0.67).
NEAREST_MIN_RATIO = 0.7


#: How every problem of a stage map begins (``stage map NAME: ...``).
MAP_PROBLEM_PREFIX = "stage map "


def said_by_a_map(problems: Iterable[str]) -> bool:
    """Whether ``problems`` hold a stage map's own lines (then a report that found no request
    does not add the generic "expected spans named download/..." line: the map's lines say which
    entries matched nothing)."""
    return any(p.startswith(MAP_PROBLEM_PREFIX) for p in problems)


def _names(names: Iterable[str]) -> str:
    ordered = sorted(set(names))
    shown = ", ".join(ordered[:MAX_NAMES_SHOWN])
    return shown + (f", ... ({len(ordered)} in all)" if len(ordered) > MAX_NAMES_SHOWN else "")


def nearest(word: str, names: Iterable[str]) -> list[str]:
    """Up to three of ``names`` closest to ``word`` (:func:`difflib.get_close_matches`,
    case-insensitive), best first."""
    by_lower: dict[str, str] = {}
    for n in sorted(set(names)):
        by_lower.setdefault(n.lower(), n)
    found = difflib.get_close_matches(word.lower(), list(by_lower), n=3, cutoff=NEAREST_MIN_RATIO)
    return [by_lower[f] for f in found]


def _nearest_clause(word: str, names: Iterable[str]) -> str:
    close = nearest(word, names)
    return f"; nearest to '{word}': {', '.join(close)}" if close else ""


def no_request_problem(stage_map: StageMap, span_names: Iterable[str], other: str | None) -> str:
    """The problem when no span has the map's ``request`` name: the names found, the nearest
    ones, and the built-in map ``other`` that fits the spans, if any."""
    names = set(span_names)
    wanted = sorted(stage_map.request)
    close = [c for w in wanted for c in nearest(w, names)]
    return (f"stage map {stage_map.name}: no span named {' or '.join(wanted)}"
            f" (span names found: {_names(names) or 'none'}); is this the right map?"
            + (f" Nearest span names: {', '.join(dict.fromkeys(close))}." if close else "")
            + (f" These spans match --stage-map {other}." if other else ""))


class _Seen:
    """Distinct names, at most :data:`MAX_NAMES_KEPT`."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def add(self, names: Iterable[str]) -> None:
        for n in names:
            if len(self.names) >= MAX_NAMES_KEPT:
                return
            self.names.add(n)


class MapChecks:
    """Collects, request by request, what :func:`problems` and :func:`labels` report."""

    def __init__(self, stage_map: StageMap) -> None:
        self.map = stage_map
        self.spans = _Seen()  # span names below request spans
        self.events = _Seen()  # event names in request subtrees
        self.attributes = _Seen()  # attribute keys of request spans
        self.label_values = _Seen()
        self._matched: dict[str, set[int]] = defaultdict(set)  # variant -> rule indices
        self.mapped = 0
        self.overlap_requests = 0
        self.overlap_pairs: Counter[tuple[str, str]] = Counter()
        self.double_ns = 0
        self.total_ns = 0
        self.outside_requests = 0
        self.outside_stages: Counter[str] = Counter()
        self.outside_max_ns = 0

    def see(self, req: Span, subtree: Sequence[Span]) -> None:
        """Remember the names one request span offers (for the "matched nothing" lines)."""
        self.spans.add(s.name for s in subtree[1:])
        self.events.add(e.name for s in subtree for e in s.events)
        self.attributes.add(req.attributes)
        if self.map.label:
            self.label_values.add(str(v) for s in subtree
                                  if (v := s.attributes.get(self.map.label)) not in (None, ""))

    def matched(self, variant: str, indices: Iterable[int]) -> None:
        """The rules of ``variant`` that found something in one request."""
        self._matched[variant].update(indices)

    def add_request(self, trace_id: str, lo: int, hi: int, stages: Sequence[Span]) -> None:
        """One mapped request ``lo`` .. ``hi`` (ns) and its stage spans: overlap and stick-out."""
        self.mapped += 1
        tol = MAP_OVERLAP_TOLERANCE_MS * 1e6
        inside: list[tuple[int, int, str]] = []
        worst, names = 0, set()
        for s in stages:
            start, end = max(s.start_ns, lo), min(s.end_ns, hi)
            if end > start:
                inside.append((start, end, s.name))
                out = (s.end_ns - s.start_ns) - (end - start)
                if out > tol:
                    worst = max(worst, out)
                    names.add(s.name)
        if names:
            self.outside_requests += 1
            self.outside_stages.update(names)
            self.outside_max_ns = max(self.outside_max_ns, worst)
        inside.sort()
        pairs: set[tuple[str, str]] = set()
        for i, (_, end, name) in enumerate(inside):
            for other_start, other_end, other in inside[i + 1:]:
                if other_start >= end:
                    break
                if min(end, other_end) - other_start > tol:
                    pairs.add((min(name, other), max(name, other)))
        covered, cursor = 0, lo
        for start, end, _ in inside:
            if end > cursor:
                covered += end - max(start, cursor)
                cursor = end
        double = sum(e - s for s, e, _ in inside) - covered
        self.total_ns += hi - lo
        if pairs and double > tol:
            self.overlap_requests += 1
            self.overlap_pairs.update(pairs)
            self.double_ns += double

    def problems(self, by_variant: Mapping[str, int], requests: int) -> list[str]:
        """The sentences (module docstring); ``by_variant`` requests mapped per variant,
        ``requests`` request spans seen."""
        out = self._unmatched(by_variant, requests)
        name = f"{MAP_PROBLEM_PREFIX}{self.map.name}"
        if self.overlap_requests:
            pairs = "; ".join(f"{a} and {b} in {n}" for (a, b), n in sorted(
                self.overlap_pairs.items(), key=lambda kv: (-kv[1], kv[0])))
            share = self.double_ns / self.total_ns if self.total_ns else 0.0
            out.append(
                f"{name}: mapped stages overlap in {self.overlap_requests} of {self.mapped} mapped"
                f" requests ({pairs}; {pct(share)} of request time is counted in two stages at"
                " once): the stage shares add up to more than 100 %, so the report takes the"
                " double count out as an (overlap) share; map each span to one stage (not a span"
                " and its parent, nor spans that run at the same time)"
            )
        if self.outside_requests:
            stages = ", ".join(f"{s} in {n}" for s, n in sorted(
                self.outside_stages.items(), key=lambda kv: (-kv[1], kv[0])))
            out.append(
                f"{name}: mapped stages reach outside their request span in"
                f" {self.outside_requests} of {self.mapped} mapped requests ({stages}; up to"
                f" {duration(self.outside_max_ns / 1e6)} outside): only the part inside the request"
                " counts; map spans that lie within the request, or map the longer span as the"
                " request"
            )
        return out

    def _unmatched(self, by_variant: Mapping[str, int], requests: int) -> list[str]:
        used = [v for v in self.map.variants if by_variant.get(v.name)]
        out = []
        for variant in used or self.map.variants:
            matched = self._matched.get(variant.name, set())
            for i, rule in enumerate(variant.stages):
                if i in matched or rule.rest or rule.attribute:
                    continue  # attribute stages are required: a request without one is unmapped
                if rule.when and self._source_seen(rule):
                    continue  # a refinement (Triton: a preprocessing model) the data has no use for
                if not rule.when and _taken_by_when(rule, variant.stages, matched):
                    continue  # every pair went to a refinement (all models preprocess): no fault
                where = (f"variants[{self.map.variants.index(variant)}].stages[{i}]"
                         if len(self.map.variants) > 1 else f"stages[{i}]")
                out.append(f"stage map {self.map.name}: {where} ({rule.stage}: {rule.source()})"
                           f" matched nothing in {requests} request span{'s' if requests != 1 else ''}"
                           f"; {self._offer(rule)}")
        return out

    def _source_seen(self, rule: StageRule) -> bool:
        if rule.span:
            return rule.span in self.spans.names
        return {rule.from_event, rule.to_event} <= self.events.names

    def _offer(self, rule: StageRule) -> str:
        """What the data has where ``rule`` looked, and the nearest names."""
        if rule.span:
            if rule.span in self.spans.names:
                return "the spans are there but none was taken (another entry took them)"
            return (f"span names below the request spans: {_names(self.spans.names) or 'none'}"
                    + _nearest_clause(rule.span, self.spans.names))
        events = self.events.names
        missing = [e for e in (rule.from_event, rule.to_event) if e and e not in events]
        if not missing:
            return "the events are there but never paired (the to_event never follows)"
        return (f"no event {' or '.join(missing)}; event names in the requests:"
                f" {_names(events) or 'none'}"
                + "".join(_nearest_clause(e, events) for e in missing))


def _taken_by_when(rule: StageRule, rules: Sequence[StageRule], matched: set[int]) -> bool:
    """Whether an entry with ``rule``'s span or events and a ``when`` found something: then
    ``rule`` (the same source, no ``when``) matching nothing only means the refinements took all."""
    source = (rule.span, rule.from_event, rule.to_event)
    return any(i in matched and r.when and (r.span, r.from_event, r.to_event) == source
               for i, r in enumerate(rules))
