"""Stages that are calls into other requests, in ClickHouse: the rule of
:mod:`otel_stages.analysis.calls` over the per-request tables of
:mod:`otel_stages.analysis.clickhouse_requests`. Pure: builds SQL;
:func:`otel_stages.analysis.clickhouse.run_queries` runs it, only where some trace holds two
requests or more (:func:`search_needed_sql`), so a report of one request per trace reads nothing
here, and the walk starts from the requests of those traces only.

Each hop (:data:`~otel_stages.analysis.calls.MAX_CALL_HOPS` at most) reads the spans at the
current links (their parents', starting from each such request span's parent, by trace and span
id) and sorts them: a stage span of a request (a child of a request or group, itself no stage
parent, its name as the request pass names it) ends the walk, as a call (of the same
``service.name`` as the called request or not); a span that is neither stage nor stage parent
passes the walk on to its parent.
"""

from __future__ import annotations

from otel_stages import semconv
from otel_stages.analysis.calls import CALL_MIN_SHARE
from otel_stages.analysis.clickhouse_requests import GROUPS_TABLE, NESTED_TABLE, PER_REQUEST_SQL
from otel_stages.analysis.clickhouse_sql import APART_TABLE, REQUESTS_TABLE, AggregateQuery, span_filter

#: The links still walked: ``(trace_key, at, svc, callee)``, ``at`` a span id above the request
#: ``callee`` (its span key) of service ``svc``.
AT_TABLE = "otel_stages_call_at"
#: The calls found: ``(name, svc, caller, trace_key, callee, sid, start, dur)`` per called
#: request, ``caller`` the calling span's service.name; ``sid`` the calling span's id, ``start`` /
#: ``dur`` its start and duration (ns).
FOUND_TABLE = "otel_stages_call_found"
#: Every stage span named as a call, in the requests read: ``(trace_key, sid, name, svc, dur)``,
#: ``svc`` its own service.name.
SPANS_TABLE = "otel_stages_call_spans"
#: Temporary tables this module creates (dropped after a report).
TABLES = (AT_TABLE, FOUND_TABLE, SPANS_TABLE)

_REQUEST_KEYS = f"SELECT trace_key, span_key FROM {REQUESTS_TABLE} WHERE is_request"
_HOLDERS = f"{_REQUEST_KEYS} UNION ALL SELECT trace_key, key FROM {NESTED_TABLE}"
_STAGE_PARENTS = f"SELECT trace_key, key FROM {GROUPS_TABLE} WHERE present"


_SHARED_TRACES = (f"SELECT trace_key FROM {REQUESTS_TABLE} WHERE is_request"
                  " GROUP BY trace_key HAVING count() > 1")


def search_needed_sql() -> str:
    """``SELECT n``: 1 when some trace holds two requests (request spans) or more, else 0."""
    return f"SELECT toUInt8(uniqExact(trace_key) < count()) AS n FROM {REQUESTS_TABLE} WHERE is_request"


def start_statements() -> list[str]:
    """(Re)create :data:`FOUND_TABLE` (empty) and :data:`AT_TABLE` with each request's parent."""
    return [
        f"DROP TEMPORARY TABLE IF EXISTS {FOUND_TABLE}",
        f"CREATE TEMPORARY TABLE {FOUND_TABLE} (name String, svc String, caller String,"
        " trace_key UInt128, callee UInt64, sid UInt64, start Int64, dur Int64) ENGINE = Memory",
        f"DROP TEMPORARY TABLE IF EXISTS {AT_TABLE}",
        f"""CREATE TEMPORARY TABLE {AT_TABLE} ENGINE = Memory AS
SELECT trace_key, self_pid AS at, self_svc AS svc, key AS callee FROM {GROUPS_TABLE}
WHERE present AND self_pid != 0 AND (trace_key, key) IN ({_REQUEST_KEYS})
    AND trace_key IN ({_SHARED_TRACES})
LIMIT 1 BY trace_key, key""",
    ]


def _spans(traces: str, query: AggregateQuery, where: str) -> str:
    """The spans of ``traces`` in ``query`` that pass ``where`` (on the columns as read), each
    once: its keys, its name as the request pass names it, service.name, start and duration (ns),
    and whether it is a ``stage`` of a request read (a child of a request or group, itself no
    stage parent) or a ``holder`` (a stage parent)."""
    return f"""SELECT reinterpretAsUInt128(unhex(TraceId)) AS trace_key,
        reinterpretAsUInt64(unhex(SpanId)) AS sid, reinterpretAsUInt64(unhex(ParentSpanId)) AS pid,
        if(match(CAST(SpanName AS String), {PER_REQUEST_SQL}),
           trimBoth(SpanAttributes['{semconv.STAGE_NAME}']), CAST(SpanName AS String)) AS name,
        CAST(ServiceName AS String) AS span_svc, toInt64(toUnixTimestamp64Nano(Timestamp)) AS start,
        toInt64(Duration) AS dur,
        ParentSpanId != '' AND (trace_key, pid) IN ({_HOLDERS})
            AND (trace_key, sid) NOT IN ({_STAGE_PARENTS}) AS stage,
        (trace_key, sid) IN ({_STAGE_PARENTS}) AS holder
    FROM {traces}
    WHERE {span_filter(query, odd=False)} AND {where}
    LIMIT 1 BY trace_key, sid"""


def spans_statements(traces: str, query: AggregateQuery) -> list[str]:
    """(params: ``query_params``) (Re)create :data:`SPANS_TABLE` with every stage span named as
    a call found (in :data:`FOUND_TABLE`), whether it holds a called request or not."""
    names = f"SELECT DISTINCT name FROM {FOUND_TABLE}"
    where = (f"(CAST(SpanName AS String) IN ({names})"
             f" OR match(CAST(SpanName AS String), {PER_REQUEST_SQL}))")
    return [
        f"DROP TEMPORARY TABLE IF EXISTS {SPANS_TABLE}",
        f"""CREATE TEMPORARY TABLE {SPANS_TABLE} ENGINE = Memory AS
SELECT trace_key, sid, name, span_svc AS svc, dur FROM ({_spans(traces, query, where)})
WHERE stage AND name IN ({names})""",
    ]


def hop_statements(traces: str, query: AggregateQuery) -> list[str]:
    """One hop (params: ``query_params``): the calls found at :data:`AT_TABLE`'s spans into
    :data:`FOUND_TABLE`, and :data:`AT_TABLE` moved one parent up past the spans that are
    neither stage nor stage parent."""
    at = (f"(reinterpretAsUInt128(unhex(TraceId)), reinterpretAsUInt64(unhex(SpanId)))"
          f" IN (SELECT trace_key, at FROM {AT_TABLE})")
    spans = _spans(traces, query, at)
    joined = f"""SELECT a.trace_key AS trace_key, a.svc AS svc, a.callee AS callee, s.pid AS pid,
        s.name AS name, s.span_svc AS span_svc, s.stage AS stage, s.holder AS holder,
        s.sid AS sid, s.start AS start, s.dur AS dur
    FROM {AT_TABLE} AS a
    INNER JOIN ({spans}) AS s ON a.trace_key = s.trace_key AND a.at = s.sid"""
    return [
        f"""INSERT INTO {FOUND_TABLE} SELECT name, svc, span_svc, trace_key, callee, sid, start, dur
FROM ({joined})
WHERE stage AND name != ''""",
        f"DROP TEMPORARY TABLE IF EXISTS {AT_TABLE}_next",
        f"""CREATE TEMPORARY TABLE {AT_TABLE}_next ENGINE = Memory AS
SELECT trace_key, pid AS at, svc, callee FROM ({joined})
WHERE NOT (stage AND name != '') AND NOT holder AND pid != 0""",
        f"DROP TEMPORARY TABLE {AT_TABLE}",
        f"CREATE TEMPORARY TABLE {AT_TABLE} ENGINE = Memory AS SELECT * FROM {AT_TABLE}_next",
        f"DROP TEMPORARY TABLE {AT_TABLE}_next",
    ]


def calls_sql() -> str:
    """``stage, service, caller, calls, spans, shared_name, callee_stage, repeated, each_q,
    own_q, callee_q, before_q, after_q``: as :func:`otel_stages.analysis.calls.remote_calls`, per called
    (``service``) and calling service (``caller``), most calls first: the stages whose calling
    spans (into any service's requests) reach :data:`~otel_stages.analysis.calls.CALL_MIN_SHARE`
    of their spans in the calling service's requests read. ``own_q``: the p5, median and p95 (ns,
    ``quantilesExactInclusive``: the file report's interpolation) of each calling span's own time
    (its duration less the union of its called requests within it) over the spans whose called
    requests are all steady (neither cold nor set apart: failed ones count), and of the call
    stage's spans of the calling service that hold none (their whole duration; not for a name the
    callees' stages share: theirs). ``callee_q``: the p5 and p95 of the covered time over the
    former; ``repeated``: how many of the former hold more called requests than the fewest any of
    them holds; ``each_q``:
    the p5 and p95 of each of their successful called requests' totals (ns); ``before_q`` /
    ``after_q``: the p5 and p95 of the own time before the first called request starts and after
    the last one ends, over the same spans as ``callee_q`` (ns); ``unsteady_traces``: the trace
    ids of the calling spans whose called requests are not all steady, sorted."""
    steady = ("min(NOT r.cold AND (r.trace_key, r.span_key) NOT IN"
              f" (SELECT trace_key, span_key FROM {APART_TABLE}))")
    per_call = f"""SELECT c.name AS name, c.svc AS svc, c.caller AS caller, c.trace_key AS tk, c.sid AS call,
        any(c.start) AS cs, any(c.dur) AS dur, count() AS k,
        groupArrayIf(r.total_ns, NOT r.error) AS totals,
        {steady} AS steady,
        max(has(r.stage_names, c.name)) AS o,
        arraySort(groupArray((r.start_ns, r.start_ns + r.total_ns))) AS iv
    FROM {FOUND_TABLE} AS c
    LEFT JOIN (SELECT trace_key, span_key, stage_names, start_ns, total_ns, cold, error
               FROM {REQUESTS_TABLE}
               WHERE is_request AND trace_key IN (SELECT trace_key FROM {FOUND_TABLE})) AS r
        ON c.trace_key = r.trace_key AND c.callee = r.span_key
    GROUP BY name, svc, caller, tk, call"""
    covered = ("arrayFold((acc, v) -> (acc.1 + greatest(toInt64(0), least(v.2, cs + dur)"
               " - greatest(v.1, acc.2, cs)), greatest(acc.2, v.2)), {iv}, (toInt64(0), cs)).1")
    # the own time is what none of the span's called requests covers, whichever service's (a
    # fan-out to two at once); before the first one starts and after the last one ends
    before = "greatest(toInt64(0), least(all_iv[1].1, cs + dur) - cs)"
    after = "greatest(toInt64(0), cs + dur - greatest(arrayMax(arrayMap(v -> v.2, all_iv)), cs))"
    lone = (f"SELECT name, svc, groupArray(dur) AS durs FROM {SPANS_TABLE}"
            f" WHERE (trace_key, sid) NOT IN (SELECT trace_key, sid FROM {FOUND_TABLE}) GROUP BY name, svc")
    # a name the callees' stages share is theirs unless their spans of it are calls themselves
    in_service = (f"SELECT name, svc, sum(k) AS n FROM {REQUESTS_TABLE} ARRAY JOIN stage_names AS name,"
                  " stage_counts AS k WHERE is_request GROUP BY name, svc")
    calling_from = (f"SELECT name, caller, count() AS n FROM (SELECT DISTINCT name, svc, caller,"
                    f" trace_key, sid FROM {FOUND_TABLE}) GROUP BY name, caller")
    # the calling spans of a name that call any service's requests (the share is of those)
    calling_any = (f"SELECT name, caller, uniqExact(trace_key, sid) AS n FROM {FOUND_TABLE}"
                   " GROUP BY name, caller")
    return f"""SELECT f.name AS stage, f.svc AS service, f.caller AS caller, f.n AS calls, t.n AS spans,
    f.caller = f.svc AS shared_name, f.own AS callee_stage, f.repeated AS repeated, f.each_q AS each_q,
    arrayReduce('quantilesExactInclusive(0.05, 0.5, 0.95)',
                arrayConcat(f.owns, if(f.own, [], l.durs))) AS own_q,
    f.callee_q AS callee_q, f.before_q AS before_q, f.after_q AS after_q,
    f.unsteady_traces AS unsteady_traces
FROM (SELECT g.name AS name, g.svc AS svc, g.caller AS caller, g.n AS n, g.owns AS owns,
             g.callee_q AS callee_q, g.repeated AS repeated, g.each_q AS each_q,
             g.before_q AS before_q, g.after_q AS after_q, g.unsteady_traces AS unsteady_traces,
             toUInt8(g.named AND ifNull(ins.n, 0) > ifNull(cf.n, 0)) AS own
      FROM (SELECT name, svc, caller, count() AS n, max(o) AS named,
             groupArrayIf(dur - cov_all, steady) AS owns,
             quantilesExactInclusiveIf(0.05, 0.95)(cov, steady) AS callee_q,
             quantilesExactInclusiveIf(0.05, 0.95)({before}, steady) AS before_q,
             quantilesExactInclusiveIf(0.05, 0.95)({after}, steady) AS after_q,
             countIf(steady AND k > fewest) AS repeated,
             arraySort(groupUniqArrayIf(lower(hex(reinterpretAsFixedString(tk))), NOT steady))
                 AS unsteady_traces,
             arrayReduce('quantilesExactInclusive(0.05, 0.95)', arrayFlatten(groupArrayIf(totals, steady)))
                 AS each_q
      FROM (SELECT *, {covered.format(iv="iv")} AS cov, {covered.format(iv="all_iv")} AS cov_all
            FROM (SELECT *, minIf(k, steady) OVER (PARTITION BY name, svc, caller) AS fewest,
                         arraySort(arrayFlatten(groupArray(iv) OVER (PARTITION BY tk, call))) AS all_iv
                  FROM ({per_call})))
      GROUP BY name, svc, caller) AS g
      LEFT JOIN ({in_service}) AS ins ON g.name = ins.name AND g.svc = ins.svc
      LEFT JOIN ({calling_from}) AS cf ON g.name = cf.name AND g.svc = cf.caller) AS f
INNER JOIN ({in_service}) AS t ON f.name = t.name AND f.caller = t.svc
LEFT JOIN ({lone}) AS l ON f.name = l.name AND f.caller = l.svc
INNER JOIN ({calling_any}) AS a ON f.name = a.name AND f.caller = a.caller
WHERE a.n >= {CALL_MIN_SHARE} * t.n
ORDER BY calls DESC, stage, service, caller"""

