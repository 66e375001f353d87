"""Fleet analysis in ClickHouse, on real chDB: every handed scenario imported as the Collector's
``clickhouse`` exporter writes it, aggregated in SQL, and compared with the Python path
(``find_requests`` + ``stage_stats`` + ``gpu_evidence`` on warm requests) on the same spans.

chDB runs one data folder per process, so the whole module shares one (``chdb_path``) and each
scenario gets a database of its own.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("chdb", reason="needs the clickhouse extra (pip install -e '.[test]')")

from otel_stages.analysis import Recording, load_paths
from otel_stages.analysis.clickhouse import Tables, connect, fetch_aggregates, import_files, parse_url
from otel_stages.analysis.clickhouse_result import FleetAggregates, ordered_stages
from otel_stages.analysis.clickhouse_sql import (
    EXACT_RELATIVE_TOLERANCE,
    MAX_SPAN_DURATION_NS,
    MIN_SPAN_START_NS,
    AggregateQuery,
)
from otel_stages.analysis.gpu import gpu_evidence
from otel_stages.analysis.requests import Request, find_requests
from otel_stages.analysis.stats import correlation, distribution, percentile, stage_stats

TRACES = Path(__file__).parent / "data" / "traces"
SCENARIOS = sorted(TRACES.glob("*.otlp.jsonl")) + sorted((TRACES / "trust").glob("*.otlp.jsonl"))
TRUST_ANSWERS = json.loads((TRACES / "trust" / "answers.json").read_text())
TOL = {"rel": EXACT_RELATIVE_TOLERANCE, "abs": 1e-9}


def _db(path: Path) -> str:
    return "s_" + path.name.removesuffix(".otlp.jsonl").replace(".", "_")


@pytest.fixture(scope="module")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"chdb:{tmp_path_factory.mktemp('chdb')}"


@pytest.fixture(scope="module")
def engine(chdb_path: str):
    with connect(parse_url(chdb_path)) as eng:
        yield eng


def aggregate(engine: Any, files: list[Path], database: str, **query: Any) -> FleetAggregates:
    tables = Tables(database=database)
    summary = import_files(engine, tables, files)
    assert summary.problems == [] and summary.spans > 0
    return fetch_aggregates(engine, tables, AggregateQuery(**query))


@pytest.fixture(scope="module")
def scenario_results(engine) -> dict[str, FleetAggregates]:
    return {_db(p): aggregate(engine, [p], _db(p)) for p in SCENARIOS}


# --- the Python path, on the spans the SQL keeps ------------------------------------------------


def complete_part(recording: Recording) -> Recording:
    """The recording without spans the SQL leaves out (start before 2000, over a day) and without
    spans whose parent never arrived (the SQL counts those as incomplete, not as requests)."""
    spans = [s for s in recording.spans
             if s.start_ns >= MIN_SPAN_START_NS and s.end_ns - s.start_ns <= MAX_SPAN_DURATION_NS]
    ids = {(s.trace_id, s.span_id) for s in spans}
    spans = [s for s in spans if s.parent_span_id is None or (s.trace_id, s.parent_span_id) in ids]
    return Recording(spans=spans, metrics=recording.metrics)


def covered_ms(req: Request) -> float:
    start, end = req.start_ns, req.start_ns + round(req.total_ms * 1e6)
    covered, reach = 0, start
    for s, e in sorted((s.start_ns, s.end_ns) for s in req.spans):
        covered += max(0, min(e, end) - max(s, reach, start))
        reach = max(reach, e)
    return covered / 1e6


def decode_format(req: Request) -> str | None:
    fmt = req.stage_attribute("decode", "image.format")
    return str(fmt) if fmt else None


def check_against_python(agg: FleetAggregates, recording: Recording) -> None:
    requests = find_requests(complete_part(recording).spans)
    warm = [r for r in requests if not r.cold and not r.error]
    cold = [r for r in requests if r.cold]
    c = agg.counts
    assert (c.requests, c.warm, c.cold, c.failed) == (
        len(requests), len(warm), len(cold), sum(r.error for r in requests))

    totals = [r.total_ms for r in warm]
    want_total = distribution(totals)
    assert agg.total is not None and agg.total.count == want_total.count
    for key in ("min_ms", "p5_ms", "median_ms", "p95_ms", "max_ms"):
        assert getattr(agg.total, key) == pytest.approx(getattr(want_total, key), **TOL), key
    assert agg.total.p25_ms == pytest.approx(percentile(totals, 25), **TOL)

    want_stages = stage_stats([r.stages_ms for r in warm], totals)
    assert list(agg.stages) == list(want_stages)
    for name, want in want_stages.items():
        got = agg.stages[name]
        assert got.ran.count == want.count
        for key in ("min_ms", "p5_ms", "median_ms", "p95_ms", "max_ms", "swing_ms"):
            assert getattr(got.ran, key) == pytest.approx(getattr(want, key), **TOL), (name, key)
        assert got.share_of_median == pytest.approx(want.share, **TOL)
        assert got.explained == pytest.approx(want.explained, rel=1e-6, abs=1e-9), name

    unaccounted = [r.total_ms - covered_ms(r) for r in warm]
    assert agg.unaccounted is not None
    assert agg.unaccounted.median_ms == pytest.approx(statistics.median(unaccounted), abs=1e-6)
    assert agg.unaccounted.max_ms == pytest.approx(max(unaccounted), abs=1e-6)
    assert agg.unaccounted_explained == pytest.approx(
        statistics.covariance(unaccounted, totals) / statistics.variance(totals), rel=1e-6, abs=1e-9)

    for name, got in agg.stages.items():  # does the stage's cost follow the input's size?
        sized = [r for r in warm if name in r.stages_ms and r.pixels is not None]
        for attr, size in (("pixels_correlation", [r.pixels for r in sized]),
                           ("bytes_correlation", [r.image_bytes for r in sized])):
            pairs = [(r.stages_ms[name], b) for r, b in zip(sized, size) if b is not None]
            want_corr = correlation([a for a, _ in pairs], [float(b) for _, b in pairs])
            value = getattr(got, attr)
            assert value == (None if want_corr is None else pytest.approx(want_corr, abs=1e-9)), (name, attr)

    gpu = gpu_evidence(warm, recording.metrics)
    assert agg.gpu.source == gpu.source
    assert (agg.gpu.samples, agg.gpu.forwards, agg.gpu.forwards_covered) == (
        gpu.samples, gpu.forwards, gpu.forwards_covered)
    for key in ("mean_utilization", "slow_mean_utilization", "fast_mean_utilization"):
        want = getattr(gpu, key)
        assert getattr(agg.gpu, key) == (None if want is None else pytest.approx(want, **TOL)), key
    assert agg.gpu.hw_id == gpu.hw_id

    if cold:
        assert agg.cold_start is not None and agg.cold_start.total.count == len(cold)
        assert agg.cold_start.total.median_ms == pytest.approx(
            statistics.median(r.total_ms for r in cold), **TOL)
        for name, ms in agg.cold_start.stages_median_ms.items():
            assert ms == pytest.approx(statistics.median(
                r.stages_ms[name] for r in cold if name in r.stages_ms), **TOL)
    else:
        assert agg.cold_start is None

    cohorts: dict[tuple[Any, ...], list[float]] = {}
    for r in warm:
        if r.image_width is not None and r.image_height is not None:
            cohorts.setdefault((r.image_width, r.image_height, decode_format(r)), []).append(r.total_ms)
    assert agg.cohorts_total == len(cohorts)
    by_size = sorted(cohorts.items(), key=lambda kv: -len(kv[1]))
    assert [len(v) for _, v in by_size][: len(agg.cohorts)] == [k.total.count for k in agg.cohorts]
    for cohort in agg.cohorts:
        values = cohorts[(cohort.width, cohort.height, cohort.format)]
        assert cohort.total.median_ms == pytest.approx(statistics.median(values), **TOL)
    known = [t for v in cohorts.values() for t in v]
    if len(cohorts) >= 2:
        ss_total = sum((t - statistics.fmean(known)) ** 2 for t in known)
        ss_within = sum((t - statistics.fmean(v)) ** 2 for v in cohorts.values() for t in v)
        assert agg.input_mix_explains == pytest.approx(1 - ss_within / ss_total, rel=1e-6)
    else:
        assert agg.input_mix_explains is None


@pytest.mark.parametrize("path", SCENARIOS, ids=_db)
def test_scenario_aggregates_equal_the_python_path(path: Path, scenario_results) -> None:
    check_against_python(scenario_results[_db(path)], load_paths([path]))


def test_incomplete_traces_orphans_and_1970_span(scenario_results) -> None:
    agg = scenario_results["s_incomplete_traces"]
    expected = TRUST_ANSWERS["incomplete_traces"]
    assert agg.counts.requests == expected["requests"]
    assert agg.counts.incomplete >= expected["incomplete_min"]
    assert agg.counts.odd_spans == 1
    assert any("1970-01-01" in p and "'forward'" in p for p in agg.problems)
    assert any("never arrived" in p for p in agg.problems)
    for name, limit in expected["stage_max_ms"].items():
        assert agg.stages[name].ran.max_ms < 10 * limit


def test_mixed_cold_start_compares_with_the_same_input(scenario_results) -> None:
    agg = scenario_results["s_mixed_cold_start"]
    expected = TRUST_ANSWERS["mixed_cold_start"]
    assert agg.cold_start is not None
    (same,) = [c for c in agg.cold_start.by_input if c.width is not None]
    assert same.key.startswith(expected["cold_start"]["cohort"])
    assert same.warm_requests >= 5
    warm_same = [r for r in find_requests(load_paths([TRACES / "trust" / "mixed_cold_start.otlp.jsonl"]).spans)
                 if not r.cold and not r.error and (r.image_width, r.image_height) == (same.width, same.height)]
    assert same.warm_stages_median_ms == pytest.approx(
        {n: statistics.median(r.stages_ms[n] for r in warm_same if n in r.stages_ms)
         for n in warm_same[0].stages_ms})
    assert same.cold_median_total_ms / same.warm_median_total_ms >= expected["cold_start"]["min_ratio"]
    assert len(agg.cohorts) >= expected["min_cohorts"]
    assert agg.input_mix_explains is not None
    assert agg.input_mix_explains >= expected["min_input_mix_explains"]


def test_shares_of_time_and_unaccounted_add_up(scenario_results) -> None:
    for agg in scenario_results.values():
        assert agg.total is not None and agg.unaccounted is not None
        shares = sum(s.share_of_time for s in agg.stages.values())
        assert shares + agg.unaccounted.sum_ms / agg.total.sum_ms == pytest.approx(1.0, abs=1e-9)
    gaps = scenario_results["s_shares_gaps"].unaccounted
    assert gaps is not None and 10 < gaps.median_ms < 20  # "about 12 ms between stage spans"


def test_stage_order_is_the_pipeline_order() -> None:
    assert ordered_stages(["zeta", "forward", "alpha", "download"]) == [
        "download", "forward", "alpha", "zeta"]


@pytest.mark.slow
def test_scale_benchmark_smoke_run() -> None:
    """The benchmark's generator, report and client steps run end to end (60 000 spans): every
    generated request is found and warm but the 20 cold ones, all five stages, GPU samples."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "clickhouse_scale.py"
    out = subprocess.run([sys.executable, str(script), "--smoke"], capture_output=True, text=True,
                         timeout=300, check=True)
    result = json.loads(out.stdout)
    (report,) = result["reports"]
    assert (result["fill"]["spans"], report["requests"], report["warm"]) == (60_000, 10_000, 9_980)
    assert report["stages"] == ["download", "decode", "resize", "queue", "forward"]
    assert report["gpu_samples"] > 0 and report["cohorts"] == 4
    assert result["client_rss_mb"] < 200
