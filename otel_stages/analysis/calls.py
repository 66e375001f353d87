"""Stages that are calls into another service's requests, in one report.

A gateway instrumented with otel_stages times its own request (``download``, ``decode``,
``resize``) and then calls a worker over HTTP: the HTTP client span (httpx's ``POST``) is a child
of the gateway's request span, so it reads as a custom stage, and the worker's ``request`` span
(``queue``, ``forward``) is a child of that client span (trace context propagated), or of the
worker's HTTP server span under it. Both requests are in the trace; read together, the client
span's time *is* the worker's request's, so it swings exactly as much as the worker's stages do
and, being larger, explains more of the pooled totals than the stage that makes it swing. Such a
stage is a *call*: :func:`remote_calls` finds them, and the rules
(:func:`otel_stages.analysis.decision.decide`) leave calls out of the suspects, say so, and
advise the report of the called service alone (``--service``), which holds the cause.

A stage is a call into service S when at least :data:`CALL_MIN_SHARE` of its spans (over all the
requests read) hold a request span of S (S not the service that recorded the stage span) within
:data:`MAX_CALL_HOPS` parent links: the request span's parent is the stage span, or its parent's
parent is (the callee's HTTP server span in between, itself neither a stage nor a request or
group). Only where the requests read are of two services or more (none otherwise: a callee's
request is a request of its own service). The ClickHouse report reads the same
(:mod:`otel_stages.analysis.clickhouse_calls`). Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from otel_stages import semconv
from otel_stages.analysis.model import Span
from otel_stages.analysis.requests import Request

#: A called request span lies at most this many parent links below the calling stage span: 1,
#: the request span is the client span's child (context injected by hand or by an SDK that makes
#: no server span); 2, the callee's HTTP server span (FastAPI's, gRPC's) sits in between, as
#: OpenTelemetry's instrumentations make it. Deeper chains (a proxy's spans too) are not read as
#: calls: the farther up, the likelier the stage is other work that happens to hold one.
MAX_CALL_HOPS = 2
#: A stage name is a call when at least this share of its spans hold a called request: most of
#: its figures are then the callee's time. Below it (a ``POST`` that mostly calls an API this
#: report does not read), the stage is the caller's own, ranked as any other.
CALL_MIN_SHARE = 0.5


@dataclass(frozen=True)
class Call:
    """A stage that calls into another service's requests: ``stage`` its name, ``service`` the
    called requests' ``service.name``, ``calls`` how many of its spans hold one, ``spans`` how
    many spans of that stage the requests read hold."""

    stage: str
    service: str
    calls: int
    spans: int


def _service(resource: dict[str, object]) -> str:
    name = resource.get(semconv.SERVICE_NAME)
    return "" if name is None else str(name)


def remote_calls(requests: Sequence[Request], spans: Iterable[Span]) -> tuple[Call, ...]:
    """The :class:`Call` stages of ``requests`` (all read: warm, cold, failed), most calls first
    (then by name); ``spans`` the spans they were grouped from (read again only for the parent
    links of request spans, and only with requests of two services or more). Never raises."""
    if len({_service(r.resource) for r in requests}) < 2:
        return ()
    span_list = spans if isinstance(spans, list) else list(spans)
    leaves: dict[tuple[str, str], Span] = {}
    counts: Counter[str] = Counter()
    for r in requests:
        for s in r.spans:
            leaves.setdefault((s.trace_id, s.span_id), s)
            counts[s.name] += 1
    callees = {(r.trace_id, r.span_id): r for r in requests}
    parents = set(callees) | {(g.trace_id, g.span_id) for r in requests for g in r.groups}
    at: dict[tuple[str, str], list[tuple[str, str]]] = {}  # span -> the requests above which it lies
    for key in callees:
        at.setdefault(key, []).append(key)
    found: Counter[tuple[str, str]] = Counter()
    for _ in range(MAX_CALL_HOPS):
        parent_of: dict[tuple[str, str], str | None] = {}
        for s in span_list:
            key = (s.trace_id, s.span_id)
            if key in at and key not in parent_of:
                parent_of[key] = s.parent_span_id
        upper: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for key, below in at.items():
            pid = parent_of.get(key)
            if pid is None:
                continue
            up = (key[0], pid)
            stage = leaves.get(up)
            if stage is not None:
                for callee in below:
                    service = _service(callees[callee].resource)
                    if service != _service(stage.resource):
                        found[(stage.name, service)] += 1
            elif up not in parents:  # (a request or group above: no call)
                upper.setdefault(up, []).extend(below)
        at = upper
        if not at:
            break
    calls = [Call(stage, service, n, counts[stage]) for (stage, service), n in found.items()
             if n >= CALL_MIN_SHARE * counts[stage]]
    return tuple(sorted(calls, key=lambda c: (-c.calls, c.stage, c.service)))
