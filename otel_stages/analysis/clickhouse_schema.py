"""The OpenTelemetry Collector ``clickhouse`` exporter's tables: their DDL, as the exporter runs it.

Pure: DDL text, no I/O (:mod:`otel_stages.analysis.clickhouse` sends it;
:mod:`otel_stages.analysis.clickhouse_rows` turns OTLP/JSON into the rows these tables hold).

Source read (opentelemetry-collector-contrib, ``exporter/clickhouseexporter``; the deploy stack pins
otelcol-contrib 0.157.0; these are the newest versions of each file in the snapshot read, the
release tag itself could not be mapped to a commit here):

- ``internal/sqltemplates/traces_table.sql`` @ 2bf6b9e1f8c8716ab54eaac1635e56b4d0649900: the
  traces table. Text (full-text) indexes when the server is ClickHouse >= 26.2
  (``versionFullTextSearch`` in ``exporter_logs.go``), bloom filters before.
- ``internal/sqltemplates/traces_id_ts_lookup_table.sql`` @ 1b08503058e58c68b9175b4d0663d0aaf16b5398
  and ``traces_id_ts_lookup_mv.sql`` @ 57b29d74154d72320747c8dd2a0b4a1629a39187: the
  ``<table>_trace_id_ts`` lookup table (``AggregatingMergeTree()``, per ``exporter_traces.go``'s
  ``traceIDTsTableEngineString`` test) and its materialized view.
- ``internal/sqltemplates/metrics_gauge_table.sql`` @ e3bd2d1d648f1868f50a8f2c1b68f7ce451ee6eb.
- ``internal/sqltemplates/metrics_sum_table.sql`` @ 8090d3c8ba8acfa230ff78df7528065be6bb2284: the
  gauge table's columns plus ``AggregationTemporality`` and ``IsMonotonic`` (the version with
  ``DateTime64(9)`` times and the gauge's sort key; another version in the snapshot stores
  ``TimeUnix`` as ``DateTime``, whole seconds, and sorts by hour).

Identifiers are back-quoted (the templates' ``ident`` helper); ``ON CLUSTER``, TTL and other
engines (exporter settings ``cluster_name``, ``ttl``, ``table_engine``) are not offered: a fleet
that needs them lets its Collector create the tables.
"""

from __future__ import annotations

import re

#: The exporter's default table names (``traces_table_name``, ``metrics_tables.gauge.name``).
DEFAULT_TRACES_TABLE = "otel_traces"
DEFAULT_GAUGE_TABLE = "otel_metrics_gauge"
#: The exporter's default sum metrics table (``metrics_tables.sum.name``): cumulative counters.
DEFAULT_SUM_TABLE = "otel_metrics_sum"
#: First ClickHouse release with ``TYPE text()`` indexes: the exporter picks its DDL by it.
FULL_TEXT_SEARCH_VERSION = (26, 2)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def quote_ident(name: str) -> str:
    """``name`` as a back-quoted ClickHouse identifier. Raises ``ValueError`` unless it is a plain
    identifier (letters, digits, ``_``), so table names from the command line cannot inject SQL."""
    if not _IDENT.fullmatch(name):
        raise ValueError(f"not a plain ClickHouse identifier: {name!r} (letters, digits and _ only)")
    return f"`{name}`"


def table_ref(database: str, table: str) -> str:
    """```database`.`table```, both checked by :func:`quote_ident`."""
    return f"{quote_ident(database)}.{quote_ident(table)}"


# --- DDL --------------------------------------------------------------------------------------

_TRACES_COLUMNS = """
    Timestamp DateTime64(9) CODEC(Delta(8), ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(T64, ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    ResourceAttributeItems Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2), CAST(ResourceAttributes, 'Array(Tuple(String, String))')),
    SpanAttributeItems Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2), CAST(SpanAttributes, 'Array(Tuple(String, String))')),"""  # noqa: E501 (verbatim DDL)

_TRACES_TEXT_INDEXES = """
    INDEX idx_trace_id TraceId TYPE text(tokenizer = 'array'),
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE text(tokenizer = 'array'),
    INDEX idx_res_attr_items ResourceAttributeItems TYPE text(tokenizer = 'array'),
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE text(tokenizer = 'array'),
    INDEX idx_span_attr_items SpanAttributeItems TYPE text(tokenizer = 'array'),"""

_TRACES_BLOOM_INDEXES = """
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,"""

_TRACES_TAIL = """
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1,
    INDEX idx_lower_span_name lower(SpanName) TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 8
) ENGINE = MergeTree()
PARTITION BY toDate(Timestamp)
PRIMARY KEY (ServiceName, SpanName, toDateTime(Timestamp))
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1"""

_TRACE_ID_TS = """CREATE TABLE IF NOT EXISTS {table} (
    TraceId String CODEC(ZSTD(1)),
    Start SimpleAggregateFunction(min, DateTime) CODEC(ZSTD(1)),
    End SimpleAggregateFunction(max, DateTime) CODEC(ZSTD(1))
) ENGINE = AggregatingMergeTree()
PARTITION BY toStartOfWeek(Start)
ORDER BY (TraceId)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1"""

_TRACE_ID_TS_MV = """CREATE MATERIALIZED VIEW IF NOT EXISTS {view}
TO {table}
AS SELECT
    TraceId,
    min(Timestamp) as Start,
    max(Timestamp) as End
FROM {source}
WHERE TraceId != ''
GROUP BY TraceId"""

_GAUGE = """CREATE TABLE IF NOT EXISTS {table} (
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ResourceSchemaUrl String CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    ScopeAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeDroppedAttrCount UInt32 CODEC(ZSTD(1)),
    ScopeSchemaUrl String CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    MetricName String CODEC(ZSTD(1)),
    MetricDescription String CODEC(ZSTD(1)),
    MetricUnit String CODEC(ZSTD(1)),
    Attributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    StartTimeUnix DateTime64(9) CODEC(Delta, ZSTD(1)),
    TimeUnix DateTime64(9) CODEC(Delta, ZSTD(1)),
    Value Float64 CODEC(ZSTD(1)),
    Flags UInt32 CODEC(ZSTD(1)),
    Exemplars Nested (
        FilteredAttributes Map(LowCardinality(String), String),
        TimeUnix DateTime64(9),
        Value Float64,
        SpanId String,
        TraceId String
    ) CODEC(ZSTD(1)),
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_scope_attr_key mapKeys(ScopeAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_scope_attr_value mapValues(ScopeAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_attr_key mapKeys(Attributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_attr_value mapValues(Attributes) TYPE bloom_filter(0.01) GRANULARITY 1
    ) ENGINE = MergeTree()
    PARTITION BY toDate(TimeUnix)
    ORDER BY (ServiceName, MetricName, Attributes, toUnixTimestamp64Nano(TimeUnix))
    SETTINGS index_granularity=8192, ttl_only_drop_parts = 1"""


#: The sum table: the gauge table's columns (same text up to ``Exemplars``), then these two.
_SUM = _GAUGE.replace("""    ) CODEC(ZSTD(1)),
    INDEX idx_res_attr_key""", """    ) CODEC(ZSTD(1)),
    AggregationTemporality Int32 CODEC(ZSTD(1)),
    IsMonotonic Boolean CODEC(Delta, ZSTD(1)),
    INDEX idx_res_attr_key""")


def parse_server_version(text: str) -> tuple[int, int]:
    """``"26.9.2.1"`` -> ``(26, 9)``; ``(0, 0)`` when unreadable (then the older DDL is used)."""
    parts = text.strip().split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 0


def traces_ddl(database: str, table: str, server_version: tuple[int, int]) -> list[str]:
    """The statements the exporter runs for its traces table, in order: the table, the
    ``<table>_trace_id_ts`` lookup table and its materialized view (``IF NOT EXISTS`` each).
    ``server_version`` (major, minor) picks text indexes (>= 26.2) or bloom filters."""
    indexes = (_TRACES_TEXT_INDEXES if server_version >= FULL_TEXT_SEARCH_VERSION
               else _TRACES_BLOOM_INDEXES)
    return [
        f"CREATE TABLE IF NOT EXISTS {table_ref(database, table)} ({_TRACES_COLUMNS}{indexes}"
        f"{_TRACES_TAIL}",
        _TRACE_ID_TS.format(table=table_ref(database, f"{table}_trace_id_ts")),
        _TRACE_ID_TS_MV.format(
            view=table_ref(database, f"{table}_trace_id_ts_mv"),
            table=table_ref(database, f"{table}_trace_id_ts"),
            source=table_ref(database, table),
        ),
    ]


def gauge_ddl(database: str, table: str) -> str:
    """The exporter's ``CREATE TABLE IF NOT EXISTS`` for its gauge metrics table."""
    return _GAUGE.format(table=table_ref(database, table))


def sum_ddl(database: str, table: str) -> str:
    """The exporter's ``CREATE TABLE IF NOT EXISTS`` for its sum metrics table."""
    return _SUM.format(table=table_ref(database, table))


# --- columns ----------------------------------------------------------------------------------

#: The traces table's columns ``otel-stages import`` writes: every column of the DDL above but
#: the two ALIAS ones (Nested columns by their ``Name.Field`` names, as ``system.columns`` lists
#: them).
TRACES_COLUMNS: tuple[str, ...] = (
    "Timestamp", "TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind",
    "ServiceName", "ResourceAttributes", "ScopeName", "ScopeVersion", "SpanAttributes", "Duration",
    "StatusCode", "StatusMessage", "Events.Timestamp", "Events.Name", "Events.Attributes",
    "Links.TraceId", "Links.SpanId", "Links.TraceState", "Links.Attributes",
)
#: The gauge table's columns (all of them) ...
GAUGE_COLUMNS: tuple[str, ...] = (
    "ResourceAttributes", "ResourceSchemaUrl", "ScopeName", "ScopeVersion", "ScopeAttributes",
    "ScopeDroppedAttrCount", "ScopeSchemaUrl", "ServiceName", "MetricName", "MetricDescription",
    "MetricUnit", "Attributes", "StartTimeUnix", "TimeUnix", "Value", "Flags",
    "Exemplars.FilteredAttributes", "Exemplars.TimeUnix", "Exemplars.Value", "Exemplars.SpanId",
    "Exemplars.TraceId",
)
#: ... and the sum table's.
SUM_COLUMNS: tuple[str, ...] = (*GAUGE_COLUMNS, "AggregationTemporality", "IsMonotonic")
#: The traces columns the report's SQL reads (a table without one cannot be reported on).
TRACES_READ_COLUMNS: tuple[str, ...] = (
    "Timestamp", "TraceId", "SpanId", "ParentSpanId", "SpanName", "ServiceName",
    "ResourceAttributes", "SpanAttributes", "Duration", "StatusCode", "Events.Timestamp",
    "Events.Name", "Events.Attributes",
)
#: The columns of a metrics table (gauge or sum) the report's SQL reads, with their types ...
_METRICS_READ = (
    ("ServiceName", "LowCardinality(String)"),
    ("ResourceAttributes", "Map(LowCardinality(String), String)"),
    ("MetricName", "String"),
    ("MetricUnit", "String"),
    ("Attributes", "Map(LowCardinality(String), String)"),
    ("TimeUnix", "DateTime64(9)"),
    ("Value", "Float64"),
    ("Flags", "UInt32"),
)
METRICS_READ_COLUMNS: tuple[str, ...] = tuple(name for name, _ in _METRICS_READ)
#: ... and an empty table with them (the ``null`` table function), read in place of a metrics
#: table that is missing, so every statement runs unchanged and finds no points.
EMPTY_METRICS = "null('" + ", ".join(f"{n} {t}" for n, t in _METRICS_READ) + "')"
