"""Decode / resize facts for the concrete preprocessing advice, in ClickHouse: the SQL behind
:class:`~otel_stages.analysis.figures.PreprocessFacts` (see :mod:`otel_stages.analysis.preprocessing`
for what each fact means and its thresholds). Pure: builds SQL and reads its one answer row.

One statement over the warm requests of the per-request table and their ``decode`` / ``resize``
spans (children of the request span, matched by trace and parent span id; spans inside a custom
group such as ``preprocess`` are not read here): per request the first span's ``image.draft_scale``
and resize target, the decode spans and the distinct images they decoded, per process the distinct
``thread.name`` values and whether an event loop was running. Only one row of sums comes back. The
draft speed-up model (:func:`~otel_stages.analysis.preprocessing.estimated_speedup`) and Pillow's
scale rule (:func:`~otel_stages.analysis.preprocessing.draft_scale`) are written in SQL with the
same constants; the parity tests hold them to the Python results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.clickhouse_requests import NESTED_TABLE
from otel_stages.analysis.clickhouse_sql import AggregateQuery, requests, span_filter
from otel_stages.analysis.figures import DraftEstimate, PreprocessFacts, RepeatedInputs, ThreadUse
from otel_stages.analysis.preprocessing import (
    BYTE_COST_PIXELS,
    CACHE_MIN_SHARE,
    DRAFT_FORMATS,
    DRAFT_MIN_SCALE,
    DRAFT_MIN_SHARE,
    DRAFT_MIN_SPEEDUP,
    POOL_MIN_THREADS,
    draft_missing,
)

#: The join of warm requests with their decode / resize spans is as large as the requests: a grace
#: hash join splits it into buckets that spill to disk, so memory stays bounded at 10M spans.
JOIN_SETTINGS = "join_algorithm = 'grace_hash', grace_hash_join_initial_buckets = 16"
#: Thread names quoted in the evidence (as in analysis.preprocessing).
NAMES_SHOWN = 3

_R = requests(recorded_format=True)  # the draft-decoding rule reads the recorded format
_JPEG = "(" + ", ".join(f"'{f}'" for f in sorted(DRAFT_FORMATS)) + ")"


def _pos_int(key: str) -> str:
    value = f"toInt64OrNull(SpanAttributes['{key}'])"
    return f"if(ifNull({value}, 0) > 0, {value}, NULL)"


def _size(key: str) -> str:
    return f"toInt64OrZero(SpanAttributes['{key}'])"


#: Over a decode span's row: its image (a hash of width, height and bytes, each read as the
#: request's size is: an int above 0), 0 when one of them is not that.
_IMAGE = (f"if({_size(semconv.IMAGE_WIDTH)} > 0 AND {_size(semconv.IMAGE_HEIGHT)} > 0"
          f" AND {_size(semconv.IMAGE_SIZE)} > 0, cityHash64({_size(semconv.IMAGE_WIDTH)},"
          f" {_size(semconv.IMAGE_HEIGHT)}, {_size(semconv.IMAGE_SIZE)}), 0)")

#: The stages whose evidence carries the facts (the report reads them only when the verdict
#: names one of these).
STAGES = (semconv.STAGE_DECODE, semconv.STAGE_RESIZE)
#: Temporary table: one row per warm request with decode / resize spans (dropped after a report).
TABLE = "otel_stages_preprocess"


def prepare_statements(traces: str, query: AggregateQuery) -> list[str]:
    """Statements that fill :data:`TABLE` (params: :func:`~otel_stages.analysis.clickhouse_sql.query_params`):
    per warm request its input, decode ms, its decode spans and their distinct images (width,
    height and bytes on the span), the first span's draft scale and resize target, and its decode
    / resize spans' thread names and event-loop flags. Read once; the sums of
    :func:`preprocess_sql` then read this small table. Spans count by span id: one
    stored twice (a file imported twice, a retried export) counts once."""
    a = "SpanAttributes"
    decode = semconv.STAGE_DECODE
    spans = f"""SELECT reinterpretAsUInt128(unhex(TraceId)) AS trace_key,
        reinterpretAsUInt64(unhex(ParentSpanId)) AS span_key, reinterpretAsUInt64(unhex(SpanId)) AS sid,
        CAST(SpanName AS String) AS name,
        toInt64(toUnixTimestamp64Nano(Timestamp)) AS start,
        {_pos_int(semconv.IMAGE_DRAFT_SCALE)} AS draft,
        {_pos_int(semconv.IMAGE_TARGET_WIDTH)} AS tw, {_pos_int(semconv.IMAGE_TARGET_HEIGHT)} AS th,
        {a}['{semconv.THREAD_NAME}'] AS thread, {a}['{semconv.EVENT_LOOP_RUNNING}'] AS loop,
        {_IMAGE} AS image
    FROM {traces}
    WHERE SpanName IN ('{decode}', '{semconv.STAGE_RESIZE}') AND {span_filter(query, odd=False)}"""
    warm = f"""SELECT trace_key, span_key, proc, start_ns, width, height, bytes, fmt,
        arraySum(arrayFilter((d, n) -> n = '{decode}', stage_ns, stage_names)) / 1e6 AS ms,
        has(stage_names, '{decode}') AS decoded
    FROM {_R} WHERE warm AND span_key != 0"""
    per_request = f"""SELECT w.trace_key AS trace_key, any(w.proc) AS proc, any(w.start_ns) AS start,
        any(w.width) AS width, any(w.height) AS height, any(w.bytes) AS bytes, any(w.fmt) AS fmt,
        any(w.ms) AS ms, any(w.decoded) AS decoded, uniqExactIf(s.sid, s.name = '{decode}') AS n_decode,
        uniqExactIf(s.sid, s.name = '{decode}' AND s.image != 0) AS n_sized,
        uniqExactIf(s.image, s.name = '{decode}' AND s.image != 0) AS n_images,
        argMinIf(s.draft, s.start, s.name = '{decode}' AND s.draft IS NOT NULL) AS draft,
        argMinIf(s.tw, s.start, s.name != '{decode}' AND s.tw IS NOT NULL) AS tw,
        argMinIf(s.th, s.start, s.name != '{decode}' AND s.th IS NOT NULL) AS th,
        uniqExact(s.sid) AS k, groupUniqArrayIf(s.thread, s.thread != '') AS threads,
        uniqExactIf(s.sid, s.loop = 'true') AS on_loop,
        uniqExactIf(s.sid, s.loop IN ('true', 'false')) AS loop_known,
        groupUniqArrayIf(s.thread, s.loop = 'true' AND s.thread != '') AS loop_threads
    FROM ({warm}) AS w INNER JOIN ({spans}) AS s ON s.trace_key = w.trace_key AND s.span_key = w.span_key
    GROUP BY w.trace_key, w.span_key
    SETTINGS join_use_nulls = 1, {JOIN_SETTINGS}"""
    return [f"DROP TEMPORARY TABLE IF EXISTS {TABLE}",
            f"CREATE TEMPORARY TABLE {TABLE} ENGINE = Memory AS {per_request}"]


def grouped_sql(traces: str, query: AggregateQuery) -> str:
    """One row: ``n``, the decode / resize spans inside custom group spans (their parent one of
    the nested groups of :mod:`otel_stages.analysis.clickhouse_requests`), which
    :func:`prepare_statements` does not read (params: ``query_params``)."""
    return f"""SELECT count() AS n FROM {traces}
WHERE SpanName IN ('{semconv.STAGE_DECODE}', '{semconv.STAGE_RESIZE}') AND {span_filter(query, odd=False)}
    AND (reinterpretAsUInt128(unhex(TraceId)), reinterpretAsUInt64(unhex(ParentSpanId)))
        IN (SELECT trace_key, key FROM {NESTED_TABLE})"""


def preprocess_sql() -> str:
    """One row of sums over :data:`TABLE` (see :func:`facts` for the columns read)."""
    sized = "width IS NOT NULL AND height IS NOT NULL AND bytes IS NOT NULL"
    jpeg = f"decoded AND fmt IN {_JPEG}"  # fmt is Pillow's name (clickhouse_sql.format_text)
    ratio = "least(intDiv(width, tw), intDiv(height, th))"
    scale = f"multiIf({ratio} >= 8, 8, {ratio} >= 4, 4, {ratio} >= 2, 2, 1)"
    cost = f"{BYTE_COST_PIXELS} * greatest(bytes, 0)"
    px = "toFloat64(width * height)"
    candidate = (f"{jpeg} AND draft IS NULL AND tw IS NOT NULL AND th IS NOT NULL AND {sized}"
                 f" AND {scale} >= {DRAFT_MIN_SCALE}")
    threads = f"""SELECT sum(k) AS spans, max(n) AS threads,
        argMax(proc_names, n) AS names, sum(on_loop) AS on_loop, sum(loop_known) AS loop_known,
        arraySort(arrayDistinct(arrayFlatten(groupArray(proc_loop_names)))) AS loop_names
    FROM (
        SELECT proc, sum(k) AS k, arraySort(groupUniqArrayArray(threads)) AS proc_names,
            length(proc_names) AS n, sum(on_loop) AS on_loop, sum(loop_known) AS loop_known,
            groupUniqArrayArray(loop_threads) AS proc_loop_names
        FROM {TABLE} GROUP BY proc
    )"""
    # several images, or sizes missing on a decode span: no draft estimate, no repeat (as in
    # analysis.preprocessing)
    one_image = "(n_decode <= 1 OR (n_images = 1 AND n_sized = n_decode))"
    return f"""WITH requests AS (SELECT *, {one_image} AS one_image FROM {TABLE}),
draft_rows AS (
    SELECT {scale} AS scale, width, height, tw, th, ms,
        ms / (({cost} + {px}) / ({cost} + {px} / pow({scale}, 2))) AS draft_ms
    FROM requests WHERE {candidate} AND one_image
),
draft_sizes AS (
    SELECT scale, width, height, tw, th, sum(ms) AS weight FROM draft_rows
    GROUP BY scale, width, height, tw, th
),
repeats AS (
    SELECT proc, width, height, bytes, count() AS n, sum(ms) AS total, argMin(ms, start) AS first
    FROM requests WHERE decoded AND one_image AND {sized} GROUP BY proc, width, height, bytes
)
SELECT
    (SELECT countIf(decoded) FROM requests) AS decodes,
    (SELECT sumIf(ms, decoded) FROM requests) AS decode_ms,
    (SELECT countIf({jpeg}) FROM requests) AS jpeg,
    (SELECT countIf({jpeg} AND draft IS NOT NULL) FROM requests) AS drafted,
    (SELECT topKIf(1)(draft, {jpeg} AND draft IS NOT NULL) FROM requests) AS drafted_scale,
    (SELECT countIf(decoded AND fmt = '') FROM requests) AS unknown_format,
    (SELECT countIf({jpeg} AND one_image AND draft IS NULL AND (tw IS NULL OR th IS NULL))
        FROM requests) AS untargeted,
    (SELECT countIf(decoded AND n_sized > n_images) FROM requests) AS decoded_twice,
    (SELECT countIf(decoded AND n_images > 1) FROM requests) AS several_images,
    (SELECT countIf(decoded AND n_decode > 1 AND n_sized = n_images AND n_images < 2) FROM requests)
        AS decodes_untold,
    (SELECT count() FROM draft_rows) AS draft_requests,
    (SELECT sum(ms) FROM draft_rows) AS draft_full_ms,
    (SELECT sum(draft_ms) FROM draft_rows) AS draft_drafted_ms,
    (SELECT argMax((scale, width, height, tw, th), weight) FROM draft_sizes) AS draft_top,
    (SELECT sumIf(n - 1, n > 1) FROM repeats) AS repeat_requests,
    (SELECT sumIf(total - first, n > 1) FROM repeats) AS repeat_ms,
    (SELECT countIf(n > 1) FROM repeats) AS repeat_images,
    (SELECT uniqExact((width, height, bytes)) FROM repeats) AS identities,
    ({threads}) AS threads"""


def facts(row: Mapping[str, Any]) -> PreprocessFacts:
    """The answer row of :func:`preprocess_sql` -> :class:`PreprocessFacts`, with the thresholds
    of :mod:`otel_stages.analysis.preprocessing`."""
    total = float(row.get("decode_ms") or 0.0)
    draft = None
    if int(row.get("draft_requests") or 0):
        full, drafted = float(row["draft_full_ms"]), float(row["draft_drafted_ms"])
        speedup = full / drafted if drafted > 0 else 1.0
        share = full / total if total > 0 else 0.0
        top = row["draft_top"]
        scale, w, h, tw, th = top.values() if isinstance(top, dict) else top
        draft = DraftEstimate(
            requests=int(row["draft_requests"]), scale=int(scale), source=f"{w}x{h}",
            target=f"{tw}x{th}", decode_ms=full, speedup=speedup, share=share,
            worth=speedup >= DRAFT_MIN_SPEEDUP and share >= DRAFT_MIN_SHARE)
    repeats = None
    if int(row.get("repeat_requests") or 0):
        ms = float(row["repeat_ms"])
        share = ms / total if total > 0 else 0.0
        repeats = RepeatedInputs(requests=int(row["repeat_requests"]),
                                 images=int(row["repeat_images"]), decode_ms=ms, share=share,
                                 worth=int(row["identities"]) > 1 and share >= CACHE_MIN_SHARE)
    t = row["threads"]  # a named tuple: an object in JSONEachRow
    spans, n, names, on_loop, loop_known, loop_names = (
        t[k] for k in ("spans", "threads", "names", "on_loop", "loop_known", "loop_names"))
    threads = None
    if int(spans or 0):
        count = int(n) if int(n or 0) > 0 else None
        threads = ThreadUse(spans=int(spans), threads=count, names=tuple(names[:NAMES_SHOWN]),
                            on_loop=int(on_loop), loop_known=int(loop_known),
                            several=count is not None and count >= POOL_MIN_THREADS,
                            loop_names=tuple(loop_names[:NAMES_SHOWN]))
    scales = row.get("drafted_scale") or []
    drafted = int(row.get("drafted") or 0)
    return PreprocessFacts(
        decodes=int(row.get("decodes") or 0), jpeg=int(row.get("jpeg") or 0), drafted=drafted,
        drafted_scale=int(scales[0]) if scales else None,
        draft_missing=draft_missing(draft is not None or drafted > 0,
                                    int(row.get("unknown_format") or 0) > 0,
                                    int(row.get("untargeted") or 0) > 0),
        draft=draft, repeats=repeats, threads=threads,
        decoded_twice=int(row.get("decoded_twice") or 0),
        several_images=int(row.get("several_images") or 0),
        decodes_untold=int(row.get("decodes_untold") or 0),
    )
