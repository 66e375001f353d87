"""``--service NAME`` on trace files: whole traces with a span of that ``service.name``, as
Jaeger, Tempo and the ClickHouse report pick them (a request's stages that ran in another
service stay in it), and the sentence that names the services seen when none matches (the same
from the file report and the ClickHouse report). Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from otel_stages import semconv
from otel_stages.analysis.model import Recording, Span

#: At most this many services are named when ``--service`` matches none.
MAX_SERVICES_NAMED = 5


def service_of(resource: Mapping[str, object]) -> str:
    """``service.name`` of a resource (``""`` when it has none)."""
    name = resource.get(semconv.SERVICE_NAME)
    return "" if name is None else str(name)


def spans_by_service(spans: Iterable[Span]) -> list[tuple[str, int]]:
    """``(service.name, spans)`` for every service with spans, most spans first (then by name)."""
    counts = Counter(service_of(s.resource) for s in spans)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def pick_service(recording: Recording, service: str) -> Recording:
    """The spans of the traces that hold a span of ``service`` (every span of those traces, any
    service), and the metric points of the services with a span in those traces or with no span
    at all (a metrics-only process: a node's GPU exporter, which the GPU rules then place by its
    ``host.name``), as the ClickHouse SQL's ``metric_filter``; problems kept. Empty spans when none
    matches."""
    traces = {s.trace_id for s in recording.spans if service_of(s.resource) == service}
    spans = [s for s in recording.spans if s.trace_id in traces]
    services = {service_of(s.resource) for s in spans}
    with_spans = {service_of(s.resource) for s in recording.spans}
    metrics = [p for p in recording.metrics
               if service_of(p.resource) in services or service_of(p.resource) not in with_spans]
    return Recording(spans=spans, metrics=metrics, problems=list(recording.problems))


def no_service_line(service: str, seen: Sequence[tuple[str, int]], services: int) -> str:
    """``no span of service 'S'; services seen: a (N spans), ...``: ``seen`` the first
    ``(service.name, spans)`` pairs, most spans first, ``services`` how many there are in all."""
    if not services:
        return f"no span of service {service!r}: no spans at all"
    named = ", ".join(f"{name or '(no service.name)'} ({n} span{'s' if n != 1 else ''})"
                      for name, n in seen[:MAX_SERVICES_NAMED])
    more = services - min(len(seen), MAX_SERVICES_NAMED)
    return (f"no span of service {service!r}; services seen: {named}"
            + (f" and {more} more" if more > 0 else ""))
