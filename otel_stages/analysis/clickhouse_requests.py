"""Requests from the spans table, in ClickHouse: the statements that fill the per-request table.
Pure: builds SQL; :func:`otel_stages.analysis.clickhouse.fetch_aggregates` runs it.

The rules are those of :mod:`otel_stages.analysis.requests`:

- a *stage parent* is a span, not itself a standard stage, whose children include a standard
  stage (``download``/``decode``/``resize``/``queue``/``forward``), or a ``request`` span with
  children; its children that are not stage parents are its *stage spans* (custom names too);
- a stage parent whose own parent is a stage parent is a custom stage *group*
  (``request -> preprocess -> decode``): its stage spans count for the outermost one, the request
  (walked up at most :data:`~otel_stages.analysis.clickhouse_sql.MAX_GROUP_DEPTH` levels);
- stage spans whose parent never arrived (context lost, spans dropped) are *incomplete*: counted
  per missing parent, never a request; standard stage spans with no parent at all are one request
  per trace (the trace fallback), its total first start .. last end;
- spans starting before 2000-01-01 or lasting over a day are left out (and counted elsewhere);
  a span stored twice (a retried export) counts once.

How, at scale (10 million spans in seconds, memory bounded):

1. **Groups** (:data:`GROUPS_TABLE`): one vectorized aggregation keyed by (trace, parent span id)
   over the standard stage spans, with the parent's own row (keyed by its span id) folded in:
   flat ``-If`` aggregate states only (sums and counts per stage, earliest decode attributes,
   forward windows, stage intervals). No join and no per-trace arrays. It runs in **time
   slices** (:func:`slices`): a request belongs to the slice its span starts in, and a slice
   reads its own time range plus :data:`~otel_stages.analysis.clickhouse_sql.WINDOW_SLACK_NS`
   (the table's sort key ends in time, so each slice reads only its part), so the aggregation
   state stays small without spilling to disk.
2. **Custom stages and nested groups** (small tables): spans with other names than the standard
   ones and ``request`` are read separately (the sort key starts with the span name, so this
   read skips the rest), matched to stage parents, and their durations and groups' sums are
   added to the owning request.
3. **Requests** (:data:`~otel_stages.analysis.clickhouse_sql.REQUESTS_TABLE`): one row per
   request (and one per missing parent, for the incomplete counts) with its total, per-stage
   sums, the time covered by the union of its stage spans, its input (``image.width``,
   ``image.height``, ``image.size``, ``image.format`` from the earliest decode span, directly
   under the request or in a custom group (by the start of each parent's first decode span that
   has one; a direct one wins a tie), else from the earliest group span's own, else from the request span:
   the telemetry contract puts them on decode), and its
   forward windows. A stage counts only its time inside the request span (as in
   :mod:`otel_stages.analysis.requests`); the same pass keeps, per request, the stage spans wholly
   outside it (``detached_spans``), the most one reaches outside (``outside_ns``), ends after
   it (``after_ns``) and starts before it (``before_ns``), and the time
   counted twice by overlapping stages (``overlap_ns``), which
   :mod:`otel_stages.analysis.clickhouse_issues` counts into the report's problems.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.clickhouse_sql import (
    MAX_GROUP_DEPTH,
    PROCESS_TABLE,
    REQUESTS_TABLE,
    RESOURCE_PROCESS,
    WINDOW_SLACK_NS,
    AggregateQuery,
    finite_number,
    format_text,
    process_hash,
    process_label,
    query_params,
    requests,
    span_filter,
)
from otel_stages.analysis.naming import RECURRING_NAME_MIN_SHARE

GROUPS_TABLE = "otel_stages_groups"
CUSTOM_TABLE = "otel_stages_custom"
NESTED_TABLE = "otel_stages_nested"
EXTRAS_TABLE = "otel_stages_extras"
BEFORE_TABLE = "otel_stages_before_window"
#: Temporary tables this module creates (dropped after a report).
TABLES = (GROUPS_TABLE, CUSTOM_TABLE, NESTED_TABLE, EXTRAS_TABLE, BEFORE_TABLE, PROCESS_TABLE,
          REQUESTS_TABLE)
#: The per-request table's columns and types (see clickhouse_queries for how they are read).
REQUEST_SCHEMA: tuple[tuple[str, str], ...] = (
    ("trace_key", "UInt128"), ("is_request", "UInt8"), ("by_trace", "UInt8"), ("span_key", "UInt64"),
    ("start_ns", "Int64"), ("total_ns", "Int64"), ("stage_names", "Array(String)"),
    ("stage_ns", "Array(Int64)"), ("stage_counts", "Array(UInt64)"), ("covered_ns", "Int64"),
    ("width", "Nullable(Int64)"), ("height", "Nullable(Int64)"), ("bytes", "Nullable(Int64)"),
    ("fmt", "String"), ("seq", "Nullable(Int64)"), ("cold_attr", "Nullable(UInt8)"),
    ("error", "UInt8"), ("svc", "String"), ("inst", "String"), ("host", "String"), ("pid", "String"),
    ("proc", "String"),
    ("proc_key", "UInt64"), ("fwd_start", "Array(Int64)"), ("fwd_end", "Array(Int64)"),
    ("fwd_util", "Array(Nullable(Float64))"), ("fwd_count", "Array(Nullable(Int64))"),
    ("incomplete_groups", "UInt64"), ("incomplete_spans", "UInt64"), ("cold", "UInt8"),
    ("warm", "UInt8"), ("detached_spans", "UInt32"), ("outside_ns", "Int64"),
    ("after_ns", "Int64"), ("before_ns", "Int64"),
    ("overlap_ns", "Int64"), ("first_of_proc", "UInt8"), ("decode_bad_sizes", "UInt64"),
    ("images_sig", "UInt64"))
REQUEST_COLUMNS = tuple(name for name, _ in REQUEST_SCHEMA)
#: The temporary tables written once and read many times (the groups by every later pass, the
#: requests by some thirty statements) are stored uncompressed: at 10 M spans LZ4 cost about
#: 5 s of CPU writing and reading them (BENCHMARKS.md, ClickHouse), their disk use is about
#: 1 GB (the engine's temporary path) and the engine's memory does not grow.
UNCOMPRESSED = "CODEC(NONE)"

#: :func:`otel_stages.analysis.naming.looks_per_request` in RE2 (ClickHouse's ``match``), which
#: has no lookbehind: "not preceded by X" is written "at the start or after a character not in X",
#: which finds the same names. A custom span name that matches counts under its ``stage``
#: attribute, or is left out of the stage rows (its time then counts as unaccounted). Not done
#: here: the "more than MAX_STAGE_NAMES distinct names" switch of the Python path.
PER_REQUEST_RE2 = (r"(?i)[/?=#]|(^|[^0-9a-z])[0-9a-f]{8,}($|[^0-9a-z])"
                   r"|(^|[^\w.])\d{3,}($|[^\w.])")
PER_REQUEST_SQL = "'" + PER_REQUEST_RE2.replace("\\", "\\\\").replace("'", "\\'") + "'"

_STD = "[" + ", ".join(f"'{s}'" for s in semconv.STANDARD_STAGES) + "]"
_REQUEST = f"'{semconv.SPAN_REQUEST}'"
_N_TOTAL = "n_kids"
#: For joins whose right side is a small table: build the hash table from it, never from the
#: large left side (the planner's automatic swap can pick the wrong side for temporary tables).
SMALL_RIGHT = "query_plan_join_swap_table = 'false'"


def plan_sql(traces: str, query: AggregateQuery) -> str:
    """One row: spans in the window (``n``), the first and last span start, and the longest
    span that is not a standard stage (``longest``: a request or group span), which sets the
    slack between time slices (:func:`slack_ns`)."""
    return f"""SELECT count() AS n,
    min(toUnixTimestamp64Nano(Timestamp)) AS first, max(toUnixTimestamp64Nano(Timestamp)) AS last,
    maxIf(Duration, SpanName NOT IN {_STD}) AS longest
FROM {traces} WHERE {span_filter(query, odd=False)}"""


def slack_ns(plan: dict[str, Any]) -> int:
    """How far past a slice its requests' stage spans may lie: the longest parent span read
    (a request's children end within it), at least 1 s, at most
    :data:`~otel_stages.analysis.clickhouse_sql.WINDOW_SLACK_NS`."""
    return max(10**9, min(int(plan.get("longest") or 0) + 10**6, WINDOW_SLACK_NS))


def slices(plan: dict[str, Any], query: AggregateQuery) -> list[tuple[int, int]]:
    """``[(start_ns, end_ns), ...]``: consecutive equal time ranges covering the window (or,
    without one, all spans), about ``query.slice_spans`` spans each if spans arrive evenly
    (``plan`` from :func:`plan_sql`; at most 256 slices)."""
    lo = query.start_ns if query.start_ns is not None else int(plan.get("first") or 0)
    hi = query.end_ns if query.end_ns is not None else int(plan.get("last") or 0) + 1
    parts = max(1, min(256, -(-int(plan.get("n") or 0) // query.slice_spans)))
    bounds = sorted({lo + (hi - lo) * k // parts for k in range(parts)} | {hi})
    return list(itertools.pairwise(bounds))


#: Over a decode span's row (after ``w`` / ``h`` are read): its ``image.width`` or ``image.height``
#: is present but not an int above 0 (counted:
#: :class:`otel_stages.analysis.value_issues.UnreadValues`).
_BAD_SIZE = (f"((mapContains(SpanAttributes, '{semconv.IMAGE_WIDTH}') AND NOT w > 0)"
             f" OR (mapContains(SpanAttributes, '{semconv.IMAGE_HEIGHT}') AND NOT h > 0))")
#: Over a span's row: ``request.seq`` when it is an int above 0 (as
#: :func:`otel_stages.analysis.requests.positive_int` reads it); -1 when present but not that
#: (counted: :class:`otel_stages.analysis.value_issues.UnreadValues`); 0 when absent.
_SEQ = (f"multiIf(toInt64OrZero(SpanAttributes['{semconv.REQUEST_SEQ}']) > 0,"
        f" toInt64OrZero(SpanAttributes['{semconv.REQUEST_SEQ}']),"
        f" mapContains(SpanAttributes, '{semconv.REQUEST_SEQ}'), -1, 0)")
#: Over a span's row: ``request.cold_start`` 2 true, 1 false (as
#: :func:`otel_stages.analysis.requests.usable_bool` reads it), 3 present but neither, 0 absent.
_COLD = (f"toUInt8(multiIf(SpanAttributes['{semconv.REQUEST_COLD_START}'] = 'true', 2,"
         f" SpanAttributes['{semconv.REQUEST_COLD_START}'] = 'false', 1,"
         f" mapContains(SpanAttributes, '{semconv.REQUEST_COLD_START}'), 3, 0))")


#: Over a decode span's row (after ``w`` / ``h`` are read): its image, a hash of width and height
#: when both are ints above 0 (as :func:`otel_stages.analysis.cohorts.decoded_images` reads them:
#: pixels, not bytes), else 0 (an unknown image).
_DECODED_IMAGE = "if(w > 0 AND h > 0, cityHash64(w, h), toUInt64(0))"
#: Over a request's row in :func:`_requests_select`: the images its decode spans decoded, as a
#: multiset (:func:`otel_stages.analysis.cohorts.decoded_images`): 0 with at most one decode span,
#: else a hash of the sum of their :data:`_DECODED_IMAGE` hashes (order-free) and their count.
#: Flat sums per request (no arrays); a decode span stored twice counts twice here.
_IMAGES_SIG = (f"if(n{semconv.STANDARD_STAGES.index(semconv.STAGE_DECODE) + 1} > 1,"
               " cityHash64(p.dec_hsum + x.dec_hsum, p.dec_n + x.dec_n), toUInt64(0))")


def groups_insert(traces: str, query: AggregateQuery) -> str:
    """``INSERT`` of one time slice (params ``slice_lo`` / ``slice_hi``) into :data:`GROUPS_TABLE`.

    One small aggregation of the standard stage spans by (trace, parent span id): count, extent,
    errors, and their ids, stage codes (pipeline order, 1..5) and intervals; with the parent's own
    row (``self_*``: times, status, ``request.seq``, ``request.cold_start``, image attributes,
    process), the decode children's image attributes (each the first above 0 or non-empty by start,
    then span id, as the file report reads them), process, and the start and id of the first that
    has any (``first_ns``: which of a request's decode spans, direct or grouped, come first), and
    forward children's GPU attributes joined in (``ANY LEFT JOIN``, one match per key; the slice
    keeps each side small). Each part reads only its spans' granules (the sort key starts with the
    span name) and the attribute maps only where they are needed. Key 0 collects a trace's
    standard stage spans without a parent (the trace fallback). Children are read from the slice
    start to its end plus the slack, parents from the slack before the slice start to its end; a
    group is kept by the slice its parent (else its first child) starts in."""
    base = span_filter(query, odd=False)
    kids_time = ("Timestamp >= fromUnixTimestamp64Nano({slice_lo:Int64})"
                 " AND Timestamp < fromUnixTimestamp64Nano({slice_hi:Int64} + {slack:Int64})")
    self_time = ("Timestamp >= fromUnixTimestamp64Nano({slice_lo:Int64} - {slack:Int64})"
                 " AND Timestamp < fromUnixTimestamp64Nano({slice_hi:Int64})")
    trace = "reinterpretAsUInt128(unhex(TraceId)) AS trace_key"
    sid = "reinterpretAsUInt64(unhex(SpanId))"
    pid = "reinterpretAsUInt64(unhex(ParentSpanId))"
    start = "toInt64(toUnixTimestamp64Nano(Timestamp))"
    err = "CAST(StatusCode IN ('Error', 'STATUS_CODE_ERROR') AS UInt8)"
    codes = ", ".join(str(i) for i in range(1, 6))
    a = "SpanAttributes"
    ns = f"ResourceAttributes['{semconv.SERVICE_NAMESPACE}']"
    inst = f"ResourceAttributes['{semconv.SERVICE_INSTANCE_ID}']"
    host = f"ResourceAttributes['{semconv.HOST_NAME}']"
    # the process id tells apart a host's workers only without an instance id (process_key)
    ppid = f"if({inst} = '', ResourceAttributes['{semconv.PROCESS_PID}'], '')"
    image = (f"toInt64OrZero({a}['{semconv.IMAGE_WIDTH}']) AS w, "
             f"toInt64OrZero({a}['{semconv.IMAGE_HEIGHT}']) AS h, "
             f"toInt64OrZero({a}['{semconv.IMAGE_SIZE}']) AS s,"
             f" {format_text(f'{a}[{semconv.IMAGE_FORMAT!r}]')} AS fmt")
    anchor = "if(self.trace_key != 0, self.start, k.kid_min)"
    return f"""INSERT INTO {GROUPS_TABLE}
SELECT k.trace_key, k.key, self.trace_key != 0 AS present,
    self.start, self.dur, self.pid, self.err, self.isreq, self.seq, self.cold,
    self.w, self.h, self.s, self.fmt, self.svc, self.inst, self.host, self.ns, self.ppid, d.svc, d.inst,
    k.n_kids, {", ".join(f"k.d{i}, k.n{i}" for i in range(1, 6))}, k.kid_min, k.kid_max, k.kid_err,
    d.w, d.h, d.s, d.fmt, d.bad, d.first_ns, d.img_sum, d.img_n,
    k.k_id, k.k_code, k.k_s, k.k_e, g.g_id, g.g_u, g.g_c
FROM (
    SELECT {trace}, {pid} AS key, count() AS n_kids,
        {", ".join(f"sumIf(dur, code = {i}) AS d{i}, countIf(code = {i}) AS n{i}" for i in range(1, 6))},
        min(start) AS kid_min, max(start + dur) AS kid_max, max(err) AS kid_err,
        groupArray({sid}) AS k_id, groupArray(code) AS k_code,
        groupArray(start) AS k_s, groupArray(start + dur) AS k_e
    FROM (
        SELECT TraceId, SpanId, ParentSpanId, {start} AS start, toInt64(Duration) AS dur, {err} AS err,
            CAST(transform(SpanName, {_STD}, [{codes}], 0) AS UInt8) AS code
        FROM {traces} WHERE SpanName IN {_STD} AND {base} AND {kids_time}
    )
    GROUP BY trace_key, key
) AS k
ANY LEFT JOIN (
    SELECT {trace}, {sid} AS sid, {pid} AS pid, {start} AS start, toInt64(Duration) AS dur, {err} AS err,
        CAST(SpanName = {_REQUEST} AS UInt8) AS isreq, {_SEQ} AS seq, {_COLD} AS cold, {image},
        CAST(ServiceName AS String) AS svc, {inst} AS inst, {host} AS host, {ns} AS ns, {ppid} AS ppid
    FROM {traces} WHERE SpanName NOT IN {_STD} AND {base} AND {self_time}
) AS self ON k.trace_key = self.trace_key AND k.key = self.sid
ANY LEFT JOIN (
    SELECT {trace}, {pid} AS key, argMinIf(w, at, w > 0) AS w, argMinIf(h, at, h > 0) AS h,
        argMinIf(s, at, s > 0) AS s, argMinIf(fmt, at, fmt != '') AS fmt,
        any(svc) AS svc, '' AS inst, countIf(bad) AS bad,
        toInt64(bitShiftRight(minIf(at, sized), 64)) AS first_ns,  -- 0: none
        sum(img) AS img_sum, count() AS img_n  -- the images decoded, as a multiset (_IMAGES_SIG)
    FROM (
        SELECT TraceId, ParentSpanId, {image}, CAST(ServiceName AS String) AS svc, {_BAD_SIZE} AS bad,
            {_DECODED_IMAGE} AS img,
            w > 0 OR h > 0 OR s > 0 OR fmt != '' AS sized,
            -- (start, span id as hex text orders) packed in one number: a tuple key costs about
            -- 2 s of CPU more at 10 M spans (generic comparisons); starts are > 0 (span_filter)
            bitOr(bitShiftLeft(toUInt128({start}), 64),
                  toUInt128(reinterpretAsUInt64(reverse(unhex(SpanId))))) AS at
        FROM {traces} WHERE SpanName = '{semconv.STAGE_DECODE}' AND {base} AND {kids_time}
    )
    GROUP BY trace_key, key
) AS d ON k.trace_key = d.trace_key AND k.key = d.key
ANY LEFT JOIN (
    SELECT {trace}, {pid} AS key, groupArray({sid}) AS g_id,
        groupArray(ifNull({finite_number(f"{a}['{semconv.GPU_UTILIZATION_MEAN}']")}, nan)) AS g_u,
        groupArray(if(mapContains({a}, '{semconv.GPU_SAMPLE_COUNT}'),  -- absent: 1, no int: 0 (no reading)
                      ifNull(toInt64OrNull({a}['{semconv.GPU_SAMPLE_COUNT}']), 0), 1)) AS g_c
    FROM {traces}
    WHERE SpanName = '{semconv.STAGE_FORWARD}' AND mapContains({a}, '{semconv.GPU_UTILIZATION_MEAN}')
        AND {base} AND {kids_time}
    GROUP BY trace_key, key
) AS g ON k.trace_key = g.trace_key AND k.key = g.key
WHERE {anchor} >= {{slice_lo:Int64}} AND {anchor} < {{slice_hi:Int64}}
SETTINGS {SMALL_RIGHT}"""


def custom_only_insert(traces: str, query: AggregateQuery) -> str:
    """``INSERT`` into :data:`GROUPS_TABLE` of ``request`` spans whose children are all custom
    stages (no standard stage child, so the slices did not see them), after
    :data:`CUSTOM_TABLE` is filled."""
    a = "SpanAttributes"
    return f"""INSERT INTO {GROUPS_TABLE} (trace_key, key, present, self_start, self_dur, self_pid, self_err,
    self_isreq, self_seq, self_cold, self_w, self_h, self_s, self_fmt, self_svc, self_inst, self_host,
    self_ns, self_ppid)
SELECT trace_key, sid, 1, start, dur, pid, err, 1, seq, cold, w, h, s, fmt, svc, inst, host, ns, ppid
FROM (
    SELECT reinterpretAsUInt128(unhex(TraceId)) AS trace_key, reinterpretAsUInt64(unhex(SpanId)) AS sid,
        reinterpretAsUInt64(unhex(ParentSpanId)) AS pid, toInt64(toUnixTimestamp64Nano(Timestamp)) AS start,
        toInt64(Duration) AS dur, CAST(StatusCode IN ('Error', 'STATUS_CODE_ERROR') AS UInt8) AS err,
        {_SEQ} AS seq, {_COLD} AS cold,
        toInt64OrZero({a}['{semconv.IMAGE_WIDTH}']) AS w, toInt64OrZero({a}['{semconv.IMAGE_HEIGHT}']) AS h,
        toInt64OrZero({a}['{semconv.IMAGE_SIZE}']) AS s,
        {format_text(f"{a}[{semconv.IMAGE_FORMAT!r}]")} AS fmt,
        CAST(ServiceName AS String) AS svc, ResourceAttributes['{semconv.SERVICE_INSTANCE_ID}'] AS inst,
        ResourceAttributes['{semconv.HOST_NAME}'] AS host,
        ResourceAttributes['{semconv.SERVICE_NAMESPACE}'] AS ns,
        if(inst = '', ResourceAttributes['{semconv.PROCESS_PID}'], '') AS ppid
    FROM {traces} WHERE SpanName = {_REQUEST} AND {span_filter(query, odd=False)}
    LIMIT 1 BY trace_key, sid
)
WHERE (trace_key, sid) IN (SELECT trace_key, pid FROM {CUSTOM_TABLE})
    AND (trace_key, sid) NOT IN (SELECT trace_key, key FROM {GROUPS_TABLE})"""


_GROUPS_SCHEMA = (
    "trace_key UInt128, key UInt64, present UInt8, "
    "self_start Int64, self_dur Int64, self_pid UInt64, self_err UInt8, self_isreq UInt8, "
    "self_seq Int64, self_cold UInt8, self_w Int64, self_h Int64, self_s Int64, self_fmt String, "
    "self_svc String, self_inst String, self_host String, self_ns String, self_ppid String, "
    "kid_svc String, kid_inst String, n_kids UInt64, "
    + "".join(f"d{i} Int64, n{i} UInt64, " for i in range(1, 6))
    + "kid_min Int64, kid_max Int64, kid_err UInt8, "
    "dec_w Int64, dec_h Int64, dec_s Int64, dec_f String, dec_bad UInt64, dec_at_ns Int64, "
    "dec_hsum UInt64, dec_n UInt64, "
    "k_id Array(UInt64), k_code Array(UInt8), k_s Array(Int64), k_e Array(Int64), "
    "g_id Array(UInt64), g_u Array(Float64), g_c Array(Int64)")
_GROUPS_COLUMNS = ", ".join(f"{column} {UNCOMPRESSED}" for column in _GROUPS_SCHEMA.split(", "))


def stage_parents_among(keys: str) -> str:
    """(trace, key) of the stage parents among ``keys`` (a query of ``trace_key, key`` rows,
    expected small): spans with standard stage children (present or not), or ``request`` spans
    with custom stage children. Only ``keys`` is hashed, never the whole groups table."""
    return f"""SELECT g.trace_key AS trace_key, g.key AS key
FROM {GROUPS_TABLE} AS g INNER JOIN ({keys}) AS c ON g.trace_key = c.trace_key AND g.key = c.key
WHERE g.n_kids > 0 OR (g.self_isreq AND (g.trace_key, g.key) IN (SELECT trace_key, pid FROM {CUSTOM_TABLE}))
SETTINGS {SMALL_RIGHT}"""


def names_sql() -> str:
    """One row over the custom stage spans (children of stage parents that hold no stage spans):
    those with per-request names (:data:`PER_REQUEST_RE2`) counted under their ``stage``
    attribute (``grouped``, its values ``by_attribute``), those left out without one
    (``dropped``), and the first such name (``example``), for
    :func:`otel_stages.analysis.naming.problem_lines`."""
    return f"""SELECT countIf(per_request AND name != '') AS grouped,
    countIf(per_request AND name = '') AS dropped,
    arraySort(groupUniqArrayIf(name, per_request AND name != '')) AS by_attribute,
    minIf(span_name, per_request) AS example
FROM {CUSTOM_TABLE}
WHERE per_request AND (trace_key, pid) IN ({stage_parents_among(
        f"SELECT DISTINCT trace_key, pid AS key FROM {CUSTOM_TABLE} WHERE per_request")})
    AND (trace_key, sid) NOT IN ({stage_parents_among(
        f"SELECT DISTINCT trace_key, sid AS key FROM {CUSTOM_TABLE} WHERE per_request")})"""


def sized_custom_sql() -> str:
    """``SELECT n``: custom stage spans (children of stage parents that hold no stage spans) with
    ``image.width``, which the file report reads as a request's image size where its decode spans
    have none and the SQL does not (:mod:`otel_stages.analysis.clickhouse_gaps`)."""
    sized = f"SELECT DISTINCT trace_key, {{}} AS key FROM {CUSTOM_TABLE} WHERE has_width"
    return f"""SELECT count() AS n FROM {CUSTOM_TABLE}
WHERE has_width AND (trace_key, pid) IN ({stage_parents_among(sized.format("pid"))})
    AND (trace_key, sid) NOT IN ({stage_parents_among(sized.format("sid"))})"""


def custom_names_sql() -> str:
    """``SELECT distinct_names, plain_names``: distinct names of the custom stage spans (children
    of stage parents that hold no stage spans), and of those the names the file report would read
    as per-request past :data:`~otel_stages.analysis.naming.MAX_STAGE_NAMES` names but the SQL does
    not: names that do not look per-request (:data:`PER_REQUEST_RE2`) and do not recur
    (:func:`otel_stages.analysis.naming.recurring_names`: fewer spans than
    :data:`~otel_stages.analysis.naming.RECURRING_NAME_MIN_SHARE` of the most used name's,
    standard stage names included)."""
    parents = stage_parents_among(f"SELECT DISTINCT trace_key, pid AS key FROM {CUSTOM_TABLE}")
    groups = stage_parents_among(f"SELECT DISTINCT trace_key, sid AS key FROM {CUSTOM_TABLE}")
    standard_top = (f"(SELECT greatest({', '.join(f'sum(n{i})' for i in range(1, 6))})"
                    f" FROM {GROUPS_TABLE} WHERE key != 0)")
    return f"""SELECT count() AS distinct_names,
    countIf(NOT per_request AND top >= 2 AND n < {RECURRING_NAME_MIN_SHARE} * top) AS plain_names
FROM (
    SELECT span_name, any(per_request) AS per_request, count() AS n,
        greatest(max(count()) OVER (), toUInt64(ifNull({standard_top}, 0))) AS top
    FROM {CUSTOM_TABLE}
    WHERE (trace_key, pid) IN ({parents}) AND (trace_key, sid) NOT IN ({groups})
    GROUP BY span_name
)"""


def owner_walk(depth: int) -> str:
    """Nested groups: each group's owner is its parent, or that parent's owner when the parent is
    a group too (``depth`` steps)."""
    inner = f"SELECT trace_key, key, self_pid AS owner FROM {NESTED_TABLE}"
    for _ in range(depth - 1):
        inner = f"""SELECT g.trace_key AS trace_key, g.key AS key,
    if(u.key != 0, u.self_pid, g.owner) AS owner
FROM ({inner}) AS g LEFT JOIN {NESTED_TABLE} AS u ON g.trace_key = u.trace_key AND g.owner = u.key"""
    return inner


#: :data:`EXTRAS_TABLE`'s columns as its statement makes them (a test compares): it is created
#: with them, empty, where no custom stage span and no nested group was read.
EXTRAS_SCHEMA = (
    "trace_key UInt128, owner UInt64, err UInt8, dec_w Int64, dec_h Int64, dec_s Int64,"
    " dec_f String, dec_bad UInt64, first_ns Int64, dec_hsum UInt64, dec_n UInt64, grp_w Int64,"
    " grp_h Int64, grp_s Int64, grp_f String, k_id Array(UInt64), k_code Array(UInt8),"
    " k_s Array(Int64), k_e Array(Int64), g_id Array(UInt64), g_u Array(Float64),"
    " g_c Array(Int64), c_id Array(UInt64), c_name Array(String), c_s Array(Int64),"
    " c_e Array(Int64)")


def prepare_statements(traces: str, query: AggregateQuery, plan: dict[str, Any],
                       count: Callable[[str], int] | None = None
                       ) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(statement, params)``: (re)create the temporary tables and fill them, slice by slice
    (``plan`` from :func:`plan_sql`); the last ones fill the per-process table the cold rule
    reads, then the per-request table (created with :data:`REQUEST_SCHEMA`, then filled).
    ``count``: the rows of a table the statements so far filled (each statement is run before
    the next is asked for); with it, the statements over custom stage spans and nested groups
    are left out where there are none (their tables then empty: the common case)."""
    params = query_params(query)
    time_slices = slices(plan, query)
    for table in TABLES:
        yield f"DROP TEMPORARY TABLE IF EXISTS {table}", {}
    yield (f"CREATE TEMPORARY TABLE {GROUPS_TABLE} ({_GROUPS_COLUMNS})"
           " ENGINE = Log"), {}
    insert = groups_insert(traces, query)
    for lo, hi in time_slices:
        yield insert, {**params, "slice_lo": lo, "slice_hi": hi, "slack": slack_ns(plan)}
    # custom stage candidates: other names than the standard ones and 'request', with a parent
    yield (f"""CREATE TEMPORARY TABLE {CUSTOM_TABLE} ENGINE = Memory AS
SELECT reinterpretAsUInt128(unhex(TraceId)) AS trace_key, reinterpretAsUInt64(unhex(SpanId)) AS sid,
    reinterpretAsUInt64(unhex(ParentSpanId)) AS pid, CAST(SpanName AS String) AS span_name,
    match(span_name, {PER_REQUEST_SQL}) AS per_request,
    if(per_request, trimBoth(SpanAttributes['{semconv.STAGE_NAME}']), span_name) AS name,
    toInt64(toUnixTimestamp64Nano(Timestamp)) AS start, toInt64(Duration) AS dur,
    CAST(StatusCode IN ('Error', 'STATUS_CODE_ERROR') AS UInt8) AS err,
    mapContains(SpanAttributes, '{semconv.IMAGE_WIDTH}') AS has_width
FROM {traces}
WHERE SpanName NOT IN ({_STD[1:-1]}, {_REQUEST}) AND ParentSpanId != '' AND {span_filter(query, odd=False)}
LIMIT 1 BY trace_key, sid"""), params
    custom = count(CUSTOM_TABLE) if count is not None else 1
    if custom:
        yield custom_only_insert(traces, query), params
    # nested groups: stage parents (not named request) whose parent is a stage parent
    candidates = (f"SELECT trace_key, key, self_pid FROM {GROUPS_TABLE}"
                  f" WHERE present AND NOT self_isreq AND {_N_TOTAL} > 0")
    parents = stage_parents_among(f"SELECT DISTINCT trace_key, self_pid AS key FROM ({candidates})")
    yield (f"""CREATE TEMPORARY TABLE {NESTED_TABLE} ENGINE = Memory AS
SELECT trace_key, key, self_pid FROM ({candidates})
WHERE (trace_key, self_pid) IN ({parents})"""), {}
    if not custom and count is not None and not count(NESTED_TABLE):
        yield f"CREATE TEMPORARY TABLE {EXTRAS_TABLE} ({EXTRAS_SCHEMA}) ENGINE = Memory", {}
    else:
        yield _extras_statement(), {}
    yield from _process_statements(traces, query, params)


def _extras_statement() -> str:
    """``CREATE`` :data:`EXTRAS_TABLE`: per request (``owner``), what its custom stage spans and
    nested groups add (sizes, error, the spans of each)."""
    nested = owner_walk(MAX_GROUP_DEPTH)
    leaves = f"""SELECT c.trace_key AS trace_key, if(o.key != 0, o.owner, c.pid) AS owner, c.sid AS sid,
    c.name AS name, c.start AS start, c.dur AS dur, c.err AS err
FROM {CUSTOM_TABLE} AS c LEFT JOIN ({nested}) AS o ON c.trace_key = o.trace_key AND c.pid = o.key
WHERE c.name != '' AND (c.trace_key, c.pid) IN ({stage_parents_among(
        f"SELECT DISTINCT trace_key, pid AS key FROM {CUSTOM_TABLE}")})
    AND (c.trace_key, c.sid) NOT IN ({stage_parents_among(
        f"SELECT DISTINCT trace_key, sid AS key FROM {CUSTOM_TABLE}")})"""
    kids = "k_id, k_code, k_s, k_e, g_id, g_u, g_c"
    groups = f"""SELECT g.trace_key AS trace_key, o.owner AS owner, g.kid_err AS err,
    g.dec_w AS dec_w, g.dec_h AS dec_h, g.dec_s AS dec_s, g.dec_f AS dec_f, g.dec_bad AS dec_bad,
    g.dec_at_ns AS dec_at, g.kid_min AS kid_min,
    g.self_w AS grp_w, g.self_h AS grp_h, g.self_s AS grp_s, g.self_fmt AS grp_f,
    (g.self_start, byteSwap(g.key)) AS grp_at,  -- span id order: as hex text
    g.dec_hsum AS dec_hsum, g.dec_n AS dec_n,
    g.k_id AS k_id, g.k_code AS k_code, g.k_s AS k_s, g.k_e AS k_e,
    g.g_id AS g_id, g.g_u AS g_u, g.g_c AS g_c
FROM {GROUPS_TABLE} AS g INNER JOIN ({nested}) AS o ON g.trace_key = o.trace_key AND g.key = o.key
SETTINGS {SMALL_RIGHT}"""
    return f"""CREATE TEMPORARY TABLE {EXTRAS_TABLE} ENGINE = Memory AS
SELECT trace_key, owner, max(err) AS err,
    -- each size from the group whose first sized decode span starts first (the largest of each
    -- apart made sizes no image had)
    argMinIf(dec_w, dec_at, dec_w > 0) AS dec_w, argMinIf(dec_h, dec_at, dec_h > 0) AS dec_h,
    argMinIf(dec_s, dec_at, dec_s > 0) AS dec_s, argMinIf(dec_f, dec_at, dec_f != '') AS dec_f,
    sum(dec_bad) AS dec_bad, minIf(dec_at, dec_at != 0) AS first_ns,
    sum(dec_hsum) AS dec_hsum, sum(dec_n) AS dec_n,
    -- the group spans' own sizes, each from the first group span by start that has one (after
    -- the decode spans', before the request span's, as analysis.requests reads them)
    argMinIf(grp_w, grp_at, grp_w > 0) AS grp_w, argMinIf(grp_h, grp_at, grp_h > 0) AS grp_h,
    argMinIf(grp_s, grp_at, grp_s > 0) AS grp_s, argMinIf(grp_f, grp_at, grp_f != '') AS grp_f,
    {", ".join(f"groupArrayArray({k}) AS {k}" for k in kids.split(", "))},
    groupArrayArray(c_id) AS c_id, groupArrayArray(c_name) AS c_name,
    groupArrayArray(c_s) AS c_s, groupArrayArray(c_e) AS c_e
FROM (
    SELECT trace_key, owner, err, dec_w, dec_h, dec_s, dec_f, dec_bad, dec_at, kid_min,
        grp_w, grp_h, grp_s, grp_f, grp_at, dec_hsum, dec_n, {kids},
        emptyArrayUInt64() AS c_id, emptyArrayString() AS c_name,
        emptyArrayInt64() AS c_s, emptyArrayInt64() AS c_e
    FROM ({groups})
    UNION ALL
    SELECT trace_key, owner, err, 0, 0, 0, '', toUInt64(0), toInt64(0), start,
        0, 0, 0, '', (start, toUInt64(0)), toUInt64(0), toUInt64(0),
        emptyArrayUInt64(), CAST([] AS Array(UInt8)), emptyArrayInt64(), emptyArrayInt64(),
        emptyArrayUInt64(), emptyArrayFloat64(), emptyArrayInt64(),
        [sid], [name], [start], [start + dur]
    FROM ({leaves})
)
GROUP BY trace_key, owner"""


def _process_statements(traces: str, query: AggregateQuery, params: dict[str, Any]
                        ) -> Iterator[tuple[str, dict[str, Any]]]:
    """The last of :func:`prepare_statements`: the per-process table, then the per-request
    table."""
    # the cold rule per process: whether its requests carry request.cold_start / request.seq,
    # its earliest request, and (with a window start) whether it ran before the window
    in_window = f"WHERE {_IS_REQUEST} {request_window(query, 'start')}"
    before = "0"
    if query.start_ns is not None:
        yield _before_insert(traces, query), params
        before = f"proc IN (SELECT proc FROM {BEFORE_TABLE}) AND NOT has_cold_attr AND NOT has_seq"
    yield (f"""CREATE TEMPORARY TABLE {PROCESS_TABLE} ENGINE = Memory AS
SELECT *, toUInt8({before}) AS started_before FROM (
SELECT {_PROC} AS proc, any(if(present, self_svc, kid_svc)) AS svc, any(if(present, self_inst, '')) AS inst,
    any(if(present, self_host, '')) AS host,
    groupUniqArray({_PROC_HASH}) AS proc_keys,
    max(self_cold IN (1, 2)) AS has_cold_attr, max(self_seq > 0) AS has_seq,
    countIf(self_cold = 3) AS unread_cold, countIf(self_seq = -1) AS unread_seq,
    -- by start, then trace and span id as hex text order (requests.group_spans)
    argMin((start, trace_key, span_key), (start, reinterpretAsFixedString(trace_key),
                                          reinterpretAsFixedString(span_key))) AS first
FROM (SELECT *, if(present, self_start, kid_min) AS start, if(present, key, 0) AS span_key
      FROM {GROUPS_TABLE})
{in_window}
GROUP BY proc)"""), params
    columns = ", ".join(f"{name} {kind} {UNCOMPRESSED}" for name, kind in REQUEST_SCHEMA)
    yield f"CREATE TEMPORARY TABLE {REQUESTS_TABLE} ({columns}) ENGINE = Log", {}
    yield f"INSERT INTO {REQUESTS_TABLE}\n{_requests_select(query)}", params


#: With a window start (``--since``), a process that carries neither ``request.cold_start`` nor
#: ``request.seq`` and has stage spans this long before the window started before it: its first
#: request in the window is not its cold one (the fallback takes each process's earliest
#: request), and it has none. An hour: a process idle longer than that before the window is
#: taken as starting in it (its first request pays what a restart would).
BEFORE_WINDOW_S = 3600


def _before_insert(traces: str, query: AggregateQuery) -> str:
    """``CREATE`` :data:`BEFORE_TABLE`: the processes (labels) of the stage spans in the
    :data:`BEFORE_WINDOW_S` before the window start, of the services whose requests in the window
    carry neither ``request.cold_start`` nor ``request.seq`` (the sort key's service and span
    name skip the rest)."""
    fallback = (f"SELECT any(if(present, self_svc, kid_svc)) AS svc"
                f" FROM (SELECT *, if(present, self_start, kid_min) AS start FROM {GROUPS_TABLE}) {{where}}"
                f" GROUP BY {_PROC} HAVING max(self_cold IN (1, 2)) = 0 AND max(self_seq > 0) = 0")
    where = f"WHERE {_IS_REQUEST} {request_window(query, 'start')}"
    return f"""CREATE TEMPORARY TABLE {BEFORE_TABLE} ENGINE = Memory AS
SELECT DISTINCT {process_label(*RESOURCE_PROCESS)} AS proc FROM {traces}
WHERE SpanName IN {_STD}
    AND ServiceName IN ({fallback.format(where=where)})
    AND Timestamp >= fromUnixTimestamp64Nano({{lo:Int64}} - {BEFORE_WINDOW_S * 10**9})
    AND Timestamp < fromUnixTimestamp64Nano({{lo:Int64}})"""


def window_edge_sql(traces: str, query: AggregateQuery) -> str:
    """``SELECT n, longest_ns``: the stage parents (spans with a standard stage child) that started
    in the :data:`~otel_stages.analysis.clickhouse_sql.WINDOW_SLACK_NS` before the window's start
    (``query.start_ns``, param ``lo``) and ended inside it, not cold ones (``request.cold_start``
    true or ``request.seq`` 1): requests the window left out, being kept by their own start
    (:mod:`otel_stages.analysis.window_edge`). Only for a window with a
    start; the sort key's span name skips the stage spans, the time bounds the rest."""
    return f"""SELECT count() AS n, max(Duration) AS longest_ns
FROM {traces}
WHERE SpanName NOT IN {_STD} AND {span_filter(query, odd=False)}
    -- a cold request (marked, or seq 1) is no slow request the window cut off (a tester's)
    AND SpanAttributes['{semconv.REQUEST_COLD_START}'] != 'true'
    AND SpanAttributes['{semconv.REQUEST_SEQ}'] != '1'
    AND Timestamp < fromUnixTimestamp64Nano({{lo:Int64}})
    AND toUnixTimestamp64Nano(Timestamp) + Duration >= {{lo:Int64}}
    AND (TraceId, SpanId) IN (
        SELECT TraceId, ParentSpanId FROM {traces}
        WHERE SpanName IN {_STD} AND {span_filter(query, odd=False)})"""


def request_window(query: AggregateQuery, column: str) -> str:
    """``AND`` conditions keeping ``column`` (ns) in ``query``'s window, as the requests are kept
    (the ``lo`` / ``hi`` parameters of ``query_params``); ``""`` without one."""
    window = ""
    if query.start_ns is not None:
        window += f" AND {column} >= {{lo:Int64}}"
    if query.end_ns is not None:
        window += f" AND {column} < {{hi:Int64}}"
    return window


#: Over GROUPS_TABLE rows: the process key of a group (as analysis.requests.process_key; a group
#: whose parent span never arrived, by the ``service.name`` of its decode spans).
_PROC_PARTS = ("if(present, self_ns, '')", "if(present, self_svc, kid_svc)", "if(present, self_inst, '')",
               "if(present, self_host, '')", "if(present, self_ppid, '')")
_PROC = process_label(*_PROC_PARTS)
#: Over GROUPS_TABLE rows: the hash of the group's process (clickhouse_sql.process_hash).
_PROC_HASH = process_hash(*_PROC_PARTS)
#: Over GROUPS_TABLE rows: the group is a request (not a nested group). Standard stage spans at
#: the root of their trace (key 0) are no request: each is an incomplete unit, as in
#: analysis.requests.
_IS_REQUEST = (f"(key != 0 AND present AND (n_kids > 0 OR self_isreq)"
               f" AND (trace_key, key) NOT IN (SELECT trace_key, key FROM {NESTED_TABLE}))")


#: (trace, span id) of the standard stage spans in traces with a missing parent: a group whose
#: parent is one of them holds detail spans nested inside a stage (``download`` in
#: ``download``), which analysis.requests leaves out, neither request nor incomplete. Only traces
#: with a parent not found are expanded (usually none).
_INSIDE_A_STAGE = f"""SELECT trace_key, arrayJoin(k_id) FROM {GROUPS_TABLE}
    WHERE trace_key IN (SELECT trace_key FROM {GROUPS_TABLE} WHERE NOT present AND key != 0)"""


def _requests_select(query: AggregateQuery) -> str:
    """One row per request (with its cold and warm flags), and one per missing parent with stage
    children (incomplete). A child stored twice (same span id) counts once. The common case (no
    duplicates, no groups, no custom stages) reads the sums the aggregation already made."""
    # a stage counts only its time inside the request span (analysis.requests): the sums the
    # aggregation made serve when every stage span lies inside it
    inside = "greatest(toInt64(0), least(b, start_ns + total_ns) - greatest(a, start_ns))"
    stages = ",\n    ".join(
        f"if(simple, p.n{i}, arrayCount((c, m) -> m AND c = {i}, codes, keep)) AS n{i}, "
        f"if(simple AND contained, p.d{i}, arraySum((c, m, a, b) -> if(m AND c = {i}, {inside}, 0),"
        f" codes, keep, starts, ends)) AS d{i}"
        for i in range(1, 6))
    names = ", ".join(f"n{i}" for i in range(1, 6))
    durs = ", ".join(f"d{i}" for i in range(1, 6))
    fwd = "arrayFilter((v, c, m) -> m AND c = 5, {}, codes, keep)"
    return f"""SELECT {", ".join(REQUEST_COLUMNS)} FROM (SELECT
    p.trace_key AS trace_key,
    toUInt8({_IS_REQUEST}) AS is_request,
    toUInt8(key = 0) AS by_trace,
    if(present, key, 0) AS span_key,
    if(present, self_start, kid_min) AS start_ns,
    if(present, self_start + self_dur, kid_max) - start_ns AS total_ns,
    empty(x.k_id) AND empty(x.c_id) AS no_extras,
    if(no_extras, p.k_id, arrayConcat(p.k_id, x.k_id)) AS ids,
    if(no_extras, p.k_code, arrayConcat(p.k_code, x.k_code)) AS codes,
    if(no_extras, p.k_s, arrayConcat(p.k_s, x.k_s)) AS starts,
    if(no_extras, p.k_e, arrayConcat(p.k_e, x.k_e)) AS ends,
    length(arrayDistinct(ids)) = length(ids) AS unique,
    if(unique, arrayWithConstant(length(ids), 1), arrayMap(v -> v = 1, arrayEnumerateUniq(ids))) AS keep,
    unique AND no_extras AS simple,
    p.kid_min >= start_ns AND p.kid_max <= start_ns + total_ns AS contained,
    {stages},
    if(empty(x.c_name), (emptyArrayString(), emptyArrayUInt64()),
       arrayReduce('sumMap',
                   [arrayFilter((v, m) -> m, x.c_name, arrayMap(v -> v = 1, arrayEnumerateUniq(x.c_id)))],
                   [arrayFilter((v, m) -> m, arrayMap((a, b) -> toUInt64({inside}), x.c_s, x.c_e),
                                arrayMap(v -> v = 1, arrayEnumerateUniq(x.c_id)))])) AS custom,
    arrayConcat(arrayFilter((nm, c) -> c > 0, {_STD}, [{names}]), custom.1) AS stage_names,
    arrayConcat(arrayFilter((d, c) -> c > 0, [{durs}], [{names}]),
                arrayMap(v -> toInt64(v), custom.2)) AS stage_ns,
    -- spans per stage (the signals need all of a stage's spans to carry one)
    arrayMap(v -> v = 1, arrayEnumerateUniq(x.c_id)) AS c_keep,
    arrayConcat(arrayFilter(c -> c > 0, [{names}]),
                if(empty(x.c_name), emptyArrayUInt64(),
                   arrayReduce('sumMap', [arrayFilter((v, m) -> m, x.c_name, c_keep)],
                               [arrayFilter((v, m) -> m, arrayMap(v -> toUInt64(1), x.c_id), c_keep)]).2)
    ) AS stage_counts,
    arraySort(if(simple, arrayZip(starts, ends),
                 arrayConcat(arrayFilter((v, m) -> m, arrayZip(starts, ends), keep),
                             arrayZip(x.c_s, x.c_e)))) AS intervals,
    -- time inside the union of the stage spans, clipped to the request
    arrayFold((acc, v) -> (acc.1 + greatest(toInt64(0),
                                            least(v.2, start_ns + total_ns) - greatest(v.1, acc.2, start_ns)),
                           greatest(acc.2, v.2)),
              intervals, (toInt64(0), start_ns)).1 AS covered_ns,
    -- each stage span's time inside the request; the problems of analysis.span_issues: spans
    -- wholly outside the request (clock skew), the most a span reaches outside, overlap
    arrayMap(v -> greatest(toInt64(0), least(v.2, start_ns + total_ns) - greatest(v.1, start_ns)),
             intervals) AS inside,
    arrayMap((v, i) -> i = 0 AND v.2 > v.1 AND (v.1 >= start_ns + total_ns OR v.2 <= start_ns),
             intervals, inside) AS off,
    toUInt32(arrayCount(f -> f, off)) AS detached_spans,
    toInt64(arrayMax(arrayConcat([toInt64(0)], arrayMap((v, i, f) -> if(f, 0, v.2 - v.1 - i),
                                                         intervals, inside, off)))) AS outside_ns,
    -- the most a standard stage span ends after the request: a request span that closes before
    -- its work (or a stage on a clock ahead); custom stages after the answer are work after it
    toInt64(arrayMax(arrayConcat([toInt64(0)], arrayMap(e -> e - start_ns - total_ns, ends))))
        AS after_ns,
    -- the most a standard stage span starts before the request (a stage on a clock behind)
    if(empty(starts), toInt64(0), greatest(toInt64(0), start_ns - arrayMin(starts))) AS before_ns,
    arraySum(inside) - covered_ns AS overlap_ns,
    coalesce(if(direct_first, if(p.dec_w > 0, p.dec_w, NULL), if(x.dec_w > 0, x.dec_w, NULL)),
             if(direct_first, if(x.dec_w > 0, x.dec_w, NULL), if(p.dec_w > 0, p.dec_w, NULL)),
             if(x.grp_w > 0, x.grp_w, NULL),
             if(self_w > 0, self_w, NULL)) AS width,
    coalesce(if(direct_first, if(p.dec_h > 0, p.dec_h, NULL), if(x.dec_h > 0, x.dec_h, NULL)),
             if(direct_first, if(x.dec_h > 0, x.dec_h, NULL), if(p.dec_h > 0, p.dec_h, NULL)),
             if(x.grp_h > 0, x.grp_h, NULL),
             if(self_h > 0, self_h, NULL)) AS height,
    coalesce(if(direct_first, if(p.dec_s > 0, p.dec_s, NULL), if(x.dec_s > 0, x.dec_s, NULL)),
             if(direct_first, if(x.dec_s > 0, x.dec_s, NULL), if(p.dec_s > 0, p.dec_s, NULL)),
             if(x.grp_s > 0, x.grp_s, NULL),
             if(self_s > 0, self_s, NULL)) AS bytes,
    -- the decode spans' sizes: those directly under the request first when its first sized
    -- decode span starts before a group's (by start, then span id, as analysis.requests reads)
    p.dec_at_ns != 0 AND (x.first_ns = 0 OR p.dec_at_ns <= x.first_ns) AS direct_first,
    multiIf(direct_first AND p.dec_f != '', p.dec_f, x.dec_f != '', x.dec_f, p.dec_f != '', p.dec_f,
            x.grp_f != '', x.grp_f, self_fmt) AS fmt,
    if(present AND self_seq > 0, self_seq, NULL) AS seq,  -- sizes and seq: 0 or less is unknown
    if(present AND self_cold IN (1, 2), toUInt8(self_cold - 1), NULL) AS cold_attr,
    toUInt8(if(present, self_err, kid_err OR x.err)) AS error,  -- the request span's status
    if(present, self_svc, kid_svc) AS svc,
    if(present, self_inst, '') AS inst,
    if(present, self_host, '') AS host,
    if(present, self_ppid, '') AS pid,
    {_PROC} AS proc,
    {_PROC_HASH} AS proc_key,
    {fwd.format("starts")} AS fwd_start,
    {fwd.format("ends")} AS fwd_end,
    arrayConcat(p.g_id, x.g_id) AS gids,
    if(empty(gids), arrayMap(v -> CAST(NULL AS Nullable(Float64)), fwd_start),
       arrayMap(f -> if(indexOf(gids, f) = 0, NULL,  -- NaN: a value that is no number (counted)
                        arrayConcat(p.g_u, x.g_u)[indexOf(gids, f)]), {fwd.format("ids")})) AS fwd_util,
    if(empty(gids), arrayMap(v -> CAST(NULL AS Nullable(Int64)), fwd_start),
       arrayMap(f -> if(indexOf(gids, f) = 0, NULL,
                        arrayConcat(p.g_c, x.g_c)[indexOf(gids, f)]), {fwd.format("ids")})) AS fwd_count,
    toUInt64(key != 0 AND NOT present AND n_kids > 0) AS incomplete_groups,
    if(NOT present, toUInt64(arrayCount(m -> m, keep)), 0) AS incomplete_spans,
    toUInt8(is_request AND multiIf(
        pr.has_cold_attr, ifNull(cold_attr, 0) = 1,
        pr.has_seq, ifNull(seq, 0) = 1,
        first_of_proc AND NOT pr.started_before)) AS cold,
    toUInt8((start_ns, p.trace_key, span_key) = pr.first) AS first_of_proc,
    p.dec_bad + x.dec_bad AS decode_bad_sizes,
    {_IMAGES_SIG} AS images_sig,
    toUInt8(is_request AND NOT cold AND NOT error) AS warm
FROM {GROUPS_TABLE} AS p
LEFT JOIN {EXTRAS_TABLE} AS x ON p.trace_key = x.trace_key AND p.key = x.owner
LEFT JOIN {PROCESS_TABLE} AS pr ON {_PROC} = pr.proc
WHERE (is_request OR incomplete_groups > 0 OR (key = 0 AND n_kids > 0)) {request_window(query, "start_ns")}
    AND (present OR key = 0 OR (p.trace_key, key) NOT IN ({_INSIDE_A_STAGE}))
SETTINGS {SMALL_RIGHT}, max_block_size = 8192)"""


#: Services listed by :func:`services_sql` (the caveat names those with enough warm requests).
MAX_SERVICES_LISTED = 20


def services_sql() -> str:
    """``service_name, n, all_n``: warm and cold requests (not failed) per ``service.name`` of the
    request span, most first, and their sum over every service (as
    :func:`otel_stages.analysis.diagnosis` counts them for
    :func:`~otel_stages.analysis.caveats.services_caveat`)."""
    return f"""SELECT svc AS service_name, countIf(warm OR (cold AND NOT error)) AS n,
    sum(n) OVER () AS all_n
FROM {requests()}
WHERE is_request GROUP BY svc HAVING n > 0 ORDER BY n DESC, svc LIMIT {MAX_SERVICES_LISTED}"""
