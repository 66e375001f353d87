"""The request rules in ClickHouse SQL, on real chDB, against the Python path on the same spans:
custom stages and nested groups, duplicates, missing parents, the trace fallback, the cold rule's
three sources, windows and slices, the service filter, both GPU sources, the approximate quantile
function. Traces are built here as OTLP/JSON (the format ``otel-stages`` writes) and imported."""

from __future__ import annotations

import itertools
import json
import os
import statistics
from collections.abc import Iterator
from dataclasses import astuple
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

from otel_stages.analysis import load_paths
from otel_stages.analysis.clickhouse import Tables, connect, fetch_aggregates, import_files, parse_url
from otel_stages.analysis.clickhouse_result import FleetAggregates
from otel_stages.analysis.clickhouse_sql import DD_RELATIVE_ACCURACY, AggregateQuery
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.gpu import gpu_evidence
from otel_stages.analysis.requests import find_requests, group_spans
from otel_stages.analysis.stats import stage_stats

T0 = 1_800_000_000 * 10**9
MS = 10**6
_ids = itertools.count(1)


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


class Trace:
    """Spans of one trace as OTLP/JSON span objects."""

    def __init__(self) -> None:
        self.trace_id = f"{next(_ids):032x}"
        self.spans: list[dict[str, Any]] = []

    def span(self, name: str, start_ms: float, dur_ms: float, parent: str | None = None,
             error: bool = False, attrs: dict[str, Any] | None = None) -> str:
        span_id = f"{next(_ids):016x}"
        start = T0 + int(start_ms * MS)
        self.spans.append({
            "traceId": self.trace_id, "spanId": span_id, "name": name, "kind": 1,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + int(dur_ms * MS)),
            "attributes": [_attr(k, v) for k, v in (attrs or {}).items()],
            "status": {"code": 2} if error else {},
            **({"parentSpanId": parent} if parent else {}),
        })
        return span_id


def request(t: Trace, at_ms: float, stages: dict[str, float], *, parent: str | None = None,
            seq: int | None = None, cold: bool | None = None, width: int = 640,
            error: bool = False) -> str:
    """A request span with standard stages one after another, 1 ms apart."""
    total = sum(stages.values()) + len(stages) + 2
    attrs: dict[str, Any] = {}
    if seq is not None:
        attrs["request.seq"] = seq
    if cold is not None:
        attrs["request.cold_start"] = cold
    rid = t.span("request", at_ms, total, parent, error=error, attrs=attrs)
    now = at_ms + 1
    for name, ms in stages.items():
        extra = {"image.width": width, "image.height": 480} if name == "decode" else {}
        t.span(name, now, ms, rid, attrs=extra)
        now += ms + 1
    return rid


def write(path: Path, traces: list[Trace], service: str = "svc", instance: str | None = None,
          metrics: list[dict[str, Any]] | None = None) -> Path:
    resource = [_attr("service.name", service)]
    if instance:
        resource.append(_attr("service.instance.id", instance))
    lines = [{"resourceSpans": [{"resource": {"attributes": resource}, "scopeSpans": [
        {"scope": {"name": "otel_stages"}, "spans": [s for t in traces for s in t.spans]}]}]}]
    if metrics:
        lines.append({"resourceMetrics": [{"resource": {"attributes": resource}, "scopeMetrics": [
            {"scope": {"name": "otel_stages.gpu"}, "metrics": metrics}]}]})
    with path.open("a") as fh:
        for line in lines:
            fh.write(json.dumps(line) + "\n")
    return path


def steady(n: int, start_ms: float = 0, **kw: Any) -> Iterator[Trace]:
    for i in range(n):
        t = Trace()
        request(t, start_ms + i * 300, {"download": 2 + i % 3, "decode": 5 + i % 4, "resize": 3,
                                        "queue": 1 + (i * 7) % 5, "forward": 100 + (i * 13) % 40},
                seq=i + 1, **kw)
        yield t


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    with connect(parse_url(f"chdb:{tmp_path_factory.mktemp('chdb')}")) as eng:
        yield eng


_dbs = itertools.count()


def run(engine: Any, files: list[Path], **query: Any) -> FleetAggregates:
    tables = Tables(database=f"r{next(_dbs)}")
    summary = import_files(engine, tables, files)
    assert summary.problems == []
    return fetch_aggregates(engine, tables, AggregateQuery(**query))


def python_stats(files: list[Path]) -> tuple[list[Any], dict[str, Any]]:
    requests = find_requests(load_paths(files).spans)
    warm = [r for r in requests if not r.cold and not r.error]
    return requests, stage_stats([r.stages_ms for r in warm], [r.total_ms for r in warm])


def assert_same_stages(agg: FleetAggregates, files: list[Path]) -> None:
    requests, want = python_stats(files)
    assert agg.counts.requests == len(requests)
    assert list(agg.stages) == list(want)
    for name, stats in want.items():
        got = agg.stages[name]
        assert got.ran.count == stats.count, name
        assert got.ran.median_ms == pytest.approx(stats.median_ms, rel=1e-9), name
        assert got.ran.max_ms == pytest.approx(stats.max_ms, rel=1e-9), name
        assert got.explained == pytest.approx(stats.explains, rel=1e-6, abs=1e-9), name


def test_custom_stages_and_nested_groups_count_for_the_request(engine, tmp_path: Path) -> None:
    traces = []
    for i in range(8):
        t = Trace()
        rid = t.span("request", i * 300, 200, attrs={"request.seq": i + 1})
        t.span("download", i * 300 + 1, 3, rid)
        group = t.span("preprocess", i * 300 + 5, 30, rid)  # a group: decode/resize inside
        t.span("decode", i * 300 + 6, 10 + i, group, attrs={"image.width": 800, "image.height": 600})
        inner = t.span("augment", i * 300 + 17, 10, group)  # nested group inside the group
        t.span("resize", i * 300 + 18, 4, inner)
        t.span("queue", i * 300 + 40, 1, rid)
        t.span("tokenize", i * 300 + 42, 2 + i % 2, rid)  # a custom stage (leaf)
        t.span("forward", i * 300 + 45, 100 + i, rid)
        t.span("http.get", i * 300 + 2, 1, group)  # beside decode: a custom stage of the group
        traces.append(t)
    path = write(tmp_path / "groups.jsonl", traces)
    agg = run(engine, [path])
    assert agg.counts.requests == 8 and agg.counts.incomplete == 0
    assert "preprocess" not in agg.stages and "augment" not in agg.stages
    assert {"tokenize", "decode", "resize", "http.get"} <= set(agg.stages)
    assert agg.cohorts[0].key == "800x600"
    assert_same_stages(agg, [path])


def test_duplicate_rows_of_a_span_count_once(engine, tmp_path: Path) -> None:
    path = write(tmp_path / "once.jsonl", list(steady(12)))
    again = tmp_path / "again.jsonl"
    again.write_text(path.read_text())  # a retried export: every row stored twice
    once = run(engine, [path])
    twice = run(engine, [path, again])
    assert twice.counts == once.counts
    assert astuple(twice.stages["decode"].ran) == pytest.approx(astuple(once.stages["decode"].ran))
    assert astuple(twice.total) == pytest.approx(astuple(once.total))


def test_stage_spans_whose_parent_never_arrived_are_incomplete(engine, tmp_path: Path) -> None:
    traces = list(steady(10))
    orphan = Trace()
    for i in range(3):
        orphan.span("queue", 50 + i * 400, 20_000, parent=f"{0xdead + i:016x}")
    traces.append(orphan)
    path = write(tmp_path / "orphans.jsonl", traces)
    agg = run(engine, [path])
    assert agg.counts.requests == 10
    assert (agg.counts.incomplete, agg.counts.incomplete_spans) == (3, 3)
    assert agg.stages["queue"].ran.max_ms < 10
    assert any("never arrived" in p for p in agg.problems)


def test_stage_spans_without_any_parent_are_incomplete(engine, tmp_path: Path) -> None:
    """Stage spans at the root of their trace are no request (analysis.requests): each is an
    incomplete unit; the requests beside them are unaffected."""
    traces = list(steady(6))
    for i in range(6):
        t = Trace()
        t.span("decode", 10_000 + i * 100, 5 + i)
        t.span("forward", 10_000 + i * 100 + 10, 50)
        traces.append(t)
    path = write(tmp_path / "roots.jsonl", traces)
    agg = run(engine, [path])
    grouping = group_spans(load_paths([path]).spans)
    assert len(grouping.requests) == 6 and len(grouping.incomplete) == 12
    assert (agg.counts.requests, agg.counts.incomplete, agg.counts.by_trace) == (6, 12, 12)
    assert agg.counts.incomplete_spans == 12
    assert any("no request span above" in p for p in agg.problems)
    assert_same_stages(agg, [path])


@pytest.mark.parametrize("mode", ["attribute", "seq", "earliest"])
def test_cold_requests_follow_the_python_rules(engine, tmp_path: Path, mode: str) -> None:
    files = []
    for pod, offset in (("pod-a", 0), ("pod-b", 5000)):
        traces = []
        for i in range(6):
            t = Trace()
            kw: dict[str, Any] = {}
            if mode == "attribute":
                kw["cold"] = i == 2  # not the first one: the attribute decides
            elif mode == "seq":
                kw["seq"] = i + 5 if pod == "pod-b" else i + 1  # pod-b started before the file
            stages = {"decode": 5, "forward": 1000 if i == 0 else 100}
            request(t, offset + i * 2000, stages, **kw)
            traces.append(t)
        files.append(write(tmp_path / f"{pod}.jsonl", traces, instance=pod))
    agg = run(engine, files)
    requests = find_requests(load_paths(files).spans)
    assert agg.counts.cold == sum(r.cold for r in requests)
    assert agg.counts.runs == 2
    assert agg.cold_start is not None
    assert agg.cold_start.total.median_ms == pytest.approx(
        statistics.median(r.total_ms for r in requests if r.cold))


def test_window_and_slices_keep_each_request_once(engine, tmp_path: Path) -> None:
    path = write(tmp_path / "long.jsonl", list(steady(40)))
    whole = run(engine, [path])
    sliced = run(engine, [path], slice_spans=25)  # ~10 slices over 12 s of requests
    assert sliced.counts == whole.counts
    assert astuple(sliced.stages["forward"].ran) == pytest.approx(astuple(whole.stages["forward"].ran))
    # a window from request 10 to request 20: requests start every 300 ms
    part = run(engine, [path], start_ns=T0 + 10 * 300 * MS - MS, end_ns=T0 + 20 * 300 * MS - MS,
               slice_spans=25)
    assert part.counts.requests == 10 and part.counts.incomplete == 0


def test_service_filter_reads_one_service(engine, tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl", list(steady(5)), service="svc-a")
    write(path, list(steady(7, start_ms=100_000)), service="svc-b")
    assert run(engine, [path], service="svc-b").counts.requests == 7
    assert run(engine, [path]).counts.requests == 12


def _band_ms(recording: Any) -> float:
    """The run's noise band as the file report computes it (it sets the slow forwards)."""
    noise = diagnose(recording).noise
    assert noise is not None
    return noise.band_ms


def _gauge(points: list[tuple[float, float]], hw: str = "GPU-0") -> dict[str, Any]:
    return {"name": "hw.gpu.utilization", "unit": "1", "gauge": {"dataPoints": [
        {"timeUnixNano": str(T0 + int(ms * MS)), "asDouble": v,
         "attributes": [_attr("hw.id", hw), _attr("hw.type", "gpu")]} for ms, v in points]}}


def test_gpu_percent_series_and_idle_gpu_match_python(engine, tmp_path: Path) -> None:
    traces = list(steady(20))
    # samples every 50 ms: the model's GPU reads percent (busy in forwards), another GPU idles
    busy = [(ms, 95.0 if (ms % 300) > 20 else 10.0) for ms in range(0, 6000, 50)]
    idle = [(ms, 0.05) for ms in range(0, 6000, 50)]
    path = write(tmp_path / "gpu.jsonl", traces, metrics=[_gauge(busy), _gauge(idle, "GPU-1")])
    agg = run(engine, [path])
    recording = load_paths([path])
    warm = [r for r in find_requests(recording.spans) if not r.cold and not r.error]
    want = gpu_evidence(warm, recording.metrics, band_ms=_band_ms(recording))
    assert (agg.gpu.source, agg.gpu.hw_id) == ("metrics", "GPU-0") == (want.source, want.hw_id)
    assert (agg.gpu.samples, agg.gpu.forwards_covered) == (want.samples, want.forwards_covered)
    assert agg.gpu.mean_utilization == pytest.approx(want.mean_utilization)
    assert agg.gpu.slow_mean_utilization == pytest.approx(want.slow_mean_utilization)
    assert agg.gpu.split is not None and agg.gpu.slow_min_ms == pytest.approx(want.slow_min_ms)
    assert (agg.gpu.split.slow_forwards, agg.gpu.split.slow_covered, agg.gpu.split.slow_samples) == (
        want.slow_forwards, want.slow_covered, want.slow_samples)


def test_gpu_from_forward_span_attributes_is_preferred(engine, tmp_path: Path) -> None:
    traces = []
    for i in range(10):
        t = Trace()
        rid = t.span("request", i * 300, 200)
        t.span("forward", i * 300 + 5, 100 + 10 * i, rid,
               attrs={"gpu.utilization.mean": 0.5 + i / 40, "gpu.sample_count": 1 + i % 3})
        traces.append(t)
    idle = _gauge([(ms, 0.1) for ms in range(0, 3000, 50)])
    path = write(tmp_path / "attrs.jsonl", traces, metrics=[idle])
    agg = run(engine, [path])
    recording = load_paths([path])
    warm = [r for r in find_requests(recording.spans) if not r.cold and not r.error]
    want = gpu_evidence(warm, recording.metrics, band_ms=_band_ms(recording))
    assert agg.gpu.source == "span_attributes" == want.source
    assert agg.gpu.samples == want.samples
    assert agg.gpu.mean_utilization == pytest.approx(want.mean_utilization)
    assert agg.gpu.fast_mean_utilization == pytest.approx(want.fast_mean_utilization)
    assert agg.gpu.slow_mean_utilization == pytest.approx(want.slow_mean_utilization)
    assert agg.gpu.split is not None and agg.gpu.slow_min_ms == pytest.approx(want.slow_min_ms)
    assert (agg.gpu.split.slow_forwards, agg.gpu.split.slow_covered) == (
        want.slow_forwards, want.slow_covered) != (0, 0)


def test_dd_quantiles_stay_within_their_documented_accuracy(engine, tmp_path: Path) -> None:
    path = write(tmp_path / "many.jsonl", list(steady(60)))
    exact = run(engine, [path], quantiles="exact")
    approx = run(engine, [path], quantiles="dd")
    assert (exact.quantile_function, approx.quantile_function) == (
        "quantilesExactInclusive", "quantilesDD")
    for name in exact.stages:
        for key in ("p5_ms", "median_ms", "p95_ms"):
            want = getattr(exact.stages[name].ran, key)
            got = getattr(approx.stages[name].ran, key)
            # DDSketch bounds the error against the nearest-rank value; R-7 interpolates between
            # neighbours, so allow the accuracy plus one neighbour gap
            assert abs(got - want) <= DD_RELATIVE_ACCURACY * want + exact.stages[name].ran.iqr_ms, key


NAMES = ["download /img/13.jpg", "fetch 3f2a9c1d", "fetch 3F2A9C1D", "request 1234", "tokenize",
         "http.get", "v1.2.345", "GET ?q=1", "stage#2", "abc12345678", "x_1234", "deadbeef",
         "deadbee", "a.1234", "1234", "postprocess", "id-0123456789abcdef"]


def test_per_request_names_match_the_python_rule(engine) -> None:
    """The RE2 form (no lookbehind in ClickHouse) finds the names naming.looks_per_request does."""
    from otel_stages.analysis.clickhouse_requests import PER_REQUEST_SQL
    from otel_stages.analysis.naming import looks_per_request

    names = "[" + ", ".join("'" + n.replace("'", "\\'") + "'" for n in NAMES) + "]"
    rows = engine.rows(f"SELECT name, match(name, {PER_REQUEST_SQL}) AS hit"
                       f" FROM (SELECT arrayJoin({names}) AS name)")
    assert {r["name"]: bool(r["hit"]) for r in rows} == {n: looks_per_request(n) for n in NAMES}
    assert any(looks_per_request(n) for n in NAMES) and not all(looks_per_request(n) for n in NAMES)
