"""Span names that carry per-request data (``download /img/13.jpg``, ``fetch 3f2a9c1d``) are not
stage names: each would become its own stage row, with one run each and no swing.

:func:`per_request_names` looks at the distinct names of the spans under requests. Names are taken
as per-request when more than :data:`MAX_STAGE_NAMES` distinct names appear there, or when a
custom name holds a path, a query, or an id (:func:`looks_per_request`); names that recur across
requests (:func:`recurring_names`) stay stage names however many there are. Such a span is then
counted under its ``stage`` attribute (``semconv.STAGE_NAME``) when it has one, and otherwise left
out of the stage rows (its time counts as unaccounted) with a problem saying how to fix the naming.
Standard stage names are never renamed. Pure.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from otel_stages import semconv
from otel_stages.analysis.model import Span

#: More distinct span names than this under requests means names carry per-request data: a
#: pipeline has a handful of stages (5 standard ones plus a few custom), not dozens.
MAX_STAGE_NAMES = 20
#: ...except the names that recur: a custom name on at least this share as many spans as the
#: most used name under requests (which runs about once per request) is a fixed stage of the
#: pipeline, however many there are; a name carrying per-request data recurs about once.
RECURRING_NAME_MIN_SHARE = 0.5

#: A path or query (``/``, ``?``, ``=``, ``#``), a hex run of 8+ digits (ids, hashes, UUID parts)
#: or a number of 3+ digits standing alone (``request 1234``): data, not a stage name.
_PER_REQUEST = re.compile(r"[/?=#]|(?<![0-9a-z])[0-9a-f]{8,}(?![0-9a-z])|(?<![\w.])\d{3,}(?![\w.])",
                          re.IGNORECASE)
_STANDARD = frozenset(semconv.STANDARD_STAGES)


def looks_per_request(name: str) -> bool:
    """True when ``name`` holds a path, query or id (see the module docstring)."""
    return bool(_PER_REQUEST.search(name))


@dataclass
class Naming:
    """How to name the stage spans under requests.

    ``renamed`` maps (trace id, span id) -> the stage name to count the span under (its ``stage``
    attribute), or ``None`` to leave it out of the stage rows. Empty when names look fine.
    ``problems`` explain what was done and how to fix the instrumentation.
    """

    renamed: dict[tuple[str, str], str | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def name_of(self, span: Span) -> str | None:
        """The stage name ``span`` counts under (``None``: left out)."""
        key = (span.trace_id, span.span_id)
        return self.renamed.get(key, span.name)


#: ``why`` of :func:`problem_lines` when names were found by :func:`looks_per_request`.
WHY_PATTERN = "span names that hold a path or an id"


def problem_lines(why: str, example: str, grouped: int, by_attribute: list[str], dropped: int
                  ) -> list[str]:
    """The sentences about per-request span names: ``why`` they were taken as such, an
    ``example`` name, ``grouped`` spans counted under their ``stage`` attribute (the names
    ``by_attribute``), ``dropped`` spans without one (left out of the stage rows)."""
    head = f"span names look per-request ({why}, e.g. {example!r})"
    fix = ("name each span by its stage (download, decode, resize, queue, forward or a fixed custom"
           " name) and put the URL or id in an attribute (url.full, request.id)")
    out = []
    if by_attribute:
        out.append(
            f"{head}: {grouped} spans grouped by their '{semconv.STAGE_NAME}'"
            f" attribute ({', '.join(by_attribute)}); {fix}"
        )
    if dropped:
        out.append(
            f"{head}: {dropped} spans without a '{semconv.STAGE_NAME}' attribute were left out of the"
            f" stage rows (their time counts as unaccounted); {fix}, or set a"
            f" '{semconv.STAGE_NAME}' attribute on them"
        )
    return out


def recurring_names(counts: Mapping[str, int]) -> set[str]:
    """The names (``counts``: spans per name under requests) on at least
    :data:`RECURRING_NAME_MIN_SHARE` as many spans as the most used one; none when that one has a
    single span (one request tells nothing)."""
    top = max(counts.values(), default=0)
    if top < 2:
        return set(counts)
    return {n for n, c in counts.items() if c >= RECURRING_NAME_MIN_SHARE * top}


def per_request_names(stage_spans: Iterable[Span]) -> Naming:
    """Decide how to name ``stage_spans`` (every span whose parent is a request or a group).

    One pass to collect names, one to rename: linear in the spans.
    """
    spans = list(stage_spans)
    counts = Counter(s.name for s in spans)
    distinct = set(counts)
    too_many = len(distinct) > MAX_STAGE_NAMES
    recurring = recurring_names(counts) if too_many else set()
    suspect_names = {n for n in distinct if n not in _STANDARD
                     and ((too_many and n not in recurring) or looks_per_request(n))}
    if not suspect_names:
        return Naming()
    suspects = [s for s in spans if s.name in suspect_names]
    naming = Naming()
    by_attribute: set[str] = set()
    dropped = 0
    for span in suspects:
        value = span.attributes.get(semconv.STAGE_NAME)
        if isinstance(value, str) and value.strip():
            naming.renamed[(span.trace_id, span.span_id)] = value.strip()
            by_attribute.add(value.strip())
        else:
            naming.renamed[(span.trace_id, span.span_id)] = None
            dropped += 1
    names = sorted({s.name for s in suspects})
    why = (f"{len(distinct)} distinct span names under requests" if too_many
           else WHY_PATTERN)
    naming.problems.extend(problem_lines(why, names[0], len(suspects) - dropped,
                                         sorted(by_attribute), dropped))
    return naming
