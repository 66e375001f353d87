"""The aggregate queries over the per-request table of :mod:`otel_stages.analysis.clickhouse_sql`.
Pure: ``(name, SQL, params)`` triples; :mod:`otel_stages.analysis.clickhouse_result` reads their
answers.

Definitions (all over *warm* requests: not cold, not failed, unless said otherwise; ms):

- distributions: count, min, p5, p25, median, p75, p95, max, mean, sample variance, sum;
- per stage: the distribution over the requests where the stage ran, and ``cross`` =
  ``sum(stage_ms * (total_ms - mean_total_ms))``: ``explained = cross / ss_total`` with
  ``ss_total = var(total) * (n - 1)``, i.e. ``cov(stage, total) / var(total)`` with the stage
  counted as 0 where it did not run (the definition of ``analysis.stats.explained_fraction``);
  ``sq`` = ``sum(stage_ms^2)``: ``alone = (sq - sum^2 / n) / ss_total``, ``var(stage) /
  var(total)`` with the same 0s (``analysis.stats.alone_fraction``);
- unaccounted: ``total - covered`` per request, covered = union of its stage spans' intervals;
  its ``cross`` (as a stage's) gives the variance of the total it explains;
- overlap: the stages' time inside the request beyond ``covered`` (time counted in two stages at
  once, :mod:`otel_stages.analysis.stage_overlap`), its distribution, ``cross`` and how many
  requests have more than the tolerance;
- cohorts: warm requests by (``image.width``, ``image.height``, ``image.format``); the input mix
  explains ``1 - ss_within / ss_total`` of the total's variance over requests with a known input;
- cold: cold requests' totals and per-stage medians, and per input the cold requests against warm
  requests with the same input;
- GPU: see :func:`gpu_metrics_sql` and :func:`gpu_spans_sql`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otel_stages import semconv
from otel_stages.analysis import clickhouse_issues as issues
from otel_stages.analysis.clickhouse_failures import FAILED_IN, LAST_STAGE, stopped_sql
from otel_stages.analysis.clickhouse_gpu_ids import MODEL_ENGINE, ambiguous_condition
from otel_stages.analysis.clickhouse_requests import names_sql, request_window
from otel_stages.analysis.clickhouse_sql import (
    DD_RELATIVE_ACCURACY,
    FORMATS_TABLE,
    GPU_BUCKET_NS,
    GPU_OWNERS_TABLE,
    PROCESS_TABLE,
    RESOURCE_PROCESS,
    AggregateQuery,
    distribution,
    finite_number,
    median,
    median_and_p95,
    metric_filter,
    process_hash,
    process_label,
    query_params,
    requests,
    span_filter,
    utilization_reading,
)
from otel_stages.analysis.clickhouse_sql import WARM_TABLE as WARM_TABLE
from otel_stages.analysis.cohorts import (
    COMPARABLE_MIN_REQUESTS,
    FAILED_COLD_STAGES,
    FAILED_COLD_STOP_MIN_SHARE,
)
from otel_stages.analysis.decision import COLD_START_MIN_RATIO
from otel_stages.analysis.episode import EPISODE_BUCKETS
from otel_stages.analysis.figures import COLD_UNTRACED
from otel_stages.analysis.gpu import (
    GPU_BUSY_MIN_UTILIZATION,
    GPU_STARVED_MAX_UTILIZATION,
    LEVEL_DECIMALS,
    MIN_MISALIGNED_FALL,
    MIN_MISALIGNED_READINGS,
    MIN_MODEL_GPU_RISE,
    MIN_RISE_STANDARD_ERRORS,
    MIXED_UNIT_MIN_SHARE,
    MODEL_GPU_RISE_SHARE,
)
from otel_stages.analysis.gpu_owners import NVML_UUID, PERCENT_GUESS, UNDECLARED_UNIT
from otel_stages.analysis.otlp_json import PERCENT_SCALE, PERCENT_UNIT
from otel_stages.analysis.sampled import (
    HEAD_KEPT,
    SAMPLED_MIN_MISSING_FRACTION,
    SEQ_RESTART_MIN_DROP,
    SHARED_SEQ_MAX_SHARE,
)
from otel_stages.analysis.span_issues import OVERLAP_TOLERANCE_MS

#: The per-request rows with their cold / warm flags (a subquery).
R = requests()
_TOTAL_MS = "total_ns / 1e6"
_KNOWN = "width IS NOT NULL AND height IS NOT NULL"
#: The cold requests that failed after paying the cold start
#: (:func:`otel_stages.analysis.cohorts.failed_cold_paid`; :func:`failed_cold_statements`).
FAILED_COLD_TABLE = "otel_stages_failed_cold"


def _cold(alias: str = "") -> str:
    """Cold requests in the figures' sense (over the row ``alias``, if given): first of their
    process and not failed, or failed after paying the cold start (:data:`FAILED_COLD_TABLE`)."""
    p = f"{alias}." if alias else ""
    return (f"{p}is_request AND {p}cold AND (NOT {p}error OR ({p}trace_key, {p}span_key) IN"
            f" (SELECT trace_key, span_key FROM {FAILED_COLD_TABLE}))")


_COLD = _cold()
_UNACCOUNTED_MS = "(total_ns - covered_ns) / 1e6"
#: The cold figures' per-stage rows: each stage that ran, then the untraced time under
#: :data:`~otel_stages.analysis.figures.COLD_UNTRACED` (one-time setup done lazily in the first
#: request lies outside the stage spans), as :func:`otel_stages.analysis.cohorts.cold_figures`.
_COLD_STAGES = (f"ARRAY JOIN arrayPushBack(stage_names, '{COLD_UNTRACED}') AS stage,"
                f" arrayPushBack(arrayMap(x -> x / 1e6, stage_ns), {_UNACCOUNTED_MS}) AS ms")
#: A cold request's input in the cold comparison: its size and format (the cohort key) and the
#: images its decode spans decoded when it has several (``images_sig``, 0 with at most one: as
#: :func:`otel_stages.analysis.cohorts.cold_figures` keys them).
_INPUT = "width, height, fmt, images_sig"
#: Time counted in two stages at once (analysis.stage_overlap.double_counted_ms): the stages'
#: time inside the request beyond the union they cover.
_OVERLAP_MS = "greatest(overlap_ns, 0) / 1e6"
OVERLAP_TOLERANCE_NS = round(OVERLAP_TOLERANCE_MS * 1e6)
#: The warm requests' mean total (ms), computed once (clickhouse_sql.warm_statements).
_MEAN_TOTAL = f"(SELECT mean_total FROM {WARM_TABLE})"
#: Warm requests with a known input per cohort (``width``, ``height``, ``fmt``): ``n``,
#: ``mean_total`` (ms), ``ss`` (sum of squares about that mean) and ``rank`` (1 = most
#: requests; ties by input), filled once by :func:`cohort_statements` for the statements that
#: read the largest cohorts or their means.
COHORTS_TABLE = "otel_stages_cohorts"
#: Cohorts of one size are ordered by their key's text, as the file report orders them
#: (:func:`otel_stages.analysis.cohorts.group`: "1280x960" before "640x480"; format last, unset
#: read as "unknown"), so both keep the same largest cohorts and list them alike.
_KEY_ORDER = ("concat(toString(width), 'x', toString(height)), if(fmt = '', 'unknown', fmt)")
#: The largest ``{top_cohorts:UInt32}`` cohorts, as a SELECT of their keys.
TOP_COHORTS = f"SELECT width, height, fmt FROM {COHORTS_TABLE} WHERE rank <= {{top_cohorts:UInt32}}"


def cohort_statements() -> list[tuple[str, dict[str, Any]]]:
    """``(statement, params)`` filling :data:`COHORTS_TABLE` (one read of the requests, where the
    cohort statements each grouped them again)."""
    fill = f"""CREATE TEMPORARY TABLE {COHORTS_TABLE} ENGINE = Memory AS
SELECT width, height, fmt, n, mean_total, ss,
    row_number() OVER (ORDER BY n DESC, {_KEY_ORDER}) AS rank
FROM (
    SELECT width, height, fmt, count() AS n, avg({_TOTAL_MS}) AS mean_total,
        if(n > 1, varSampStable({_TOTAL_MS}) * (n - 1), 0) AS ss
    FROM {R} WHERE warm AND {_KNOWN} GROUP BY width, height, fmt
)"""
    return [(f"DROP TEMPORARY TABLE IF EXISTS {COHORTS_TABLE}", {}), (fill, {})]


def summary_sql(method: str) -> str:
    """One row: counts, the warm total and unaccounted distributions."""
    return f"""SELECT
    countIf(is_request) AS n_requests, countIf(warm) AS n_warm,
    countIf(is_request AND cold) AS n_cold, countIf(is_request AND error) AS n_failed,
    countIf(is_request AND cold AND error) AS n_cold_failed,
    countIf(is_request AND cold AND NOT first_of_proc) AS n_cold_not_first,
    sumIf(incomplete_spans, by_trace) AS n_by_trace,
    sum(incomplete_groups) + n_by_trace AS n_incomplete, sum(incomplete_spans) AS n_incomplete_spans,
    uniqExactIf(proc, is_request) AS n_runs,
    sumIf(length(fwd_start), warm) AS n_warm_forwards,
    {distribution("total", _TOTAL_MS, "warm", method)},
    {distribution("unaccounted", _UNACCOUNTED_MS, "warm", method)},
    sumIf({_UNACCOUNTED_MS} * ({_TOTAL_MS} - {_MEAN_TOTAL}), warm) AS unaccounted_cross,
    {distribution("overlap", _OVERLAP_MS, "warm", method)},
    countIf(warm AND overlap_ns > {OVERLAP_TOLERANCE_NS}) AS n_overlap,
    sumIf({_OVERLAP_MS} * ({_TOTAL_MS} - {_MEAN_TOTAL}), warm) AS overlap_cross
FROM {R}"""


def stages_sql(method: str) -> str:
    """One row per stage over the warm requests: its distribution where it ran, ``cross``, and
    its correlation with the input's pixels and encoded bytes over the requests where both are
    known (``pixels_corr``, ``bytes_corr``; NaN when undefined)."""
    return _stage_stats(method, "", R, "warm", _MEAN_TOTAL)


def _stage_stats(method: str, by: str, source: str, where: str, mean: str) -> str:
    """The per-stage statistics of :func:`stages_sql` over ``source`` rows where ``where``, per
    ``by`` group too (e.g. ``"width, height, fmt"``), ``cross`` about ``mean`` (ms)."""
    keys = f"{by}, " if by else ""
    return f"""SELECT {keys}stage,
    {distribution("stage", "ms", "1", method)},
    sum(ms * dt) AS cross, sum(ms * ms) AS sq,
    corrStable(ms, pixels) AS pixels_corr, corrStable(ms, toFloat64(bytes)) AS bytes_corr
FROM (
    SELECT {keys}stage_names, stage_ns, {_TOTAL_MS} - {mean} AS dt,
        toFloat64(width) * toFloat64(height) AS pixels, bytes
    FROM {source} WHERE {where}
)
ARRAY JOIN stage_names AS stage, arrayMap(x -> x / 1e6, stage_ns) AS ms
GROUP BY {keys}stage
ORDER BY {keys}stage"""


def cohorts_sql(method: str) -> str:
    """The largest cohorts (``{top_cohorts:UInt32}``), with their warm total distribution, their
    untraced time's (``unaccounted_*``) and its ``unaccounted_cross`` about the cohort's mean total
    (``sum(u t) - sum(u) sum(t) / n``: a cohort's verdict weighs the untraced time as the run's
    does)."""
    return f"""SELECT width, height, fmt, {distribution("total", _TOTAL_MS, "1", method)},
    {distribution("unaccounted", _UNACCOUNTED_MS, "1", method)},
    sum({_UNACCOUNTED_MS} * {_TOTAL_MS}) - sum({_UNACCOUNTED_MS}) * sum({_TOTAL_MS}) / count()
        AS unaccounted_cross
FROM {R} WHERE warm AND {_KNOWN}
GROUP BY width, height, fmt
ORDER BY total_n DESC, {_KEY_ORDER}
LIMIT {{top_cohorts:UInt32}}"""


def cohort_stages_sql(method: str) -> str:
    """Per-stage distributions within each of the largest ``{top_cohorts:UInt32}`` cohorts (as
    :func:`stages_sql`, ``cross`` within the cohort)."""
    by = "width, height, fmt"
    source = (f"{R} AS q INNER JOIN (SELECT {by}, mean_total FROM {COHORTS_TABLE}"
              f" WHERE rank <= {{top_cohorts:UInt32}}) AS m USING ({by})")
    return _stage_stats(method, by, source, f"warm AND {_KNOWN}", "mean_total")


def cohort_mix_sql() -> str:
    """One row: cohort count, warm requests with a known / unknown input, and the sums of squares
    for ``input_mix_explains``."""
    # formats: as the cohorts read them (0 unless the requests hold more than one)
    return f"""SELECT
    count() AS cohorts, sum(n) AS known, sum(ss) AS ss_within,
    (SELECT if(formats > 1, formats, 0) FROM {FORMATS_TABLE}) AS formats,
    (SELECT n_warm FROM {WARM_TABLE}) - known AS unknown,
    (SELECT if(count() > 1, varSampStable({_TOTAL_MS}) * (count() - 1), 0) FROM {R}
     WHERE warm AND {_KNOWN}) AS ss_total
FROM {COHORTS_TABLE}"""


def process_mix_sql() -> str:
    """One row: the warm requests' processes (``processes``), their count (``n``), the sums of
    squares of the total within processes and over all (``ss_within``, ``ss_total``, ms^2) for
    :class:`otel_stages.analysis.process_mix.ProcessMix`, and the fastest and the slowest process
    by mean total (``fastest`` / ``slowest``: ``(process, requests, mean_total_ms, first_ns,
    last_ns)``, the last two its first warm request's start and last one's end; of equal means
    the first / the last process, as the file report sorts them)."""
    return f"""SELECT count() AS processes, sum(k) AS n, sum(ss) AS ss_within,
    (SELECT if(count() > 1, varSampStable({_TOTAL_MS}) * (count() - 1), 0) FROM {R} WHERE warm)
        AS ss_total,
    argMin((proc, k, m, lo, hi), (m, proc)) AS fastest, argMax((proc, k, m, lo, hi), (m, proc)) AS slowest
FROM (
    SELECT proc, count() AS k, avg({_TOTAL_MS}) AS m,
        if(k > 1, varSampStable({_TOTAL_MS}) * (k - 1), 0) AS ss,
        min(start_ns) AS lo, max(start_ns + total_ns) AS hi
    FROM {R} WHERE warm GROUP BY proc
)"""


def seq_coverage_sql() -> str:
    """One row: ``kept`` and ``numbered``, :class:`otel_stages.analysis.sampled.SeqCoverage`'s
    counts over every request read (warm, cold, failed) with a ``request.seq``: per process, in
    start order, a run restarts where the number drops by
    :data:`~otel_stages.analysis.sampled.SEQ_RESTART_MIN_DROP` or more; each run's distinct
    numbers and its lowest-to-highest range, summed (as
    :func:`otel_stages.analysis.sampled.seq_runs`)."""
    order = "PARTITION BY owner ORDER BY start_ns, trace_key"
    numbered = f"{R} WHERE is_request AND seq IS NOT NULL"
    # numbers from one counter the processes share are read as one process's (sampled.shared_counter)
    one = f"""(SELECT uniqExact(owner) >= 2 AND countIf(procs > 1) < {SHARED_SEQ_MAX_SHARE} * count()
            AND count() >= {1 - SAMPLED_MIN_MISSING_FRACTION} * (max(seq) - min(seq) + 1)
        FROM (SELECT seq, uniqExact(proc) AS procs, min(proc) AS owner FROM {numbered} GROUP BY seq))"""
    # new names (owner, n): an alias named as a column would replace it in the WHERE too
    return f"""SELECT toUInt64(sum(k)) AS kept, toUInt64(sum(span)) AS numbered FROM (
    SELECT uniqExact(n) AS k, max(n) - min(n) + 1 AS span FROM (
        SELECT owner, n, sum(restart) OVER ({order} ROWS UNBOUNDED PRECEDING) AS run FROM (
            SELECT if({one}, '', proc) AS owner, start_ns, trace_key, assumeNotNull(seq) AS n,
                toUInt64(lagInFrame(n, 1, n) OVER ({order} ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)
                         - n >= {SEQ_RESTART_MIN_DROP}) AS restart
            FROM {numbered}))
    GROUP BY owner, run)"""


def _kept_spans(traces: str, query: AggregateQuery, values: Sequence[str] = ()) -> str:
    """``(t, s, kept)``: trace and span key and ``otel_stages.sampling.kept`` of the spans in the
    window that carry it (``values``: only those values)."""
    window = request_window(query, "toUnixTimestamp64Nano(Timestamp)")
    only = (f" AND SpanAttributes['{semconv.SAMPLING_KEPT}'] IN ({', '.join(repr(v) for v in values)})"
            if values else "")
    return f"""SELECT reinterpretAsUInt128(unhex(TraceId)) AS t, reinterpretAsUInt64(unhex(SpanId)) AS s,
        SpanAttributes['{semconv.SAMPLING_KEPT}'] AS kept
    FROM {traces}
    WHERE {span_filter(query, odd=False)} {window}
        AND mapContains(SpanAttributes, '{semconv.SAMPLING_KEPT}'){only}"""


def sampling_kept_sql(traces: str, query: AggregateQuery) -> str:
    """``kept``, ``n``: requests read (warm, cold, failed) per ``otel_stages.sampling.kept``
    value of their request span, as :func:`otel_stages.analysis.sampled.seq_coverage` counts them.
    Run only when the ``request.seq`` gaps read as sampled
    (:func:`otel_stages.analysis.sampled.is_sampled`), so an unsampled run pays nothing."""
    return f"""SELECT k.kept AS kept, count() AS n
FROM {R} AS r INNER JOIN ({_kept_spans(traces, query)}) AS k ON r.trace_key = k.t AND r.span_key = k.s
WHERE r.is_request GROUP BY kept ORDER BY kept"""


def sampling_unbiased_sql(traces: str, query: AggregateQuery, method: str) -> str:
    """One row: ``n`` warm requests kept at the head (``ratio`` / ``parent``) and ``median_ms``
    their median total; run with :func:`sampling_kept_sql`."""
    head = _kept_spans(traces, query, HEAD_KEPT)
    return f"""SELECT count() AS n, {median(_TOTAL_MS, "1", method)} AS median_ms
FROM {R} AS r INNER JOIN ({head}) AS k ON r.trace_key = k.t AND r.span_key = k.s
WHERE r.warm"""


def process_versions_sql(traces: str, query: AggregateQuery) -> str:
    """Per process of the warm requests (labels, as :func:`process_mix_sql` names them): ``proc``,
    ``versions``, up to 2 distinct ``service.version``s (``''``: not set) of its spans in the
    window, as :func:`otel_stages.analysis.process_mix.one_version` reads them (one, else no
    version), and its warm requests' ``k`` (count), ``m`` (mean total, ms) and ``ss`` (sum of
    squares about that mean): the versions' part of the variance
    (:attr:`otel_stages.analysis.process_mix.ProcessMix.version_explains`). Run only when the
    process mix explains :data:`~otel_stages.analysis.process_mix.PROCESS_MIX_DOMINATES` or more,
    so a run whose processes do not dominate pays nothing; the sort key's service name keeps the
    read to the warm requests' services."""
    return f"""SELECT w.proc AS proc, w.k AS k, w.m AS m, w.ss AS ss, v.versions AS versions
FROM (SELECT proc, count() AS k, avg({_TOTAL_MS}) AS m,
             if(k > 1, varSampStable({_TOTAL_MS}) * (k - 1), 0) AS ss
      FROM {R} WHERE warm GROUP BY proc) AS w
LEFT JOIN (
    SELECT proc, groupUniqArray(2)(v) AS versions FROM (
        SELECT {process_label(*RESOURCE_PROCESS)} AS proc,
            ResourceAttributes['{semconv.SERVICE_VERSION}'] AS v
        FROM {traces}
        WHERE {span_filter(query, odd=False)}
            AND CAST(ServiceName AS String) IN (SELECT DISTINCT svc FROM {R} WHERE warm))
    GROUP BY proc) AS v ON w.proc = v.proc
ORDER BY proc"""


def failed_cold_count_sql() -> str:
    """One row, ``n``: cold requests that failed (:func:`failed_cold_statements` reads the warm
    requests' bars only when there are some)."""
    return f"SELECT countIf(is_request AND cold AND error) AS n FROM {R}"


def failed_cold_statements(traces: str, query: AggregateQuery, method: str, failed: bool
                           ) -> list[str]:
    """(Re)create :data:`FAILED_COLD_TABLE` (``trace_key``, ``span_key``), after the warm flags:
    the cold requests that failed after running until at least their input's cold bar
    (:func:`otel_stages.analysis.cohorts.paid_min_ms` over the warm requests of their input when
    at least :data:`~otel_stages.analysis.cohorts.COMPARABLE_MIN_REQUESTS` share it, else over all
    warm requests) and stopped in the model's stages, that stage holding most of its time (where it
    stopped: :func:`~otel_stages.analysis.clickhouse_failures.stopped_sql`), as
    :func:`otel_stages.analysis.cohorts.failed_cold_paid`. ``failed``: whether any cold request
    failed (:func:`failed_cold_count_sql`);
    without, the table stays empty and no span or warm request is read. Params:
    :func:`~otel_stages.analysis.clickhouse_sql.query_params`."""
    out = [f"DROP TEMPORARY TABLE IF EXISTS {FAILED_COLD_TABLE}",
           f"CREATE TEMPORARY TABLE {FAILED_COLD_TABLE} (trace_key UInt128, span_key UInt64)"
           " ENGINE = Memory"]
    if not failed:
        return out
    def bar(t: str) -> str:  # paid_min_ms over the warm requests summarised as t
        return f"{t}.q[2] + {COLD_START_MIN_RATIO - 1} * {t}.q[1]"
    # stopped in the model's stages, that stage holding most of its time (cohorts._stopped_in_the_model)
    stages = ", ".join(f"'{name}'" for name in FAILED_COLD_STAGES)
    stops = (f"SELECT trace_key, span_key, replaceRegexpOne(stopped, '^({FAILED_IN}|{LAST_STAGE})', '')"
             f" AS stage FROM ({stopped_sql(traces, query, 'cold')})")
    mine = (f"SELECT r.trace_key AS trace_key, r.span_key AS span_key, r.width AS width,"
            f" r.height AS height, r.fmt AS fmt, r.images_sig AS images_sig,"
            f" r.width IS NOT NULL AND r.height IS NOT NULL AS known, r.total_ns / 1e6 AS ms"
            f" FROM {R} AS r INNER JOIN ({stops}) AS t"
            f" ON r.trace_key = t.trace_key AND r.span_key = t.span_key"
            f" WHERE r.is_request AND r.cold AND r.error AND t.stage IN ({stages})"
            f" AND has(r.stage_names, t.stage)"
            f" AND r.stage_ns[indexOf(r.stage_names, t.stage)] >= {FAILED_COLD_STOP_MIN_SHARE} * r.total_ns")
    out.append(f"""INSERT INTO {FAILED_COLD_TABLE}
WITH mine AS ({mine})
SELECT f.trace_key, f.span_key
FROM mine AS f
LEFT JOIN (
    SELECT {_INPUT}, countIf(warm) AS n, {median_and_p95(_TOTAL_MS, "warm", method)} AS q
    FROM {R} WHERE is_request AND {_KNOWN}
        AND ({_INPUT}) IN (SELECT {_INPUT} FROM mine WHERE known)
    GROUP BY {_INPUT}
) AS b ON f.width = b.width AND f.height = b.height AND f.fmt = b.fmt AND f.images_sig = b.images_sig
CROSS JOIN (
    SELECT countIf(warm) AS n, {median_and_p95(_TOTAL_MS, "warm", method)} AS q
    FROM {R} WHERE is_request
) AS a
WHERE a.n > 0 AND f.ms >= if(f.known AND b.n >= {COMPARABLE_MIN_REQUESTS}, {bar("b")}, {bar("a")})""")
    return out


def cold_sql(method: str) -> str:
    """One row: the cold requests' total distribution (those that failed before paying the cold
    start left out, as in :func:`otel_stages.analysis.diagnosis.diagnose`), and ``total_failed``:
    those in it that failed after paying it."""
    return (f"SELECT {distribution('total', _TOTAL_MS, _COLD, method)},"
            f" countIf({_COLD} AND error) AS total_failed FROM {R}")


def cold_stages_sql(method: str) -> str:
    """Per stage: the median and the mean over cold requests where it ran."""
    return f"""SELECT stage, count() AS n, {median("ms", "1", method)} AS median_ms, avg(ms) AS mean_ms
FROM {R} {_COLD_STAGES}
WHERE {_COLD} GROUP BY stage ORDER BY stage"""


def cold_cohorts_sql(method: str) -> str:
    """Per input of cold requests (NULL width = unknown; with the images decoded, ``images_sig``):
    cold count and median total, and the warm requests with the same input (count, median total)."""
    return f"""SELECT {_INPUT},
    countIf({_COLD}) AS cold_n, {median(_TOTAL_MS, _COLD, method)} AS cold_median_ms,
    countIf(warm) AS warm_n, {median(_TOTAL_MS, "warm", method)} AS warm_median_ms
FROM {R} WHERE is_request
GROUP BY {_INPUT} HAVING cold_n > 0
ORDER BY cold_n DESC, {_INPUT}
LIMIT {{top_cohorts:UInt32}}"""


def _comparable_cold_inputs() -> str:
    """The known inputs of cold requests with at least
    :data:`~otel_stages.analysis.cohorts.COMPARABLE_MIN_REQUESTS` warm requests."""
    return (f"SELECT {_INPUT} FROM {R} WHERE is_request AND {_KNOWN}"
            f" GROUP BY {_INPUT}"
            f" HAVING countIf({_COLD}) > 0 AND countIf(warm) >= {COMPARABLE_MIN_REQUESTS}")


def _paid_bars(method: str, inputs: str) -> str:
    """Per input of ``inputs`` (a query of ``width, height, fmt, images_sig``): the least total (ms) of a cold
    request that paid a cold start against the warm requests of that input, ``bar_ms``
    (:func:`otel_stages.analysis.cohorts.paid_min_ms`: their p95 plus the ratio less one times
    their median)."""
    return f"""SELECT {_INPUT}, q[2] + {COLD_START_MIN_RATIO - 1} * q[1] AS bar_ms
FROM (SELECT {_INPUT}, {median_and_p95(_TOTAL_MS, "warm", method)} AS q
      FROM {R} WHERE is_request AND {_KNOWN} AND ({_INPUT}) IN ({inputs})
      GROUP BY {_INPUT} HAVING countIf(warm) > 0)"""


def _paid_rows(method: str, inputs: str) -> str:
    """The cold requests of ``inputs`` that paid a cold start against their own input's warm
    requests (:func:`_paid_bars`)."""
    return (f"SELECT r.width AS width, r.height AS height, r.fmt AS fmt, r.images_sig AS images_sig,"
            f" r.total_ns AS total_ns, r.covered_ns AS covered_ns, r.stage_names AS stage_names,"
            f" r.stage_ns AS stage_ns, r.error AS error"
            f" FROM {R} AS r INNER JOIN ({_paid_bars(method, inputs)}) AS t"
            f" ON r.width = t.width AND r.height = t.height AND r.fmt = t.fmt"
            f" AND r.images_sig = t.images_sig"
            f" WHERE {_cold('r')} AND r.total_ns / 1e6 >= t.bar_ms")


def _summary_rows(side: str, rows: str, method: str) -> str:
    """``side``, then a row with ``stage`` ``''`` (count and median total of ``rows``), then one
    per stage with its median."""
    return f"""SELECT '{side}' AS side, '' AS stage, count() AS n,
    {median(_TOTAL_MS, "1", method)} AS median_ms, toFloat64(0) AS mean_ms,
    uniqExact({_INPUT}) AS inputs, any(width) AS w, any(height) AS h, any(fmt) AS f,
    countIf(error) AS failed
FROM ({rows})
UNION ALL
SELECT '{side}' AS side, stage, count() AS n, {median("ms", "1", method)} AS median_ms,
    avg(ms) AS mean_ms, 0 AS inputs, NULL AS w, NULL AS h, '' AS f, 0 AS failed
FROM ({rows}) {_COLD_STAGES}
GROUP BY stage"""


def cold_paid_sql(method: str, by_input: bool) -> str:
    """The cold requests compared that paid a cold start, read when they are several, for the
    figures of those when others did not (:func:`otel_stages.analysis.cohorts.cold_figures`,
    ``without_penalty``): ``side`` ``cold``, a row with ``stage`` ``''`` (their count, median
    total, how many inputs and one of them), then one per stage with its median. ``by_input``
    (compared with the same input): each against the warm requests of its own input, of the
    comparable inputs (:func:`_paid_bars`); else each against ``{paid_min_ms:Float64}`` (all warm
    requests'). The warm requests of the inputs that paid: :func:`cold_paid_warm_sql`."""
    if not by_input:
        rows = (f"SELECT {_INPUT}, total_ns, covered_ns, stage_names, stage_ns, error FROM {R}"
                f" WHERE {_COLD} AND {_TOTAL_MS} >= {{paid_min_ms:Float64}}")
        return _summary_rows("cold", rows, method)
    return _summary_rows("cold", _paid_rows(method, _comparable_cold_inputs()), method)


def cold_paid_warm_sql(method: str) -> str:
    """``side`` ``warm``: the warm requests of the inputs whose cold requests paid a cold start
    (:func:`cold_paid_sql` by input), as its rows; read only when some cold requests did not pay
    (every warm request's stages are read)."""
    paid = _paid_rows(method, _comparable_cold_inputs())
    warm = (f"SELECT {_INPUT}, total_ns, covered_ns, stage_names, stage_ns, error FROM {R}"
            f" WHERE warm AND {_KNOWN} AND ({_INPUT}) IN (SELECT {_INPUT} FROM ({paid}))")
    return _summary_rows("warm", warm, method)


def cold_input_paid_sql(method: str) -> str:
    """Per known input with two or more cold requests: those that paid a cold start against the
    warm requests of that input (:func:`_paid_bars`; ``stage`` ``''``: their count and median
    total; then one row per stage with its median), for a cohort's own cold figures as
    :func:`cold_paid_sql` gives the whole run's."""
    inputs = (f"SELECT {_INPUT} FROM {R} WHERE is_request AND {_KNOWN}"
              f" GROUP BY {_INPUT} HAVING countIf({_COLD}) >= 2 AND countIf(warm) > 0")
    rows = _paid_rows(method, inputs)
    return f"""SELECT {_INPUT}, '' AS stage, count() AS n,
    {median(_TOTAL_MS, "1", method)} AS median_ms, toFloat64(0) AS mean_ms
FROM ({rows}) GROUP BY {_INPUT}
UNION ALL
SELECT {_INPUT}, stage, count() AS n, {median("ms", "1", method)} AS median_ms, avg(ms) AS mean_ms
FROM ({rows}) {_COLD_STAGES}
GROUP BY {_INPUT}, stage"""


def cold_union_sql(method: str) -> str:
    """The cold requests whose input has at least
    :data:`~otel_stages.analysis.cohorts.COMPARABLE_MIN_REQUESTS` warm requests, and the warm
    requests of those inputs, for cold requests of several inputs or of inputs not all comparable:
    per ``side`` (``cold`` / ``warm``) a row with ``stage`` ``''``, their count and median total,
    then one per stage with its median, as the trace report compares them
    (:func:`otel_stages.analysis.cohorts.cold_figures`: the comparable cold requests with the
    union of their inputs' warm requests, the others left out)."""
    inputs = _comparable_cold_inputs()
    parts = []
    for side, rows in (("warm", "warm"), ("cold", _COLD)):
        where = f"{rows} AND {_KNOWN} AND ({_INPUT}) IN ({inputs})"
        parts.append(f"""SELECT '{side}' AS side, '' AS stage, count() AS n,
    {median(_TOTAL_MS, "1", method)} AS median_ms, toFloat64(0) AS mean_ms, countIf(error) AS failed
FROM {R} WHERE {where}
UNION ALL
SELECT '{side}' AS side, stage, count() AS n, {median("ms", "1", method)} AS median_ms,
    avg(ms) AS mean_ms, 0 AS failed
FROM {R} {_COLD_STAGES}
WHERE {where}
GROUP BY stage""")
    return "\nUNION ALL\n".join(parts)


def cold_cohort_stages_sql(method: str) -> str:
    """Per input of cold requests (the largest ``{top_cohorts:UInt32}``, known inputs only): each
    stage's median over the warm requests with that input (what the cold request is compared
    with, stage by stage)."""
    cold_inputs = (f"SELECT {_INPUT} FROM {R} WHERE {_COLD} AND {_KNOWN}"
                   f" GROUP BY {_INPUT} ORDER BY count() DESC, {_INPUT}"
                   f" LIMIT {{top_cohorts:UInt32}}")
    return f"""SELECT {_INPUT}, stage, count() AS n, {median("ms", "1", method)} AS median_ms
FROM {R} {_COLD_STAGES}
WHERE warm AND {_KNOWN} AND ({_INPUT}) IN ({cold_inputs})
GROUP BY {_INPUT}, stage ORDER BY {_INPUT}, stage"""


def cold_input_stages_sql(method: str) -> str:
    """Per input of cold requests (NULL width = unknown): each stage's median and mean over those
    cold requests (a cohort's own cold request, stage by stage)."""
    return f"""SELECT {_INPUT}, stage, count() AS n, {median("ms", "1", method)} AS median_ms,
    avg(ms) AS mean_ms
FROM {R} {_COLD_STAGES}
WHERE {_COLD} GROUP BY {_INPUT}, stage ORDER BY {_INPUT}, stage"""


def runs_sql() -> str:
    """The processes read (``{top_runs:UInt32}`` earliest first)."""
    return f"""SELECT argMin(svc, start_ns) AS service_name, argMin(inst, start_ns) AS service_instance_id,
    argMin(host, start_ns) AS host_name, argMin(pid, start_ns) AS process_pid,
    min(start_ns) AS first_unix_ns, max(start_ns + total_ns) AS last_unix_ns, count() AS requests
FROM {R} WHERE is_request GROUP BY proc
ORDER BY first_unix_ns, proc LIMIT {{top_runs:UInt32}}"""


def slowest_sql() -> str:
    """The ``{top_slowest:UInt32}`` slowest warm requests."""
    return f"""SELECT lower(hex(reinterpretAsFixedString(trace_key))) AS trace_id, seq,
    total_ns, stage_names, stage_ns, width, height, bytes, error,
    greatest(toInt64(0), total_ns - covered_ns) AS unaccounted_ns
FROM {R} WHERE warm ORDER BY total_ns DESC, start_ns LIMIT {{top_slowest:UInt32}}"""


_STD_LIST = "(" + ", ".join(f"'{s}'" for s in semconv.STANDARD_STAGES) + ")"
#: Span attributes of the mechanism signals (analysis.stage_signals): whether to read them
#: (analysis.clickhouse_signals).
SIGNAL_ATTRIBUTES = (semconv.THREAD_CPU_TIME_MS, semconv.GC_PAUSE_MS, semconv.EVENT_LOOP_LAG_MS)


def signals_sql(traces: str, query: AggregateQuery) -> str:
    """One row: ``signals`` 1 when any stage span in the window carries a mechanism signal
    (:data:`SIGNAL_ATTRIBUTES`), else 0. Stops at the first such span (``LIMIT 1``; the exporter's
    bloom filter index on the attribute keys skips granules without them)."""
    has = " OR ".join(f"mapContains(SpanAttributes, '{k}')" for k in SIGNAL_ATTRIBUTES)
    return f"""SELECT count() AS signals FROM (
    SELECT 1 FROM {traces} WHERE SpanName IN {_STD_LIST} AND ({has}) AND {span_filter(query, odd=False)}
    LIMIT 1)"""


#: The queue-depth read aggregates in memory up to this (bytes) before spilling: its state is
#: about 1.7 M keys at 10 M spans, and at the default SPILL_BYTES it spilled (3x the CPU).
QUEUE_SPILL_BYTES = 512 * 2**20


def queue_depth_sql(traces: str, query: AggregateQuery) -> str:
    """One row: the Pearson r of warm requests' queue ms with their queue span's ``queue.depth``
    (the first queue span that has it, as ``Request.stage_attribute``), over ``n`` pairs. Queue
    spans are matched to their request by trace and parent span id (a queue span inside a custom
    group is not read). A separate read: only queue spans' attribute maps are touched. Requests
    and queue spans meet in one aggregation by (trace, parent span id), each key one request
    (10 M spans: 2.6-3.0 s CPU and 600 MB peak against 3.3-4.7 s and 690 MB for a join of the
    requests with the queue spans grouped first)."""
    queue = semconv.STAGE_QUEUE
    depth = finite_number(f"SpanAttributes['{semconv.QUEUE_DEPTH}']")
    return f"""SELECT corrStable(ms, depth) AS depth_corr, count() AS n
FROM (
    SELECT anyIf(ms, side = 0) AS ms, argMinIf(depth, ts, side = 1) AS depth,
        max(side = 0) AS has_request, max(side = 1) AS has_queue
    FROM (
        SELECT trace_key, span_key,
            arraySum(arrayFilter((d, n) -> n = '{queue}', stage_ns, stage_names)) / 1e6 AS ms,
            CAST(NULL AS Nullable(Float64)) AS depth, toInt64(0) AS ts, 0 AS side
        FROM {R} WHERE warm AND span_key != 0 AND has(stage_names, '{queue}')
        UNION ALL
        SELECT reinterpretAsUInt128(unhex(TraceId)) AS trace_key,
            reinterpretAsUInt64(unhex(ParentSpanId)) AS span_key, 0. AS ms, {depth} AS depth,
            toInt64(toUnixTimestamp64Nano(Timestamp)) AS ts, 1 AS side
        FROM {traces}
        WHERE SpanName = '{queue}' AND mapContains(SpanAttributes, '{semconv.QUEUE_DEPTH}')
            AND isNotNull({depth}) AND {span_filter(query, odd=False)}
    )
    GROUP BY trace_key, span_key
    HAVING has_request AND has_queue
) SETTINGS max_bytes_before_external_group_by = {QUEUE_SPILL_BYTES}"""


def _episode_buckets(per_process: bool) -> str:
    """The warm requests with their bucket (episode.buckets) in their process's run
    (``per_process``) or in the recording's time, a subquery."""
    if per_process:
        spans = (f"(SELECT proc, min(start_ns) AS lo, max(start_ns) AS hi FROM {R} WHERE warm"
                 " GROUP BY proc) AS s ON w.proc = s.proc")
    else:
        spans = f"(SELECT min(start_ns) AS lo, max(start_ns) AS hi FROM {R} WHERE warm) AS s ON 1"
    return f"""(SELECT w.proc AS proc, w.start_ns AS start_ns, w.total_ns AS total_ns,
        intDiv((w.start_ns - s.lo) * {EPISODE_BUCKETS}, s.hi - s.lo + 1) AS b
    FROM (SELECT proc, start_ns, total_ns FROM {R} WHERE warm) AS w
    INNER JOIN {spans})"""


def episode_sql(per_process: bool) -> str:
    """Per bucket ``b`` of the warm requests' start times in their process's run
    (``per_process``) or in the recording's time (:func:`otel_stages.analysis.episode.buckets`),
    ``n`` warm requests and ``slow``, those whose total is above ``{slow_min_ms:Float64}``
    (``slow_min_ms``, repeated on every row); buckets without requests give no row."""
    return f"""SELECT b, count() AS n, countIf(total_ns / 1e6 > {{slow_min_ms:Float64}}) AS slow,
    {{slow_min_ms:Float64}} AS slow_min_ms
FROM {_episode_buckets(per_process)}
GROUP BY b ORDER BY b"""


def episode_outside_sql(method: str, per_process: bool) -> str:
    """One row: ``swing_ms``, the p95 - p5 of the totals of the warm requests outside the buckets
    ``{lo:UInt32}`` .. ``{hi:UInt32}`` (excluded) of :func:`episode_sql` (``method``: the quantile
    function), ``band_ms``, the ``{band_ms:Float64}`` it is judged against; of the slow requests
    (total above ``{slow_min_ms:Float64}``) in those buckets, the first and last start
    (``first_ns``, ``last_ns``), how many processes they ran in (``slow_procs``) and one of them
    (``one_proc``); and how many processes the warm requests ran in (``procs``)
    (:func:`otel_stages.analysis.episode.confirm`); ``per_process`` as given. No row without
    requests outside."""
    q = ("quantilesExactInclusiveIf(0.05, 0.95)" if method == "exact"
         else f"quantilesDDIf({DD_RELATIVE_ACCURACY}, 0.05, 0.95)")
    inside = "b >= {lo:UInt32} AND b < {hi:UInt32}"
    slow = f"{inside} AND total_ns / 1e6 > {{slow_min_ms:Float64}}"
    return f"""SELECT q[2] - q[1] AS swing_ms, {{band_ms:Float64}} AS band_ms, first_ns, last_ns,
    slow_procs, one_proc, procs, {int(per_process)} AS per_process
FROM (SELECT {q}(total_ns / 1e6, NOT ({inside})) AS q, countIf(NOT ({inside})) AS n,
          minIf(start_ns, {slow}) AS first_ns, maxIf(start_ns, {slow}) AS last_ns,
          uniqExactIf(proc, {slow}) AS slow_procs, anyIf(proc, {slow}) AS one_proc,
          uniqExact(proc) AS procs
      FROM {_episode_buckets(per_process)})
WHERE n > 0"""


def slow_forwards_sql() -> str:
    """One row: ``slow_min_ns``, the slow-forward threshold (the warm forward spans' median plus
    the run's noise band ``{band_ns:Float64}``, :func:`otel_stages.analysis.gpu.slow_forward_min_ms`)
    and ``slow_forwards``, the warm forward spans longer than it."""
    return f"""SELECT any(th) AS slow_min_ns, countIf(d > th) AS slow_forwards
FROM (SELECT w.2 - w.1 AS d FROM {R} ARRAY JOIN arrayZip(fwd_start, fwd_end) AS w WHERE warm) AS f
CROSS JOIN (
    SELECT quantileExactInclusive(0.5)(w.2 - w.1) + {{band_ns:Float64}} AS th
    FROM {R} ARRAY JOIN arrayZip(fwd_start, fwd_end) AS w WHERE warm
) AS t"""


def span_units_sql(above: str, fractions: str) -> str:
    """SQL: :func:`otel_stages.analysis.gpu.unit_divisor` of a process's forward-span readings
    above :data:`~otel_stages.analysis.gpu_owners.PERCENT_GUESS` (``above``) and strictly between 0
    and 1 (``fractions``), with 0 for ``None`` (mixed units: left out)."""
    return (f"multiIf({above} = 0, 1, {fractions} >= {MIXED_UNIT_MIN_SHARE} * ({above} + {fractions}),"
            " 0, 100)")


def _span_units(ok: str = "1") -> str:
    """SQL window columns over rows ``proc_key``, ``u`` (a reading where ``ok``): ``k``, the
    unit divisor of the row's process over all the rows (:func:`span_units_sql`), and ``r``, the
    reading as a ratio (``u`` when ``k`` is 0)."""
    w = "OVER (PARTITION BY proc_key)"
    k = span_units_sql(f"countIf({ok} AND u > {PERCENT_GUESS}) {w}",
                       f"countIf({ok} AND u > 0 AND u < 1) {w}")
    return f"{k} AS k, u / if(k = 0, 1, k) AS r"


def gpu_spans_sql() -> str:
    """GPU utilization from the forward spans' own ``gpu.utilization.mean`` (weighted by
    ``gpu.sample_count``, default 1; counts <= 0 and values not finite or outside 0 ..
    :data:`~otel_stages.analysis.gpu.MAX_UTILIZATION_READING` skipped; each process's unit guessed
    over its warm forwards, :func:`span_units_sql`, those that mix units left out and counted:
    ``mixed_processes``, ``mixed_forwards``, ``mixed_fractions``, ``mixed_above``, ``mixed_example``
    the first such process), split at the slow-forward threshold ``{slow_min_ns:Float64}``
    (:func:`slow_forwards_sql`; ``slow_covered``: slow forwards with a value)."""
    forwards = f"""SELECT proc, d, c, u, {_span_units()}
FROM (
    SELECT proc_key, proc, (w.2 - w.1) AS d, w.3 AS u, ifNull(w.4, 1) AS c
    FROM {R} ARRAY JOIN arrayZip(fwd_start, fwd_end, fwd_util, fwd_count) AS w
    WHERE warm AND {utilization_reading("w.3", "w.4")})"""
    th = "{slow_min_ns:Float64}"
    return f"""SELECT countIf(k > 0) AS covered, sumIf(c, k > 0) AS samples, sumIf(r * c, k > 0) AS weighted,
    countIf(k > 0 AND d > {th}) AS slow_covered,
    sumIf(r * c, k > 0 AND d > {th}) AS slow_sum, sumIf(c, k > 0 AND d > {th}) AS slow_n,
    sumIf(r * c, k > 0 AND d <= {th}) AS fast_sum, sumIf(c, k > 0 AND d <= {th}) AS fast_n,
    uniqExactIf(proc, k = 0) AS mixed_processes, countIf(k = 0) AS mixed_forwards,
    countIf(k = 0 AND u > 0 AND u < 1) AS mixed_fractions,
    countIf(k = 0 AND u > {PERCENT_GUESS}) AS mixed_above, minIf(proc, k = 0) AS mixed_example
FROM ({forwards}) AS f"""


#: Temporary tables of the GPU step: the three gauges' points in the window (read once from the
#: gauge table: its attribute maps are the costly part), utilization samples, and samples inside
#: forwards.
GPU_POINTS_TABLE = "otel_stages_gpu_points"
GPU_SAMPLES_TABLE = "otel_stages_gpu_samples"
GPU_PAIRS_TABLE = "otel_stages_gpu_pairs"
#: Per GPU series (``proc_key``, ``hw``), the samples inside a forward of a request that is not
#: warm (cold, failed, set apart) and inside no warm forward: ``n_aside``, ``sum_aside``,
#: ``sq_aside``. Neither during the warm forwards nor between them (``gpu.falls``).
GPU_ASIDE_TABLE = "otel_stages_gpu_aside"
#: Request processes' ``host.name`` (``k``, ``host``), read only when some GPU points come from
#: processes without requests (:func:`request_hosts_statements`).
REQUEST_HOSTS_TABLE = "otel_stages_request_hosts"
#: Forward spans recorded by a process that ran no request (``trace_key``, ``s``, ``e``, ``proc``:
#: its process hash), read only when some GPU point comes from such a process
#: (:func:`forward_owners_statements`).
FORWARD_OWNERS_TABLE = "otel_stages_forward_owners"
#: Temporary tables this module creates (dropped after a report).
TABLES = (FAILED_COLD_TABLE, COHORTS_TABLE, GPU_POINTS_TABLE, GPU_SAMPLES_TABLE, GPU_PAIRS_TABLE,
          GPU_ASIDE_TABLE, REQUEST_HOSTS_TABLE, FORWARD_OWNERS_TABLE)
#: GPU points from processes that ran no request here (a GPU worker, a metrics sidecar) and name
#: no request process's host are lined up by time with the forwards of every request process
#: without a known host (of every one, when no host is known), as the file report lines up every
#: series; past this many such processes they are not, since every forward would meet every
#: host's GPUs. Those on a request process's host (one exporter per node) are not counted: each
#: goes to its own node's processes only.
MAX_FOREIGN_GPU_PROCESSES = 8
#: The three GPU gauges; a SQL tuple of them.
GPU_METRICS = (semconv.HW_GPU_UTILIZATION, semconv.HW_GPU_MEMORY_USAGE, semconv.HW_GPU_MEMORY_LIMIT)
_GPU_METRICS = "(" + ", ".join(f"'{m}'" for m in GPU_METRICS) + ")"


def gpu_metric_is(name: str) -> str:
    """SQL over :data:`GPU_POINTS_TABLE`: the point is of the gauge ``name`` (one of
    :data:`GPU_METRICS`; the table holds its 1-based position there, ``metric``)."""
    return f"metric = {GPU_METRICS.index(name) + 1}"


_REQUEST_PROCESSES = f"SELECT arrayJoin(proc_keys) AS k FROM {PROCESS_TABLE}"
#: The processes that own GPU series: those with requests and those that recorded forwards
#: without running a request (:data:`FORWARD_OWNERS_TABLE`; empty in the common case).
_OWNER_PROCESSES = (f"SELECT arrayJoin(proc_keys) AS k FROM {PROCESS_TABLE}"
                    f" UNION ALL SELECT DISTINCT proc AS k FROM {FORWARD_OWNERS_TABLE}")


def gpu_points_statements(gauge: str, query: AggregateQuery) -> list[tuple[str, dict[str, Any]]]:
    """``(statement, params)`` filling :data:`GPU_POINTS_TABLE`: every point of the three GPU
    gauges in the window (:func:`~otel_stages.analysis.clickhouse_sql.metric_filter`) with
    ``point_key`` (its process, :func:`~otel_stages.analysis.clickhouse_sql.process_hash` of
    ``service.namespace``, ``service.name`` and ``service.instance.id`` or ``host.name``),
    ``host`` (``host.name``), ``hw`` (``hw.id``), ``t`` (ns), ``v`` (a metric whose
    ``MetricUnit`` is ``%`` as a ratio, as the file reader reads it:
    :data:`~otel_stages.analysis.otlp_json.PERCENT_UNIT`), ``undeclared`` (1 where ``MetricUnit``
    is :data:`~otel_stages.analysis.gpu_owners.UNDECLARED_UNIT`), ``unit`` (``MetricUnit``: the
    unit is guessed per sender and unit, :func:`otel_stages.analysis.gpu_owners.sender_divisors`) and
    ``metric`` (:func:`gpu_metric_is`); utilization points of the compute engine only
    (:data:`~otel_stages.analysis.clickhouse_gpu_ids.MODEL_ENGINE`). The GPU series, the
    utilization and the memory statements read it."""
    fill = f"""CREATE TEMPORARY TABLE {GPU_POINTS_TABLE} ENGINE = Log AS
SELECT {process_hash(*RESOURCE_PROCESS)} AS point_key,
    ResourceAttributes['{semconv.HOST_NAME}'] AS host,
    Attributes['{semconv.HW_ID}'] AS hw, toInt64(toUnixTimestamp64Nano(TimeUnix)) AS t,
    if(MetricUnit = '{PERCENT_UNIT}', Value * {PERCENT_SCALE}, Value) AS v,
    toUInt8(MetricUnit = '{UNDECLARED_UNIT}') AS undeclared,
    CAST(MetricUnit AS String) AS unit,
    toUInt8(indexOf([{_GPU_METRICS[1:-1]}], CAST(MetricName AS String))) AS metric
FROM {gauge} WHERE {metric_filter(query, _GPU_METRICS)} AND {MODEL_ENGINE}"""
    return [(f"DROP TEMPORARY TABLE IF EXISTS {GPU_POINTS_TABLE}", {}), (fill, query_params(query))]


def gpu_series_sql() -> str:
    """``SELECT k``: the processes (:func:`~otel_stages.analysis.clickhouse_sql.process_hash`) with GPU
    points in the window (from :data:`GPU_POINTS_TABLE`)."""
    return f"SELECT DISTINCT point_key AS k FROM {GPU_POINTS_TABLE}"


_FOREIGN_SENDERS = (f"SELECT DISTINCT point_key AS k, host FROM {GPU_POINTS_TABLE}"
                    f" WHERE point_key NOT IN ({_OWNER_PROCESSES})")
#: Processes that ran no request (``k``, ``host``) and are on no request process's host: those
#: :data:`MAX_FOREIGN_GPU_PROCESSES` counts (after :func:`request_hosts_statements`).
_UNPLACED_SENDERS = (f"SELECT k, any(host) AS host FROM ({_FOREIGN_SENDERS}) GROUP BY k"
                     f" HAVING host = '' OR host NOT IN (SELECT host FROM {REQUEST_HOSTS_TABLE})")


def foreign_gpu_sql() -> str:
    """One row (after the GPU owners table): ``foreign_gpu_processes`` (processes with GPU points
    and no request, on no request process's host: :data:`MAX_FOREIGN_GPU_PROCESSES` counts them),
    ``processes_without_gpu`` (processes with requests and no GPU points), and ``unplaced`` /
    ``unplaced_host`` (processes with GPU points and no request whose points went to no request
    process: on a host no request process names while every request process names one; the
    first such host, in order), as
    :func:`otel_stages.analysis.gpu_owners.unplaced_senders` finds them. A process that recorded
    forwards without running a request (:data:`FORWARD_OWNERS_TABLE`) owns its points: it is no
    such sender."""
    series = gpu_series_sql()
    unplaced = (f"SELECT host FROM ({_FOREIGN_SENDERS}) WHERE host != ''"
                f" AND k NOT IN (SELECT point_key FROM {GPU_OWNERS_TABLE})")
    return f"""SELECT
    (SELECT count() FROM ({_UNPLACED_SENDERS})) AS foreign_gpu_processes,
    (SELECT count() FROM ({_REQUEST_PROCESSES}) WHERE k NOT IN ({series})) AS processes_without_gpu,
    if(foreign_gpu_processes > {MAX_FOREIGN_GPU_PROCESSES}, 0,
       (SELECT uniqExact(k) FROM ({_FOREIGN_SENDERS}) WHERE host != ''
        AND k NOT IN (SELECT point_key FROM {GPU_OWNERS_TABLE}))) AS unplaced,
    (SELECT min(host) FROM ({unplaced})) AS unplaced_host"""


def request_hosts_statements(traces: str, query: AggregateQuery) -> list[tuple[str, dict[str, Any]]]:
    """``(statement, params)`` filling :data:`REQUEST_HOSTS_TABLE`: each request process's
    ``host.name`` (and each forward owner's, :data:`FORWARD_OWNERS_TABLE`; any of its spans';
    processes without one left out), read from the spans only
    when GPU points came from a process without requests with a ``host.name`` (else the table is
    empty and the spans are not read: the condition is a constant)."""
    fill = f"""CREATE TEMPORARY TABLE {REQUEST_HOSTS_TABLE} ENGINE = Memory AS
SELECT k, any(h) AS host FROM (
    SELECT {process_hash(*RESOURCE_PROCESS)} AS k,
        ResourceAttributes['{semconv.HOST_NAME}'] AS h
    FROM {traces}
    WHERE {span_filter(query, odd=False)}
        AND (SELECT count() FROM ({_FOREIGN_SENDERS}) WHERE host != '') > 0
)
WHERE h != '' AND k IN ({_OWNER_PROCESSES}) GROUP BY k"""
    return [(f"DROP TEMPORARY TABLE IF EXISTS {REQUEST_HOSTS_TABLE}", {}), (fill, query_params(query))]


def forward_owners_statements(traces: str, query: AggregateQuery
                              ) -> list[tuple[str, dict[str, Any]]]:
    """``(statement, params)`` filling :data:`FORWARD_OWNERS_TABLE`: the forward spans in the
    window recorded by a process that ran no request (a GPU worker that records ``queue`` and
    ``forward`` under a gateway's request span), one row per (trace, start, end), read from the
    spans only when some GPU point comes from a process without requests (else the table is
    empty and the spans are not read: the condition is a constant), as
    :func:`otel_stages.analysis.gpu_owners.forward_owners` decides. Such a forward is lined up
    with its own process's GPU points (:func:`warm_forwards_sql`)."""
    fill = f"""CREATE TEMPORARY TABLE {FORWARD_OWNERS_TABLE} ENGINE = Memory AS
SELECT trace_key, s, e, proc FROM (
    SELECT reinterpretAsUInt128(unhex(TraceId)) AS trace_key,
        toInt64(toUnixTimestamp64Nano(Timestamp)) AS s, s + toInt64(Duration) AS e,
        {process_hash(*RESOURCE_PROCESS)} AS proc
    FROM {traces}
    WHERE SpanName = '{semconv.STAGE_FORWARD}' AND {span_filter(query, odd=False)}
        AND (SELECT count() FROM {GPU_POINTS_TABLE} WHERE point_key NOT IN ({_REQUEST_PROCESSES})) > 0
)
WHERE proc NOT IN ({_REQUEST_PROCESSES})
LIMIT 1 BY trace_key, s, e"""
    return [(f"DROP TEMPORARY TABLE IF EXISTS {FORWARD_OWNERS_TABLE}", {}),
            (fill, query_params(query))]


def forward_owners_sql() -> str:
    """``SELECT n``: the rows of :data:`FORWARD_OWNERS_TABLE` (0 in the common case: the GPU
    joins then read each forward's request process, :func:`warm_forwards_sql`)."""
    return f"SELECT count() AS n FROM {FORWARD_OWNERS_TABLE}"


def warm_forwards_sql(owned: bool = False, which: str = "warm") -> str:
    """Rows ``trace_key``, ``span_key``, ``proc_key``, ``width``, ``height``, ``fmt``, ``s``,
    ``e``, ``i``: each warm forward window (``i``: its place in the request) with the process
    whose GPU it ran on: its request's process, or with ``owned`` (:func:`forward_owners_sql`
    found rows) the process that recorded the span where that process ran no request
    (:data:`FORWARD_OWNERS_TABLE`). Without ``owned`` the per-request table alone is read.
    ``which``: the requests whose forwards are read (a condition on the per-request table)."""
    windows = f"""SELECT trace_key, span_key, proc_key, width, height, fmt, s, e, i
        FROM {R} ARRAY JOIN fwd_start AS s, fwd_end AS e, arrayEnumerate(fwd_start) AS i
        WHERE {which}"""
    if not owned:
        return windows
    return f"""SELECT w.trace_key AS trace_key, w.span_key AS span_key,
        if(ifNull(o.proc, toUInt64(0)) = 0, w.proc_key, assumeNotNull(o.proc)) AS proc_key,
        w.width AS width, w.height AS height, w.fmt AS fmt, w.s AS s, w.e AS e, w.i AS i
    FROM ({windows}) AS w
    ANY LEFT JOIN {FORWARD_OWNERS_TABLE} AS o ON o.trace_key = w.trace_key AND o.s = w.s AND o.e = w.e"""


def gpu_owners_statements() -> list[tuple[str, dict[str, Any]]]:
    """``(statement, params)`` filling :data:`GPU_OWNERS_TABLE`: a process with requests (or that
    recorded forwards without running one, :data:`FORWARD_OWNERS_TABLE`) and GPU points owns its
    points (matched by :func:`~otel_stages.analysis.clickhouse_sql.process_hash`);
    the points of processes without requests go to every request process too, or, when the
    sender's ``host.name`` is that of some request processes (:data:`REQUEST_HOSTS_TABLE`), to
    those only (a per-node GPU exporter), and when it is none of theirs, only to request processes
    without a known host (those two kinds only up to :data:`MAX_FOREIGN_GPU_PROCESSES` senders);
    whose GPU
    is then the series that rises most during its forwards, as in the file report
    (:func:`otel_stages.analysis.gpu_owners.owned_series`). ``part`` is 0 where the points join
    the request process's series of their ``hw.id`` (its own, or a sender on its host), else the
    sender (a series of its own: :func:`series_hw_sql`). Both GPU joins (utilization, memory)
    read points through it."""
    owners = f"""CREATE TEMPORARY TABLE {GPU_OWNERS_TABLE} ENGINE = Memory AS
WITH series AS ({gpu_series_sql()}), requests AS ({_OWNER_PROCESSES}),
    foreign AS (SELECT k, any(host) AS host FROM ({_FOREIGN_SENDERS}) GROUP BY k)
SELECT k AS point_key, k AS proc_key, toUInt64(0) AS part FROM series WHERE k IN (SELECT k FROM requests)
UNION ALL
SELECT f.k AS point_key, r.k AS proc_key, if(f.host != '' AND h.host = f.host, toUInt64(0), f.k) AS part
FROM foreign AS f CROSS JOIN (SELECT DISTINCT k FROM requests) AS r
LEFT JOIN {REQUEST_HOSTS_TABLE} AS h ON h.k = r.k
WHERE (f.host != '' AND h.host = f.host)
    OR ((SELECT count() FROM ({_UNPLACED_SENDERS})) <= {MAX_FOREIGN_GPU_PROCESSES}
        AND (f.host = '' OR (f.host NOT IN (SELECT host FROM {REQUEST_HOSTS_TABLE}) AND h.host = '')))"""
    return [(f"DROP TEMPORARY TABLE IF EXISTS {GPU_OWNERS_TABLE}", {}), (owners, {})]


def series_hw_sql(hw: str, part: str) -> str:
    """SQL: a GPU series' ``hw`` (:func:`otel_stages.analysis.gpu_owners.series_hw`) from a point's
    ``hw.id`` and its owner row's ``part`` (:func:`gpu_owners_statements`); the file report names
    the sender by its process key, the SQL by its hash: the same series apart."""
    uuid = NVML_UUID.replace("\\", "\\\\")
    return (f"if({part} = 0 OR match({hw}, '{uuid}'), {hw},"
            f" concat({hw}, '{HW_SENDER_SQL}', toString({part})))")


#: :data:`otel_stages.analysis.gpu_owners.SENDER_SEPARATOR` as SQL writes it.
HW_SENDER_SQL = "\\x1E"


def buckets(s: str, e: str) -> str:
    """The :data:`GPU_BUCKET_NS` buckets a window ``s`` .. ``e`` (ns) touches, as an array."""
    return (f"range(toUInt64(intDiv({s}, {GPU_BUCKET_NS})),"
            f" toUInt64(intDiv({e}, {GPU_BUCKET_NS})) + 1)")


def gpu_points_sql() -> str:
    """``SELECT n``: the rows of :data:`GPU_POINTS_TABLE` (0: no GPU point in the window, and
    every table lined up with them would be empty)."""
    return f"SELECT count() AS n FROM {GPU_POINTS_TABLE}"


def gpu_owner_statements(traces: str, query: AggregateQuery) -> list[tuple[str, dict[str, Any]]]:
    """``(statement, params)`` after :func:`gpu_points_statements`: the forwards of processes
    without requests (:func:`forward_owners_statements`), the hosts
    (:func:`request_hosts_statements`) and the owners (:func:`gpu_owners_statements`)."""
    return [*forward_owners_statements(traces, query), *request_hosts_statements(traces, query),
            *gpu_owners_statements()]


def gpu_pairs_statements(owned: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """``(statement, params)`` after :func:`gpu_owner_statements`: the ``hw.gpu.utilization``
    points of the processes with warm requests, or of processes without requests for those with
    no GPU points (per process and ``hw.id``; values scaled to 0..1: a sender's points of one unit,
    every ``hw.id``, whose maximum exceeds :data:`PERCENT_GUESS` read as percent, its ambiguous
    undeclared points left out: :func:`~otel_stages.analysis.clickhouse_gpu_ids.ambiguous_condition`,
    as :func:`otel_stages.analysis.gpu_owners.sender_divisors`; points declared ``%`` as read),
    and one row per (point,
    warm forward window) with the point inside the window (the bucketed join described in
    :mod:`otel_stages.analysis.clickhouse_sql`), each window of the process whose GPU it ran on
    (``owned``: :func:`warm_forwards_sql`)."""
    points = f"""SELECT point_key AS proc_key, hw, t, v, undeclared, unit FROM {GPU_POINTS_TABLE}
    WHERE {gpu_metric_is(semconv.HW_GPU_UTILIZATION)}"""
    # the unit is guessed per sender and unit over every hw.id, as sender_divisors: ambiguous
    # undeclared points drop out here; points declared % (already ratios) are taken as read
    samples = f"""CREATE TEMPORARY TABLE {GPU_SAMPLES_TABLE} ENGINE = Log AS
SELECT o.proc_key AS proc_key, {series_hw_sql("p.hw", "o.part")} AS hw, p.t AS t,
    p.v / if(p.unit != '{PERCENT_UNIT}' AND m.top > {PERCENT_GUESS}, 100, 1) AS util
FROM ({points}) AS p
LEFT JOIN (SELECT proc_key, unit, max(v) AS top, {ambiguous_condition("undeclared", "v")} AS amb
           FROM ({points}) WHERE unit != '{PERCENT_UNIT}' GROUP BY proc_key, unit) AS m
    ON p.proc_key = m.proc_key AND p.unit = m.unit
INNER JOIN {GPU_OWNERS_TABLE} AS o ON p.proc_key = o.point_key
WHERE p.unit = '{PERCENT_UNIT}' OR m.amb = 0"""
    # every warm forward meets the points (not grouped by window first: most hold no point);
    # a window's requests (``mult``, per input cohort: requests of two inputs may share a batch's
    # window) are its distinct (request, forward) pairs, and a point stored more than once keeps
    # its copies (``copies``), as the join of grouped windows did
    pairs = f"""CREATE TEMPORARY TABLE {GPU_PAIRS_TABLE} ENGINE = Log AS
SELECT proc_key, hw, t, util, s, e, mult, width, height, fmt FROM (
    SELECT f.proc_key AS proc_key, sm.hw AS hw, sm.t AS t, sm.util AS util, f.s AS s, f.e AS e,
        f.width AS width, f.height AS height, f.fmt AS fmt,
        uniqExact(f.trace_key, f.span_key, f.i) AS mult, intDiv(count(), mult) AS copies
    FROM (
        SELECT trace_key, span_key, proc_key, s, e, i, width, height, fmt,
            arrayJoin({buckets("s", "e")}) AS b
        FROM ({warm_forwards_sql(owned)})
    ) AS f
    INNER JOIN (SELECT *, toUInt64(intDiv(t, {GPU_BUCKET_NS})) AS b FROM {GPU_SAMPLES_TABLE}) AS sm
        ON sm.proc_key = f.proc_key AND sm.b = f.b
    WHERE sm.t >= f.s AND sm.t <= f.e
    GROUP BY proc_key, hw, t, util, s, e, width, height, fmt
) ARRAY JOIN range(copies) AS copy"""
    # the samples inside the other requests' forwards (cold, failed, set apart) and no warm one:
    # inside a forward, so not between the warm forwards (gpu._align's ``aside``)
    aside = f"""CREATE TEMPORARY TABLE {GPU_ASIDE_TABLE} ENGINE = Memory AS
SELECT proc_key, hw, count() AS n_aside, sum(util) AS sum_aside, sum(util * util) AS sq_aside
FROM {GPU_SAMPLES_TABLE}
WHERE (proc_key, hw, t) IN (
        SELECT sm.proc_key, sm.hw, sm.t
        FROM (SELECT proc_key, s, e, arrayJoin({buckets("s", "e")}) AS b
              FROM ({warm_forwards_sql(owned, "is_request AND NOT warm")})) AS f
        INNER JOIN (SELECT proc_key, hw, t, toUInt64(intDiv(t, {GPU_BUCKET_NS})) AS b
                    FROM {GPU_SAMPLES_TABLE}) AS sm
            ON sm.proc_key = f.proc_key AND sm.b = f.b
        WHERE sm.t >= f.s AND sm.t <= f.e)
    AND (proc_key, hw, t) NOT IN (SELECT proc_key, hw, t FROM {GPU_PAIRS_TABLE})
GROUP BY proc_key, hw"""
    return [(f"DROP TEMPORARY TABLE IF EXISTS {GPU_PAIRS_TABLE}", {}),
            (f"DROP TEMPORARY TABLE IF EXISTS {GPU_SAMPLES_TABLE}", {}),
            (f"DROP TEMPORARY TABLE IF EXISTS {GPU_ASIDE_TABLE}", {}),
            (samples, {}), (pairs, {}), (aside, {})]


def _points_inside(by: str = "", where: str = "") -> str:
    """Rows ``proc_key``, ``hw``, ``t``, ``u`` (utilization), ``c``: each point inside a warm
    forward once, however many forwards hold it, with its copies (points of two senders at one
    time and value, or one point stored twice, count as the file report counts them: each)."""
    return f"""SELECT {by}proc_key, hw, t, util AS u, max(k) AS c FROM (
        SELECT {by}proc_key, hw, t, util, s, e, width AS w, height AS h, fmt AS f, count() AS k
        FROM {GPU_PAIRS_TABLE} {where} GROUP BY {by}proc_key, hw, t, util, s, e, w, h, f)
    GROUP BY {by}proc_key, hw, t, util"""


_POINTS_INSIDE = _points_inside()


#: Over ``n_all`` / ``sum_all`` / ``sq_all`` (all of a series' samples: count, sum, sum of
#: squares) and ``n_in`` / ``sum_in`` / ``sq_in`` (those inside the forwards): the ``rise`` of the
#: mean inside over the mean outside (0 without samples outside) and its standard error ``rise_se``
#: (population variances from the sums, as ``otel_stages.analysis.gpu._align``).
_RISE = """if(n_all > n_in, if(n_in > 0, sum_in / n_in, 0) - (sum_all - sum_in) / (n_all - n_in), 0)
            AS rise,
        if(n_in > 0 AND n_all > n_in,
           sqrt(greatest(0, sq_in / n_in - pow(sum_in / n_in, 2)) / n_in
                + greatest(0, (sq_all - sq_in) / (n_all - n_in) - pow((sum_all - sum_in) / (n_all - n_in), 2))
                  / (n_all - n_in)), 0) AS rise_se"""


#: Over :func:`_per_gpu` columns: the readings ``n_between`` the process's forwards (all but those
#: inside a warm forward and those inside another request's, :data:`GPU_ASIDE_TABLE`), the
#: amount ``below`` their mean that the mean inside the warm forwards lies and its standard error
#: ``below_se`` (0 without readings on either side; population variances, as
#: ``otel_stages.analysis.gpu._align``).
_DROP = """n_all - n_in - n_aside AS n_between,
        sum_all - sum_in - sum_aside AS sum_between, sq_all - sq_in - sq_aside AS sq_between,
        if(n_in > 0 AND n_between > 0, sum_between / n_between - sum_in / n_in, 0) AS below,
        if(n_in > 0 AND n_between > 0,
           sqrt(greatest(0, sq_in / n_in - pow(sum_in / n_in, 2)) / n_in
                + greatest(0, sq_between / n_between - pow(sum_between / n_between, 2)) / n_between),
           0) AS below_se"""


def _per_gpu(columns: str = "", join: str = "") -> str:
    """Per GPU series (``proc_key``, ``hw``) of the utilization: all its samples (``n_all``,
    ``sum_all``, ``sq_all``), those inside warm forwards (``n_in``, ``sum_in``, ``sq_in``), the
    ``rise`` of the mean inside over the mean outside and its standard error ``rise_se``
    (:data:`_RISE`), those inside other requests' forwards (``n_aside`` ...,
    :data:`GPU_ASIDE_TABLE`) and how far ``below`` the readings between the forwards
    (:data:`_DROP`), then ``columns`` of ``join``."""
    return f"""
    SELECT a.proc_key AS proc_key, a.hw AS hw, a.n_all AS n_all, a.sum_all AS sum_all,
        a.sq_all AS sq_all, ifNull(i.n_in, 0) AS n_in, ifNull(i.sum_in, 0) AS sum_in,
        ifNull(i.sq_in, 0) AS sq_in, ifNull(o.n_aside, 0) AS n_aside,
        ifNull(o.sum_aside, 0) AS sum_aside, ifNull(o.sq_aside, 0) AS sq_aside,
        {_RISE},
        {_DROP}{columns}
    FROM (SELECT proc_key, hw, count() AS n_all, sum(util) AS sum_all, sum(util * util) AS sq_all
          FROM {GPU_SAMPLES_TABLE} GROUP BY proc_key, hw) AS a
    LEFT JOIN (
        SELECT proc_key, hw, sum(c) AS n_in, sum(u * c) AS sum_in, sum(u * u * c) AS sq_in
        FROM ({_POINTS_INSIDE}) GROUP BY proc_key, hw
    ) AS i ON a.proc_key = i.proc_key AND a.hw = i.hw
    LEFT JOIN {GPU_ASIDE_TABLE} AS o ON a.proc_key = o.proc_key AND a.hw = o.hw
    {join}
    SETTINGS join_use_nulls = 1
"""


#: How a process's GPU is chosen (:func:`_per_gpu` columns): the highest rise (at
#: LEVEL_DECIMALS), then the most samples inside forwards, then the greater series id: ties broken
#: as the file report breaks them (``otel_stages.analysis.gpu._choice``).
_CHOICE = f"(round(rise, {LEVEL_DECIMALS}), n_in, hw)"


def _level_sql(mean: str) -> str:
    """``otel_stages.analysis.gpu._level_of`` of ``mean`` (0..1) in SQL."""
    return (f"multiIf(round({mean}, {LEVEL_DECIMALS}) >= {GPU_BUSY_MIN_UTILIZATION}, 'high',"
            f" round({mean}, {LEVEL_DECIMALS}) <= {GPU_STARVED_MAX_UTILIZATION}, 'low', 'medium')")


#: Over :func:`_per_gpu` columns: the series rises with the forwards
#: (``otel_stages.analysis.gpu.rises``).
_RISES = (f"(n_in > 0 AND round(rise, {LEVEL_DECIMALS}) >= {MIN_MODEL_GPU_RISE}"
          f" AND round(rise, {LEVEL_DECIMALS}) >= round({MIN_RISE_STANDARD_ERRORS} * rise_se,"
          f" {LEVEL_DECIMALS}))")


#: Over :func:`_per_gpu` columns: the series is less busy inside the warm forwards than between
#: the process's forwards, over enough readings on each side (``otel_stages.analysis.gpu.falls``):
#: its readings do not line up with the forwards.
_FALLS = (f"(n_in >= {MIN_MISALIGNED_READINGS} AND n_between >= {MIN_MISALIGNED_READINGS}"
          f" AND round(below, {LEVEL_DECIMALS}) >= {MIN_MISALIGNED_FALL}"
          f" AND round(below, {LEVEL_DECIMALS}) >= round({MIN_RISE_STANDARD_ERRORS} * below_se,"
          f" {LEVEL_DECIMALS}))")


def _chosen(by: str, slow_sum: str, slow_n: str) -> str:
    """Per process (and ``by``) of ``per_gpu``: the GPU taken (``g``, by :data:`_CHOICE` among
    those that rise, else among all with samples inside the forwards) and ``told``: whether it is
    the model's GPU as :func:`otel_stages.analysis.gpu.pick_gpu` decides (one series with samples
    inside the forwards, or the candidates all at one level), with ``seen``: the
    ``(hw, mean inside)`` of its series with samples, by ``hw``. ``g.5``: whether the series
    taken :data:`_FALLS`, ``g.6`` how far below (:data:`_DROP`). ``slow_sum`` / ``slow_n``: the
    slow forwards' sums in
    ``sp_row``."""
    levels = (f"({_level_sql('sum_in / n_in')}, if(ifNull({slow_n}, 0) > 0,"
              f" {_level_sql(f'{slow_sum} / {slow_n}')}, ''))")
    row = f"(hw, n_in, sum_in, sp_row, {_FALLS}, below)"
    return f"""SELECT {by}arraySort(groupArrayIf((hw, sum_in / n_in), n_in > 0)) AS seen,
        countIf(rising) AS n_rising,
        multiIf(length(seen) <= 1, argMax({row}, {_CHOICE}),
                n_rising > 0, argMaxIf({row}, {_CHOICE}, rising),
                argMaxIf({row}, {_CHOICE}, n_in > 0)) AS g,
        length(seen) <= 1 OR if(n_rising > 0, uniqExactIf({levels}, rising),
                                uniqExactIf({levels}, n_in > 0)) = 1 AS told
    FROM (SELECT *, {_RISES} AS rising FROM per_gpu) GROUP BY {by}proc_key"""


def model_gpus_sql() -> str:
    """Rows (``proc_key``, ``hw``): per process the series of the GPUs its model runs on, those
    whose utilization rises inside its warm forwards by at least
    :data:`~otel_stages.analysis.gpu.MODEL_GPU_RISE_SHARE` of the greatest rise, when that is above
    among those that rise (:data:`_RISES`), over the whole window, as
    :func:`otel_stages.analysis.gpu.model_gpus` finds them; a process
    without a rising series has none. The GPU memory rule reads these GPUs' memory
    (:func:`otel_stages.analysis.clickhouse_signals.memory_statements`)."""
    return f"""SELECT proc_key, hw FROM (
    SELECT proc_key, hw, rising, round(rise, {LEVEL_DECIMALS}) AS r,
        maxIf(r, rising) OVER (PARTITION BY proc_key) AS top
    FROM (SELECT *, {_RISES} AS rising FROM ({_per_gpu()}))
) WHERE rising AND r >= {MODEL_GPU_RISE_SHARE} * top"""


_SPLIT_ROW = """,
        (ifNull(sp.covered, 0), ifNull(sp.can_split, 0), sp.slow_sum, sp.slow_n, sp.fast_sum,
         sp.fast_n, ifNull(sp.slow_covered, 0)) AS sp_row"""
_SPLIT_JOIN = "LEFT JOIN split AS sp ON a.proc_key = sp.proc_key AND a.hw = sp.hw"


#: Over :func:`_chosen` rows: the processes whose GPU taken :data:`_FALLS` (``misaligned``) and,
#: for one of them, its means inside the warm forwards and between the forwards
#: (``misaligned_in`` / ``misaligned_out``; read when it is the only one).
_MISALIGNED = """countIf(told AND g.5) AS misaligned,
    anyIf(g.3 / g.2, told AND g.5) AS misaligned_in,
    anyIf(g.3 / g.2 + g.6, told AND g.5) AS misaligned_out"""


def gpu_metrics_sql() -> str:
    """From the GPU tables: per process the GPU whose utilization rises most inside forwards
    (vs. outside them; ties: more samples), and one row of sums over those GPUs: samples inside
    forwards and their sum, forwards covered, and the sums and counts inside slow and fast
    forwards (longer than the slow-forward threshold ``{slow_min_ns:Float64}`` of
    :func:`slow_forwards_sql`, and the others; ``slow_covered``: slow forwards with a sample).
    A process whose model GPU cannot be told (:func:`_chosen`) is left out of the sums and counted
    (``unidentified``; ``unidentified_gpus``: one such process's ``(hw, mean inside)``)."""
    slow = "f.e - f.s > {slow_min_ns:Float64}"
    fast = "f.e - f.s <= {slow_min_ns:Float64}"
    return f"""WITH
per_forward AS (
    SELECT proc_key, hw, s, e, any(mult) AS mult, count() AS n, sum(util) AS su
    FROM {GPU_PAIRS_TABLE} GROUP BY proc_key, hw, s, e, width, height, fmt
),
split AS (
    SELECT f.proc_key AS proc_key, f.hw AS hw, sum(f.mult) AS covered,
        sum(f.mult) >= 1 AS can_split,
        sumIf(f.su * f.mult, {slow}) AS slow_sum, sumIf(f.n * f.mult, {slow}) AS slow_n,
        sumIf(f.su * f.mult, {fast}) AS fast_sum, sumIf(f.n * f.mult, {fast}) AS fast_n,
        sumIf(f.mult, {slow}) AS slow_covered
    FROM per_forward AS f
    GROUP BY proc_key, hw
),
per_gpu AS ({_per_gpu(_SPLIT_ROW, _SPLIT_JOIN)}),
chosen AS ({_chosen("", "sp_row.3", "sp_row.4")})
SELECT countIf(told) AS gpus, anyIf(g.1, told) AS hw_id,
    sumIf(g.2, told) AS samples, sumIf(g.3, told) AS sum_in, sumIf(g.4.1, told) AS covered,
    countIf(g.4.2 AND told) AS split_gpus,
    sumIf(g.4.3, g.4.2 AND told) AS slow_sum, sumIf(g.4.4, g.4.2 AND told) AS slow_n,
    sumIf(g.4.5, g.4.2 AND told) AS fast_sum, sumIf(g.4.6, g.4.2 AND told) AS fast_n,
    sumIf(g.4.7, g.4.2 AND told) AS slow_covered,
    countIf(NOT told) AS unidentified, anyIf(seen, NOT told) AS unidentified_gpus,
    {_MISALIGNED}
FROM chosen"""


def cohort_forwards_sql() -> str:
    """Per cohort of the largest ``{top_cohorts:UInt32}``: ``median_ns`` of its warm forward spans
    (as :func:`slow_forwards_sql` over all) and ``forwards``, their count. The cohort's slow-forward
    threshold adds its own noise band (:func:`cohort_gpu_statements`)."""
    return f"""SELECT width, height, fmt, quantileExactInclusive(0.5)(w.2 - w.1) AS median_ns,
    count() AS forwards
FROM {R} ARRAY JOIN arrayZip(fwd_start, fwd_end) AS w
WHERE warm AND {_KNOWN} AND (width, height, fmt) IN ({TOP_COHORTS})
GROUP BY width, height, fmt ORDER BY width, height, fmt"""


def _thresholds(count: int) -> str:
    """SQL rows (``width``, ``height``, ``fmt``, ``th``: slow-forward threshold, ns) from the
    params ``w{i}``, ``h{i}``, ``f{i}``, ``t{i}`` for ``i < count`` (``count`` >= 1)."""
    return " UNION ALL ".join(
        f"SELECT {{w{i}:Int64}} AS width, {{h{i}:Int64}} AS height, {{f{i}:String}} AS fmt,"
        f" {{t{i}:Float64}} AS th" for i in range(count))


def _by_cohort_threshold(count: int) -> str:
    """The tail of a per-cohort statement over rows ``f`` (``width``, ``height``, ``fmt``): each
    met by its cohort's threshold ``t.th`` (:func:`_thresholds`), grouped by cohort."""
    return f"""INNER JOIN ({_thresholds(count)}) AS t
    ON f.width = t.width AND f.height = t.height AND f.fmt = t.fmt
GROUP BY width, height, fmt ORDER BY width, height, fmt"""


def cohort_gpu_spans_sql(count: int) -> str:
    """:func:`gpu_spans_sql` per cohort, each split at its own threshold (:func:`_thresholds`,
    returned as ``slow_min_ns``), with ``forwards``, the cohort's warm forwards, and
    ``slow_forwards``, those beyond it. Each process's unit is that of all its warm forwards
    (:class:`otel_stages.analysis.gpu.SpanUnits`), not of the cohort's alone."""
    return f"""SELECT f.width AS width, f.height AS height, f.fmt AS fmt,
    countIf(f.usable) AS covered, sumIf(f.c, f.usable) AS samples, sumIf(f.u * f.c, f.usable) AS weighted,
    any(t.th) AS slow_min_ns, count() AS forwards,
    countIf(f.d > t.th) AS slow_forwards, countIf(f.usable AND f.d > t.th) AS slow_covered,
    sumIf(f.u * f.c, f.usable AND f.d > t.th) AS slow_sum, sumIf(f.c, f.usable AND f.d > t.th) AS slow_n,
    sumIf(f.u * f.c, f.usable AND f.d <= t.th) AS fast_sum, sumIf(f.c, f.usable AND f.d <= t.th) AS fast_n
FROM (
    SELECT width, height, fmt, d, c, ok AND k > 0 AS usable, r AS u FROM (
        SELECT width, height, fmt, d, c, ok, known, {_span_units("ok")}
        FROM (
            SELECT width, height, fmt, proc_key, (w.2 - w.1) AS d, w.3 AS u, ifNull(w.4, 1) AS c,
                {utilization_reading("w.3", "w.4")} AS ok, {_KNOWN} AS known
            FROM {R} ARRAY JOIN arrayZip(fwd_start, fwd_end, fwd_util, fwd_count) AS w
            WHERE warm
        )
    ) WHERE known
) AS f
{_by_cohort_threshold(count)}"""


def cohort_slow_forwards_sql(count: int) -> str:
    """Per cohort, as :func:`cohort_gpu_spans_sql` without span attributes to read (a run whose
    GPU data is metric points only): ``slow_min_ns``, ``forwards``, ``slow_forwards``."""
    return f"""SELECT f.width AS width, f.height AS height, f.fmt AS fmt, any(t.th) AS slow_min_ns,
    count() AS forwards, countIf(f.d > t.th) AS slow_forwards, 0 AS covered
FROM (
    SELECT width, height, fmt, w.2 - w.1 AS d FROM {R} ARRAY JOIN arrayZip(fwd_start, fwd_end) AS w
    WHERE warm AND {_KNOWN}
) AS f
{_by_cohort_threshold(count)}"""


def cohort_gpu_metrics_sql(count: int) -> str:
    """:func:`gpu_metrics_sql` per cohort: per process the GPU whose utilization rises most inside
    the cohort's forwards (every process with GPU samples takes part, as in the file report), and
    the sums over those GPUs, split at the cohort's own threshold (:func:`_thresholds`)."""
    th = _thresholds(count)
    slow = "f.e - f.s > t.th"
    fast = "f.e - f.s <= t.th"
    return f"""WITH
per_forward AS (
    SELECT width, height, fmt, proc_key, hw, s, e, any(mult) AS mult, count() AS n,
        sum(util) AS su
    FROM {GPU_PAIRS_TABLE} WHERE {_KNOWN} GROUP BY width, height, fmt, proc_key, hw, s, e
),
split AS (
    SELECT f.width AS width, f.height AS height, f.fmt AS fmt, f.proc_key AS proc_key,
        f.hw AS hw, sum(f.mult) AS covered,
        sumIf(f.su * f.mult, {slow}) AS slow_sum, sumIf(f.n * f.mult, {slow}) AS slow_n,
        sumIf(f.su * f.mult, {fast}) AS fast_sum, sumIf(f.n * f.mult, {fast}) AS fast_n,
        sumIf(f.mult, {slow}) AS slow_covered
    FROM per_forward AS f
    INNER JOIN ({th}) AS t ON f.width = t.width AND f.height = t.height AND f.fmt = t.fmt
    GROUP BY width, height, fmt, proc_key, hw
),
inside AS (
    SELECT width, height, fmt, proc_key, hw, sum(c) AS n_in, sum(u * c) AS sum_in,
        sum(u * u * c) AS sq_in
    FROM ({_points_inside("width, height, fmt, ", f"WHERE {_KNOWN}")})
    GROUP BY width, height, fmt, proc_key, hw
),
per_gpu AS (
    SELECT c.width AS width, c.height AS height, c.fmt AS fmt, a.proc_key AS proc_key,
        a.hw AS hw, a.n_all AS n_all, a.sum_all AS sum_all, a.sq_all AS sq_all,
        ifNull(i.n_in, 0) AS n_in, ifNull(i.sum_in, 0) AS sum_in, ifNull(i.sq_in, 0) AS sq_in,
        {_RISE},
        -- a cohort reads the window's misalignment (gpu_evidence's misaligned), not its own
        0 AS n_between, 0 AS below, 0 AS below_se,
        (ifNull(sp.covered, 0), sp.slow_sum, sp.slow_n, sp.fast_sum, sp.fast_n,
         ifNull(sp.slow_covered, 0)) AS sp_row
    FROM (SELECT proc_key, hw, count() AS n_all, sum(util) AS sum_all, sum(util * util) AS sq_all
          FROM {GPU_SAMPLES_TABLE} GROUP BY proc_key, hw) AS a
    CROSS JOIN ({th}) AS c
    LEFT JOIN inside AS i ON i.width = c.width AND i.height = c.height AND i.fmt = c.fmt
        AND i.proc_key = a.proc_key AND i.hw = a.hw
    LEFT JOIN split AS sp ON sp.width = c.width AND sp.height = c.height AND sp.fmt = c.fmt
        AND sp.proc_key = a.proc_key AND sp.hw = a.hw
    SETTINGS join_use_nulls = 1
),
chosen AS ({_chosen("width, height, fmt, ", "sp_row.2", "sp_row.3")})
SELECT width, height, fmt, countIf(told) AS gpus, anyIf(g.1, told) AS hw_id,
    sumIf(g.2, told) AS samples, sumIf(g.3, told) AS sum_in, sumIf(g.4.1, told) AS covered,
    countIf(g.4.1 >= 1 AND told) AS split_gpus,
    sumIf(g.4.2, g.4.1 >= 1 AND told) AS slow_sum, sumIf(g.4.3, g.4.1 >= 1 AND told) AS slow_n,
    sumIf(g.4.4, g.4.1 >= 1 AND told) AS fast_sum, sumIf(g.4.5, g.4.1 >= 1 AND told) AS fast_n,
    sumIf(g.4.6, g.4.1 >= 1 AND told) AS slow_covered,
    countIf(NOT told) AS unidentified, anyIf(seen, NOT told) AS unidentified_gpus
FROM chosen GROUP BY width, height, fmt ORDER BY width, height, fmt"""


def cohort_gpu_statements(thresholds: Sequence[tuple[int, int, str, float]], *,
                          spans: bool = True, metrics: bool = True
                          ) -> list[tuple[str, str, dict[str, Any]]]:
    """``(name, SQL, params)`` of the GPU utilization aggregates per cohort (after
    :func:`gpu_statements`), ``thresholds``: ``(width, height, fmt, slow_min_ns)`` per cohort
    (its forward median, :func:`cohort_forwards_sql`, plus its own noise band). Empty without
    cohorts. ``spans`` / ``metrics``: whether the run has that source (its forwards and
    threshold come with the span statement, which runs whenever either does)."""
    if not thresholds or not (spans or metrics):
        return []
    params: dict[str, Any] = {}
    for i, (w, h, f, t) in enumerate(thresholds):
        params.update({f"w{i}": w, f"h{i}": h, f"f{i}": f, f"t{i}": t})
    n = len(thresholds)
    return [("cohort_gpu_spans", cohort_gpu_spans_sql(n) if spans else cohort_slow_forwards_sql(n),
             params),
            *([("cohort_gpu_metrics", cohort_gpu_metrics_sql(n), params)] if metrics else [])]


def gpu_statements(slow_min_ns: float, *, points: bool = True
                   ) -> list[tuple[str, str, dict[str, Any]]]:
    """``(name, SQL, params)`` of the GPU utilization aggregates, run after
    :func:`aggregate_statements` and :func:`slow_forwards_sql` (whose threshold, from the run's
    noise band in their answers, is ``slow_min_ns``): the forward spans' attributes, and the
    metric points' unless there are none (``points``)."""
    split = {"slow_min_ns": slow_min_ns}
    return [("gpu_spans", gpu_spans_sql(), split),
            *([("gpu_metrics", gpu_metrics_sql(), split)] if points else [])]


def aggregate_statements(traces: str, query: AggregateQuery, method: str
                         ) -> list[tuple[str, str, dict[str, Any]]]:
    """``(name, SQL, params)`` for every aggregate (after the per-request and GPU tables are
    filled), named as :func:`otel_stages.analysis.clickhouse_result.build_aggregates` reads them."""
    params = query_params(query)
    tops = {"top_cohorts": query.top_cohorts, "top_runs": query.top_runs,
            "top_slowest": query.top_slowest}
    return [
        ("summary", summary_sql(method), {}),
        ("stages", stages_sql(method), {}),
        ("cohorts", cohorts_sql(method), tops),
        ("cohort_stages", cohort_stages_sql(method), tops),
        ("cohort_mix", cohort_mix_sql(), {}),
        ("process_mix", process_mix_sql(), {}),
        ("seq_coverage", seq_coverage_sql(), {}),
        ("cold", cold_sql(method), {}),
        ("cold_stages", cold_stages_sql(method), {}),
        ("cold_cohorts", cold_cohorts_sql(method), tops),
        ("cold_cohort_stages", cold_cohort_stages_sql(method), tops),
        ("cold_input_stages", cold_input_stages_sql(method), {}),
        ("runs", runs_sql(), tops),
        ("slowest", slowest_sql(), tops),
        ("signals", signals_sql(traces, query), params),
        ("queue_depth", queue_depth_sql(traces, query), params),
        ("odd_spans", issues.odd_spans_sql(traces, query), params),
        ("issues", issues.issues_sql(), {}),
        ("groups", issues.groups_sql(), {}),
        ("names", names_sql(), {}),
    ]

