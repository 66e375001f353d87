"""Warm requests set apart as cold, in ClickHouse: what
:func:`otel_stages.analysis.cohorts.find_set_apart` does for the file report, computed over the
per-request table. Pure: builds SQL and reads its answer rows;
:func:`otel_stages.analysis.clickhouse.run_queries` runs it.

Per process, in start order, a warm request (not cold, not failed) is *flagged* when it follows
:data:`~otel_stages.analysis.cohorts.IDLE_GAP_MIN_S` seconds without a request (``after_idle``),
else when it is the first success after a failed first (cold) request (``after_failed_start``),
else when the process started in the window (it has a cold request) and it is the first request
with its input there and has at most one decode span (``new_input``: the input of a request of
several images is its first image's), else when a cold request came before it in its process and
fewer than :data:`~otel_stages.analysis.cohorts.WARMUP_MAX_REQUESTS` warm ones (``warm_up``;
every such request, whatever its reason, is a warm-up *candidate* at its position, the warm
requests before it). A flagged request is *set apart* when at least
:data:`~otel_stages.analysis.cohorts.COMPARABLE_MIN_REQUESTS` comparable requests (same input and
images decoded, ``images_sig``; for an unknown input all of them) have a median total above 0 and
it took :data:`~otel_stages.analysis.decision.COLD_START_MIN_RATIO` times that median or more; the
comparable requests are the warm ones not flagged for another reason than ``warm_up``. A
``warm_up`` request is compared with the warm requests flagged for nothing (after the warm-up)
and must take their p95 (``quantileExactHigh``: an element of them, not interpolated) plus their
median or more (:func:`~otel_stages.analysis.cohorts.warm_up_min_ms`),
and it stays set apart only before the first candidate of its process that is not set apart
(the warm-up is consecutive from the cold request). Each row carries its process's warm-up:
``warmup_n`` (the candidates before that first one), ``warmup_ended`` (there is one) and
``warmup_capped`` (none, and the last candidate is at the cap); :func:`warmup_sql` sums them up.

Requests set apart leave the warm statistics: :data:`APART_TABLE` holds their keys, and
:func:`otel_stages.analysis.clickhouse_sql.requests` (what every aggregate reads) clears their
``warm`` flag. Inputs are ``(image.width, image.height, image.format)``, the SQL's cohorts (the
file report also splits by prompt size when a recording has prompt token counts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.clickhouse_sql import APART_TABLE, cohort_requests
from otel_stages.analysis.cohorts import (
    COMPARABLE_MIN_REQUESTS,
    IDLE_GAP_MIN_S,
    WARM_UP_BAR_QUANTILE,
    WARMUP_MAX_REQUESTS,
)
from otel_stages.analysis.decision import COLD_START_MIN_RATIO
from otel_stages.analysis.figures import (
    REASON_AFTER_FAILED_START,
    REASON_AFTER_IDLE,
    REASON_BEHIND_COLD,
    REASON_NEW_INPUT,
    REASON_WARM_UP,
    ApartFigures,
    WarmupFigures,
)

#: Requests set apart returned one by one (in start order); past this the rest are counted.
MAX_APART_ROWS = 1000

_KNOWN = "width IS NOT NULL AND height IS NOT NULL"


#: The flagged warm requests with their reason (dropped once the requests set apart are known).
FLAGGED_TABLE = "otel_stages_apart_flagged"


def apart_statements() -> list[str]:
    """(Re)create :data:`APART_TABLE` from the per-request table (module docstring): one row per
    request set apart with its ``trace_key``, ``span_key``, ``start_ns``, ``seq``, input,
    ``total_ns``, ``reason``, ``idle_ns`` (NULL unless after an idle gap), the comparable
    ``median_ns``, its process ``ph`` and warm-up position ``warmup_pos`` (-1: not a candidate)
    and its process's ``warmup_n`` / ``warmup_ended`` / ``warmup_capped``. One window pass over
    the requests sorted per process (the time since the previous requests ended, how many came
    before, how many of them were warm or cold) keeps only the flagged requests
    (:data:`FLAGGED_TABLE`, usually few: at most ``WARMUP_MAX_REQUESTS`` warm-up candidates per
    process started in the window, and the rest): the first request of each input in a process is
    a set lookup, the per-process facts (started in the window, failed first request) a small
    aggregation joined to those rows. The comparable medians are then taken only for the inputs
    of flagged requests (and over all warm requests only when a flagged one has no known input),
    and the warm-up prefix per process over the flagged rows alone."""
    idle = round(IDLE_GAP_MIN_S * 1e9)
    cap = WARMUP_MAX_REQUESTS
    # ties in start time by the trace id's bytes, then the cold one first, then the span id's, as
    # the file report orders requests (a warm-up request must come after the cold one; a fan-out
    # at start-up starts a trace's requests in one nanosecond)
    prev = ("PARTITION BY ph ORDER BY start_ns, reinterpretAsFixedString(trace_key), cold DESC,"
            " reinterpretAsFixedString(span_key) ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING")
    # a request that started before its process's cold one ended waited for it (REASON_BEHIND_COLD)
    behind = "w.cold_before > 0 AND w.start_ns < w.cold_end"
    warming = f"w.cold_before > 0 AND w.warm_before < {cap} AND w.start_ns >= w.cold_end"
    reason = (f"multiIf(w.rows_before > 0 AND w.start_ns - w.last_end >= {idle}, '{REASON_AFTER_IDLE}',"
              f" p.failed_first AND w.warm_before = 0, '{REASON_AFTER_FAILED_START}',"
              f" p.started AND {_KNOWN} AND w.first_input, '{REASON_NEW_INPUT}',"
              f" {behind}, '{REASON_BEHIND_COLD}',"
              f" {warming}, '{REASON_WARM_UP}',"
              " '')")
    # the input with the images decoded (images_sig), as cohorts.find_set_apart compares them
    key = (f"if({_KNOWN}, concat(toString(width), 'x', toString(height), '/', fmt, '/',"
           " toString(images_sig)), '')")
    # a request's process: proc_key (clickhouse_sql.process_hash of the request span's service
    # namespace, name and instance, else host) names the same processes as ``proc``
    firsts = f"""SELECT proc_key, width, height, fmt, first.1, first.2 FROM (
            SELECT proc_key, width, height, fmt, min((start_ns, trace_key)) AS first
            FROM {cohort_requests()} WHERE is_request AND {_KNOWN} GROUP BY proc_key, width, height, fmt)"""
    # the window sorts only the columns it needs; the flagged rows' input, seq and total come
    # from a second read of the requests, joined to those few rows
    flagged = f"""CREATE TEMPORARY TABLE {FLAGGED_TABLE} ENGINE = Memory AS
SELECT d.trace_key AS trace_key, d.span_key AS span_key, d.start_ns AS start_ns, d.seq AS seq,
    d.width AS width, d.height AS height, d.fmt AS fmt, d.total_ns AS total_ns, {key} AS k,
    {reason} AS reason,
    if(reason = '{REASON_AFTER_IDLE}', w.start_ns - w.last_end, NULL) AS idle_ns,
    w.ph AS ph, if({warming}, toInt64(w.warm_before), toInt64(-1)) AS warmup_pos
FROM (
    SELECT trace_key, span_key, start_ns, seq, width, height, fmt, images_sig, total_ns
    FROM {cohort_requests()} WHERE is_request
) AS d
INNER JOIN (
    SELECT * FROM (
        SELECT trace_key, span_key, start_ns, warm, first_input, proc_key AS ph,
            max(start_ns + total_ns) OVER ({prev}) AS last_end,
            count() OVER ({prev}) AS rows_before,
            sum(warm) OVER ({prev}) AS warm_before,
            sum(cold) OVER ({prev}) AS cold_before,
            max(if(cold, start_ns + total_ns, toInt64(0))) OVER ({prev}) AS cold_end
        FROM (
            SELECT trace_key, span_key, start_ns, total_ns, warm, cold, proc_key,
                (proc_key, width, height, fmt, start_ns, trace_key) IN ({firsts})
                    AND arrayElement(stage_counts, indexOf(stage_names, '{semconv.STAGE_DECODE}')) <= 1
                    AS first_input
            FROM {cohort_requests()} WHERE is_request
        )
    )  -- what can be flagged (the reasons below, without the per-process facts)
    WHERE warm AND ((rows_before > 0 AND start_ns - last_end >= {idle}) OR warm_before = 0 OR first_input
                    OR (cold_before > 0 AND (warm_before < {cap} OR start_ns < cold_end)))
) AS w ON d.trace_key = w.trace_key AND d.span_key = w.span_key
LEFT JOIN (
    SELECT proc_key AS ph, max(cold) AS started,
        argMin(cold AND error, (start_ns, trace_key)) AS failed_first
    FROM {cohort_requests()} WHERE is_request GROUP BY ph
) AS p ON w.ph = p.ph
WHERE reason != ''"""
    # o: comparable for the other reasons (not flagged for one of them); s: for the warm-up
    # (flagged for nothing: after it)
    marks = (f"(trace_key, span_key) NOT IN (SELECT trace_key, span_key FROM {FLAGGED_TABLE}"
             f" WHERE reason != '{REASON_WARM_UP}') AS o,"
             f" (trace_key, span_key) NOT IN (SELECT trace_key, span_key FROM {FLAGGED_TABLE}) AS s")
    # compared as the warm-up is: with the warm requests flagged for nothing, p95 plus median
    warmish = f"'{REASON_WARM_UP}', '{REASON_BEHIND_COLD}'"
    stats = ("countIf(o) AS n, quantileExactInclusiveIf(0.5)(total_ns, o) AS median_ns,"
             " countIf(s) AS n_after, quantilesExactInclusiveIf(0.5)(total_ns, s) AS q_after,"
             f" quantileExactHighIf({WARM_UP_BAR_QUANTILE})(total_ns, s) AS high_after")
    create = f"""CREATE TEMPORARY TABLE {APART_TABLE} ENGINE = Memory AS
WITH comparable AS (
    SELECT k, {stats}
    FROM (SELECT {key} AS k, total_ns, {marks} FROM {cohort_requests()}
          WHERE warm AND {_KNOWN} AND k IN (SELECT k FROM {FLAGGED_TABLE}))
    GROUP BY k
    UNION ALL  -- an unknown input compares with every warm request
    SELECT '' AS k, {stats}
    FROM (SELECT total_ns, {marks} FROM {cohort_requests()}
          WHERE warm AND (SELECT count() FROM {FLAGGED_TABLE} WHERE k = '') > 0)
)
SELECT trace_key, span_key, start_ns, seq, width, height, fmt, total_ns, reason, idle_ns,
    median_ns, ph, warmup_pos, warmup_n, warmup_ended,
    NOT warmup_ended AND last_pos = {cap - 1} AS warmup_capped
FROM (
    SELECT *, countIf(warmup_pos >= 0 AND warmup_pos < break_pos) OVER (PARTITION BY ph) AS warmup_n,
        break_pos < {cap} AS warmup_ended
    FROM (
        SELECT *,
            -- the first candidate not set apart ends the warm-up ({cap}: none did)
            min(if(warmup_pos >= 0 AND NOT stands, warmup_pos, {cap})) OVER (PARTITION BY ph) AS break_pos,
            max(warmup_pos) OVER (PARTITION BY ph) AS last_pos
        FROM (
            SELECT f.trace_key AS trace_key, f.span_key AS span_key, f.start_ns AS start_ns,
                f.seq AS seq, f.width AS width, f.height AS height, f.fmt AS fmt,
                f.total_ns AS total_ns, f.reason AS reason, f.idle_ns AS idle_ns, f.ph AS ph,
                f.warmup_pos AS warmup_pos,
                if(f.reason IN ({warmish}), c.q_after[1], c.median_ns) AS median_ns,
                if(f.reason IN ({warmish}),
                   c.n_after >= {COMPARABLE_MIN_REQUESTS} AND c.q_after[1] > 0
                       AND f.total_ns >= c.high_after + {COLD_START_MIN_RATIO - 1} * c.q_after[1],
                   c.n >= {COMPARABLE_MIN_REQUESTS} AND c.median_ns > 0
                       AND f.total_ns >= {COLD_START_MIN_RATIO} * c.median_ns) AS stands
            FROM {FLAGGED_TABLE} AS f LEFT JOIN comparable AS c ON f.k = c.k
        )
    )
)
WHERE stands AND (reason != '{REASON_WARM_UP}' OR warmup_pos < break_pos)"""
    return [f"DROP TEMPORARY TABLE IF EXISTS {APART_TABLE}",
            f"DROP TEMPORARY TABLE IF EXISTS {FLAGGED_TABLE}", flagged, create,
            f"DROP TEMPORARY TABLE {FLAGGED_TABLE}"]


def apart_rows_sql() -> str:
    """The requests set apart, in start order (at most :data:`MAX_APART_ROWS`), each with the
    count of all of them (``n``)."""
    return f"""SELECT lower(hex(reinterpretAsFixedString(trace_key))) AS trace_id, seq, reason,
    total_ns, median_ns, idle_ns, width, height, fmt, count() OVER () AS n,
    countIf(reason = '{REASON_WARM_UP}') OVER () AS n_warm_up
FROM {APART_TABLE} ORDER BY start_ns, reinterpretAsFixedString(trace_key), reinterpretAsFixedString(span_key)
LIMIT {MAX_APART_ROWS}"""


def warmup_needed(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether :func:`apart_rows_sql`'s ``rows`` say requests were set apart as warm-up (then
    :func:`warmup_sql` is read)."""
    return bool(rows) and int(rows[0].get("n_warm_up") or 0) > 0


def warmup_sql() -> str:
    """One row: the warm-up over the processes with requests set apart as warm-up, the fields of
    :class:`~otel_stages.analysis.figures.WarmupFigures` (``longest`` a tuple: the most
    candidates before a process's warm-up ended, and whether one of those processes had not
    ended)."""
    return f"""SELECT uniqExact(ph) AS processes, count() AS requests,
    max((warmup_n, NOT warmup_ended)) AS longest, uniqExactIf(ph, NOT warmup_ended) AS unended,
    uniqExactIf(ph, warmup_capped) AS capped, max(total_ns / median_ns) AS max_ratio
FROM {APART_TABLE} WHERE reason = '{REASON_WARM_UP}'"""


def warmup_figures(rows: Sequence[Mapping[str, Any]]) -> WarmupFigures | None:
    """:func:`warmup_sql`'s row as :class:`~otel_stages.analysis.figures.WarmupFigures` (the
    longest warm-up counts its cold request); ``None`` without one."""
    if not rows or not int(rows[0]["requests"] or 0):
        return None
    r = rows[0]
    candidates, unended = r["longest"]
    return WarmupFigures(processes=int(r["processes"]), requests=int(r["requests"]),
                         longest_requests=int(candidates) + 1, longest_ended=not unended,
                         unended=int(r["unended"]), capped=int(r["capped"]),
                         max_ratio=float(r["max_ratio"]))


@dataclass(frozen=True)
class ApartRequest:
    """A warm request set apart as cold: what the rules read (``figures``) and its input
    (``width`` / ``height`` ``None`` when unknown, ``format``)."""

    figures: ApartFigures
    width: int | None
    height: int | None
    format: str | None


def apart_requests(rows: Sequence[Mapping[str, Any]]) -> tuple[ApartRequest, ...]:
    """:func:`apart_rows_sql`'s rows as :class:`ApartRequest` (times in ms)."""
    return tuple(ApartRequest(ApartFigures(
        reason=str(r["reason"]), seq=None if r["seq"] is None else int(r["seq"]),
        trace_id=str(r["trace_id"]), total_ms=r["total_ns"] / 1e6,
        comparable_median_total_ms=float(r["median_ns"]) / 1e6,
        ratio=r["total_ns"] / float(r["median_ns"]),
        idle_s=None if r["idle_ns"] is None else r["idle_ns"] / 1e9),
        width=r["width"], height=r["height"], format=r["fmt"] or None) for r in rows)


def apart_total(rows: Sequence[Mapping[str, Any]]) -> int:
    """All requests set apart (rows past :data:`MAX_APART_ROWS` included)."""
    return int(rows[0]["n"]) if rows else 0


def unlisted_line(total: int, listed: int) -> list[str]:
    """A problem line when more requests were set apart than are listed."""
    if total <= listed:
        return []
    return [f"{total - listed} more warm requests set apart as cold are not listed (the first"
            f" {listed} are)"]
