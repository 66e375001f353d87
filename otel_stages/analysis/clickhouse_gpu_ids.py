"""GPU ``hw.id`` values reported by more than one request process, in SQL: the ClickHouse side
of :func:`otel_stages.analysis.gpu_owners.shared_hw_ids` (the same problem line from both
reports). Pure: builds SQL and reads its rows.

The GPU tables key their series by process, then ``hw.id``
(:func:`otel_stages.analysis.clickhouse_queries.gpu_owners_statements`), as the file report
does (:mod:`otel_stages.analysis.gpu_owners` says why: ``hw.id`` is unique only within a host);
this query only names the ids that repeat, so the report says so rather than leave it unseen.
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
from otel_stages.analysis.gpu_owners import GPU_METRICS

#: A point's process as :func:`otel_stages.analysis.requests.process_key` writes it.
_LABEL = process_label(*RESOURCE_PROCESS)


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
