"""Statements whose tables would be empty are skipped (``clickhouse.SKIP_EMPTY``): the tables
lined up with the GPU points where the window holds none, those over custom stage spans and
nested groups where none was read (the common case): a third of a small report's planning. The
report is the one the full set of statements gives (real chDB), the empty table has the columns
the full statement makes, and runs with GPU points run every GPU statement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("chdb")

from otel_stages import semconv
from otel_stages.analysis import clickhouse
from otel_stages.analysis.clickhouse import Tables, connect, fetch_aggregates, import_files, parse_url
from otel_stages.analysis.clickhouse_figures import report_dict
from otel_stages.analysis.clickhouse_queries import GPU_PAIRS_TABLE
from otel_stages.analysis.clickhouse_requests import EXTRAS_SCHEMA, EXTRAS_TABLE
from otel_stages.analysis.clickhouse_sql import AggregateQuery

TRACES = Path(__file__).parent / "data" / "traces"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    with connect(parse_url(f"chdb:{tmp_path_factory.mktemp('chdb')}")) as eng:
        yield eng


def _without_metrics(source: Path, target: Path, *, span_readings: bool = False) -> Path:
    """``source``'s OTLP/JSON lines less its metric documents (the spans alone); with
    ``span_readings`` each forward span carries its GPU readings as attributes (the sampler's
    ``gpu.utilization.mean`` / ``gpu.sample_count``), slower forwards on a busier GPU."""
    docs = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    docs = [d for d in docs if "resourceMetrics" not in d]
    if span_readings:
        for doc in docs:
            for rs in doc.get("resourceSpans", []):
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        if span["name"] == "forward":
                            ms = (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e6
                            span.setdefault("attributes", []).extend([
                                {"key": semconv.GPU_UTILIZATION_MEAN,
                                 "value": {"doubleValue": min(0.99, ms / 150)}},
                                {"key": semconv.GPU_SAMPLE_COUNT, "value": {"intValue": "5"}}])
    target.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return target


def _report(engine: Any, database: str, statements: list[str],
            extras: list[list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The report's JSON on ``database``, each statement's text appended to ``statements`` (and
    the columns of the extras table, as made, to ``extras``)."""
    rows, execute = engine.rows, engine.execute

    def counted_rows(query: str, *args: Any, **kwargs: Any) -> Any:
        statements.append(query)
        return rows(query, *args, **kwargs)

    def counted_execute(query: str, *args: Any, **kwargs: Any) -> Any:
        statements.append(query)
        done = execute(query, *args, **kwargs)
        if extras is not None and query.startswith(f"CREATE TEMPORARY TABLE {EXTRAS_TABLE}"):
            extras.append([{k: r[k] for k in ("name", "type")}
                           for r in rows(f"DESCRIBE TABLE {EXTRAS_TABLE}")])
        return done

    engine.rows, engine.execute = counted_rows, counted_execute
    try:
        agg = fetch_aggregates(engine, Tables(database=database), AggregateQuery())
    finally:
        engine.rows, engine.execute = rows, execute
    return json.loads(json.dumps(report_dict(agg)))


@pytest.mark.parametrize("span_readings", [False, True])
def test_a_run_without_gpu_points_skips_their_tables_and_reports_the_same(
        engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, span_readings: bool) -> None:
    """The spans alone (the forward spans' own GPU readings or none), no custom stage span: the
    tables lined up with the points and those over custom spans are not built, and the report is
    the full statements' to the byte."""
    path = _without_metrics(TRACES / "stable.otlp.jsonl", tmp_path / "spans.jsonl",
                            span_readings=span_readings)
    database = f"g_spans_{int(span_readings)}"
    assert import_files(engine, Tables(database=database), [path]).problems == []
    skipped: list[str] = []
    extras: list[list[dict[str, Any]]] = []
    got = _report(engine, database, skipped, extras)
    monkeypatch.setattr(clickhouse, "SKIP_EMPTY", False)
    full: list[str] = []
    want = _report(engine, database, full, extras)
    assert got == want
    assert got["gpu"]["source"] == ("span_attributes" if span_readings else None)
    assert not [q for q in skipped if GPU_PAIRS_TABLE in q and "DROP" not in q]
    assert [q for q in full if GPU_PAIRS_TABLE in q and "DROP" not in q]
    # the extras table: made empty from its columns, or by its statement, the same columns
    made = [q for q in skipped if q.startswith(f"CREATE TEMPORARY TABLE {EXTRAS_TABLE}")]
    assert made == [f"CREATE TEMPORARY TABLE {EXTRAS_TABLE} ({EXTRAS_SCHEMA}) ENGINE = Memory"]
    assert len(extras) == 2 and extras[0] == extras[1]
    assert len(skipped) < len(full) - 10


def test_a_run_with_gpu_points_reads_them(engine: Any) -> None:
    """GPU points in the window: every GPU table is built and the metric points judge the GPU."""
    assert import_files(engine, Tables(database="g_points"), [TRACES / "stable.otlp.jsonl"]).problems == []
    statements: list[str] = []
    got = _report(engine, "g_points", statements)
    assert got["gpu"]["source"] == "metrics"
    assert [q for q in statements if GPU_PAIRS_TABLE in q and "DROP" not in q]
