"""``otel-stages report --clickhouse`` / ``import`` on what users actually point them at, on real
chDB: a folder that does not exist or holds no database (nothing is created), ``~``, a file, a
folder another process has open, databases with only traces or tables of another schema, and
compressed files and stdin for ``import``. Each answer is one clear line, never a traceback or the
engine's raw SQL error."""

from __future__ import annotations

import gzip
import io
import json
import os
import socket
import subprocess
import sys
import textwrap
from dataclasses import replace
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
    IN_USE,
    Tables,
    connect,
    fetch_aggregates,
    no_table,
    parse_url,
)
from otel_stages.analysis.clickhouse_figures import report_dict
from otel_stages.analysis.clickhouse_result import FleetAggregates
from otel_stages.analysis.clickhouse_sql import AggregateQuery
from otel_stages.cli import main
from otel_stages.commands.clickhouse_report import _pct, text

TRACES = Path(__file__).parent / "data" / "traces"
GPU_BUSY = TRACES / "gpu_busy.otlp.jsonl"
#: What importing gpu_busy.otlp.jsonl writes.
GPU_BUSY_IMPORTED = "imported 180 spans, 255 gauge points and 0 sum points from 1 files"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "DB::Exception" not in out.err
    return code, out.out, out.err


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A chDB folder with gpu_busy imported into the default tables."""
    url = f"chdb:{tmp_path_factory.mktemp('chdb') / 'db'}"
    assert main(["import", str(GPU_BUSY), "--clickhouse", url]) == 0
    return url


def _tables(url: str, database: str = "default") -> list[str]:
    with connect(parse_url(url)) as engine:
        return [r["name"] for r in engine.rows(
            "SELECT name FROM system.tables WHERE database = {d:String} ORDER BY name",
            {"d": database})]


# --- A: where the report looks --------------------------------------------------------------


def test_a_report_on_a_missing_folder_says_so_and_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    code, out, err = _run(["report", "--clickhouse", f"chdb:{missing}"], capsys)
    assert code == 1 and out == ""
    assert err.strip() == (f"otel-stages: error: chdb:{missing}: no otel_traces table here (run"
                           f" `otel-stages import FILE... --clickhouse chdb:{missing}` first)")
    assert not missing.exists()
    empty = tmp_path / "empty"  # a folder without a database: left as it is
    empty.mkdir()
    code, _, err = _run(["report", "--clickhouse", f"chdb:{empty}", "--traces-table", "spans"],
                        capsys)
    assert code == 1 and "no spans table here" in err and "--traces-table spans` first" in err
    assert list(empty.iterdir()) == []


def test_chdb_paths_expand_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert parse_url("chdb:~/db").path == str(tmp_path / "home" / "db")
    code, _, err = _run(["report", "--clickhouse", "chdb:~/db"], capsys)
    assert code == 1 and "chdb:~/db: no otel_traces table here" in err
    assert not (tmp_path / "~").exists() and not (tmp_path / "home").exists()
    assert main(["import", str(GPU_BUSY), "--clickhouse", "chdb:~/db"]) == 0
    assert (tmp_path / "home" / "db" / "metadata").is_dir() and not (tmp_path / "~").exists()


@pytest.mark.parametrize("command", ["report", "import"])
def test_a_chdb_path_that_is_a_file_is_not_a_folder(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("keep me\n")
    argv = ["report"] if command == "report" else ["import", str(GPU_BUSY)]
    code, _, err = _run([*argv, "--clickhouse", f"chdb:{file}"], capsys)
    assert code == 1
    assert f"chdb:{file}: {file} is a file, not a folder" in err and "Errno" not in err
    assert file.read_text() == "keep me\n"


def test_a_missing_traces_table_in_a_database_is_named(
        imported: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["report", "--clickhouse", imported, "--traces-table", "other.spans",
                         "--gauge-table", "other.gauge"], capsys)
    assert code == 1 and f"{imported}: no other.spans table here" in err
    with connect(parse_url(imported)) as engine:
        assert engine.rows("EXISTS DATABASE other")[0]["result"] == 0


def test_the_missing_table_message_for_a_server_names_the_table_flag() -> None:
    text_ = no_table("http://ch:8123/otel", "otel.otel_traces")
    assert text_.startswith("http://ch:8123/otel: no otel.otel_traces table here (")
    assert "--traces-table" in text_ and "Collector" in text_


# --- B: a database with traces only ---------------------------------------------------------


@pytest.mark.parametrize("scenario", ["gpu_busy", "gpu_memory_pressure", "gc_pause"])
def test_a_traces_only_database_reports_without_gpu_data(
        scenario: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # gpu_memory_pressure reads the gauge for memory, gc_pause's spans carry signals (the
    # container CPU limit is a gauge): every statement over the gauge table meets its absence
    url = f"chdb:{tmp_path / 'db'}"
    assert main(["import", str(TRACES / f"{scenario}.otlp.jsonl"), "--clickhouse", url]) == 0
    with connect(parse_url(url)) as engine:
        engine.execute("DROP TABLE `default`.`otel_metrics_gauge`")
    capsys.readouterr()
    code, out, err = _run(["report", "--clickhouse", url, "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    gauge = [p for p in report["problems"] if "otel_metrics_gauge" in p]
    assert gauge == [p for p in report["problems"] if "there is no `default`.`otel_metrics_gauge`"
                     " table: GPU utilization and memory" in p] != []
    assert f"warning: {gauge[0]}" in err
    assert report["aggregates"]["gpu"]["source"] != "metrics"
    assert report["requests"] > 0 and report["verdict"]["cause"]


def test_a_gauge_table_named_wrongly_or_of_another_schema_is_a_problem(
        imported: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["report", "--clickhouse", imported, "--json", "--gauge-table", "foo"],
                        capsys)
    assert code == 0
    assert any(p.startswith("there is no `default`.`foo` table") for p in json.loads(out)["problems"])
    with connect(parse_url(imported)) as engine:
        engine.execute("CREATE TABLE IF NOT EXISTS odd_gauge (n Int32) ENGINE = MergeTree ORDER BY n")
    code, out, _ = _run(["report", "--clickhouse", imported, "--json", "--gauge-table",
                         "odd_gauge"], capsys)
    assert code == 0
    assert any(p.startswith("`default`.`odd_gauge` lacks the columns ServiceName,")
               for p in json.loads(out)["problems"])
    code, out, _ = _run(["report", "--clickhouse", imported, "--json"], capsys)
    report = json.loads(out)
    assert report["aggregates"]["gpu"]["source"] == "metrics"  # the real table is still read
    assert not any("otel_metrics_gauge" in p for p in report["problems"])


def test_a_sum_table_of_another_schema_is_a_problem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # gc_pause's spans carry signals, so the report reads the sum table (throttling, pressure)
    url = f"chdb:{tmp_path / 'db'}"
    assert main(["import", str(TRACES / "gc_pause.otlp.jsonl"), "--clickhouse", url]) == 0
    with connect(parse_url(url)) as engine:
        engine.execute("DROP TABLE `default`.`otel_metrics_sum`")
        engine.execute("CREATE TABLE `default`.`otel_metrics_sum` (n Int32) ENGINE = MergeTree"
                       " ORDER BY n")
    capsys.readouterr()
    code, out, _ = _run(["report", "--clickhouse", url, "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["verdict"]["cause"] == "gc_pause"
    assert any(p.startswith("stage spans carry mechanism signals but `default`.`otel_metrics_sum`"
                            " lacks the columns ServiceName,") and "throttling" in p
               for p in report["problems"])


# --- C: a folder another process has open ----------------------------------------------------


def test_a_folder_in_use_by_another_process_is_said_so(
        imported: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = parse_url(imported).path
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, chdb
            conn = chdb.connect({path!r})
            print("open", flush=True)
            sys.stdin.read()
            conn.close()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        # in a process of its own: a failed start of the engine stays out of this one
        for argv in (["report"], ["import", str(GPU_BUSY)]):
            done = subprocess.run(
                [sys.executable, "-c", "import sys; from otel_stages.cli import main;"
                 " sys.exit(main(sys.argv[1:]))", *argv, "--clickhouse", imported],
                capture_output=True, text=True, timeout=120)
            assert done.returncode == 1 and done.stdout == ""
            assert done.stderr == "otel-stages: error: " + IN_USE.format(display=imported) + "\n"
    finally:
        holder.communicate("", timeout=60)


# --- D: what import reads -------------------------------------------------------------------


def _zstd_records(data: bytes) -> bytes:
    """The Collector file exporter's compressed framing: each line a zstd frame after its 4-byte
    big-endian length (exporter/fileexporter file_writer.go, exportMessageAsBuffer)."""
    import zstandard

    out = b""
    for line in data.splitlines():
        frame = zstandard.ZstdCompressor().compress(line)
        out += len(frame).to_bytes(4, "big") + frame
    return out


@pytest.mark.parametrize("kind", ["gzip", "zstd", "zstd-records", "folder"])
def test_import_reads_compressed_files(kind: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    import zstandard

    data = GPU_BUSY.read_bytes()
    if kind == "gzip":
        path = tmp_path / "t.jsonl.gz"
        path.write_bytes(gzip.compress(data))
    elif kind == "zstd":
        path = tmp_path / "t.jsonl.zst"
        path.write_bytes(zstandard.ZstdCompressor().compress(data))
    elif kind == "zstd-records":
        path = tmp_path / "t.zst"
        path.write_bytes(_zstd_records(data))
    else:  # a folder is searched for the compressed names too, as the file report does
        path = tmp_path / "in"
        path.mkdir()
        (path / "t.json.gz").write_bytes(gzip.compress(data))
    code, out, err = _run(["import", str(path), "--clickhouse", f"chdb:{tmp_path / 'db'}"], capsys)
    assert code == 0 and err == "" and GPU_BUSY_IMPORTED in out


def test_import_of_cut_short_gzip_keeps_what_came_before(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    packed = gzip.compress(GPU_BUSY.read_bytes())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(packed[: len(packed) * 2 // 3])
    code, out, err = _run(["import", str(path), "--clickhouse", f"chdb:{tmp_path / 'db'}"], capsys)
    assert code == 0 and "imported " in out
    assert f"{path}: gzip data cut short or damaged" in err
    assert err.count("not valid JSON") <= 1  # the one line the cut went through


def test_import_reads_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(GPU_BUSY.read_bytes()))))
    code, out, err = _run(["import", "-", "--clickhouse", f"chdb:{tmp_path / 'db'}"], capsys)
    assert code == 0 and err == "" and GPU_BUSY_IMPORTED in out


# --- E: tables of another schema ------------------------------------------------------------


def test_import_into_a_table_of_another_schema_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"chdb:{tmp_path / 'db'}"
    with connect(parse_url(url)) as engine:
        engine.execute("CREATE TABLE otel_traces (Timestamp DateTime64(9), Name String)"
                       " ENGINE = MergeTree ORDER BY Timestamp")
    before = _tables(url)
    code, out, err = _run(["import", str(GPU_BUSY), "--clickhouse", url], capsys)
    assert code == 1 and out == ""
    assert "`default`.`otel_traces` lacks TraceId, SpanId, ParentSpanId" in err
    assert "nothing imported" in err and "Unknown" not in err
    assert _tables(url) == before == ["otel_traces"]
    code, _, err = _run(["report", "--clickhouse", url], capsys)
    assert code == 1 and "otel_traces lacks the columns TraceId, SpanId" in err


# --- F: the small things ---------------------------------------------------------------------


def test_percent_plural_and_comparison(imported: str) -> None:
    assert (_pct(-0.004), _pct(0.0), _pct(-0.2), _pct(0.5), _pct(None)) == (
        "0%", "0%", "-20%", "50%", "-")
    with connect(parse_url(imported)) as engine:
        agg: FleetAggregates = fetch_aggregates(engine, Tables(), AggregateQuery(), url=imported)
    assert agg.counts.runs == 1 and "; 1 process;" in text(agg)
    assert "; 2 processes;" in text(replace(agg, counts=replace(agg.counts, runs=2)))
    negative = replace(agg, stages={n: replace(s, explained=-0.001) for n, s in agg.stages.items()})
    assert "-0%" not in text(negative) and "-0%" in f"{-0.001:.0%}"
    report = report_dict(agg)  # DESIGN.md section 3: null without a baseline
    assert "comparison" in report and report["comparison"] is None


def test_since_without_a_source_names_clickhouse(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["report", str(GPU_BUSY), "--since", "1h"], capsys)
    assert code == 2 and "--since goes with --jaeger, --tempo, --prometheus or --clickhouse" in err


def test_a_dead_server_is_one_error_line(capfd: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["report", "--clickhouse", f"http://127.0.0.1:{port}"]) == 1
    err = capfd.readouterr().err
    lines: list[Any] = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"otel-stages: error: http://127.0.0.1:{port}/default: cannot connect")


def test_the_column_lists_are_the_exporter_tables(imported: str) -> None:
    """The columns import requires and the report reads are those the exporter's DDL creates, and
    the stand-in for a missing metrics table has the read ones with the same types."""
    from otel_stages.analysis import clickhouse_schema as schema

    with connect(parse_url(imported)) as engine:
        def columns(table: str) -> dict[str, str]:
            return {r["name"]: r["type"] for r in engine.rows(
                "SELECT name, type FROM system.columns WHERE database = 'default'"
                " AND table = {t:String} AND default_kind != 'ALIAS'", {"t": table})}

        traces, gauge, sums = columns("otel_traces"), columns("otel_metrics_gauge"), columns(
            "otel_metrics_sum")
        stand_in = {r["name"]: r["type"] for r in engine.rows(
            f"DESCRIBE TABLE {schema.EMPTY_METRICS}")}
    assert list(traces) == list(schema.TRACES_COLUMNS)
    assert list(gauge) == list(schema.GAUGE_COLUMNS) and list(sums) == list(schema.SUM_COLUMNS)
    assert set(schema.TRACES_READ_COLUMNS) <= set(traces)
    assert stand_in == {c: gauge[c] for c in schema.METRICS_READ_COLUMNS} == {
        c: sums[c] for c in schema.METRICS_READ_COLUMNS}
