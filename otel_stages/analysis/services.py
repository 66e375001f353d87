"""``--service NAME`` on trace files: the requests whose request span (the parent of their stage
spans) is of that ``service.name``, with all their stage spans whatever service recorded them (a
GPU worker's ``forward`` under a gateway's request stays with it), as the ClickHouse report picks
them; the requests of other services are left out, even in the same trace (a gateway whose
request calls a worker's: ``--service worker`` reports the worker's requests alone; ``--service
gateway`` keeps the gateway's call as a stage of its own, and the stages that call requests it
left out, :attr:`~otel_stages.analysis.model.Recording.calls_left_out`, for the rules to say). And the
sentences when none matches: the services seen (no span of that service), or the services whose
requests hold its spans (its spans are stages of other services' requests). The same from the
file report and the ClickHouse report. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence

from otel_stages import semconv
from otel_stages.analysis.calls import MAX_CALL_HOPS, remote_calls
from otel_stages.analysis.model import Call, Recording, Span
from otel_stages.analysis.requests import group_spans, trace_members
from otel_stages.analysis.screen import screen_spans

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


#: How far up from another service's request span the spans between it and ``--service``'s own
#: span are walked (:func:`_foreign_members`): those a call reaches through
#: (:data:`~otel_stages.analysis.calls.MAX_CALL_HOPS`), and the same bound in the ClickHouse
#: report's walk (:mod:`otel_stages.analysis.clickhouse_services`).
MAX_BETWEEN_SPANS = MAX_CALL_HOPS - 1


def _foreign_members(spans: list[Span], service: str) -> Iterator[Span]:
    """The spans of one trace's requests whose request span is not of ``service``: each such
    request span, its stage spans and its groups (:func:`~otel_stages.analysis.requests
    .trace_members`); and the spans between such a request span and the span of ``service``
    above it (a worker's HTTP server span under the gateway's client span, a proxy's: the call's
    far side, whose process ran none of the requests kept): walking up from the request span, each
    parent of another service that is no member of a request (a stage span, a group, a request
    span), at most :data:`MAX_BETWEEN_SPANS`."""
    units = trace_members(spans)
    members = {m.span_id for request_span, kept in units for m in kept}
    members.update(r.span_id for r, _ in units if r is not None)
    by_id = {s.span_id: s for s in spans}
    for request_span, kept in units:
        if request_span is not None and service_of(request_span.resource) != service:
            yield request_span
            yield from kept
            above = by_id.get(request_span.parent_span_id or "")
            for _ in range(MAX_BETWEEN_SPANS):
                if above is None or above.span_id in members or service_of(above.resource) == service:
                    break
                yield above
                above = by_id.get(above.parent_span_id or "")


def pick_service(recording: Recording, service: str) -> Recording:
    """The spans of ``service``'s requests (module docstring): every span of the traces that hold
    a span of ``service``, less the requests of other services there (their request span, stage
    spans and groups, and the spans of other services between them and ``service``'s span above:
    :func:`_foreign_members`; stage spans whose request span never arrived stay, as incomplete ones).
    Metric points: those of the services with a span among the spans kept or with no span at all
    (a metrics-only process: a node's GPU exporter, which the GPU rules then place by its
    ``host.name``) unless on a host of the requests left out that no span kept of ``service``
    names (:func:`_left_out_hosts`), as
    the ClickHouse SQL's ``metric_filter``; problems kept. Order kept. Empty
    spans when none matches. Only traces with spans of two services or more are grouped."""
    by_trace: dict[str, list[Span]] = {}
    for s in recording.spans:
        if service_of(s.resource) == service:
            by_trace.setdefault(s.trace_id, [])
    mixed: set[str] = set()
    for s in recording.spans:
        bucket = by_trace.get(s.trace_id)
        if bucket is not None:
            bucket.append(s)
            if service_of(s.resource) != service:
                mixed.add(s.trace_id)
    left_out = {(s.trace_id, s.span_id) for trace in mixed
                for s in _foreign_members(by_trace[trace], service)}
    spans = [s for s in recording.spans
             if s.trace_id in by_trace and (s.trace_id, s.span_id) not in left_out]
    services = {service_of(s.resource) for s in spans}
    with_spans = {service_of(s.resource) for s in recording.spans}
    hosts = _left_out_hosts([by_trace[trace] for trace in mixed], service) - {
        str(s.resource.get(semconv.HOST_NAME) or "") for s in spans if service_of(s.resource) == service}
    metrics = [p for p in recording.metrics
               if service_of(p.resource) in services or (
                   service_of(p.resource) not in with_spans
                   and str(p.resource.get(semconv.HOST_NAME) or "") not in hosts)]
    calls = (_calls_left_out([s for s in recording.spans if s.trace_id in by_trace], service)
             if left_out else [])
    return Recording(spans=spans, metrics=metrics, problems=list(recording.problems),
                     calls_left_out=calls)


def _left_out_hosts(traces: Iterable[list[Span]], service: str) -> set[str]:
    """The ``host.name`` of the request spans of other services in ``traces`` (the mixed traces
    picked); :func:`pick_service` drops the points of metrics-only processes on those hosts
    where no span of ``service`` names them too: such a process (a node's GPU exporter of its own
    service.name) sends the GPU points of the services left out (a tester's: kept, the worker
    node's exporter read as "GPU points of a process on a host no request process names")."""
    return {str(r.resource.get(semconv.HOST_NAME) or "") for spans in traces
            for r, _ in trace_members(spans)
            if r is not None and service_of(r.resource) != service} - {""}


def _calls_left_out(spans: list[Span], service: str) -> list[Call]:
    """The stages of ``service``'s requests in ``spans`` (the traces picked, before their other
    services' requests are left out) that are calls (:func:`~otel_stages.analysis.calls
    .remote_calls`) into the requests of another service, most calls first; their figures over
    the called requests neither cold nor set apart (the called service's warm-up is no swing of
    the calls), as the report of both services reads them."""
    from otel_stages.analysis.cohorts import CohortKeys, set_apart_and_warmup

    screened = screen_spans(spans)
    requests = group_spans(screened.spans).requests
    apart, _ = set_apart_and_warmup(requests, CohortKeys(requests))
    apart_ids = {id(a.request) for a in apart}
    steady = {(r.trace_id, r.span_id) for r in requests if not r.cold and id(r) not in apart_ids}
    return [c for c in remote_calls(requests, screened.spans, steady)
            if c.caller == service and c.service != service]


def service_hosts(recording: Recording, service: str) -> list[tuple[str, int]]:
    """``(service.name, requests)``: the requests of other services that hold a span of
    ``service`` among their stage spans (a GPU worker that records ``forward`` under a gateway's
    request span and runs no request of its own), per service, most first (then by name); for
    the sentence when ``--service`` finds no request (:func:`no_request_line`)."""
    traces = {s.trace_id for s in recording.spans if service_of(s.resource) == service}
    by_trace: dict[str, list[Span]] = {}
    for s in recording.spans:
        if s.trace_id in traces:
            by_trace.setdefault(s.trace_id, []).append(s)
    counts: Counter[str] = Counter()
    for spans in by_trace.values():
        for request_span, members in trace_members(spans):
            if (request_span is not None and service_of(request_span.resource) != service
                    and any(service_of(m.resource) == service for m in members)):
                counts[service_of(request_span.resource)] += 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def no_request_line(service: str, hosts: Sequence[tuple[str, int]]) -> str:
    """``no request span of service 'S': its spans are stages of the requests of a (N), ...;
    --service a reports those``: ``hosts`` the ``(service.name, requests)`` of
    :func:`service_hosts` (not empty), most first."""
    named = ", ".join(f"{name or '(no service.name)'} ({n})" for name, n in hosts[:MAX_SERVICES_NAMED])
    more = len(hosts) - min(len(hosts), MAX_SERVICES_NAMED)
    first = hosts[0][0]
    return (f"no request span of service {service!r}: its spans are stages of the requests of"
            f" {named}{f' and {more} more' if more > 0 else ''}"
            + (f"; --service {first} reports those" if first else ""))


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
