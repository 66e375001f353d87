"""Failed requests in ClickHouse: what they failed with and where they stopped, as
:func:`otel_stages.analysis.diagnosis.failure_kinds` counts them for the file report. Pure: SQL
text, and the reading of its answer.

Per failed request (the request span's status is ERROR; cold ones included): its *kind* is the
first non-empty ``error.type`` of the request span, then of its failed stage spans in start
order, else the first ``exception.type`` of an event on those spans in the same order (OTel
semantic conventions; :data:`~otel_stages.analysis.failures.KIND_UNKNOWN` when none); *where it
stopped* is ``failed in <stage>`` for its first failed stage span, else ``last stage <stage>``
for the stage span that ended last. Its stage spans are the request span's children that hold no
spans of their own, and the children of those that do (a custom group): one level of groups, as
deep as the rules need for the usual ``request -> preprocess -> decode``.

Read only when some request failed: the spans of the failed requests' traces, matched by trace
id (a read of the ``TraceId`` column; the rows read are those traces' spans). Their times
(:func:`failed_times_sql`: the median total and each stage's median, as
:func:`otel_stages.analysis.diagnosis.failed_times` gives them) come from the per-request table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.clickhouse_sql import REQUESTS_TABLE, AggregateQuery, median, span_filter
from otel_stages.analysis.failures import KIND_UNKNOWN
from otel_stages.analysis.stats import order_stages

_STD = "(" + ", ".join(f"'{s}'" for s in semconv.STANDARD_STAGES) + ")"
FAILED_IN = "failed in "
LAST_STAGE = "last stage "


def failures_sql(traces: str, query: AggregateQuery) -> str:
    """Rows ``(kind, stopped, n)``: failed requests by error kind (``''``: none recorded) and by
    where they stopped (``''``: no stage span). Params: :func:`~otel_stages.analysis.
    clickhouse_sql.query_params`."""
    return f"SELECT kind, stopped, count() AS n FROM ({stopped_sql(traces, query)}) GROUP BY kind, stopped"


def stopped_sql(traces: str, query: AggregateQuery, which: str = "1") -> str:
    """Rows ``(trace_key, span_key, kind, stopped)``, one per failed request with a request span
    (and ``which``, a condition over the per-request table's columns): its error kind and where it
    stopped (module docstring). Params: :func:`~otel_stages.analysis.clickhouse_sql.query_params`."""
    a = "SpanAttributes"
    failed = (f"SELECT trace_key, span_key FROM {REQUESTS_TABLE}"
              f" WHERE is_request AND error AND span_key != 0 AND ({which})")
    # (1 sid, 2 pid, 3 name, 4 start, 5 end, 6 failed, 7 error.type, 8 exception.type)
    spans = f"""SELECT reinterpretAsUInt128(unhex(TraceId)) AS trace_key,
        groupArray((reinterpretAsUInt64(unhex(SpanId)), reinterpretAsUInt64(unhex(ParentSpanId)),
                    toString(SpanName), toInt64(toUnixTimestamp64Nano(Timestamp)),
                    toInt64(toUnixTimestamp64Nano(Timestamp)) + toInt64(Duration),
                    StatusCode IN ('Error', 'STATUS_CODE_ERROR'), {a}['{semconv.ERROR_TYPE}'],
                    arrayFirst(x -> x != '', arrayMap(m -> m['{semconv.EXCEPTION_TYPE}'],
                                                      `Events.Attributes`)))) AS spans,
        groupArray(reinterpretAsUInt64(unhex(ParentSpanId))) AS pids
    FROM {traces}
    WHERE {span_filter(query, odd=False)}
        AND reinterpretAsUInt128(unhex(TraceId)) IN (SELECT trace_key FROM ({failed}))
    GROUP BY trace_key"""
    return f"""SELECT trace_key, q AS span_key, kind, stopped FROM (
    SELECT f.trace_key AS trace_key, f.span_key AS q, t.spans AS spans, t.pids AS pids,
        arrayMap(x -> x.1, arrayFilter(x -> x.2 = q AND x.3 NOT IN {_STD} AND has(pids, x.1), spans)) AS grp,
        arraySort(x -> (x.4, x.3), arrayFilter(x -> (x.2 = q OR has(grp, x.2)) AND NOT has(grp, x.1),
                                               spans)) AS leaves,
        arrayConcat(arrayFilter(x -> x.1 = q, spans), arrayFilter(x -> x.6, leaves)) AS failed,
        if(arrayExists(x -> x.7 != '', failed), arrayFirst(x -> x.7 != '', failed).7,
           arrayFirst(x -> x.8 != '', failed).8) AS kind,
        arrayMax(arrayMap(y -> y.5, leaves)) AS last_end,
        multiIf(arrayExists(x -> x.6, leaves), concat('{FAILED_IN}', arrayFirst(x -> x.6, leaves).3),
                notEmpty(leaves), concat('{LAST_STAGE}', arrayFirst(x -> x.5 = last_end, leaves).3),
                '') AS stopped
    FROM ({failed}) AS f INNER JOIN ({spans}) AS t ON f.trace_key = t.trace_key
)"""


def failed_times_sql(method: str) -> str:
    """Rows ``(stage, median_ms)`` over the failed requests (cold ones included): ``stage`` ``''``
    for their median total, else a stage's median with 0 ms where a failed request lacks it
    (ms; ``method``: the quantile function, :func:`~otel_stages.analysis.clickhouse_sql.median`).
    No row for the total without failed requests."""
    failed = f"SELECT total_ns, stage_names, stage_ns FROM {REQUESTS_TABLE} WHERE is_request AND error"
    names = f"(SELECT groupUniqArrayArray(stage_names) FROM ({failed}))"
    return f"""SELECT '' AS stage, {median("total_ns / 1e6", "1", method)} AS median_ms
FROM ({failed}) HAVING count() > 0
UNION ALL
SELECT stage, {median("ms", "1", method)} AS median_ms FROM (
    SELECT arrayJoin({names}) AS stage,
        if(has(stage_names, stage), stage_ns[indexOf(stage_names, stage)], 0) / 1e6 AS ms
    FROM ({failed})
)
GROUP BY stage"""


def failed_times(rows: Sequence[Mapping[str, Any]]) -> tuple[float | None, dict[str, float]]:
    """``(median_total_ms, stages_ms)`` from :func:`failed_times_sql`'s rows (stages in pipeline
    order), as :func:`otel_stages.analysis.diagnosis.failed_times` gives them."""
    total = next((float(r["median_ms"]) for r in rows if r["stage"] == ""), None)
    stages = {str(r["stage"]): float(r["median_ms"]) for r in rows if r["stage"] != ""}
    return total, {n: stages[n] for n in order_stages(stages)}


def failure_kinds(rows: Sequence[Mapping[str, Any]]) -> tuple[dict[str, int], dict[str, int]]:
    """``(kinds, where)`` from :func:`failures_sql`'s rows, as
    :func:`otel_stages.analysis.diagnosis.failure_kinds` gives them."""
    kinds: dict[str, int] = {}
    where: dict[str, int] = {}
    for r in rows:
        n = int(r["n"])
        kind = str(r["kind"] or "") or KIND_UNKNOWN
        kinds[kind] = kinds.get(kind, 0) + n
        if r["stopped"]:
            where[str(r["stopped"])] = where.get(str(r["stopped"]), 0) + n
    return kinds, where
