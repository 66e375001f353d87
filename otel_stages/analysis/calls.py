"""Stages that are calls into other requests read in the same report.

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

A stage is a call when at least :data:`CALL_MIN_SHARE` of its spans (in the calling service's
requests read: each hop of a chain apart) hold another request span (of any service) within
:data:`MAX_CALL_HOPS` parent links: the request span's parent is the stage span, or its parent's
parent is (the callee's HTTP server span in between, a proxy's: each
neither a stage nor a request or group). Whatever the two requests' ``service.name``: a gateway
and a worker that share one (told apart only by ``service.namespace`` or instance) call each
other as much as two services do (:attr:`Call.shared_name`). A call named as a stage of the
requests it calls (a gateway's ``stage("forward")`` around its HTTP call) is pooled under that
stage's name with the callee's own spans (:attr:`Call.callee_stage`): it is said, not left out.
A call's *own time* (each call span less the called requests' totals: the client's wait for a
pooled connection, connecting, the network, the callee's server before its request span starts)
is the caller's: :attr:`Call.own_swing_ms`, judged by the rules, which rank a call whose own time
swings (and not its callees') as the caller's own (``CAUSE_CALL``).
Only where some trace holds two requests or more (a call needs both in one trace). The
ClickHouse report reads the same (:mod:`otel_stages.analysis.clickhouse_calls`). Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Iterable, Sequence
from dataclasses import replace

from otel_stages import semconv
from otel_stages.analysis.model import Call, Span
from otel_stages.analysis.requests import Request
from otel_stages.analysis.stats import percentile

#: A called request span lies at most this many parent links below the calling stage span: 1,
#: the request span is the client span's child (context injected by hand or by an SDK that makes
#: no server span); 2, the callee's HTTP server span (FastAPI's, gRPC's) sits in between, as
#: OpenTelemetry's instrumentations make it; up to 5, proxies' spans too (an nginx or Envoy span
#: each way, a service mesh's sidecars: a tester's gateway behind one proxy read its call as a
#: custom stage). Only spans that are neither stages nor requests nor groups lie in between (the
#: walk stops at those), so a deeper link is still a call, not other work; ``--service`` leaves
#: out the same spans between (:data:`otel_stages.analysis.services.MAX_BETWEEN_SPANS`).
MAX_CALL_HOPS = 5
#: A stage name is a call when at least this share of its spans in the calling service's requests
#: hold a called request (of any service: a ``POST`` that calls three workers a third of the time
#: each is a call into each of them, a tester's read as a custom stage): most of its figures are
#: then the callees' time. Below it (a ``POST`` that mostly calls an API this report does not
#: read), the stage is the caller's own, ranked as any other.
CALL_MIN_SHARE = 0.5
#: A call's own time is said to swing *before* its called requests start (the client's wait for a
#: connection, connecting, the called server accepting late) or *after* they end (reading the
#: response) when that side swings at least this share of the own time's swing and the other side
#: less than the rest (:func:`own_side`); else neither is named.
CALL_SIDE_MIN_SHARE = 0.75
#: :func:`own_side`'s answers.
SIDE_BEFORE, SIDE_AFTER = "before", "after"


def own_side(call: Call) -> str | None:
    """Where ``call``'s own time swings: :data:`SIDE_BEFORE` its called requests start,
    :data:`SIDE_AFTER` they end, or ``None`` (both, between them, in calls that reach no request
    read, or unread): one side's swing at least :data:`CALL_SIDE_MIN_SHARE` of the own time's and
    the other's under the rest."""
    own, before, after = call.own_swing_ms, call.before_swing_ms, call.after_swing_ms
    if not own or own <= 0 or before is None or after is None:
        return None
    rest = (1 - CALL_SIDE_MIN_SHARE) * own
    if before >= CALL_SIDE_MIN_SHARE * own and after < rest:
        return SIDE_BEFORE
    if after >= CALL_SIDE_MIN_SHARE * own and before < rest:
        return SIDE_AFTER
    return None


def left_out(calls: Iterable[Call]) -> set[str]:
    """The stage names the rules leave out of the suspects: those of ``calls``, but for a name
    that is also a stage of the requests it calls (its figures hold the callees' own spans)."""
    calls = list(calls)
    return {c.stage for c in calls} - {c.stage for c in calls if c.callee_stage}


def _service(resource: dict[str, object]) -> str:
    name = resource.get(semconv.SERVICE_NAME)
    return "" if name is None else str(name)


def remote_calls(requests: Sequence[Request], spans: Iterable[Span],
                 steady: Container[tuple[str, str]] | None = None) -> tuple[Call, ...]:
    """The :class:`Call` stages of ``requests`` (all read: warm, cold, failed), most calls first
    (then by name, called service, calling service); ``spans`` the spans they were grouped from
    (read again only for the parent links of request spans, and only where a trace holds two
    requests or more).
    ``steady``: the ``(trace_id, span_id)`` of the requests neither cold nor set apart (failed
    ones count: a retry after a failed call is the caller's wait; none given: every request):
    the own-time and called-request percentiles read only the calls whose called requests are
    all steady (a worker's warm-up is no swing of the calls), and every span of a call stage
    that holds no called request (of the calling service), its whole time the caller's. Never
    raises."""
    per_trace = Counter(r.trace_id for r in requests)
    if not per_trace or max(per_trace.values()) < 2:
        return ()
    span_list = spans if isinstance(spans, list) else list(spans)
    leaves: dict[tuple[str, str], Span] = {}
    for r in requests:
        for s in r.spans:
            leaves.setdefault((s.trace_id, s.span_id), s)
    callees = {(r.trace_id, r.span_id): r for r in requests if per_trace[r.trace_id] > 1}
    parents = {(r.trace_id, r.span_id) for r in requests} | {
        (g.trace_id, g.span_id) for r in requests for g in r.groups}
    at: dict[tuple[str, str], list[tuple[str, str]]] = {}  # span -> the requests above which it lies
    for key in callees:
        at.setdefault(key, []).append(key)
    # per calling span and found key (its name, the called service, the calling service): the
    # requests it calls
    made: dict[tuple[tuple[str, str], tuple[str, str, str]], list[Request]] = {}
    named: set[tuple[str, str, str]] = set()  # calls into requests with a stage of their name
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
                    found_key = (stage.name, _service(callees[callee].resource), _service(stage.resource))
                    made.setdefault((up, found_key), []).append(callees[callee])
                    if any(s.name == stage.name for s in callees[callee].spans):
                        named.add(found_key)
            elif up not in parents:  # (a request or group above: no call)
                upper.setdefault(up, []).extend(below)
        at = upper
        if not at:
            break
    found: Counter[tuple[str, str, str]] = Counter(found_key for _, found_key in made)
    # a name the callees' stages share is theirs unless their spans of it are calls themselves
    # (a chain: gateway POST -> router, whose own POSTs call the worker)
    in_service = Counter((s.name, _service(r.resource)) for r in requests for s in r.spans)
    calling_from = Counter((key[0], key[2]) for _, key in made)
    own = {key for key in named if in_service[(key[0], key[1])] > calling_from[(key[0], key[1])]}
    own_ms: dict[tuple[str, str, str], list[float]] = {k: [] for k in found}
    callee_ms: dict[tuple[str, str, str], list[float]] = {k: [] for k in found}
    held: dict[tuple[str, str, str], list[int]] = {k: [] for k in found}
    each_ms: dict[tuple[str, str, str], list[float]] = {k: [] for k in found}
    # the own time before the first called request starts and after the last one ends
    sides: dict[tuple[str, str, str], tuple[list[float], list[float]]] = {k: ([], []) for k in found}
    unsteady: dict[tuple[str, str, str], set[str]] = {k: set() for k in found}
    # a span's own time is what none of its called requests covers, whichever service's (a
    # fan-out to two services at once: the one's requests are no own time of the call into the
    # other's)
    every: dict[tuple[str, str], list[Request]] = {}
    for (up, _), called in made.items():
        every.setdefault(up, []).extend(called)
    for (up, found_key), called in made.items():
        if steady is not None and not all((c.trace_id, c.span_id) in steady for c in called):
            unsteady[found_key].add(up[0])
            continue
        held[found_key].append(len(called))
        each_ms[found_key].extend(c.total_ms for c in called if not c.error)
        stage = leaves[up]
        covered = covered_ms(stage.start_ns, stage.end_ns,
                             [(c.start_ns, c.start_ns + round(c.total_ms * 1e6)) for c in called])
        covered_all = covered_ms(stage.start_ns, stage.end_ns,
                                 [(c.start_ns, c.start_ns + round(c.total_ms * 1e6)) for c in every[up]])
        own_ms[found_key].append((stage.end_ns - stage.start_ns) / 1e6 - covered_all)
        callee_ms[found_key].append(covered)
        first = min(c.start_ns for c in every[up])
        last = max(c.start_ns + round(c.total_ms * 1e6) for c in every[up])
        sides[found_key][0].append(max(0, min(first, stage.end_ns) - stage.start_ns) / 1e6)
        sides[found_key][1].append(max(0, stage.end_ns - max(last, stage.start_ns)) / 1e6)
    calling = {up for up, _ in made}
    for key, s in leaves.items():  # a call stage's spans that hold no called request: all own
        if key not in calling:  # (but a name the callees' stages share: theirs, not calls)
            for found_key in found:
                if (found_key[0], found_key[2]) == (s.name, _service(s.resource)) and found_key not in own:
                    own_ms[found_key].append((s.end_ns - s.start_ns) / 1e6)
    # the share is of the name's spans in the calling service's requests (a chain's every hop)
    # that call any service's: a POST that calls three workers a third of the time each is a call
    calling_any = Counter((name, caller) for up, name, caller in {(up, k[0], k[2]) for up, k in made})
    calls = [replace(_call(key, n, in_service[(key[0], key[2])], key in own, own_ms[key], callee_ms[key],
                           held[key], each_ms[key], sides[key]), unsteady_traces=tuple(sorted(unsteady[key])))
             for key, n in found.items()
             if calling_any[(key[0], key[2])] >= CALL_MIN_SHARE * in_service[(key[0], key[2])]]
    return tuple(sorted(calls, key=lambda c: (-c.calls, c.stage, c.service, c.caller)))


def covered_ms(start_ns: int, end_ns: int, intervals: Iterable[tuple[int, int]]) -> float:
    """The time (ms) within ``start_ns .. end_ns`` that the union of ``intervals`` (ns) covers:
    called requests made at once (a fan-out) cover their shared time once."""
    total, reach = 0, start_ns
    for lo, hi in sorted(intervals):
        total += max(0, min(hi, end_ns) - max(lo, reach, start_ns))
        reach = max(reach, hi)
    return total / 1e6


def _call(key: tuple[str, str, str], n: int, spans: int, callee_stage: bool, own_ms: list[float],
          callee_ms: list[float], held: list[int], each_ms: list[float],
          sides: tuple[list[float], list[float]]) -> Call:
    """The :class:`Call` of ``key`` (stage, called service, calling service) from its values."""
    own = [percentile(own_ms, q) if own_ms else None for q in (5, 50, 95)]
    callee = [percentile(callee_ms, q) if callee_ms else None for q in (5, 95)]
    each = [percentile(each_ms, q) if each_ms else None for q in (5, 95)]
    before = [percentile(sides[0], q) if sides[0] else None for q in (5, 95)]
    after = [percentile(sides[1], q) if sides[1] else None for q in (5, 95)]
    return Call(key[0], key[1], n, spans, key[1] == key[2], callee_stage, caller=key[2],
                own_p5_ms=own[0], own_median_ms=own[1], own_p95_ms=own[2],
                callee_p5_ms=callee[0], callee_p95_ms=callee[1],
                repeated=sum(k > min(held) for k in held) if held else 0,
                each_p5_ms=each[0], each_p95_ms=each[1], before_p5_ms=before[0],
                before_p95_ms=before[1], after_p5_ms=after[0], after_p95_ms=after[1])
