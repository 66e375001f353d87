"""``--service NAME`` in ClickHouse: the requests whose request span is of that service, as
:func:`otel_stages.analysis.services.pick_service` picks them from files. Pure: builds SQL;
:func:`otel_stages.analysis.clickhouse.run_queries` runs it.

:func:`~otel_stages.analysis.clickhouse_sql.service_statements` first picks the traces that hold a
span of the service (the sort key starts with the service name, so this reads little), and the
request pass (:mod:`otel_stages.analysis.clickhouse_requests`) groups their spans. Where that pass
finds requests of other services in those traces (a gateway's request whose call holds the
worker's request: one trace, two services), :func:`foreign_statements` lists their spans (each
request span, its stage spans and its custom stage groups) and the request pass runs again with
them left out of every read (:attr:`~otel_stages.analysis.clickhouse_sql.AggregateQuery.leave_out`),
so every later statement sees what the file report keeps. The common case (traces of one
service, or whose other services only record stages of this one's requests: a GPU worker's
``forward``) pays one count over the per-request table.
"""

from __future__ import annotations

from otel_stages import semconv
from otel_stages.analysis.clickhouse_requests import (
    CUSTOM_TABLE,
    GROUPS_TABLE,
    SMALL_RIGHT,
    owner_walk,
    stage_parents_among,
)
from otel_stages.analysis.clickhouse_sql import (
    LEFT_OUT_HOSTS_TABLE,
    MAX_GROUP_DEPTH,
    REQUESTS_TABLE,
    SERVICE_FOREIGN_TABLE,
    SERVICE_NAMES_TABLE,
    SERVICE_TRACES_TABLE,
    AggregateQuery,
    span_filter,
)
from otel_stages.analysis.services import MAX_BETWEEN_SPANS

_TRACE_KEY = "reinterpretAsUInt128(unhex(TraceId))"
_SPAN_KEY = "reinterpretAsUInt64(unhex(SpanId))"
#: The spans of other services in the traces picked that may lie between a request left out and
#: the service's own span above it (:func:`foreign_statements`).
BETWEEN_TABLE = "otel_stages_service_between"
#: Temporary tables this module creates (dropped after a report).
TABLES = (BETWEEN_TABLE,)


def foreign_statements(traces: str, query: AggregateQuery) -> list[str]:
    """(Re)create :data:`~otel_stages.analysis.clickhouse_sql.SERVICE_FOREIGN_TABLE` after the
    first request pass: ``(trace_key, sid, owner, owner_svc)`` for each span of a request whose
    request span is not of the service (param ``service``): the request span itself, the custom
    stage groups it owns (walked up as the request pass does) and the stage spans under either
    (standard and custom names), with the request (``owner``) and its service; then the spans
    between such a request span and the service's own span above it (the worker's HTTP server
    span under the gateway's client span): walking up from the request span through spans of other
    services that are no member of a request (their parent no stage parent), at most
    :data:`~otel_stages.analysis.services.MAX_BETWEEN_SPANS`, as
    :func:`otel_stages.analysis.services.pick_service` leaves them out."""
    foreign = (f"SELECT trace_key, span_key AS owner, svc AS owner_svc FROM {REQUESTS_TABLE}"
               " WHERE is_request AND svc != {service:String}")
    owned = f"""SELECT o.trace_key AS trace_key, o.key AS key, f.owner AS owner, f.owner_svc AS owner_svc
    FROM ({owner_walk(MAX_GROUP_DEPTH)}) AS o INNER JOIN ({foreign}) AS f
        ON o.trace_key = f.trace_key AND o.owner = f.owner"""
    holders = f"""SELECT trace_key, owner AS key, owner, owner_svc FROM ({foreign})
    UNION ALL SELECT trace_key, key, owner, owner_svc FROM ({owned})"""
    return [
        f"DROP TEMPORARY TABLE IF EXISTS {SERVICE_FOREIGN_TABLE}",
        f"""CREATE TEMPORARY TABLE {SERVICE_FOREIGN_TABLE} ENGINE = Memory AS
SELECT DISTINCT trace_key, sid, owner, owner_svc FROM (
    SELECT trace_key, key AS sid, owner, owner_svc FROM ({holders})
    UNION ALL
    SELECT h.trace_key AS trace_key, arrayJoin(g.k_id) AS sid, h.owner AS owner, h.owner_svc AS owner_svc
    FROM {GROUPS_TABLE} AS g INNER JOIN ({holders}) AS h ON g.trace_key = h.trace_key AND g.key = h.key
    UNION ALL
    SELECT h.trace_key AS trace_key, c.sid AS sid, h.owner AS owner, h.owner_svc AS owner_svc
    FROM {CUSTOM_TABLE} AS c INNER JOIN ({holders}) AS h ON c.trace_key = h.trace_key AND c.pid = h.key
)""",
        *_between_statements(traces, query),
    ]


def _between_statements(traces: str, query: AggregateQuery) -> list[str]:
    """The walk of :func:`foreign_statements` (after its table is filled): the candidates, spans of
    other services in the traces picked, not yet left out, whose parent is no stage parent; then
    each level's spans, the parents of the last level's (the first: of the request spans left out)."""
    other = f"""SELECT {_TRACE_KEY} AS trace_key, {_SPAN_KEY} AS sid,
        reinterpretAsUInt64(unhex(ParentSpanId)) AS pid
    FROM {traces} WHERE ServiceName != {{service:String}} AND ParentSpanId != ''
        AND {span_filter(query, odd=False)}
    LIMIT 1 BY trace_key, sid"""
    requests = f"""SELECT g.trace_key AS trace_key, g.self_pid AS pid, f.owner AS owner,
        f.owner_svc AS owner_svc
    FROM {GROUPS_TABLE} AS g INNER JOIN (
        SELECT DISTINCT trace_key, owner, owner_svc FROM {SERVICE_FOREIGN_TABLE} WHERE sid = owner) AS f
        ON g.trace_key = f.trace_key AND g.key = f.owner
    WHERE g.present AND g.self_pid != 0
    SETTINGS {SMALL_RIGHT}"""
    parents = stage_parents_among(f"SELECT DISTINCT trace_key, pid AS key FROM ({other})")
    levels = [requests]
    for _ in range(MAX_BETWEEN_SPANS):
        levels.append(f"""SELECT b.trace_key AS trace_key, b.sid AS sid, b.pid AS pid, f.owner AS owner,
        f.owner_svc AS owner_svc
    FROM {BETWEEN_TABLE} AS b INNER JOIN ({levels[-1]}) AS f
        ON b.trace_key = f.trace_key AND b.sid = f.pid""")
    walked = "\n    UNION ALL ".join(f"SELECT trace_key, sid, owner, owner_svc FROM ({level})"
                                     for level in levels[1:])
    return [
        f"DROP TEMPORARY TABLE IF EXISTS {BETWEEN_TABLE}",
        f"""CREATE TEMPORARY TABLE {BETWEEN_TABLE} ENGINE = Memory AS
SELECT trace_key, sid, pid FROM ({other})
WHERE (trace_key, sid) NOT IN (SELECT trace_key, sid FROM {SERVICE_FOREIGN_TABLE})
    AND (trace_key, pid) NOT IN ({parents})""",
        f"""INSERT INTO {SERVICE_FOREIGN_TABLE}
SELECT DISTINCT trace_key, sid, owner, owner_svc FROM ({walked})""",
    ]


def left_out_hosts_statements(traces: str, query: AggregateQuery) -> list[str]:
    """(Re)create :data:`~otel_stages.analysis.clickhouse_sql.LEFT_OUT_HOSTS_TABLE` after the
    first request pass (``query.leave_out`` set): the ``host.name`` of the requests of other
    services there, less those of the service's spans kept, as
    :func:`otel_stages.analysis.services.pick_service` reads them."""
    return [f"DROP TEMPORARY TABLE IF EXISTS {LEFT_OUT_HOSTS_TABLE}",
            f"""CREATE TEMPORARY TABLE {LEFT_OUT_HOSTS_TABLE} ENGINE = Memory AS
SELECT DISTINCT host FROM {REQUESTS_TABLE}
WHERE is_request AND svc != {{service:String}} AND host != ''
    AND host NOT IN (SELECT DISTINCT ResourceAttributes['{semconv.HOST_NAME}'] FROM {traces}
                     WHERE ServiceName = {{service:String}} AND {span_filter(query, odd=False)})"""]


def foreign_count_sql() -> str:
    """``SELECT n``: the spans :func:`foreign_statements` listed (0: no second pass)."""
    return f"SELECT count() AS n FROM {SERVICE_FOREIGN_TABLE}"


def names_statements(traces: str, query: AggregateQuery) -> list[str]:
    """(Re)create :data:`~otel_stages.analysis.clickhouse_sql.SERVICE_NAMES_TABLE` from the spans
    kept (``query.leave_out`` set): the services whose GPU points are read, as
    :func:`~otel_stages.analysis.services.pick_service` keeps them."""
    return [f"DROP TEMPORARY TABLE IF EXISTS {SERVICE_NAMES_TABLE}",
            f"""CREATE TEMPORARY TABLE {SERVICE_NAMES_TABLE} ENGINE = Memory AS
SELECT DISTINCT CAST(ServiceName AS String) AS name FROM {traces} WHERE {span_filter(query, odd=False)}"""]


def hosts_sql(traces: str, query: AggregateQuery) -> str:
    """``service_name, n``: for a service that has no request of its own, the other services'
    requests that hold a span of it among their stage spans (a GPU worker's ``forward`` under a
    gateway's request), per service, most first; as
    :func:`~otel_stages.analysis.services.service_hosts`. Read only when no request was found."""
    window = span_filter(AggregateQuery(start_ns=query.start_ns, end_ns=query.end_ns), odd=False)
    return f"""SELECT owner_svc AS service_name, uniqExact(trace_key, owner) AS n
FROM {SERVICE_FOREIGN_TABLE}
WHERE (trace_key, sid) IN (
    SELECT {_TRACE_KEY}, {_SPAN_KEY} FROM {traces}
    WHERE ServiceName = {{service:String}} AND TraceId IN {SERVICE_TRACES_TABLE} AND {window})
GROUP BY owner_svc ORDER BY n DESC, owner_svc"""
