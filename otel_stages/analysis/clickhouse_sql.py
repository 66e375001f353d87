"""The diagnosis as ClickHouse SQL over the Collector exporter's tables: the query object,
constants, and helpers shared by the statement modules. Pure: builds SQL text.

Statements: :mod:`otel_stages.analysis.clickhouse_requests` fills a temporary per-request table
(:data:`REQUESTS_TABLE`) from the spans; :mod:`otel_stages.analysis.clickhouse_queries` aggregates
it (and lines GPU samples up with forward spans); only their small results leave the engine.
:func:`requests` is the per-request table with the cold and warm flags: cold where any request
of a process (:func:`process_label`: its service and ``service.instance.id``, else its service
and ``host.name``) carries ``request.cold_start`` and
it is true; else where the process's requests carry ``request.seq`` and it is 1; else the
earliest request of the process (the rules of :func:`otel_stages.analysis.requests.find_requests`).

Quantiles: ``quantilesExactInclusive`` by default, ClickHouse's R-7 method (linear interpolation
between closest ranks, ``x[floor((n-1)p)] + frac * (x[..+1] - x[..])``), the definition
:func:`otel_stages.analysis.stats.percentile` uses, so results equal the Python path up to float
rounding (:data:`EXACT_RELATIVE_TOLERANCE`). It keeps every value of a group in memory (8 bytes
each), affordable up to :data:`EXACT_QUANTILE_MAX_ROWS` warm requests; above that
``quantilesDD`` (DDSketch) is used, whose documented guarantee is a relative error of at most
:data:`DD_RELATIVE_ACCURACY` on each quantile. ``quantileTDigest`` is not used: its error is not
bounded in the documentation and its result depends on the order rows arrive in.

GPU: ``hw.gpu.utilization`` samples are lined up with the warm forward spans of the same process
(:func:`process_hash`: its service and ``service.instance.id``, else its service and host) by an
equi-join on (process, 1-second bucket) with each forward window spread over the buckets it
touches, then ``start <= t <= end``: every sample inside every forward, as
:mod:`otel_stages.analysis.gpu` counts them, without a cross join. Per process the GPU whose
utilization rises most inside forwards (vs. outside them) is taken as the model's GPU (ties: more
samples), as the Python path does for one process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.gpu import MAX_SAMPLE_COUNT, MAX_UTILIZATION_READING
from otel_stages.analysis.image_formats import format_aliases
from otel_stages.analysis.requests import FORMAT_BLANKS, FORMAT_TEXT, NO_FORMAT, NOT_FORMATS

#: The temporary per-request table (one per connection), and the per-process one.
REQUESTS_TABLE = "otel_stages_requests"
PROCESS_TABLE = "otel_stages_processes"
#: Whose forwards a process's GPU points describe (``point_key`` -> ``proc_key``): see
#: :func:`otel_stages.analysis.clickhouse_queries.gpu_owners_statements`.
GPU_OWNERS_TABLE = "otel_stages_gpu_owners"
#: The warm requests set apart as cold (:mod:`otel_stages.analysis.clickhouse_apart`).
APART_TABLE = "otel_stages_apart"
#: One row: ``formats``, the distinct ``image.format`` values of the requests (filled with the
#: per-request table's first reader, :func:`formats_statements`; what :func:`cohort_requests`
#: reads instead of counting them again in every statement).
FORMATS_TABLE = "otel_stages_formats"
#: One row: ``n_warm`` and ``mean_total`` (ms) of the warm requests, once the requests set apart
#: are known (:func:`warm_statements`).
WARM_TABLE = "otel_stages_warm"
#: With ``--service``: the traces holding a span of that service, and the services of their
#: spans (whose metrics are read), as :func:`service_statements` fills them.
SERVICE_TRACES_TABLE = "otel_stages_service_traces"
SERVICE_NAMES_TABLE = "otel_stages_service_names"
#: With ``--service``: every ``service.name`` with a span in the window (a metrics-only process,
#: a GPU exporter, has none: its points are kept).
SPAN_SERVICES_TABLE = "otel_stages_span_services"
#: With ``--service``: ``(trace_key, sid)`` of the spans of other services' requests in the
#: traces picked (their request span, stage spans and groups), left out of every read once
#: :attr:`AggregateQuery.leave_out` is set
#: (:func:`otel_stages.analysis.clickhouse_services.foreign_statements`).
SERVICE_FOREIGN_TABLE = "otel_stages_service_foreign"
#: With ``--service`` and other services' requests left out: the ``host.name`` of those requests'
#: processes that no span kept of the service names; the points of metrics-only processes there
#: are theirs (:func:`otel_stages.analysis.clickhouse_services.left_out_hosts_statements`).
LEFT_OUT_HOSTS_TABLE = "otel_stages_left_out_hosts"
#: Custom stage groups nest at most this deep under a request (deeper ones stop the walk there).
MAX_GROUP_DEPTH = 4
#: Spans starting before this (2000-01-01T00:00:00Z) are broken clocks, left out and counted.
MIN_SPAN_START_NS = 946_684_800 * 10**9
#: Spans longer than this (one day) are left out and counted (also catches end < start).
MAX_SPAN_DURATION_NS = 86_400 * 10**9
#: Spans this long before the window are read too (a request starting inside the window keeps
#: parents that began just before it; requests are kept by their own start), and the most a time
#: slice reads past its end (requests longer than this lose their late stage spans).
WINDOW_SLACK_NS = 600 * 10**9
#: Above this many warm requests the exact quantile function gives way to quantilesDD.
EXACT_QUANTILE_MAX_ROWS = 50_000_000
#: quantilesDD's relative accuracy (its documented bound on each quantile's relative error).
DD_RELATIVE_ACCURACY = 0.01
#: Relative difference allowed between exact quantiles here and in Python (float rounding only).
EXACT_RELATIVE_TOLERANCE = 1e-9
#: Width of the time buckets the forward/sample join matches on (ns).
GPU_BUCKET_NS = 10**9
#: Percentile levels computed for every distribution (p5, p25, median, p75, p95).
LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)
#: The engine spills GROUP BY / ORDER BY state to disk past these sizes (bytes).
SPILL_BYTES = 256 * 2**20
#: Settings every statement runs with unless the caller overrides them.
DEFAULT_SETTINGS: Mapping[str, Any] = {
    "max_bytes_before_external_group_by": SPILL_BYTES,
    "max_bytes_before_external_sort": SPILL_BYTES,
    # temporary tables are written in small blocks: the default squashes up to a million rows
    # (hundreds of MB with arrays) per insert thread before writing a part
    "min_insert_block_size_rows": 65_536,
    "min_insert_block_size_bytes": 16 * 2**20,
    # no JIT: each statement runs once or a few times (the slices), and compiling its
    # expressions with LLVM cost more than it saved (BENCHMARKS.md, ClickHouse)
    "compile_expressions": 0,
    "compile_aggregate_expressions": 0,
    "compile_sort_description": 0,
}



@dataclass(frozen=True)
class AggregateQuery:
    """What to aggregate. Times are Unix ns; ``start_ns``/``end_ns`` ``None`` = unbounded.

    ``service``: only the requests whose request span is of this ``service.name``, with all
    their stage spans (``None``: all). ``leave_out``: the spans in :data:`SERVICE_FOREIGN_TABLE`
    (other services' requests in the traces picked) are left out of every read; set by
    :func:`otel_stages.analysis.clickhouse.run_queries` once it has filled that table. ``top_cohorts``,
    ``top_runs``, ``top_slowest``: rows returned for those lists (totals are always complete).
    ``quantiles``: ``"exact"``, ``"dd"`` or ``"auto"`` (exact up to
    :data:`EXACT_QUANTILE_MAX_ROWS` warm requests). ``settings``: ClickHouse settings for every
    statement (memory limits, spill thresholds), merged over :data:`DEFAULT_SETTINGS`.
    ``slice_spans``: spans per time slice of the request grouping (bounds its memory, about
    1 KB per request; see :mod:`otel_stages.analysis.clickhouse_requests`).
    """

    start_ns: int | None = None
    end_ns: int | None = None
    service: str | None = None
    top_cohorts: int = 20
    top_runs: int = 50
    top_slowest: int = 5
    quantiles: str = "auto"
    settings: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_SETTINGS))
    slice_spans: int = 1_000_000
    leave_out: bool = False

    def __post_init__(self) -> None:
        if self.quantiles not in ("auto", "exact", "dd"):
            raise ValueError(f"quantiles must be auto, exact or dd, got {self.quantiles!r}")
        if self.slice_spans < 1:
            raise ValueError(f"slice_spans must be >= 1, got {self.slice_spans}")
        if self.start_ns is not None and self.end_ns is not None and self.end_ns <= self.start_ns:
            raise ValueError("the window ends before it starts")


def setting_literal(value: Any) -> str:
    """A Python value as a ClickHouse ``SET`` literal (bool -> 0/1, str quoted)."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def query_params(query: AggregateQuery) -> dict[str, Any]:
    return {
        "lo": query.start_ns if query.start_ns is not None else 0,
        "hi": query.end_ns if query.end_ns is not None else 2**63 - 1,
        "scan_lo": max(0, (query.start_ns or 0) - WINDOW_SLACK_NS),
        "service": query.service or "",
    }


def process_hash(namespace: str, service: str, instance: str, host: str, pid: str) -> str:
    """SQL: a UInt64 naming a process as :func:`otel_stages.analysis.requests.process_key` does,
    by its ``service.namespace`` (``namespace``), ``service.name`` (``service``) and
    ``service.instance.id`` (``instance``), else its namespace, ``service.name``, ``host.name``
    (``host``) and ``process.pid`` (``pid``): the key that lines metric points up with requests
    (two services sharing an instance id, the containers of one pod, stay apart; so do two
    hosts' processes of one service without instance ids, and one host's worker processes)."""
    return (f"cityHash64(if({instance} != '', 'i', 's'), {namespace}, {service},"
            f" if({instance} != '', {instance}, {host}), if({instance} != '', '', {pid}))")


def process_label(namespace: str, service: str, instance: str, host: str, pid: str) -> str:
    """SQL: the text :func:`otel_stages.analysis.requests.process_key` writes, from the
    ``service.namespace`` (``namespace``), ``service.name`` (``service``),
    ``service.instance.id`` (``instance``), ``host.name`` (``host``) and ``process.pid``
    (``pid``) expressions (``''`` for not set)."""
    return (f"arrayStringConcat(arrayFilter(x -> x != '', ["
            f"if({namespace} != '', concat('{semconv.SERVICE_NAMESPACE}=', {namespace}), ''),"
            f" if({service} != '', concat('{semconv.SERVICE_NAME}=', {service}), ''),"
            f" if({instance} != '', concat('{semconv.SERVICE_INSTANCE_ID}=', {instance}),"
            f" if({host} != '', concat('{semconv.HOST_NAME}=', {host}), '')),"
            f" if({instance} = '' AND {pid} != '', concat('{semconv.PROCESS_PID}=', {pid}), '')]),"
            " ',')")


#: Over a row of the Collector exporter's tables (``ServiceName``, ``ResourceAttributes``): the
#: ``service.namespace``, ``service.name``, ``service.instance.id``, ``host.name`` and
#: ``process.pid`` expressions of its process.
RESOURCE_PROCESS = (f"ResourceAttributes['{semconv.SERVICE_NAMESPACE}']",
                    "CAST(ServiceName AS String)",
                    f"ResourceAttributes['{semconv.SERVICE_INSTANCE_ID}']",
                    f"ResourceAttributes['{semconv.HOST_NAME}']",
                    f"ResourceAttributes['{semconv.PROCESS_PID}']")


def _span_window(query: AggregateQuery) -> list[str]:
    parts = []
    if query.start_ns is not None:
        parts.append("Timestamp >= fromUnixTimestamp64Nano({scan_lo:Int64})")
    if query.end_ns is not None:
        parts.append("Timestamp < fromUnixTimestamp64Nano({hi:Int64})")
    return parts


def service_statements(traces: str, query: AggregateQuery) -> list[str]:
    """With ``query.service``: (re)create :data:`SERVICE_TRACES_TABLE` (ids of the traces with a
    span of that ``service.name`` in the window), :data:`SERVICE_NAMES_TABLE` (every service
    with a span in those traces) and :data:`SPAN_SERVICES_TABLE` (every service with a span in the
    window: the sort key starts with the service name, so this reads little). ``--service`` picks
    whole traces here, as Jaeger and Tempo do (a request's stages that ran in another service, a
    GPU worker, stay in it); the other services' requests in them are left out after the first
    request pass (:mod:`otel_stages.analysis.clickhouse_services`). Empty without a service."""
    if not query.service:
        return []
    window = " AND ".join(["ServiceName = {service:String}", *_span_window(query)])
    return [
        f"DROP TEMPORARY TABLE IF EXISTS {SERVICE_TRACES_TABLE}",
        f"DROP TEMPORARY TABLE IF EXISTS {SERVICE_NAMES_TABLE}",
        f"DROP TEMPORARY TABLE IF EXISTS {SPAN_SERVICES_TABLE}",
        f"""CREATE TEMPORARY TABLE {SPAN_SERVICES_TABLE} ENGINE = Memory AS
SELECT DISTINCT CAST(ServiceName AS String) AS name FROM {traces}
{"WHERE " + " AND ".join(_span_window(query)) if _span_window(query) else ""}""",
        f"""CREATE TEMPORARY TABLE {SERVICE_TRACES_TABLE} ENGINE = Memory AS
SELECT DISTINCT TraceId FROM {traces} WHERE {window}""",
        f"""CREATE TEMPORARY TABLE {SERVICE_NAMES_TABLE} ENGINE = Memory AS
SELECT DISTINCT CAST(ServiceName AS String) AS name FROM {traces}
WHERE TraceId IN {SERVICE_TRACES_TABLE} {" ".join(f"AND {p}" for p in _span_window(query))}""",
    ]


def finite_number(text: str) -> str:
    """SQL: the attribute text ``text`` read as a finite Float64, else NULL (``"NaN"`` and
    ``"inf"`` too), as :func:`otel_stages.analysis.requests.usable_float` reads it."""
    return f"if(isFinite(toFloat64OrNull({text})), toFloat64OrNull({text}), NULL)"


def format_text(text: str) -> str:
    """SQL: the attribute text ``text`` as :func:`otel_stages.analysis.requests.usable_format`
    reads it: without a MIME type's parameters and surrounding blanks, named as Pillow names it
    (the table of :func:`otel_stages.analysis.image_formats.format_aliases`, looked up in lower
    case; an unknown MIME type in lower case, an unknown name in upper case); ``''`` when it is
    no format name (or :data:`~otel_stages.analysis.requests.NO_FORMAT`)."""
    not_formats = ", ".join(f"'{v}'" for v in NOT_FORMATS)
    blanks = ", ".join(f"char({ord(c)})" for c in FORMAT_BLANKS)  # as Python's strip(FORMAT_BLANKS)
    base = f"trimBoth(splitByChar(';', {text})[1], concat({blanks}))"  # the parameters left out
    aliases = format_aliases()  # names match FORMAT_TEXT: no quote to escape
    keys = ", ".join(f"'{k}'" for k in aliases)
    names = ", ".join(f"'{v}'" for v in aliases.values())
    low = f"lower({base})"  # ASCII, as FORMAT_TEXT is (Python's lower() alike)
    name = (f"transform({low}, [{keys}], [{names}],"
            f" if(position({base}, '/') > 0, {low}, upper({base})))")
    return (f"if(match({base}, '^{FORMAT_TEXT.pattern}$') AND {base} NOT IN ({not_formats})"
            f" AND upper({base}) != '{NO_FORMAT}', {name}, '')")


def utilization_reading(mean: str, count: str) -> str:
    """SQL: whether a forward's ``gpu.utilization.mean`` (``mean``: NULL when absent, NaN when
    no number) and ``gpu.sample_count`` (``count``: 1 when absent, 0 when no int; NULL, read
    as 1, for a forward without the mean) make a reading, as
    :func:`otel_stages.analysis.gpu.utilization_reading` reads them."""
    return (f"({mean} IS NOT NULL AND isFinite({mean}) AND {mean} >= 0"
            f" AND {mean} <= {MAX_UTILIZATION_READING} AND ifNull({count}, 1) > 0"
            f" AND ifNull({count}, 1) <= {MAX_SAMPLE_COUNT})")


def span_filter(query: AggregateQuery, *, odd: bool) -> str:
    """WHERE clause over the traces table: window (with slack), service (the spans of the
    traces :func:`service_statements` picked, less those of :data:`SERVICE_FOREIGN_TABLE` with
    ``query.leave_out``), and odd spans left out (``odd=False``) or
    selected (``odd=True``: start before 2000 or longer than a day; the table's partition key
    and duration index answer this without a full read)."""
    parts = _span_window(query)
    if query.service:
        parts.append(f"TraceId IN {SERVICE_TRACES_TABLE}")
        if query.leave_out:
            parts.append(f"(reinterpretAsUInt128(unhex(TraceId)), reinterpretAsUInt64(unhex(SpanId)))"
                         f" NOT IN (SELECT trace_key, sid FROM {SERVICE_FOREIGN_TABLE})")
    bad = (f"(Timestamp < fromUnixTimestamp64Nano({MIN_SPAN_START_NS})"
           f" OR Duration > {MAX_SPAN_DURATION_NS})")
    parts.append(bad if odd else f"NOT {bad} AND SpanId != '' AND TraceId != ''")
    return " AND ".join(parts)


#: ``image.format`` as the cohorts read it: only when the requests hold more than one format,
#: else '' (as :class:`otel_stages.analysis.cohorts.CohortKeys`: one format on some requests and
#: none on others is one input, not two).
_COHORT_FORMAT = f"if((SELECT formats FROM {FORMATS_TABLE}) > 1, fmt, '')"


def formats_statements() -> list[str]:
    """(Re)create :data:`FORMATS_TABLE` from the per-request table: run before anything reads
    :func:`cohort_requests` or :func:`requests` (a scalar subquery over one row, where the count
    itself read every request's format again in each statement)."""
    return [f"DROP TEMPORARY TABLE IF EXISTS {FORMATS_TABLE}",
            f"""CREATE TEMPORARY TABLE {FORMATS_TABLE} ENGINE = Memory AS
SELECT uniqExactIf(fmt, fmt != '') AS formats FROM {REQUESTS_TABLE} WHERE is_request"""]


def warm_statements() -> list[str]:
    """(Re)create :data:`WARM_TABLE` (after the requests set apart): the warm count and the
    warm requests' mean total, read by :func:`count_statement` and the statements that centre
    on that mean."""
    return [f"DROP TEMPORARY TABLE IF EXISTS {WARM_TABLE}",
            f"""CREATE TEMPORARY TABLE {WARM_TABLE} ENGINE = Memory AS
SELECT countIf(warm) AS n_warm, avgIf(total_ns / 1e6, warm) AS mean_total FROM {requests()}"""]


def cohort_requests() -> str:
    """The per-request table as a subquery with ``fmt`` as the cohorts read it (only when the
    requests hold more than one format)."""
    return f"(SELECT * REPLACE ({_COHORT_FORMAT} AS fmt) FROM {REQUESTS_TABLE})"


def requests(*, recorded_format: bool = False) -> str:
    """The per-request table (:data:`REQUESTS_TABLE`), with its ``cold`` and ``warm`` flags, as
    a subquery: ``warm`` is cleared for the requests set apart as cold (:data:`APART_TABLE`,
    filled before any statement reads this; the engine reads only the columns a statement uses),
    ``fmt`` as in :func:`cohort_requests` unless ``recorded_format`` (the format as recorded,
    for rules about the format itself).
    """
    fmt = "" if recorded_format else f", {_COHORT_FORMAT} AS fmt"
    return (f"(SELECT * REPLACE (toUInt8(warm AND (trace_key, span_key) NOT IN"
            f" (SELECT trace_key, span_key FROM {APART_TABLE})) AS warm{fmt}) FROM {REQUESTS_TABLE})")


def count_statement() -> str:
    """Warm requests in the temporary table (picks the quantile function under ``auto``; after
    :func:`warm_statements`)."""
    return f"SELECT n_warm FROM {WARM_TABLE}"


def quantile_function(query: AggregateQuery, warm_requests: int) -> str:
    """``"exact"`` or ``"dd"`` for this query and this many warm requests."""
    if query.quantiles != "auto":
        return query.quantiles
    return "exact" if warm_requests <= EXACT_QUANTILE_MAX_ROWS else "dd"


def _levels() -> str:
    return ", ".join(repr(x) for x in LEVELS)


def distribution(prefix: str, expr: str, cond: str, method: str) -> str:
    """Select-list items summarising ``expr`` over rows where ``cond``: ``{prefix}_n``, ``_min``,
    ``_max``, ``_q`` (the :data:`LEVELS`), ``_mean``, ``_var`` (sample variance), ``_sum``.
    ``cond`` ``"1"`` (every row) gives the plain aggregate functions (no ``-If`` per row)."""
    if cond == "1":
        q = (f"quantilesExactInclusive({_levels()})({expr})" if method == "exact"
             else f"quantilesDD({DD_RELATIVE_ACCURACY}, {_levels()})({expr})")
        return (f"count() AS {prefix}_n, min({expr}) AS {prefix}_min, "
                f"max({expr}) AS {prefix}_max, {q} AS {prefix}_q, "
                f"avg({expr}) AS {prefix}_mean, varSampStable({expr}) AS {prefix}_var, "
                f"sum({expr}) AS {prefix}_sum")
    q = (f"quantilesExactInclusiveIf({_levels()})({expr}, {cond})" if method == "exact"
         else f"quantilesDDIf({DD_RELATIVE_ACCURACY}, {_levels()})({expr}, {cond})")
    return (f"countIf({cond}) AS {prefix}_n, minIf({expr}, {cond}) AS {prefix}_min, "
            f"maxIf({expr}, {cond}) AS {prefix}_max, {q} AS {prefix}_q, "
            f"avgIf({expr}, {cond}) AS {prefix}_mean, varSampStableIf({expr}, {cond}) AS {prefix}_var, "
            f"sumIf({expr}, {cond}) AS {prefix}_sum")


def median_and_p95(expr: str, cond: str, method: str) -> str:
    """``[median, p95]`` of ``expr`` over rows where ``cond`` (an array), with the chosen quantile
    function, as :func:`otel_stages.analysis.cohorts.paid_min_ms` reads a cold request's warm
    peers."""
    if method == "exact":
        return f"quantilesExactInclusiveIf(0.5, 0.95)({expr}, {cond})"
    return f"quantilesDDIf({DD_RELATIVE_ACCURACY}, 0.5, 0.95)({expr}, {cond})"


def median(expr: str, cond: str, method: str) -> str:
    """The median of ``expr`` over rows where ``cond``, with the chosen quantile function
    (``cond`` ``"1"``: the plain function)."""
    if cond == "1":
        return (f"quantileExactInclusive(0.5)({expr})" if method == "exact"
                else f"quantileDD({DD_RELATIVE_ACCURACY}, 0.5)({expr})")
    if method == "exact":
        return f"quantileExactInclusiveIf(0.5)({expr}, {cond})"
    return f"quantileDDIf({DD_RELATIVE_ACCURACY}, 0.5)({expr}, {cond})"


#: Over a metrics row: not a point flagged "no recorded value" (OTLP ``DataPointFlags``
#: ``DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK`` = 1, opentelemetry-proto
#: ``opentelemetry/proto/metrics/v1/metrics.proto``: explicitly missing data, as a Prometheus
#: staleness marker), which the exporter stores with its ``Flags`` and a ``Value`` of 0.
NO_RECORDED_VALUE_SQL = "bitAnd(Flags, 1) = 0"


def metric_filter(query: AggregateQuery, names: str) -> str:
    """WHERE over a metrics table (the exporter's gauge or sum schema): ``MetricName IN names``
    (``names`` a SQL tuple, e.g. ``('hw.gpu.utilization')``), finite recorded values
    (:data:`NO_RECORDED_VALUE_SQL`), the window with
    :data:`WINDOW_SLACK_NS` (params ``scan_lo`` / ``hi``) and, with a service, the services of
    the traces it picked (:data:`SERVICE_NAMES_TABLE`) and the services with no span in the
    window (:data:`SPAN_SERVICES_TABLE`: metrics-only processes, GPU exporters, as
    :func:`otel_stages.analysis.services.pick_service` keeps them; with ``query.leave_out``, not
    those on a host of :data:`LEFT_OUT_HOSTS_TABLE`)."""
    parts = [f"MetricName IN {names}", "isFinite(Value)", NO_RECORDED_VALUE_SQL]
    if query.start_ns is not None:
        parts.append("TimeUnix >= fromUnixTimestamp64Nano({scan_lo:Int64})")
    if query.end_ns is not None:
        parts.append(f"TimeUnix < fromUnixTimestamp64Nano({{hi:Int64}} + {WINDOW_SLACK_NS})")
    if query.service:
        alone = f"ServiceName NOT IN {SPAN_SERVICES_TABLE}"
        if query.leave_out:  # (not on a host of the requests left out only)
            alone += f" AND ResourceAttributes['{semconv.HOST_NAME}'] NOT IN {LEFT_OUT_HOSTS_TABLE}"
        parts.append(f"(ServiceName IN {SERVICE_NAMES_TABLE} OR ({alone}))")
    return " AND ".join(parts)
