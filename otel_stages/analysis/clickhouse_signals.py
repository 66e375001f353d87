"""The mechanism signals in ClickHouse: per-stage amounts of thread CPU time, waiting, GC pauses,
event-loop lag, cgroup throttling and CPU pressure, the stages that held the loop, and GPU memory around the
forwards. Pure:
builds SQL (``(statement, params)`` / ``(name, SQL, params)``);
:mod:`otel_stages.analysis.clickhouse_signal_result` reads the answers into the inputs of the
one rule set, :func:`otel_stages.analysis.mechanisms.judge` and
:func:`otel_stages.analysis.gpu_memory.memory_mechanism` (no threshold or rule here).

What is read, and how narrowly (a fleet has millions of spans):

- **signal spans** (:data:`SIGNAL_SPANS_TABLE`): only spans whose attribute map carries
  ``thread.cpu_time_ms``, ``otel_stages.gc.pause_ms``, ``otel_stages.event_loop.lag_ms`` or
  ``otel_stages.event_loop.held_ms`` (the exporter's bloom-filter index on the map keys skips the
  rest) or ``cpython.gc.pause`` events; per (trace, parent span, name), the sums of each signal and
  how many spans carried it, with the rules of :mod:`otel_stages.analysis.stage_signals` per span
  (GC time from the attribute, else from the overlap of GC events with the span, else 0 on a span
  with CPU time; lag likewise 0 on a span with CPU time). Read only when
  :func:`otel_stages.analysis.clickhouse_queries.signals_sql` finds such a span.
- **throttling** (:data:`THROTTLE_TABLE`): the cumulative ``container.cpu.throttling_data.
  throttled_time`` points of the processes with requests, from the exporter's sum table, by
  process and time range, cut at the first drop; each signal span's throttled ms is the counter's
  rise between its start and end, interpolated between the points around each (two ``ASOF``
  joins per end), unknown outside the series. Only spans that carry signals are read: the file
  report also reads throttling on stage spans without them (a producer that records the
  cgroup's counter records the span signals too). The quota: each process's latest
  ``container.cpu.limit`` gauge, the largest (:func:`limit_sql`).
- **CPU pressure** (:data:`PRESSURE_TABLE`): the cumulative ``system.cpu.linux.pressure.total``
  points (``stall_type`` ``some``, seconds) from the sum table, read exactly as the throttled
  time (same process key, cut at the first drop, interpolated at each signal span's start and
  end, only on spans that carry signals).
  Its scope (:func:`pressure_scope_sql`): ``cgroup`` only when every point says so.
- **run-queue wait**: ``otel_stages.thread.run_queue_wait_ms`` on the signal spans, read and
  summed as ``thread.cpu_time_ms`` (its own count: opt-in, so unknown where missing); the
  ``blocked`` part is ``wall - cpu - runq`` per sample, as ``wait`` is ``wall - cpu``.
- **samples** (:data:`SAMPLES_TABLE`): one row per warm request and stage (the stage's ms as in
  the statistics), the signal known only when *every* span of the stage in the request carried it
  (the request's ``stage_counts``). Stage spans are matched to their request by parent span id:
  spans inside a custom group span count as not recorded (the file report reads them).
- **per-stage aggregates** (:func:`stage_signals_sql`): over the whole window and within each of
  the largest cohorts, exactly the figures :class:`~otel_stages.analysis.mechanisms.Part` and
  :class:`~otel_stages.analysis.mechanisms.StageSignals` hold: counts, medians over all runs, the
  slowest quarter (``>= p75`` of the stage) and the faster half (``<= median``),
  ``cov(part, stage) / var(stage)``, the CPU/wall medians and upper quartile, and the slowdown's
  share of the variance of ``log(stage ms)``; the percentile levels come from
  :mod:`otel_stages.analysis.mechanisms`.
- **held** (:func:`held_sql`): per stage name, how many warm request spans held an event loop and
  the median, max and sum of how long.
- **GPU memory**: ``hw.gpu.memory.usage`` points of the processes with warm requests in the
  window (:data:`MEMORY_SAMPLES_TABLE`), lined up with each warm forward window by the bucketed
  join of the utilization (:mod:`otel_stages.analysis.clickhouse_sql`), per process; per GPU
  series (process, ``hw.id``) the point and limit counts, the largest limit and whether it is
  read (:func:`memory_gpus_sql`); per scope the forward windows' count, median and processes
  (:func:`memory_windows_sql`); and one row per covered forward (:func:`memory_forwards_sql`),
  judged on the GPU series read for its process, as :mod:`otel_stages.analysis.gpu_memory` reads
  them: the model's GPU alone when the whole window's utilization chose one for the process
  (:data:`MODEL_GPUS_TABLE`, from
  :func:`~otel_stages.analysis.clickhouse_queries.model_gpus_sql`: the series that
  :func:`~otel_stages.analysis.clickhouse_queries.gpu_metrics_sql` sums, unless two tie) and it has
  memory points and a positive limit; else *every* such series of the process (no utilization, a
  tie, or no memory on the chosen GPU: which GPU the model uses cannot be told). Over the series
  read with points inside the forward, the highest peak, range and released memory, each as a
  fraction of its own series' largest ``hw.gpu.memory.limit``, and all their points. At most
  :data:`MAX_MEMORY_FORWARDS` rows: the memory rule compares per-forward shares, so it needs the
  forwards, not a sum. Above that a deterministic sample (by hash of the forward, so a forward's
  GPUs stay together in one row) is returned and the report says so.

Left out on purpose: signals of stage spans under a custom group span (they count as not
recorded; the file report reads them; the report says so in ``problems``:
:func:`otel_stages.analysis.clickhouse_issues.not_checked`).
"""

from __future__ import annotations

from typing import Any

from otel_stages import semconv
from otel_stages.analysis.clickhouse_queries import (
    GPU_POINTS_TABLE,
    TOP_COHORTS,
    buckets,
    gpu_metric_is,
    model_gpus_sql,
    series_hw_sql,
    warm_forwards_sql,
)
from otel_stages.analysis.clickhouse_sql import (
    DD_RELATIVE_ACCURACY,
    GPU_BUCKET_NS,
    GPU_OWNERS_TABLE,
    NO_RECORDED_VALUE_SQL,
    PROCESS_TABLE,
    RESOURCE_PROCESS,
    AggregateQuery,
    finite_number,
    metric_filter,
    process_hash,
    requests,
    span_filter,
)
from otel_stages.analysis.signal_figures import (
    _MIN_CPU_MS,
    BUSY_PERCENTILE,
    SLOW_PERCENTILE,
    TAIL_PERCENTILE,
)

SIGNAL_SPANS_TABLE = "otel_stages_signal_spans"
SAMPLES_TABLE = "otel_stages_signal_samples"
MEMORY_SAMPLES_TABLE = "otel_stages_memory_samples"
MEMORY_PAIRS_TABLE = "otel_stages_memory_pairs"
#: Per process, the model's GPU (``proc_key``, ``hw``): :func:`model_gpus_sql`.
MODEL_GPUS_TABLE = "otel_stages_model_gpus"
THROTTLE_TABLE = "otel_stages_throttle"
PRESSURE_TABLE = "otel_stages_cpu_pressure"
#: Temporary tables this module creates (dropped after a report).
TABLES = (SIGNAL_SPANS_TABLE, SAMPLES_TABLE, MEMORY_SAMPLES_TABLE, MEMORY_PAIRS_TABLE, MODEL_GPUS_TABLE,
          THROTTLE_TABLE, PRESSURE_TABLE)
#: At most this many covered forwards come back for the GPU memory rule (a sample above).
MAX_MEMORY_FORWARDS = 20_000
#: Cohort columns of the per-request table (the scope of a cohort's signals).
COHORT = "width, height, fmt"

R = requests()
_SIGNAL_KEYS = (semconv.THREAD_CPU_TIME_MS, semconv.GC_PAUSE_MS, semconv.EVENT_LOOP_LAG_MS,
                semconv.EVENT_LOOP_HELD_MS)
#: The parts of a stage read per sample (columns of SAMPLES_TABLE, plus ``wait``).
PARTS = ("cpu", "wait", "gc", "lag", "throttled", "pressure", "runq", "blocked")


def _q(level: float, expr: str, cond: str, method: str) -> str:
    if method == "exact":
        return f"quantileExactInclusiveIf({level!r})({expr}, {cond})"
    return f"quantileDDIf({DD_RELATIVE_ACCURACY}, {level!r})({expr}, {cond})"


def _num(key: str) -> str:
    return finite_number(f"SpanAttributes['{key}']")


_PROC_KEY = process_hash(*RESOURCE_PROCESS)


def throttle_statement(sums: str, query: AggregateQuery) -> str:
    """Fill :data:`THROTTLE_TABLE`: the cumulative ``container.cpu.throttling_data.throttled_time``
    points (ns) of the processes with requests, by process, in time order, up to the first drop
    (a new cgroup, a restart: as :class:`otel_stages.analysis.stage_signals.ThrottleSeries`)."""
    return _counter_statement(THROTTLE_TABLE, sums, query, semconv.CONTAINER_CPU_THROTTLED_TIME, "1")


def pressure_statement(sums: str, query: AggregateQuery) -> str:
    """Fill :data:`PRESSURE_TABLE`: the cumulative ``system.cpu.linux.pressure.total`` points
    (seconds) with ``system.linux.pressure.stall_type`` = ``some`` of the processes with
    requests, as :func:`throttle_statement` (:class:`otel_stages.analysis.stage_signals.
    PressureSeries`)."""
    some = (f"Attributes['{semconv.SYSTEM_LINUX_PRESSURE_STALL_TYPE}']"
            f" = '{semconv.PRESSURE_STALL_SOME}'")
    return _counter_statement(PRESSURE_TABLE, sums, query, semconv.SYSTEM_CPU_PRESSURE_TOTAL, some)


def _counter_statement(table: str, sums: str, query: AggregateQuery, name: str, where: str) -> str:
    """Fill ``table`` with one cumulative counter's points (``name``, rows where ``where``) by
    process, in time order, up to the first drop."""
    points = f"""SELECT {_PROC_KEY} AS proc_key, toInt64(toUnixTimestamp64Nano(TimeUnix)) AS t, Value AS v
        FROM {sums} WHERE {metric_filter(query, f"('{name}')")} AND {where}"""
    order = "PARTITION BY proc_key ORDER BY t, v ROWS BETWEEN"
    return f"""CREATE TEMPORARY TABLE {table} ENGINE = Memory AS
SELECT proc_key, t, v FROM (
    SELECT proc_key, t, v, max(dropped) OVER ({order} UNBOUNDED PRECEDING AND CURRENT ROW) AS gone
    FROM (
        SELECT proc_key, t, v, v < lagInFrame(v, 1, v) OVER ({order} 1 PRECEDING AND CURRENT ROW) AS dropped
        FROM ({points}) WHERE proc_key IN (SELECT arrayJoin(proc_keys) FROM {PROCESS_TABLE})
    )
) WHERE NOT gone"""


def pressure_scope_sql(sums: str, query: AggregateQuery) -> str:
    """One row: ``n``, the CPU pressure points (``some``) of the processes with requests, and
    ``cgroup_n``, those read from the process's cgroup (``otel_stages.pressure.scope`` =
    ``cgroup``): the scope is ``cgroup`` only when all are (as
    :func:`otel_stages.analysis.stage_signals.pressure_scope`)."""
    some = (f"Attributes['{semconv.SYSTEM_LINUX_PRESSURE_STALL_TYPE}']"
            f" = '{semconv.PRESSURE_STALL_SOME}'")
    cgroup = f"Attributes['{semconv.PRESSURE_SCOPE}'] = '{semconv.PRESSURE_SCOPE_CGROUP}'"
    return f"""SELECT count() AS n, countIf({cgroup}) AS cgroup_n
FROM {sums} WHERE {metric_filter(query, f"('{semconv.SYSTEM_CPU_PRESSURE_TOTAL}')")} AND {some}
    AND {_PROC_KEY} IN (SELECT arrayJoin(proc_keys) FROM {PROCESS_TABLE})"""


def limit_sql(gauge: str) -> str:
    """One row: ``limit_cpus``, the largest of each process's latest ``container.cpu.limit``
    (NULL without points)."""
    return f"""SELECT maxOrNull(l) AS limit_cpus FROM (
    SELECT {_PROC_KEY} AS proc_key, argMax(Value, TimeUnix) AS l
    FROM {gauge} WHERE MetricName = '{semconv.CONTAINER_CPU_LIMIT}' AND isFinite(Value)
        AND {NO_RECORDED_VALUE_SQL}
    GROUP BY proc_key HAVING proc_key IN (SELECT arrayJoin(proc_keys) FROM {PROCESS_TABLE}))"""


def _at(side: str, at: str) -> str:
    """The throttle counter at time ``at`` from the joined points before (``{side}0``) and after
    (``{side}1``): NULL outside the series, else linear between them (ThrottleSeries._at)."""
    p, n = f"{side}0", f"{side}1"
    return (f"if({p}.t IS NULL OR {n}.t IS NULL, NULL, if({n}.t = {at}, {n}.v,"
            f" {p}.v + ({n}.v - {p}.v) * ({at} - {p}.t) / ({n}.t - {p}.t)))")


def signal_spans_statement(traces: str, query: AggregateQuery, throttle: bool = False,
                           pressure: bool = False) -> str:
    """Fill :data:`SIGNAL_SPANS_TABLE` (module docstring): per (``trace_key``, ``pid``, ``name``)
    ``n`` spans, ``n_cpu`` / ``cpu``, ``n_gc`` / ``gc``, ``n_lag`` / ``lag``, ``n_throttled`` /
    ``throttled``, ``n_pressure`` / ``pressure`` (how many carried the signal, and its sum in ms)
    and ``held`` (ms of each span that held an event loop). ``throttle``: :data:`THROTTLE_TABLE`
    is filled; each span's throttled ms is the counter's rise between its start and end,
    interpolated (NULL outside the series). ``pressure``: :data:`PRESSURE_TABLE` is filled,
    read the same way (seconds to ms)."""
    has = " OR ".join(f"mapContains(SpanAttributes, '{k}')" for k in _SIGNAL_KEYS)
    gc_event = f"'{semconv.EVENT_GC_PAUSE}'"
    dur = finite_number(f"a['{semconv.GC_DURATION_MS}']")
    start = "toInt64(toUnixTimestamp64Nano(Timestamp))"
    t = "toInt64(toUnixTimestamp64Nano(t))"
    # stage_signals._gc_from_events: overlap of each GC event (time .. time + duration) with the span
    from_events = (f"arraySum((t, n, a) -> if(n = {gc_event} AND isNotNull({dur}),"
                   f" greatest(toInt64(0), least({t} + toInt64(assumeNotNull({dur}) * 1e6), s_end)"
                   f" - greatest({t}, s_start)), 0), Events.Timestamp, Events.Name, Events.Attributes)"
                   " / 1e6")
    head = f"""CREATE TEMPORARY TABLE {SIGNAL_SPANS_TABLE} ENGINE = Memory AS
SELECT trace_key, pid, name, count() AS n,
    count(c) AS n_cpu, sum(ifNull(c, 0)) AS cpu, count(g) AS n_gc, sum(ifNull(g, 0)) AS gc,
    count(l) AS n_lag, sum(ifNull(l, 0)) AS lag, count(rq) AS n_runq, sum(ifNull(rq, 0)) AS runq,
    count(thr) AS n_throttled,
    sum(ifNull(thr, 0)) AS throttled, count(prs) AS n_pressure, sum(ifNull(prs, 0)) AS pressure,
    groupArrayIf(h, h > 0) AS held
FROM ({{spans}})
GROUP BY trace_key, pid, name"""
    spans = f"""SELECT reinterpretAsUInt128(unhex(TraceId)) AS trace_key,
        reinterpretAsUInt64(unhex(SpanId)) AS sid, reinterpretAsUInt64(unhex(ParentSpanId)) AS pid,
        CAST(SpanName AS String) AS name,
        {_PROC_KEY} AS proc_key, {start} AS s_start, s_start + toInt64(Duration) AS s_end,
        {_num(semconv.THREAD_CPU_TIME_MS)} AS c, {_num(semconv.THREAD_RUN_QUEUE_WAIT_MS)} AS rq,
        coalesce({_num(semconv.GC_PAUSE_MS)}, if(has(Events.Name, {gc_event}), {from_events}, NULL),
                 if(c IS NULL, NULL, 0.)) AS g,
        coalesce({_num(semconv.EVENT_LOOP_LAG_MS)}, if(c IS NULL, NULL, 0.)) AS l,
        ifNull({_num(semconv.EVENT_LOOP_HELD_MS)}, 0.) AS h
    FROM {traces}
    WHERE ({has} OR has(Events.Name, {gc_event})) AND {span_filter(query, odd=False)}
    LIMIT 1 BY trace_key, sid"""
    null = "CAST(NULL AS Nullable(Float64))"
    if not throttle and not pressure:
        return head.replace("{spans}", f"SELECT *, {null} AS thr, {null} AS prs FROM ({spans})")
    columns, joins = [], []
    # per counter: its table, the join aliases at the span's start and end, the ms per unit
    for on, alias, table, start, end, ms in ((throttle, "thr", THROTTLE_TABLE, "a", "b", "1e-6"),
                                             (pressure, "prs", PRESSURE_TABLE, "c", "d", "1e3")):
        if not on:
            columns.append(f"{null} AS {alias}")
            continue
        joins += [f"\nASOF LEFT JOIN {table} AS {side}{k} ON x.proc_key = {side}{k}.proc_key"
                  f" AND x.{at} {op} {side}{k}.t"
                  for side, at in ((start, "s_start"), (end, "s_end"))
                  for k, op in ((0, ">="), (1, "<="))]
        columns += [f"if({alias}_a IS NULL OR {alias}_b IS NULL, NULL,"
                    f" greatest(0., ({alias}_b - {alias}_a) * {ms})) AS {alias}",
                    f"{_at(start, 'x.s_start')} AS {alias}_a", f"{_at(end, 'x.s_end')} AS {alias}_b"]
    with_counters = f"""SELECT x.*, {", ".join(columns)}
    FROM ({spans}) AS x{"".join(joins)}
    SETTINGS join_use_nulls = 1"""
    return head.replace("{spans}", with_counters)


def samples_statement(with_spans: bool) -> str:
    """Fill :data:`SAMPLES_TABLE`: one row per warm request and stage (its cohort, ``stage``,
    ``wall`` ms, ``cpu`` / ``gc`` / ``lag`` ms or NULL when not every span of the stage carried
    it). Without signal spans only ``forward`` rows (the GPU memory rule's stage), signals NULL."""
    inner = f"""SELECT trace_key, span_key, {COHORT}, stage, ms AS wall, cnt
    FROM {R} ARRAY JOIN stage_names AS stage, arrayMap(x -> x / 1e6, stage_ns) AS ms, stage_counts AS cnt
    WHERE warm"""
    if not with_spans:  # forward only: its ms per request, without unrolling every stage
        null = "CAST(NULL AS Nullable(Float64))"
        forward = f"'{semconv.STAGE_FORWARD}'"
        return f"""CREATE TEMPORARY TABLE {SAMPLES_TABLE} ENGINE = Log AS
SELECT {COHORT}, {forward} AS stage,
    arraySum(arrayFilter((d, n) -> n = {forward}, stage_ns, stage_names)) / 1e6 AS wall,
    {null} AS cpu, {null} AS gc, {null} AS lag, {null} AS throttled, {null} AS pressure,
    {null} AS runq
FROM {R} WHERE warm AND has(stage_names, {forward})"""
    known = ", ".join(f"if(s.n_{p} = q.cnt, s.{p}, NULL) AS {p}"
                      for p in ("cpu", "gc", "lag", "throttled", "pressure", "runq"))
    return f"""CREATE TEMPORARY TABLE {SAMPLES_TABLE} ENGINE = Log AS
SELECT q.width AS width, q.height AS height, q.fmt AS fmt, q.stage AS stage, q.wall AS wall, {known}
FROM ({inner}) AS q
LEFT JOIN {SIGNAL_SPANS_TABLE} AS s ON q.trace_key = s.trace_key AND q.span_key = s.pid AND q.stage = s.name
SETTINGS join_use_nulls = 1"""


def _part_items(p: str, method: str) -> str:
    k = f"{p} IS NOT NULL"
    slow, fast = "wall >= th_slow", "wall <= th_fast"
    return (f"count({p}) AS {p}_n, {_q(0.5, p, k, method)} AS {p}_median,"
            f" countIf({k} AND {slow}) AS {p}_slow_n, {_q(0.5, p, f'{k} AND {slow}', method)} AS {p}_slow,"
            f" countIf({k} AND {fast}) AS {p}_fast_n, {_q(0.5, p, f'{k} AND {fast}', method)} AS {p}_fast,"
            f" minIf(wall, {k}) AS {p}_wmin, maxIf(wall, {k}) AS {p}_wmax,"
            f" covarSampStableIf(assumeNotNull({p}), wall, {k}) AS {p}_cov,"
            f" varSampStableIf(wall, {k}) AS {p}_var, maxIf(assumeNotNull({p}), {k}) AS {p}_max")


def stage_signals_sql(method: str, by: str = "") -> str:
    """Per stage (per ``by`` group too, e.g. :data:`COHORT`, then within the largest
    ``{top_cohorts:UInt32}`` cohorts only) over :data:`SAMPLES_TABLE`: ``n``, ``slow_min`` /
    ``fast_max``, for each of :data:`PARTS` its count, medians (all, slow, fast), the walls'
    range, ``cov(part, wall)`` and ``var(wall)`` over the rows where it is known, and its max;
    CPU/wall medians (slow, tail, fast) and upper quartile (``busy``); the slowdown's ``cov`` and
    ``var`` of ``log(wall)`` over runs with CPU time above the rule's floor."""
    keys = f"{by}, " if by else ""
    where = f"WHERE ({by}) IN ({TOP_COHORTS})" if by else ""
    u = "util IS NOT NULL"
    sd = "sd"
    return f"""SELECT {keys}stage, count() AS n, any(th_slow) AS slow_min, any(th_fast) AS fast_max,
    {", ".join(_part_items(p, method) for p in PARTS)},
    countIf({u} AND wall >= th_slow) AS util_slow_n,
    {_q(0.5, "util", f"{u} AND wall >= th_slow", method)} AS util_slow,
    countIf({u} AND wall >= th_tail) AS util_tail_n,
    {_q(0.5, "util", f"{u} AND wall >= th_tail", method)} AS util_tail,
    countIf({u} AND wall <= th_fast) AS util_fast_n,
    {_q(0.5, "util", f"{u} AND wall <= th_fast", method)} AS util_fast,
    count(util) AS util_n, {_q(BUSY_PERCENTILE / 100, "util", u, method)} AS busy,
    countIf({sd}) AS sd_n, minIf(lw, {sd}) AS sd_min, maxIf(lw, {sd}) AS sd_max,
    covarSampStableIf(lx, lw, {sd}) AS sd_cov, varSampStableIf(lw, {sd}) AS sd_var
FROM (
    SELECT *, if(cpu IS NULL, NULL, greatest(0., wall - cpu)) AS wait,
        if(cpu IS NULL OR runq IS NULL, NULL, greatest(0., wall - cpu - runq)) AS blocked,
        if(cpu IS NULL OR wall <= 0, NULL, least(1., cpu / wall)) AS util,
        ifNull(cpu > {_MIN_CPU_MS!r} AND wall >= cpu, 0) AS sd,
        log(wall) AS lw, if({sd}, log(wall / assumeNotNull(cpu)), 0.) AS lx
    FROM {SAMPLES_TABLE} {where}
) AS x
INNER JOIN (
    SELECT {keys}stage, {_q(SLOW_PERCENTILE / 100, "wall", "1", method)} AS th_slow,
        {_q(TAIL_PERCENTILE / 100, "wall", "1", method)} AS th_tail,
        {_q(0.5, "wall", "1", method)} AS th_fast
    FROM {SAMPLES_TABLE} {where} GROUP BY {keys}stage
) AS th USING ({keys}stage)
GROUP BY {keys}stage ORDER BY {keys}stage"""


def held_sql(method: str, by: str = "") -> str:
    """Per span name (per ``by`` group too): warm-request spans that held an event loop, ``n``,
    and the ``median_ms`` / ``max_ms`` / ``sum_ms`` of how long."""
    keys = f"{by}, " if by else ""
    return f"""SELECT {keys}name, count() AS n, {_q(0.5, "h", "1", method)} AS median_ms,
    max(h) AS max_ms, sum(h) AS sum_ms
FROM (
    SELECT {"".join(f"q.{k.strip()} AS {k.strip()}, " for k in by.split(",")) if by else ""}s.name AS name,
        arrayJoin(s.held) AS h
    FROM (SELECT trace_key, span_key, {COHORT} FROM {R} WHERE warm) AS q
    INNER JOIN {SIGNAL_SPANS_TABLE} AS s ON q.trace_key = s.trace_key AND q.span_key = s.pid
    WHERE notEmpty(s.held)
)
GROUP BY {keys}name ORDER BY {keys}name"""


def memory_statements(owned: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """``(statement, params)`` filling the two memory tables: ``hw.gpu.memory.usage`` and
    ``hw.gpu.memory.limit`` points of the processes with requests, in the window (from the GPU
    points table, by process through the GPU owners table, and time, as the utilization; after
    :func:`otel_stages.analysis.clickhouse_queries.gpu_owner_statements`), and one row per
    (warm forward window of a cohort, GPU) with the points inside it (``vmax``, ``vmin``, ``n``;
    ``vdrop``: the memory released between them, the sum of the falls in time order within each
    sending process's points, :func:`otel_stages.analysis.gpu_memory.released_by_sender`;
    ``mult``: warm requests with that window; each window of the process whose GPU it ran on,
    ``owned``: :func:`~otel_stages.analysis.clickhouse_queries.warm_forwards_sql`); and
    :data:`MODEL_GPUS_TABLE`, each process's model GPU
    (:func:`~otel_stages.analysis.clickhouse_queries.model_gpus_sql`, from the utilization
    tables: one choice for the window)."""
    is_usage = gpu_metric_is(semconv.HW_GPU_MEMORY_USAGE)
    is_limit = gpu_metric_is(semconv.HW_GPU_MEMORY_LIMIT)
    samples = f"""CREATE TEMPORARY TABLE {MEMORY_SAMPLES_TABLE} ENGINE = Log AS
SELECT o.proc_key AS proc_key, {series_hw_sql("p.hw", "o.part")} AS hw, p.t AS t, p.v AS v,
    p.is_limit AS is_limit, p.proc_key AS src FROM (
    SELECT point_key AS proc_key, hw, t, v, {is_limit} AS is_limit
    FROM {GPU_POINTS_TABLE} WHERE {is_usage} OR {is_limit}
) AS p INNER JOIN {GPU_OWNERS_TABLE} AS o ON p.proc_key = o.point_key"""
    usage = (f"SELECT *, toUInt64(intDiv(t, {GPU_BUCKET_NS})) AS b FROM {MEMORY_SAMPLES_TABLE}"
             " WHERE NOT is_limit")
    # one join of every warm forward (not grouped by window first: most hold no point, and that
    # grouping by window and cohort cost more than the join); a window's requests (``mult``)
    # are its distinct (request, forward) pairs, each met by the same ``n`` points
    # vdrop: the falls within each sender's own points (two senders' readings of one GPU differ
    # by their offsets: gpu_memory.released_by_sender)
    pairs = f"""CREATE TEMPORARY TABLE {MEMORY_PAIRS_TABLE} ENGINE = Log AS
SELECT * EXCEPT (by_sender) FROM (
SELECT f.proc_key AS proc_key, f.width AS width, f.height AS height, f.fmt AS fmt,
    f.s AS s, f.e AS e, uniqExact(f.trace_key, f.span_key, f.i) AS mult, sm.hw AS hw,
    max(sm.v) AS vmax, min(sm.v) AS vmin, intDiv(count(), mult) AS n,
    arraySort(groupArray((sm.src, sm.t, sm.v))) AS by_sender,
    arraySum(arrayMap(i -> if(i > 1 AND by_sender[i].1 = by_sender[i - 1].1,
                              greatest(by_sender[i - 1].3 - by_sender[i].3, 0), 0),
                      arrayEnumerate(by_sender))) AS vdrop
FROM (
    SELECT trace_key, span_key, proc_key, width, height, fmt, s, e, i, arrayJoin({buckets("s", "e")}) AS b
    FROM ({warm_forwards_sql(owned)})
) AS f
INNER JOIN ({usage}) AS sm ON sm.proc_key = f.proc_key AND sm.b = f.b
WHERE sm.t >= f.s AND sm.t <= f.e
GROUP BY proc_key, width, height, fmt, s, e, hw)"""
    model = f"CREATE TEMPORARY TABLE {MODEL_GPUS_TABLE} ENGINE = Log AS {model_gpus_sql()}"
    return [(f"DROP TEMPORARY TABLE IF EXISTS {MEMORY_PAIRS_TABLE}", {}),
            (f"DROP TEMPORARY TABLE IF EXISTS {MEMORY_SAMPLES_TABLE}", {}),
            (f"DROP TEMPORARY TABLE IF EXISTS {MODEL_GPUS_TABLE}", {}),
            (samples, {}), (pairs, {}), (model, {})]


def _memory_series_sql() -> str:
    """Per GPU series (``proc_key``, ``hw``: a request process's points of one ``hw.id``, its own
    and those of processes without requests): memory points (``n_usage``), limit points and the
    largest limit (``n_limit``, ``limit_bytes``), and ``read``: whether the memory rule reads it
    (module docstring): it has memory points and a positive limit, and it is its process's model
    GPU (:data:`MODEL_GPUS_TABLE`) or that process has no such readable series."""
    return f"""SELECT proc_key, hw, n_usage, n_limit, limit_bytes,
    readable AND (model OR NOT max(readable AND model) OVER (PARTITION BY proc_key)) AS read
FROM (
    SELECT proc_key, hw, countIf(NOT is_limit) AS n_usage, countIf(is_limit) AS n_limit,
        maxIf(v, is_limit) AS limit_bytes, n_usage > 0 AND limit_bytes > 0 AS readable,
        (proc_key, hw) IN (SELECT proc_key, hw FROM {MODEL_GPUS_TABLE}) AS model
    FROM {MEMORY_SAMPLES_TABLE} GROUP BY proc_key, hw)"""


def memory_gpus_sql() -> str:
    """Every GPU memory series with its counts, limit and ``read`` flag
    (:func:`_memory_series_sql`), by process and ``hw.id``."""
    return f"{_memory_series_sql()} ORDER BY proc_key, hw"


def memory_windows_sql(method: str, by: str = "", owned: bool = False) -> str:
    """Warm forward windows (per ``by`` group too, then within the largest ``{top_cohorts:UInt32}``
    cohorts only): ``n``, ``median_ms`` (the memory rule's slow forwards are those beyond it plus
    the run's noise band, :class:`~otel_stages.analysis.gpu_memory.MemoryEvidence`) and ``procs``,
    the processes that ran them (their GPU series are the ones read; ``owned``: a forward
    recorded by a process without requests is that process's,
    :func:`~otel_stages.analysis.clickhouse_queries.warm_forwards_sql`)."""
    keys = f"{by}, " if by else ""
    where = f" AND ({by}) IN ({TOP_COHORTS})" if by else ""
    group = f"GROUP BY {by} ORDER BY {by}" if by else ""
    source = (f"(SELECT *, (e - s) / 1e6 AS d FROM ({warm_forwards_sql(True)}))" if owned else
              f"{R} ARRAY JOIN arrayMap((s, e) -> (e - s) / 1e6, fwd_start, fwd_end) AS d")
    return f"""SELECT {keys}count() AS n,
    {_q(0.5, "d", "1", method)} AS median_ms, groupUniqArray(proc_key) AS procs
FROM {source}
WHERE {"1" if owned else "warm"}{where} {group}"""


def memory_forwards_sql() -> str:
    """Covered warm forwards, one row per (cohort, process, window) over the GPU series read for
    the process (``read``, :func:`_memory_series_sql`: its model's GPU, else every one with
    memory points and a positive limit) that have points inside it (module docstring): cohort,
    ``proc_key``, ``ms``, the highest ``peak``, ``spread`` (max - min) and ``freed`` (memory
    released, :func:`otel_stages.analysis.gpu_memory.released_by_sender`) over those series, each
    a fraction of its own series' largest limit, ``n`` points (of all of them), ``mult``; at most
    ``{cap:UInt64}`` rows (a deterministic sample by hash of the forward above), and ``total``
    rows in all."""
    limits = f"SELECT proc_key, hw, limit_bytes FROM ({_memory_series_sql()}) WHERE read"
    return f"""SELECT {COHORT}, proc_key, (e - s) / 1e6 AS ms,
    max(p.vmax / g.limit_bytes) AS peak, max((p.vmax - p.vmin) / g.limit_bytes) AS spread,
    max(p.vdrop / g.limit_bytes) AS freed, sum(p.n) AS n, max(p.mult) AS mult,
    count() OVER () AS total
FROM {MEMORY_PAIRS_TABLE} AS p INNER JOIN ({limits}) AS g USING (proc_key, hw)
GROUP BY {COHORT}, proc_key, s, e
ORDER BY cityHash64(proc_key, s, e), {COHORT} LIMIT {{cap:UInt64}}"""
