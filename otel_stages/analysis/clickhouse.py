"""ClickHouse as a report source: create the Collector exporter's tables, import OTLP/JSON files
into them, and run the aggregate queries of :mod:`otel_stages.analysis.clickhouse_sql`, on an
:class:`~otel_stages.analysis.clickhouse_engine.Engine` (a server or embedded chDB: URL forms,
:func:`connect` and its errors in :mod:`otel_stages.analysis.clickhouse_engine`, whose names are
re-exported here).

Both backends run the same SQL; the server does all the work, only aggregates come back. Every
failure is a :class:`SourceError` naming the URL (without its password) and what is wrong.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from otel_stages.analysis import clickhouse_apart as apart
from otel_stages.analysis import clickhouse_calls as calls
from otel_stages.analysis import clickhouse_failures as failures
from otel_stages.analysis import clickhouse_figures
from otel_stages.analysis import clickhouse_gaps as gaps
from otel_stages.analysis import clickhouse_gpu_ids as gpu_ids
from otel_stages.analysis import clickhouse_issues as issues
from otel_stages.analysis import clickhouse_preprocess as preprocess
from otel_stages.analysis import clickhouse_queries as queries
from otel_stages.analysis import clickhouse_requests as requests
from otel_stages.analysis import clickhouse_rows as rows_of
from otel_stages.analysis import clickhouse_schema as schema
from otel_stages.analysis import clickhouse_services as service_sql
from otel_stages.analysis import clickhouse_signal_result as signal_result
from otel_stages.analysis import clickhouse_signals as signals
from otel_stages.analysis import clickhouse_sql as sql
from otel_stages.analysis.calls import MAX_CALL_HOPS
from otel_stages.analysis.clickhouse_engine import CONNECT_TIMEOUT_S as CONNECT_TIMEOUT_S
from otel_stages.analysis.clickhouse_engine import ENV_PASSWORD as ENV_PASSWORD
from otel_stages.analysis.clickhouse_engine import ENV_USER as ENV_USER
from otel_stages.analysis.clickhouse_engine import IN_USE as IN_USE
from otel_stages.analysis.clickhouse_engine import Engine, no_table
from otel_stages.analysis.clickhouse_engine import Target as Target
from otel_stages.analysis.clickhouse_engine import connect as connect
from otel_stages.analysis.clickhouse_engine import parse_url as parse_url
from otel_stages.analysis.clickhouse_files import iter_export_requests, iter_files
from otel_stages.analysis.clickhouse_result import (
    FleetAggregates,
    build_aggregates,
    episode_of,
    steady_episode,
)
from otel_stages.analysis.http_source import SourceError
from otel_stages.analysis.process_mix import PROCESS_MIX_DOMINATES
from otel_stages.analysis.sampled import is_sampled
from otel_stages.analysis.services import MAX_SERVICES_NAMED

#: Rows per INSERT: large enough for ClickHouse's "insert in big batches" advice, small enough
#: that a batch of spans stays a few tens of MB in this process.
INSERT_BATCH_ROWS = 20_000


# --- schema + import --------------------------------------------------------------------------


@dataclass(frozen=True)
class Tables:
    """Where the exporter's data lives: ``database`` and the traces / gauge / sum table names."""

    database: str = "default"
    traces: str = schema.DEFAULT_TRACES_TABLE
    gauge: str = schema.DEFAULT_GAUGE_TABLE
    sum: str = schema.DEFAULT_SUM_TABLE

    @property
    def traces_name(self) -> str:
        """The traces table as a person names it: ``TABLE``, or ``DB.TABLE`` outside
        ``default``."""
        return self.traces if self.database == "default" else f"{self.database}.{self.traces}"

    @property
    def gauge_name(self) -> str:
        """The gauge table as a person names it (as :attr:`traces_name`)."""
        return self.gauge if self.database == "default" else f"{self.database}.{self.gauge}"

    @property
    def traces_ref(self) -> str:
        """The traces table, quoted."""
        return schema.table_ref(self.database, self.traces)

    @property
    def gauge_ref(self) -> str:
        """The gauge metrics table, quoted."""
        return schema.table_ref(self.database, self.gauge)

    @property
    def sum_ref(self) -> str:
        """The sum metrics table, quoted."""
        return schema.table_ref(self.database, self.sum)


def table_columns(engine: Engine, database: str, table: str) -> set[str] | None:
    """The column names of ``database.table`` (Nested ones as ``Name.Field``), ``None`` when there
    is no such table."""
    rows = engine.rows("SELECT name FROM system.columns WHERE database = {db:String}"
                       " AND table = {t:String}", {"db": database, "t": table})
    return {str(r["name"]) for r in rows} or None


def missing_columns(engine: Engine, database: str, table: str, required: Iterable[str]
                    ) -> list[str] | None:
    """Which of ``required`` the table lacks (in ``required``'s order); ``None`` when there is no
    such table."""
    have = table_columns(engine, database, table)
    return None if have is None else [c for c in required if c not in have]


def create_tables(engine: Engine, tables: Tables) -> None:
    """Create the database and the exporter's traces, gauge and sum tables where missing (the
    exporter's own DDL, picked by server version as the exporter does). A table already there
    must have the columns the import writes: else ``ValueError`` naming the table and the
    columns it lacks, and nothing is created."""
    wrong = []
    for table, columns in ((tables.traces, schema.TRACES_COLUMNS),
                           (tables.gauge, schema.GAUGE_COLUMNS),
                           (tables.sum, schema.SUM_COLUMNS)):
        lacks = missing_columns(engine, tables.database, table, columns)
        if lacks:
            wrong.append(f"{schema.table_ref(tables.database, table)} lacks {', '.join(lacks)}")
    if wrong:
        raise ValueError(
            "tables already there are not the Collector clickhouse exporter's ("
            + "; ".join(wrong) + "): nothing imported; import into other tables (--traces-table /"
            " --gauge-table DB.TABLE) or another database")
    if tables.database != "default":
        engine.execute(f"CREATE DATABASE IF NOT EXISTS {schema.quote_ident(tables.database)}")
    version = engine.rows("SELECT version() AS v")[0]["v"]
    for statement in schema.traces_ddl(tables.database, tables.traces,
                                       schema.parse_server_version(str(version))):
        engine.execute(statement)
    engine.execute(schema.gauge_ddl(tables.database, tables.gauge))
    engine.execute(schema.sum_ddl(tables.database, tables.sum))


@dataclass
class ImportSummary:
    """What :func:`import_files` wrote: spans, gauge and sum points, files read, metric points of
    other kinds skipped, and problems (``"<file>:<line>: ..."``) for what was left out."""

    files: int = 0
    spans: int = 0
    gauge_points: int = 0
    sum_points: int = 0
    skipped_points: int = 0
    problems: list[str] = field(default_factory=list)


def import_files(engine: Engine, tables: Tables, paths: Sequence[str | os.PathLike[str]],
                 batch_rows: int = INSERT_BATCH_ROWS) -> ImportSummary:
    """Create the tables where missing, then load every OTLP/JSON file under ``paths`` (``-``:
    standard input; any compression and framing
    :mod:`otel_stages.analysis.clickhouse_files` reads) into them as the Collector's
    ``clickhouse`` exporter would have (see
    :mod:`otel_stages.analysis.clickhouse_rows`). Rows go in batches of ``batch_rows``."""
    summary = ImportSummary()
    files = iter_files(paths, summary.problems)
    create_tables(engine, tables)
    spans: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []
    sums: list[dict[str, Any]] = []

    def flush(force: bool) -> None:
        if sums and (force or len(sums) >= batch_rows):
            engine.insert(tables.sum_ref, rows_of.json_each_row(sums))
            summary.sum_points += len(sums)
            sums.clear()
        if spans and (force or len(spans) >= batch_rows):
            engine.insert(tables.traces_ref, rows_of.json_each_row(spans))
            summary.spans += len(spans)
            spans.clear()
        if points and (force or len(points) >= batch_rows):
            engine.insert(tables.gauge_ref, rows_of.json_each_row(points))
            summary.gauge_points += len(points)
            points.clear()

    for file in files:
        summary.files += 1
        for where, obj in iter_export_requests(file, summary.problems):
            rows = rows_of.export_request_rows(obj, where=where)
            spans.extend(rows.spans)
            points.extend(rows.gauge_points)
            sums.extend(rows.sum_points)
            summary.skipped_points += rows.skipped_points
            summary.problems.extend(rows.problems)
            flush(force=False)
    flush(force=True)
    return summary


# --- aggregates -------------------------------------------------------------------------------


def fetch_aggregates(engine: Engine, tables: Tables, query: sql.AggregateQuery, *,
                     url: str = "") -> FleetAggregates:
    """Run the diagnosis's SQL for ``query`` (window, service, list sizes) on ``engine``: fill
    the connection's temporary per-request table, pick the quantile function (exact unless the
    warm requests exceed :data:`~otel_stages.analysis.clickhouse_sql.EXACT_QUANTILE_MAX_ROWS`),
    run the aggregate queries, and return their results. ``url`` names the source in the result.
    Raises :class:`SourceError` when the traces table is missing (:func:`no_table`) or lacks a
    column the SQL reads.
    """
    lacks = missing_columns(engine, tables.database, tables.traces, schema.TRACES_READ_COLUMNS)
    if lacks is None:
        raise SourceError(no_table(url or "ClickHouse", tables.traces_name))
    if lacks:
        raise SourceError(
            f"{url or 'ClickHouse'}: {tables.traces_name} lacks the columns {', '.join(lacks)} the"
            " report reads: is it the Collector clickhouse exporter's traces table? (name that"
            " one with --traces-table)")
    results, method = run_queries(engine, tables, query)
    return build_aggregates(results, url=url, method=method, start_ns=query.start_ns,
                            end_ns=query.end_ns, service=query.service)


def services_seen(engine: Engine, tables: Tables, query: sql.AggregateQuery
                  ) -> tuple[list[tuple[str, int]], int, bool]:
    """For a ``--service`` that found no request: the first
    :data:`~otel_stages.analysis.services.MAX_SERVICES_NAMED` ``(service.name, spans)`` of the
    traces table in ``query``'s window (most spans first, then by name), how many services there
    are, and whether ``query.service`` is one of them (read for the error, a grouping on the
    ``ServiceName`` column)."""
    parts = ["1"]
    if query.start_ns is not None:
        parts.append("Timestamp >= fromUnixTimestamp64Nano({lo:Int64})")
    if query.end_ns is not None:
        parts.append("Timestamp < fromUnixTimestamp64Nano({hi:Int64})")
    rows = engine.rows(f"""SELECT name, spans, count() OVER () AS services,
    max(name = {{service:String}}) OVER () AS found
FROM (SELECT CAST(ServiceName AS String) AS name, count() AS spans FROM {tables.traces_ref}
      WHERE {" AND ".join(parts)} GROUP BY name)
ORDER BY spans DESC, name LIMIT {MAX_SERVICES_NAMED}""", sql.query_params(query))
    if not rows:
        return [], 0, False
    return ([(str(r["name"]), int(r["spans"])) for r in rows], int(rows[0]["services"]),
            bool(rows[0]["found"]))


def run_queries(engine: Engine, tables: Tables, query: sql.AggregateQuery
                ) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """The statements behind :func:`fetch_aggregates`: the answer rows of every aggregate query
    (by name) and the quantile method used. Temporary tables are dropped afterwards."""
    settings = {**sql.DEFAULT_SETTINGS, **query.settings}
    left_out_calls: list[dict[str, Any]] = []
    for statement in sql.service_statements(tables.traces_ref, query):
        engine.execute(statement, sql.query_params(query), settings)
    _group_requests(engine, tables, query, settings)
    if query.service:  # other services' requests in the traces picked: left out, grouped again
        for statement in service_sql.foreign_statements(tables.traces_ref, query):
            engine.execute(statement, sql.query_params(query), settings)
        if int(engine.rows(service_sql.foreign_count_sql(), None, settings)[0]["n"]):
            # the service's stages that call the requests left out, before they are
            left_out_calls = _calls_left_out(engine, tables, query, settings)
            query = replace(query, leave_out=True)
            for statement in (*service_sql.left_out_hosts_statements(tables.traces_ref, query),
                              *service_sql.names_statements(tables.traces_ref, query)):
                engine.execute(statement, sql.query_params(query), settings)
            _group_requests(engine, tables, query, settings)
    # before anything reads the cohorts' format / the warm flag
    for statement in (*sql.formats_statements(), *apart.apart_statements(), *sql.warm_statements()):
        engine.execute(statement, None, settings)
    warm = int(engine.rows(sql.count_statement(), None, settings)[0]["n_warm"])
    method = sql.quantile_function(query, warm)
    # cold requests that failed after paying the cold start count in the cold figures
    failed_cold = int(engine.rows(queries.failed_cold_count_sql(), None, settings)[0]["n"])
    for statement in queries.failed_cold_statements(tables.traces_ref, query, method, failed_cold > 0):
        engine.execute(statement, sql.query_params(query), settings)
    gauge = metrics_table(engine, tables.database, tables.gauge)
    for statement, params in (*queries.cohort_statements(),
                              *queries.gpu_points_statements(gauge[0]["read"], query)):
        engine.execute(statement, params, settings)
    # without GPU points in the window the tables lined up with them are empty: not built, and
    # their answers absent (read as none): a fifth less planning for a run without GPU metrics
    points = int(engine.rows(queries.gpu_points_sql(), None, settings)[0]["n"]) if SKIP_EMPTY else 1
    results_points = [{"n": points}]
    owned: list[dict[str, Any]] = [{"n": 0}]
    if points:
        for statement, params in queries.gpu_owner_statements(tables.traces_ref, query):
            engine.execute(statement, params, settings)
        # forwards recorded by a process without requests (a GPU worker under a gateway's
        # request) join their own process's GPU points; none in the common case, which reads no
        # span here
        owned = engine.rows(queries.forward_owners_sql(), None, settings)
        for statement, params in queries.gpu_pairs_statements(bool(owned and int(owned[0]["n"]))):
            engine.execute(statement, params, settings)
    results = {
        name: engine.rows(text, params, settings)
        for name, text, params in queries.aggregate_statements(tables.traces_ref, query, method)
    }
    # the GPU split needs the run's noise band: the slow forwards are those beyond it
    head = build_aggregates(results, url="", method=method, start_ns=query.start_ns,
                            end_ns=query.end_ns, service=query.service)
    band = clickhouse_figures.band_ms(head.stages, head.total)
    mix = head.process_mix
    if mix is not None and mix.explains >= PROCESS_MIX_DOMINATES:
        # the processes' versions decide the process caveat only then (a deploy: process_mix)
        results["process_versions"] = engine.rows(
            queries.process_versions_sql(tables.traces_ref, query), sql.query_params(query),
            settings)
    if is_sampled(head.sampling):  # why the sampler kept them, only where the seq gaps say sampled
        results["sampling_kept"] = engine.rows(queries.sampling_kept_sql(tables.traces_ref, query),
                                               sql.query_params(query), settings)
        results["sampling_unbiased"] = engine.rows(
            queries.sampling_unbiased_sql(tables.traces_ref, query, method), sql.query_params(query),
            settings)
    cold = head.cold_start
    if cold is not None and len(cold.by_input) > 1 and any(
            clickhouse_figures.comparable_cold_input(i) for i in cold.by_input):
        # cold requests of several inputs, some comparable: those with their inputs' warm requests
        results["cold_union"] = engine.rows(queries.cold_union_sql(method), None, settings)
        head = build_aggregates(results, url="", method=method, start_ns=query.start_ns,
                                end_ns=query.end_ns, service=query.service)
    paid = clickhouse_figures.cold_paid_params(head)
    if paid is not None:  # only some cold requests may have paid a cold start: their figures
        results["cold_paid"] = engine.rows(queries.cold_paid_sql(method, by_input=paid[1]),
                                           {"paid_min_ms": paid[0]}, settings)
        if paid[1] and clickhouse_figures.cold_split(head, results["cold_paid"]):
            results["cold_paid"] += engine.rows(queries.cold_paid_warm_sql(method), None, settings)
    if cold is not None and any(clickhouse_figures.input_paid_needed(i) for i in cold.by_input):
        results["cold_input_paid"] = engine.rows(queries.cold_input_paid_sql(method), None, settings)
    if head.total is not None and band is not None:  # do the slow requests fall in one stretch?
        results.update(_episode_rows(engine, method, head.total.median_ms, band, settings))
    results["slow_forwards"] = engine.rows(queries.slow_forwards_sql(),
                                           {"band_ns": (band or 0.0) * 1e6}, settings)
    threshold = results["slow_forwards"][0]["slow_min_ns"] if results["slow_forwards"] else None
    results["gpu_points"] = results_points
    for name, text, params in queries.gpu_statements(
            float(threshold) if threshold is not None and math.isfinite(threshold) else 0.0,
            points=bool(points)):
        results[name] = engine.rows(text, params, settings)
    results.update(_cohort_gpu(engine, query, head, settings, results))
    results["gauge_table"] = gauge
    results["calls_left_out"] = left_out_calls
    results["forward_owners"] = owned
    results["apart"] = engine.rows(apart.apart_rows_sql(), None, settings)
    if apart.warmup_needed(results["apart"]):  # requests set apart as warm-up: how long it lasted
        results["warmup"] = engine.rows(apart.warmup_sql(), None, settings)
    results["services"] = engine.rows(requests.services_sql(), None, settings)
    if int(engine.rows(calls.search_needed_sql(), None, settings)[0]["n"]):
        # stages that call into other requests read here (none with one request per trace)
        results["calls"] = _search_calls(engine, tables, query, settings)
    if query.leave_out and not (results["summary"] and int(results["summary"][0].get("n_requests") or 0)):
        # no request of the service's own: the services whose requests hold its spans
        results["service_hosts"] = engine.rows(service_sql.hosts_sql(tables.traces_ref, query),
                                               sql.query_params(query), settings)
    custom = not SKIP_EMPTY or int(engine.rows(f"SELECT count() AS n FROM {requests.CUSTOM_TABLE}",
                                               None, settings)[0]["n"]) > 0
    results["gaps"] = engine.rows(gaps.gaps_sql(tables.traces_ref, query, custom=custom),
                                  sql.query_params(query), settings)
    if query.start_ns is not None:  # requests kept by their own start: those the start cut off
        results["window_edge"] = engine.rows(requests.window_edge_sql(tables.traces_ref, query),
                                             sql.query_params(query), settings)
    if points:
        results["foreign_gpu"] = engine.rows(queries.foreign_gpu_sql(), None, settings)
    results["shared_gpu_ids"] = engine.rows(gpu_ids.shared_gpu_ids_sql(gauge[0]["read"], query),
                                            sql.query_params(query), settings)
    results["ambiguous_units"] = engine.rows(gpu_ids.ambiguous_units_sql(gauge[0]["read"], query),
                                             sql.query_params(query), settings)
    results.update(issue_results(engine, tables, query, settings, results))
    if results["summary"] and int(results["summary"][0].get("n_failed") or 0):
        results["failures"] = engine.rows(failures.failures_sql(tables.traces_ref, query),
                                          sql.query_params(query), settings)
        results["failed_times"] = engine.rows(failures.failed_times_sql(method), None, settings)
    results.update(signal_results(engine, tables, query, method, settings, results))
    # the decode facts feed only the advice on decode / resize (the verdict's stage, or a
    # co-suspect's lines, headed by its name), and cost a join of the warm requests with their
    # decode / resize spans: read them only then
    first = clickhouse_figures.verdict(build_aggregates(
        results, url="", method=method, start_ns=query.start_ns, end_ns=query.end_ns,
        service=query.service))
    if first.stage in preprocess.STAGES or any(
            line.startswith(f"{stage}: ") for stage in preprocess.STAGES for line in first.advice):
        for statement in preprocess.prepare_statements(tables.traces_ref, query):
            engine.execute(statement, sql.query_params(query), settings)
        results["preprocess"] = engine.rows(preprocess.preprocess_sql(), None, settings)
        if results.get("groups") and int(results["groups"][0]["n"]):
            results["preprocess_grouped"] = engine.rows(
                preprocess.grouped_sql(tables.traces_ref, query), sql.query_params(query), settings)
    for table in (*requests.TABLES, *calls.TABLES, *queries.TABLES, preprocess.TABLE, *signals.TABLES,
                  issues.CLASH_TABLE, issues.DUPLICATE_TABLE, sql.APART_TABLE, sql.FORMATS_TABLE,
                  sql.WARM_TABLE, sql.SERVICE_TRACES_TABLE, sql.SERVICE_NAMES_TABLE, sql.SPAN_SERVICES_TABLE,
                  sql.SERVICE_FOREIGN_TABLE, sql.LEFT_OUT_HOSTS_TABLE, *service_sql.TABLES,
                  sql.GPU_OWNERS_TABLE):
        engine.execute(f"DROP TEMPORARY TABLE IF EXISTS {table}", None, settings)
    return results, method


def _episode_rows(engine: Engine, method: str, median_ms: float, band_ms: float,
                  settings: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The ``episode`` and ``episode_outside`` answers (:mod:`otel_stages.analysis.episode`): over
    the recording's time, else each process's run, the first that is an episode (none: the last
    tried)."""
    params = {"slow_min_ms": median_ms + band_ms, "band_ms": band_ms}
    out: dict[str, list[dict[str, Any]]] = {}
    for per_process in (False, True):
        out["episode"] = engine.rows(queries.episode_sql(per_process), params, settings)
        window = episode_of(out["episode"])
        if window is None:
            continue
        out["episode_outside"] = engine.rows(
            queries.episode_outside_sql(method, per_process),
            {**params, "lo": window.bucket_lo, "hi": window.bucket_hi}, settings)
        if steady_episode(out["episode"], out["episode_outside"]) is not None:
            break
        del out["episode_outside"]
    return out


#: Skip the statements whose tables would be empty: the GPU tables and answers where the window
#: holds no GPU point, those over custom stage spans and nested groups where none was read (their
#: answers are then empty; tests compare both ways).
SKIP_EMPTY = True


def _calls_left_out(engine: Engine, tables: Tables, query: sql.AggregateQuery,
                    settings: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``calls_left_out`` answer: the call search over the first request pass of
    ``--service``, its other services' requests still read (their cold and set-apart requests
    flagged first: not steady), and of its calls
    (:func:`~otel_stages.analysis.clickhouse_calls.calls_sql`) those the service makes into
    another's requests, as :func:`otel_stages.analysis.services.pick_service` finds them."""
    for statement in (*sql.formats_statements(), *apart.apart_statements(), *sql.warm_statements()):
        engine.execute(statement, None, settings)
    return [row for row in _search_calls(engine, tables, query, settings)
            if row["caller"] == query.service and row["service"] != query.service]


def _search_calls(engine: Engine, tables: Tables, query: sql.AggregateQuery,
                  settings: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The call search (:mod:`otel_stages.analysis.clickhouse_calls`) over the per-request tables
    as they stand: the ``calls`` rows."""
    for statement in calls.start_statements():
        engine.execute(statement, None, settings)
    for _ in range(MAX_CALL_HOPS):
        for statement in calls.hop_statements(tables.traces_ref, query):
            engine.execute(statement, sql.query_params(query), settings)
        if not int(engine.rows(f"SELECT count() AS n FROM {calls.AT_TABLE}", None, settings)[0]["n"]):
            break  # (no link left to walk up)
    for statement in calls.spans_statements(tables.traces_ref, query):
        engine.execute(statement, sql.query_params(query), settings)
    return engine.rows(calls.calls_sql(), None, settings)


def _group_requests(engine: Engine, tables: Tables, query: sql.AggregateQuery,
                    settings: Mapping[str, Any]) -> None:
    """Fill the per-request table for ``query``: plan the time slices, then group the spans
    (:mod:`otel_stages.analysis.clickhouse_requests`)."""
    plan = engine.rows(requests.plan_sql(tables.traces_ref, query),
                       sql.query_params(query), settings)[0]
    def count(table: str) -> int:
        return int(engine.rows(f"SELECT count() AS n FROM {table}", None, settings)[0]["n"])

    for statement, params in requests.prepare_statements(tables.traces_ref, query, plan,
                                                         count if SKIP_EMPTY else None):
        engine.execute(statement, params, settings)


def _cohort_gpu(engine: Engine, query: sql.AggregateQuery, head: FleetAggregates,
                settings: Mapping[str, Any], results: Mapping[str, list[dict[str, Any]]]
                ) -> dict[str, list[dict[str, Any]]]:
    """GPU utilization within each of the largest cohorts (``head``: the aggregates so far), its
    slow forwards beyond the cohort's own forward median plus its own noise band, as the file
    report judges a cohort (:func:`otel_stages.analysis.gpu.gpu_evidence` on its requests). Each
    source is read per cohort only when the run has it (``results``: the run's GPU answers)."""
    spans = bool(results.get("gpu_spans") and int(results["gpu_spans"][0].get("covered") or 0))
    metrics = bool(results.get("gpu_metrics") and int(results["gpu_metrics"][0].get("gpus") or 0))
    if not spans and not metrics:
        return {}
    rows = engine.rows(queries.cohort_forwards_sql(), {"top_cohorts": query.top_cohorts}, settings)
    bands = {(c.width, c.height, c.format or ""): clickhouse_figures.band_ms(c.stages, c.total)
             for c in head.cohorts}
    thresholds = []
    for r in rows:
        key = (int(r["width"]), int(r["height"]), str(r["fmt"]))
        if key in bands and math.isfinite(float(r["median_ns"])):
            thresholds.append((*key, float(r["median_ns"]) + (bands[key] or 0.0) * 1e6))
    return {name: engine.rows(text, params, settings)
            for name, text, params in queries.cohort_gpu_statements(thresholds, spans=spans,
                                                                     metrics=metrics)}


def metrics_table(engine: Engine, database: str, table: str) -> list[dict[str, Any]]:
    """One row for a metrics table the report reads: ``table`` (quoted), ``exists``, ``lacks``
    (the read columns it lacks) and ``read``, what the SQL reads in its place: the table, or an
    empty one (:data:`~otel_stages.analysis.clickhouse_schema.EMPTY_METRICS`) when it is missing
    or lacks columns, so the statements run unchanged and find no points."""
    lacks = missing_columns(engine, database, table, schema.METRICS_READ_COLUMNS)
    ref = schema.table_ref(database, table)
    return [{"table": ref, "exists": lacks is not None, "lacks": lacks or [],
             "read": ref if lacks == [] else schema.EMPTY_METRICS}]


def issue_results(engine: Engine, tables: Tables, query: sql.AggregateQuery,
                  settings: Mapping[str, Any], results: Mapping[str, list[dict[str, Any]]]
                  ) -> dict[str, list[dict[str, Any]]]:
    """The span-id clashes and the example traces behind the data problems
    (:mod:`otel_stages.analysis.clickhouse_issues`), after the aggregate queries (``results``
    holds the ``issues`` counts)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for statement, params in issues.clash_statements(tables.traces_ref, query):
        engine.execute(statement, params, settings)
    if int(engine.rows(issues.duplicate_count_sql(), None, settings)[0]["n"]):
        for statement, params in issues.clash_check_statements(tables.traces_ref, query):
            engine.execute(statement, params, settings)
    if int(engine.rows(issues.clash_count_sql(), None, settings)[0]["n"]):
        out["clashes"] = engine.rows(issues.clashes_sql(tables.traces_ref, query),
                                     sql.query_params(query), settings)
    ids = issues.example_trace_ids(results["issues"][0] if results.get("issues") else {},
                                   out["clashes"][0] if out.get("clashes") else None)
    if ids:
        out["issue_spans"] = engine.rows(issues.example_spans_sql(tables.traces_ref, query),
                                         {**sql.query_params(query), "ids": ids}, settings)
    return out


def signal_results(engine: Engine, tables: Tables, query: sql.AggregateQuery, method: str,
                   settings: Mapping[str, Any], results: Mapping[str, list[dict[str, Any]]]
                   ) -> dict[str, list[dict[str, Any]]]:
    """The answers behind the mechanism rules (:mod:`otel_stages.analysis.clickhouse_signals`),
    by name, after the aggregate queries (``results``: their answers; ``signals`` says whether
    stage spans carry signals). GPU memory is read when warm forwards ran; the signal spans only
    when some carry signals; nothing comes back when neither is there."""
    out: dict[str, list[dict[str, Any]]] = {}
    spans = bool(results.get("signals") and results["signals"][0]["signals"])
    # GPU memory: its points are among the GPU points (none: nothing to read)
    forwards = bool(results["summary"] and results["summary"][0].get("n_warm_forwards")
                    and int((results.get("gpu_points") or [{"n": 1}])[0]["n"]))
    tops = {"top_cohorts": query.top_cohorts}
    gpus: list[dict[str, Any]] = []
    gauge = str((results.get("gauge_table") or [{"read": tables.gauge_ref}])[0]["read"])
    owned = bool(results.get("forward_owners") and int(results["forward_owners"][0]["n"]))
    if forwards:
        for statement, params in signals.memory_statements(owned):
            engine.execute(statement, params, settings)
        gpus = engine.rows(signals.memory_gpus_sql(), None, settings)
    memory = any(g.readable for g in signal_result.memory_gpus(gpus))
    if not spans and not memory:
        return out
    if spans:
        params = sql.query_params(query)
        for table in (signals.SIGNAL_SPANS_TABLE, signals.THROTTLE_TABLE, signals.PRESSURE_TABLE):
            engine.execute(f"DROP TEMPORARY TABLE IF EXISTS {table}", None, settings)
        out["sum_table"] = metrics_table(engine, tables.database, tables.sum)
        sums = out["sum_table"][0]["read"] == tables.sum_ref
        filled = {}
        for counter, fill in ((signals.THROTTLE_TABLE, signals.throttle_statement),
                              (signals.PRESSURE_TABLE, signals.pressure_statement)):
            if sums:
                engine.execute(fill(tables.sum_ref, query), params, settings)
            filled[counter] = sums and bool(engine.rows(f"SELECT count() AS n FROM {counter}",
                                                        None, settings)[0]["n"])
        engine.execute(signals.signal_spans_statement(
            tables.traces_ref, query, filled[signals.THROTTLE_TABLE],
            filled[signals.PRESSURE_TABLE]), params, settings)
        out["limit"] = engine.rows(signals.limit_sql(gauge), None, settings)
        if filled[signals.PRESSURE_TABLE]:
            out["pressure_scope"] = engine.rows(
                signals.pressure_scope_sql(tables.sum_ref, query), params, settings)
    engine.execute(f"DROP TEMPORARY TABLE IF EXISTS {signals.SAMPLES_TABLE}", None, settings)
    engine.execute(signals.samples_statement(spans), None, settings)
    out["signal_stages"] = engine.rows(signals.stage_signals_sql(method), None, settings)
    out["signal_cohort_stages"] = engine.rows(
        signals.stage_signals_sql(method, signals.COHORT), tops, settings)
    if spans:
        out["held"] = engine.rows(signals.held_sql(method), None, settings)
        out["cohort_held"] = engine.rows(signals.held_sql(method, signals.COHORT), None, settings)
    if memory:
        out["memory_gpus"] = gpus
        out["memory_windows"] = engine.rows(signals.memory_windows_sql(method, owned=owned), None,
                                            settings)
        out["cohort_memory_windows"] = engine.rows(
            signals.memory_windows_sql(method, signals.COHORT, owned=owned), tops, settings)
        out["memory_forwards"] = engine.rows(
            signals.memory_forwards_sql(),
            {"cap": signals.MAX_MEMORY_FORWARDS}, settings)
    return out
