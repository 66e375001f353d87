"""GPU ``hw.id`` values reported by more than one request process, in SQL: the ClickHouse side
of :func:`otel_stages.analysis.gpu_owners.shared_hw_ids` (the same problem line from both
reports). Pure: builds SQL and reads its rows.

The GPU tables key their series by process, then ``hw.id``
(:func:`otel_stages.analysis.clickhouse_queries.gpu_owners_statements`), as the file report
does (:mod:`otel_stages.analysis.gpu_owners` says why: ``hw.id`` is unique only within a host);
this query only names the ids that repeat, so the report says so rather than leave it unseen.

Also the utilization senders whose unit is ambiguous (:func:`ambiguous_condition`, the SQL of
:func:`otel_stages.analysis.gpu_owners.is_ambiguous`, judged per sender over all its undeclared
points): :func:`ambiguous_units_sql` names their series for the problem line, and the GPU
samples statement leaves those points out
(:func:`otel_stages.analysis.clickhouse_queries.gpu_pairs_statements`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.clickhouse_sql import (
    PROCESS_TABLE,
    RESOURCE_PROCESS,
    AggregateQuery,
    metric_filter,
    process_hash,
    process_label,
)
from otel_stages.analysis.gpu_owners import (
    GPU_METRICS,
    PERCENT_GUESS,
    UNDECLARED_UNIT,
    SeriesKey,
)

#: A point's process as :func:`otel_stages.analysis.requests.process_key` writes it.
_LABEL = process_label(*RESOURCE_PROCESS)
#: SQL over a gauge table row: not an ``hw.gpu.utilization`` point of a video engine
#: (``hw.gpu.task`` ``decoder`` / ``encoder``), as
#: :func:`otel_stages.analysis.gpu_owners.is_model_utilization` reads them.
MODEL_ENGINE = (f"(MetricName != '{semconv.HW_GPU_UTILIZATION}'"
                f" OR Attributes['{semconv.HW_GPU_TASK}'] IN ('', '{semconv.HW_GPU_TASK_GENERAL}'))")


def shared_gpu_ids_sql(gauge: str, query: AggregateQuery) -> str:
    """Rows ``hw`` and ``procs`` (sorted process keys, at least two): the ``hw.id`` values that
    GPU points of more than one process with requests (the per-request tables' process table)
    carry. Params: :func:`~otel_stages.analysis.clickhouse_sql.query_params`."""
    names = "(" + ", ".join(f"'{n}'" for n in GPU_METRICS) + ")"
    return f"""SELECT hw, arraySort(groupUniqArray(label)) AS procs FROM (
    SELECT Attributes['{semconv.HW_ID}'] AS hw, {_LABEL} AS label, {process_hash(*RESOURCE_PROCESS)} AS k
    FROM {gauge} WHERE {metric_filter(query, names)}
) WHERE k IN (SELECT arrayJoin(proc_keys) FROM {PROCESS_TABLE})
GROUP BY hw HAVING length(procs) > 1 ORDER BY hw"""


def shared_gpu_ids(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """:func:`shared_gpu_ids_sql`'s rows as :func:`otel_stages.analysis.gpu_owners.shared_hw_ids`
    answers: ``hw.id`` -> its processes."""
    return {str(r["hw"]): [str(p) for p in r["procs"]] for r in rows}


def ambiguous_condition(undeclared: str, value: str) -> str:
    """SQL aggregate over one sender's utilization points of one unit (every ``hw.id``): true when
    :func:`otel_stages.analysis.gpu_owners.is_ambiguous` is (every point's ``undeclared``, a UInt8,
    is 1, and every ``value`` a whole number not above
    :data:`~otel_stages.analysis.gpu_owners.PERCENT_GUESS`, at least one above 0)."""
    return (f"(min({undeclared}) = 1 AND max({value}) <= {PERCENT_GUESS} AND max({value}) > 0"
            f" AND min({value} = floor({value})) = 1)")


def ambiguous_units_sql(gauge: str, query: AggregateQuery) -> str:
    """Rows ``proc`` (the sender as :func:`otel_stages.analysis.requests.process_key` writes it)
    and ``hw`` (``hw.id``), sorted: the ``hw.gpu.utilization`` series in the window with undeclared
    points of a sender whose undeclared points (every ``hw.id``) :func:`ambiguous_condition` finds
    ambiguous, as :func:`otel_stages.analysis.gpu_owners.ambiguous_series` finds them (every sender,
    with requests or not). Params: :func:`~otel_stages.analysis.clickhouse_sql.query_params`."""
    return f"""WITH undeclared AS (
    SELECT Attributes['{semconv.HW_ID}'] AS hw, {_LABEL} AS label, {process_hash(*RESOURCE_PROCESS)} AS k,
        toUInt8(1) AS undeclared, Value
    FROM {gauge} WHERE {metric_filter(query, f"('{semconv.HW_GPU_UTILIZATION}')")}
        AND MetricUnit = '{UNDECLARED_UNIT}' AND {MODEL_ENGINE}
)
SELECT any(label) AS proc, hw FROM undeclared
WHERE k IN (SELECT k FROM undeclared GROUP BY k HAVING {ambiguous_condition("undeclared", "Value")})
GROUP BY k, hw ORDER BY proc, hw"""


def ambiguous_units(rows: Sequence[Mapping[str, Any]]) -> list[SeriesKey]:
    """:func:`ambiguous_units_sql`'s rows as :func:`otel_stages.analysis.gpu_owners.ambiguous_series`
    answers: ``(process, hw.id)`` pairs."""
    return [(str(r["proc"]), str(r["hw"])) for r in rows]
