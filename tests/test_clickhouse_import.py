"""``otel-stages import`` and the Collector ``clickhouse`` exporter's schema, on real chDB: the
exporter's DDL (both index variants), rows exactly as the exporter writes them (read back from the
engine), pdata's ``AsString`` for attribute values, URL parsing, and the CLI around it."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

try:
    import chdb  # noqa: F401
except ImportError:
    # CI installs the test extra, which holds chDB: there a missing chDB is a broken install
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        raise
    pytest.skip("needs chDB: the clickhouse extra (pip install -e '.[test]')", allow_module_level=True)

from otel_stages.analysis.clickhouse import (
    Tables,
    connect,
    create_tables,
    import_files,
    parse_url,
)
from otel_stages.analysis.clickhouse_rows import as_string, export_request_rows, go_float
from otel_stages.analysis.clickhouse_schema import quote_ident, traces_ddl
from otel_stages.analysis.http_source import SourceError
from otel_stages.cli import main

TRACES = Path(__file__).parent / "data" / "traces"

#: Column names and types of the exporter's tables (internal/sqltemplates/traces_table.sql and
#: metrics_gauge_table.sql), as DESCRIBE TABLE shows them.
TRACES_COLUMNS = [
    ("Timestamp", "DateTime64(9)"), ("TraceId", "String"), ("SpanId", "String"),
    ("ParentSpanId", "String"), ("TraceState", "String"), ("SpanName", "LowCardinality(String)"),
    ("SpanKind", "LowCardinality(String)"), ("ServiceName", "LowCardinality(String)"),
    ("ResourceAttributes", "Map(LowCardinality(String), String)"), ("ScopeName", "String"),
    ("ScopeVersion", "String"), ("SpanAttributes", "Map(LowCardinality(String), String)"),
    ("Duration", "UInt64"), ("StatusCode", "LowCardinality(String)"), ("StatusMessage", "String"),
    ("Events.Timestamp", "Array(DateTime64(9))"), ("Events.Name", "Array(LowCardinality(String))"),
    ("Events.Attributes", "Array(Map(LowCardinality(String), String))"),
    ("Links.TraceId", "Array(String)"), ("Links.SpanId", "Array(String)"),
    ("Links.TraceState", "Array(String)"), ("Links.Attributes", "Array(Map(LowCardinality(String), String))"),
    ("ResourceAttributeItems", "Array(String)"), ("SpanAttributeItems", "Array(String)"),
]
GAUGE_COLUMNS = [
    ("ResourceAttributes", "Map(LowCardinality(String), String)"), ("ResourceSchemaUrl", "String"),
    ("ScopeName", "String"), ("ScopeVersion", "String"),
    ("ScopeAttributes", "Map(LowCardinality(String), String)"), ("ScopeDroppedAttrCount", "UInt32"),
    ("ScopeSchemaUrl", "String"), ("ServiceName", "LowCardinality(String)"), ("MetricName", "String"),
    ("MetricDescription", "String"), ("MetricUnit", "String"),
    ("Attributes", "Map(LowCardinality(String), String)"), ("StartTimeUnix", "DateTime64(9)"),
    ("TimeUnix", "DateTime64(9)"), ("Value", "Float64"), ("Flags", "UInt32"),
    ("Exemplars.FilteredAttributes", "Array(Map(LowCardinality(String), String))"),
    ("Exemplars.TimeUnix", "Array(DateTime64(9))"), ("Exemplars.Value", "Array(Float64)"),
    ("Exemplars.SpanId", "Array(String)"), ("Exemplars.TraceId", "Array(String)"),
]


@pytest.fixture(scope="module")
def chdb_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"chdb:{tmp_path_factory.mktemp('chdb')}"


@pytest.fixture(scope="module")
def engine(chdb_url: str):
    with connect(parse_url(chdb_url)) as eng:
        yield eng


def test_tables_have_the_exporter_columns(engine) -> None:
    tables = Tables(database="ddl")
    create_tables(engine, tables)
    create_tables(engine, tables)  # IF NOT EXISTS: a second run changes nothing
    # the sum table: the gauge's columns, then the exporter's two sum columns
    sum_columns = [*GAUGE_COLUMNS, ("AggregationTemporality", "Int32"), ("IsMonotonic", "Bool")]
    for ref, want in ((tables.traces_ref, TRACES_COLUMNS), (tables.gauge_ref, GAUGE_COLUMNS),
                      (tables.sum_ref, sum_columns)):
        got = [(r["name"], r["type"]) for r in engine.rows(f"DESCRIBE TABLE {ref}")]
        assert got == want
    show = engine.rows(f"SHOW CREATE TABLE {tables.traces_ref}")[0]["statement"]
    assert "TYPE text(tokenizer = 'array')" in show  # this engine is >= 26.2, as the exporter checks
    assert "PARTITION BY toDate(Timestamp)" in show and "ORDER BY (ServiceName, SpanName" in show
    names = {r["name"] for r in engine.rows("SHOW TABLES FROM ddl")}
    assert names == {"otel_traces", "otel_traces_trace_id_ts", "otel_traces_trace_id_ts_mv",
                     "otel_metrics_gauge", "otel_metrics_sum"}


def test_older_servers_get_the_bloom_filter_variant(engine) -> None:
    old = traces_ddl("ddl_old", "otel_traces", (25, 8))
    assert "bloom_filter(0.001)" in old[0] and "TYPE text" not in old[0]
    assert "TYPE text" in traces_ddl("x", "otel_traces", (26, 2))[0]
    engine.execute("CREATE DATABASE IF NOT EXISTS ddl_old")
    for statement in old:
        engine.execute(statement)
    got = [(r["name"], r["type"]) for r in engine.rows("DESCRIBE TABLE ddl_old.otel_traces")]
    assert got == TRACES_COLUMNS


def _anyvalue(kind: str, value: Any) -> dict[str, Any]:
    return {kind: value}


SPAN_REQUEST = {"resourceSpans": [{
    "resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "vlm"}},
        {"key": "service.instance.id", "value": {"stringValue": "pod-7"}},
        {"key": "n", "value": {"intValue": "3"}},
        {"key": "ok", "value": {"boolValue": True}},
        {"key": "f", "value": {"doubleValue": 0.5}},
        {"key": "big", "value": {"doubleValue": 1.5e21}},
        {"key": "arr", "value": {"arrayValue": {"values": [{"stringValue": "a<b"}, {"intValue": "1"}]}}},
    ]},
    "scopeSpans": [{"scope": {"name": "otel_stages", "version": "1.2"}, "spans": [
        {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331",
         "name": "request", "kind": 2, "startTimeUnixNano": "1790000000123456789",
         "endTimeUnixNano": "1790000000223456790", "traceState": "k=v",
         "status": {"code": 2, "message": "boom"},
         "attributes": [{"key": "request.seq", "value": {"intValue": "1"}}],
         "events": [{"timeUnixNano": "1790000000200000001", "name": "exception",
                     "attributes": [{"key": "exception.type", "value": {"stringValue": "E"}}]}],
         "links": [{"traceId": "11111111111111111111111111111111", "spanId": "2222222222222222"}]},
        {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "00f067aa0ba902b7",
         "parentSpanId": "b7ad6b7169203331", "name": "decode", "kind": "SPAN_KIND_INTERNAL",
         "startTimeUnixNano": "1790000000200000000", "endTimeUnixNano": "1790000000100000000"},
    ]}]}]}


def test_span_rows_are_what_the_exporter_writes(engine, tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps(SPAN_REQUEST) + "\n")
    tables = Tables(database="rows")
    summary = import_files(engine, tables, [path])
    assert (summary.spans, summary.problems) == (2, [])
    row = engine.rows(f"""SELECT toUnixTimestamp64Nano(Timestamp) AS ts, * EXCEPT Timestamp,
        arrayMap(t -> toUnixTimestamp64Nano(t), Events.Timestamp) AS event_ns
        FROM {tables.traces_ref} WHERE SpanName = 'request'""")[0]
    assert row["ts"] == 1790000000123456789 and row["Duration"] == 100000001
    assert (row["TraceId"], row["SpanId"], row["ParentSpanId"]) == (
        "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", "")
    assert (row["SpanKind"], row["StatusCode"], row["StatusMessage"]) == ("Server", "Error", "boom")
    assert (row["ScopeName"], row["ScopeVersion"], row["TraceState"]) == ("otel_stages", "1.2", "k=v")
    assert row["ServiceName"] == "vlm"
    assert row["ResourceAttributes"] == {
        "service.name": "vlm", "service.instance.id": "pod-7", "n": "3", "ok": "true", "f": "0.5",
        "big": "1.5e+21", "arr": '["a\\u003cb",1]'}
    assert row["SpanAttributes"] == {"request.seq": "1"}
    assert (row["Events.Name"], row["event_ns"]) == (["exception"], [1790000000200000001])
    assert row["Events.Attributes"] == [{"exception.type": "E"}]
    assert (row["Links.TraceId"], row["Links.SpanId"]) == (
        ["11111111111111111111111111111111"], ["2222222222222222"])
    child = engine.rows(f"SELECT SpanKind, Duration FROM {tables.traces_ref} WHERE SpanName = 'decode'")[0]
    # an end before the start: Go's uint64 subtraction wraps around, as the exporter stores it
    assert child == {"SpanKind": "Internal", "Duration": 2**64 - 100_000_000}


def test_gauge_rows_and_what_is_left_out(engine, tmp_path: Path) -> None:
    point = {"timeUnixNano": "1790000000000000007", "startTimeUnixNano": "0",
             "attributes": [{"key": "hw.id", "value": {"stringValue": "GPU-0"}}]}
    request = {"resourceMetrics": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "vlm"}}]}, "scopeMetrics": [
        {"scope": {"name": "otel_stages.gpu"}, "metrics": [
            {"name": "hw.gpu.memory.usage", "unit": "By", "gauge": {"dataPoints": [{**point, "asInt": "42"}]}},
            {"name": "hw.gpu.utilization", "unit": "1", "gauge": {"dataPoints": [point]}},
            {"name": "calls", "sum": {"aggregationTemporality": "AGGREGATION_TEMPORALITY_CUMULATIVE",
                                      "isMonotonic": True,
                                      "dataPoints": [{**point, "asInt": "1"}, {**point, "asInt": "2"}]}},
            {"name": "latency", "histogram": {"dataPoints": [{**point, "count": "1"}]}},
        ]}]}]}
    rows = export_request_rows(request, where="m.jsonl:1")
    assert rows.skipped_points == 1
    assert [(r["Value"], r["AggregationTemporality"], r["IsMonotonic"]) for r in rows.sum_points] == [
        (1.0, 2, True), (2.0, 2, True)]
    assert rows.problems == [
        "m.jsonl:1: resourceMetrics[0]: metric 'hw.gpu.utilization' point 0: no asDouble/asInt"
        " value (the exporter would store 0.0)"]
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(request) + "\n")
    tables = Tables(database="gauge")
    summary = import_files(engine, tables, [path])
    assert (summary.gauge_points, summary.sum_points, summary.skipped_points) == (1, 2, 1)
    assert engine.rows(f"SELECT sum(Value) AS v, any(AggregationTemporality) AS a FROM {tables.sum_ref}"
                       ) == [{"v": 3, "a": 2}]
    got = engine.rows(f"""SELECT MetricName, MetricUnit, Value, Attributes, ServiceName, ScopeName,
        toUnixTimestamp64Nano(TimeUnix) AS t, toUnixTimestamp64Nano(StartTimeUnix) AS s
        FROM {tables.gauge_ref}""")
    assert got == [{"MetricName": "hw.gpu.memory.usage", "MetricUnit": "By", "Value": 42,
                    "Attributes": {"hw.id": "GPU-0"}, "ServiceName": "vlm",
                    "ScopeName": "otel_stages.gpu", "t": 1790000000000000007, "s": 0}]


@pytest.mark.parametrize(("value", "text"), [
    (0.0427, "0.0427"), (3.0, "3"), (-2.5, "-2.5"), (1e-7, "1e-7"), (1e-6, "0.000001"),
    (1.5e21, "1.5e+21"), (1e20, "100000000000000000000"), (123456789012345678.0, "123456789012345680"),
    (float("nan"), "json: unsupported value: NaN"), (float("-inf"), "json: unsupported value: -Inf"),
])
def test_doubles_are_written_as_pdata_writes_them(value: float, text: str) -> None:
    assert go_float(value) == text


def test_attribute_values_as_strings() -> None:
    assert as_string({"boolValue": False}) == "false"
    assert as_string({"intValue": 7}) == "7"
    assert as_string({}) == ""
    assert as_string({"bytesValue": "AAE="}) == "AAE="
    assert as_string({"kvlistValue": {"values": [{"key": "z", "value": {"doubleValue": 2.0}},
                                                 {"key": "a", "value": {"stringValue": "&"}}]}}
                     ) == '{"a":"\\u0026","z":2}'


def test_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    target = parse_url("https://alice:s3cret@ch.example:9440/otel", environ={})
    assert (target.kind, target.host, target.port, target.secure, target.database) == (
        "http", "ch.example", 9440, True, "otel")
    assert (target.username, target.password) == ("alice", "s3cret")
    assert "s3cret" not in target.display
    env = parse_url("http://ch:8123", environ={"CLICKHOUSE_USER": "bob", "CLICKHOUSE_PASSWORD": "pw"})
    assert (env.port, env.database, env.username, env.password) == (8123, "default", "bob", "pw")
    assert parse_url("chdb:./data").path == "./data"
    for bad in ("chdb:", "clickhouse://h:9000", "http:///db", "http://h/evil;drop"):
        with pytest.raises(ValueError):
            parse_url(bad)
    with pytest.raises(ValueError):
        quote_ident("otel_traces` DROP")


def test_an_unreachable_server_is_a_clear_error() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SourceError, match=f"http://127.0.0.1:{port}/default: cannot connect"):
        with connect(parse_url(f"http://127.0.0.1:{port}")):
            pass
    assert main(["report", "--clickhouse", f"http://127.0.0.1:{port}"]) == 1


def test_cli_import_then_report(engine, chdb_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = TRACES / "gpu_busy.otlp.jsonl"
    assert main(["import", str(scenario), "--clickhouse", chdb_url,
                 "--traces-table", "cli.spans", "--gauge-table", "cli.gauge"]) == 0
    out = capsys.readouterr()
    assert "imported 180 spans, 255 gauge points and 0 sum points from 1 files" in out.out
    assert out.err == ""
    assert main(["report", "--clickhouse", chdb_url, "--traces-table", "cli.spans",
                 "--gauge-table", "cli.gauge", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"] == "clickhouse" and report["requests"] == 30
    assert report["stages"]["forward"]["count"] == 29
    assert report["aggregates"]["gpu"]["source"] == "metrics"
    assert (report["verdict"]["cause"], report["verdict"]["stage"]) == ("gpu_busy", "forward")
    assert main(["report", "--clickhouse", chdb_url, "--traces-table", "cli.spans",
                 "--gauge-table", "cli.gauge"]) == 0
    text = capsys.readouterr().out
    assert "30 requests" in text and "forward" in text and "GPU utilization" in text
    assert "verdict: gpu_busy (forward)" in text


@pytest.mark.parametrize("argv", [
    ["report", "x.jsonl", "--clickhouse", "chdb:/tmp/x"],
    ["report", "--clickhouse", "chdb:/tmp/x", "--limit", "5"],
    ["report", "--clickhouse", "chdb:/tmp/x", "--stage-map", "triton"],  # SQL cannot apply maps
    # options the SQL does not apply are refused, not silently ignored
    ["report", "--clickhouse", "chdb:/tmp/x", "--last-run"],
    ["report", "--clickhouse", "chdb:/tmp/x", "--html", "r.html"],
    ["report", "--clickhouse", "chdb:/tmp/x", "--fail-on-regression", "5"],
    ["report", "--clickhouse", "chdb:/tmp/x", "--traces-table", "a.b.c"],
    ["report", "--clickhouse", "ftp://h"],
    ["report", "--traces-table", "t"],
    ["import", "x.jsonl", "--clickhouse", "chdb:/tmp/x", "--traces-table", "a.t", "--gauge-table", "b.g"],
])
def test_cli_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    if "--stage-map" in argv:
        assert "--stage-map is not applied by the ClickHouse SQL" in err


def test_cli_import_of_nothing_fails(chdb_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(tmp_path / "missing.jsonl"), "--clickhouse", chdb_url]) == 1
    err = capsys.readouterr().err
    assert "no such file or folder" in err and "nothing imported" in err


class _Connection:
    """The chDB connection with a log of the statements, refusing ``refuse``."""

    def __init__(self, conn: Any, refuse: str | None) -> None:
        self.conn, self.refuse, self.statements = conn, refuse, []  # type: ignore[var-annotated]

    def query(self, text: str, *args: Any, **kwargs: Any) -> Any:
        self.statements.append(text)
        if text == self.refuse:
            raise RuntimeError(f"Code: 48. DB::Exception: {text} is not supported")
        return self.conn.query(text, *args, **kwargs)


@pytest.mark.parametrize("refuse", [None, "SYSTEM JEMALLOC PURGE"])
def test_chdb_hands_freed_memory_back_after_each_statement(engine, refuse: str | None) -> None:
    # the embedded engine shares the report's process: its allocator's freed pages are purged
    # after every statement (the 1 GB target of benchmarks/clickhouse_scale.py); a chDB build
    # that refuses the command is asked once, and the statements still run
    real = engine._conn
    engine._conn = spy = _Connection(real, refuse)
    try:
        assert engine.rows("SELECT 1 AS one") == [{"one": 1}]
        engine.execute("SELECT 2")
        assert engine.rows("SELECT 3 AS three") == [{"three": 3}]
    finally:
        engine._conn = real
        engine._purge = True
    purges = [s for s in spy.statements if s == "SYSTEM JEMALLOC PURGE"]
    assert len(purges) == (1 if refuse else 3)
    assert spy.statements[-1] == ("SELECT 3 AS three" if refuse else "SYSTEM JEMALLOC PURGE")
