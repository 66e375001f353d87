"""The file report's data problems, found by the ClickHouse report too (real chDB): each input is a
copy of a handed scenario (OTLP/JSON lines as otel-stages' exporter writes them) with one defect
edited in, imported as the Collector's ``clickhouse`` exporter writes it; the file report and the
ClickHouse report must give the same verdict (cause, stage, evidence, advice, tentative) and the
same problem lines (counts; the example each names may be another request). Each test fails when
the SQL for its problem is taken out (``report_dict`` then lacks the line, or the verdict is
confident where the file report hedges)."""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
from collections.abc import Callable
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

from otel_stages.analysis import advice, clickhouse_apart, load_paths
from otel_stages.analysis.caveats import SKEWED_MIN_FRACTION
from otel_stages.analysis.clickhouse import Tables, connect, fetch_aggregates, import_files, parse_url
from otel_stages.analysis.clickhouse_figures import report_dict
from otel_stages.analysis.clickhouse_gaps import BATCHES_UNREAD
from otel_stages.analysis.clickhouse_issues import NOT_CHECKED
from otel_stages.analysis.clickhouse_queries import MAX_FOREIGN_GPU_PROCESSES
from otel_stages.analysis.clickhouse_sql import AggregateQuery
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.commands.clickhouse_report import text

TRACES = Path(__file__).parent / "data" / "traces"
STABLE = TRACES / "stable.otlp.jsonl"  # 30 requests, forward 87 % of request time, verdict stable
MS = 10**6
Spans = list[dict[str, Any]]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    with connect(parse_url(f"chdb:{tmp_path_factory.mktemp('chdb')}")) as eng:
        yield eng


_dbs = itertools.count()


def edited(source: Path, target: Path, edit: Callable[[int, Spans], None]) -> Path:
    """A copy of ``source`` with ``edit(i, spans)`` applied to the spans of its i-th trace (in
    order of first appearance; a trace's spans may lie in several lines). ``spans`` may be changed
    in place; spans removed from it are dropped, spans added go beside the trace's first span."""
    docs = [json.loads(line) for line in source.read_text().splitlines()]
    by_trace: dict[str, Spans] = {}
    home: dict[str, Spans] = {}
    for doc in docs:
        for rs in doc.get("resourceSpans", []):
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    by_trace.setdefault(span["traceId"], []).append(span)
                    home.setdefault(span["traceId"], ss["spans"])
    for i, (trace, spans) in enumerate(by_trace.items()):
        before = list(spans)
        edit(i, spans)
        for span in before:
            if not any(span is s for s in spans):
                for doc in docs:
                    for rs in doc.get("resourceSpans", []):
                        for ss in rs["scopeSpans"]:
                            ss["spans"] = [s for s in ss["spans"] if s is not span]
        home[trace].extend(s for s in spans if not any(s is b for b in before))
    target.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    return target


def named(spans: Spans, name: str) -> dict[str, Any]:
    return next(s for s in spans if s["name"] == name)


def shift(span: dict[str, Any], start_ns: int, end_ns: int | None = None) -> None:
    """Move ``span``'s start by ``start_ns`` and its end by ``end_ns`` (default: the same)."""
    span["startTimeUnixNano"] = str(int(span["startTimeUnixNano"]) + start_ns)
    span["endTimeUnixNano"] = str(int(span["endTimeUnixNano"]) + (start_ns if end_ns is None else end_ns))


def _examples_out(line: str) -> str:
    """A problem line without the example it names (the reports may pick other requests)."""
    return re.sub(r"e\.g\. [^)]*", "e.g. ...", line)


def reports(engine: Any, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ClickHouse report, file report) as JSON, on the same file."""
    tables = Tables(database=f"i{next(_dbs)}")
    summary = import_files(engine, tables, [path])
    assert summary.problems == []
    got = json.loads(json.dumps(report_dict(fetch_aggregates(engine, tables, AggregateQuery()))))
    want = json.loads(json.dumps(diagnose(load_paths([path])).to_dict()))
    return got, want


def assert_same(got: dict[str, Any], want: dict[str, Any], *, expect: str) -> None:
    """Same verdict and the same problem lines (up to their examples); one of them has ``expect``."""
    assert got["verdict"] == want["verdict"]
    mine = sorted(_examples_out(p) for p in got["problems"] if not p.startswith(NOT_CHECKED))
    assert mine == sorted(_examples_out(p) for p in want["problems"])
    assert any(expect in p for p in mine), mine


# --- clock skew: stage spans wholly outside their request ----------------------------------------


def _skewed(fraction_of: int) -> Callable[[int, Spans], None]:
    def edit(i: int, spans: Spans) -> None:
        if i % 30 < fraction_of:  # the forward ran on a host whose clock is 5 s ahead
            shift(named(spans, "forward"), 5_000 * MS)
    return edit


def test_clock_skew_in_most_requests_says_sync_the_clocks(engine, tmp_path: Path) -> None:
    """Forward spans of 20 of 30 requests 5 s after their request (another host's clock): both
    reports name the 20 spans, read the untraced time as skew (SKEWED_MIN_FRACTION) and advise
    syncing the clocks; without the SQL count the ClickHouse report would advise instrumenting."""
    assert SKEWED_MIN_FRACTION * 30 <= 20
    got, want = reports(engine, edited(STABLE, tmp_path / "skew.jsonl", _skewed(20)))
    assert_same(got, want, expect="20 stage spans in 20 requests lie entirely outside")
    assert any(advice.SYNC_CLOCKS in a for a in got["verdict"]["advice"])


def test_clock_skew_in_a_few_requests_is_named_but_not_read_as_skew(engine, tmp_path: Path) -> None:
    """Below SKEWED_MIN_FRACTION of the requests the spans are named, the advice is not to sync."""
    few = int(SKEWED_MIN_FRACTION * 30) - 1
    got, want = reports(engine, edited(STABLE, tmp_path / "few.jsonl", _skewed(few)))
    assert_same(got, want, expect=f"{few} stage spans in {few} requests lie entirely outside")
    assert not any(advice.SYNC_CLOCKS in a for a in got["verdict"]["advice"])


# --- stage spans reaching outside their request, overlapping stages ------------------------------


def test_stage_spans_reaching_outside_their_request(engine, tmp_path: Path) -> None:
    def edit(i: int, spans: Spans) -> None:
        if i in (3, 7, 11, 12):  # fire-and-forget work after the answer: forward ends 20 ms late
            shift(named(spans, "forward"), 0, (20 + i) * MS)

    got, want = reports(engine, edited(STABLE, tmp_path / "outside.jsonl", edit))
    assert_same(got, want, expect="reach outside their request span in 4 requests (up to 31.9 ms outside")


def test_overlapping_stage_spans(engine, tmp_path: Path) -> None:
    def edit(i: int, spans: Spans) -> None:
        if i % 6 == 1:  # resize starts 2 ms before decode ends
            shift(named(spans, "resize"), -2 * MS, 0)

    got, want = reports(engine, edited(STABLE, tmp_path / "overlap.jsonl", edit))
    assert_same(got, want, expect="stage spans overlap in 5 requests")


def test_overlap_within_the_tolerance_is_no_problem(engine, tmp_path: Path) -> None:
    """OVERLAP_TOLERANCE_MS (0.05 ms): 0.05 ms is within it, 0.051 ms is not, in both reports."""
    def edit(i: int, spans: Spans) -> None:
        if i == 4:
            shift(named(spans, "resize"), -50_000, 0)
        if i == 5:
            shift(named(spans, "resize"), -51_000, 0)

    got, want = reports(engine, edited(STABLE, tmp_path / "tolerance.jsonl", edit))
    assert_same(got, want, expect="stage spans overlap in 1 request ")


# --- span ids shared by different spans ------------------------------------------------------------


def test_span_ids_shared_by_different_spans_are_counted(engine, tmp_path: Path) -> None:
    """A second decode span with the first's id and other times (a fixed id generator), in 2
    requests, and an exact copy of a span (a retried export) in another: 2 clashes in both."""
    def edit(i: int, spans: Spans) -> None:
        if i in (5, 9):
            other = copy.deepcopy(named(spans, "decode"))
            shift(other, 40 * MS)
            spans.append(other)
        if i == 12:
            spans.append(copy.deepcopy(named(spans, "resize")))

    got, want = reports(engine, edited(STABLE, tmp_path / "clash.jsonl", edit))
    assert_same(got, want, expect="2 spans share a span id with a different span")


# --- spans left out: impossible times ------------------------------------------------------------


def test_spans_left_out_are_counted_per_reason(engine, tmp_path: Path) -> None:
    """Starts in microseconds (1970) and a span over a day: one line per reason, with the file
    report's counts and unit hint."""
    def edit(i: int, spans: Spans) -> None:
        forward = named(spans, "forward")
        start, end = int(forward["startTimeUnixNano"]), int(forward["endTimeUnixNano"])
        if i in (2, 4):
            forward["startTimeUnixNano"], forward["endTimeUnixNano"] = str(start // 1000), str(end // 1000)
        if i == 8:
            forward["endTimeUnixNano"] = str(start + 86_400 * 10**9 + 1)

    got, want = reports(engine, edited(STABLE, tmp_path / "odd.jsonl", edit))
    assert_same(got, want, expect="2 spans left out: starts before 2000-01-01")
    lines = "\n".join(got["problems"])
    assert "1 span left out: lasts longer than a day" in lines
    assert "read as microseconds" in lines


def test_a_span_that_ends_before_it_starts_is_named_by_both(engine, tmp_path: Path) -> None:
    """The file reader refuses such a span as malformed (a load problem naming it); the exporter
    stores it with a wrapped-around ``Duration``, and the SQL counts it under its own reason."""
    def edit(i: int, spans: Spans) -> None:
        if i == 6:
            forward = named(spans, "forward")
            forward["startTimeUnixNano"], forward["endTimeUnixNano"] = (
                forward["endTimeUnixNano"], forward["startTimeUnixNano"])

    path = edited(STABLE, tmp_path / "backwards.jsonl", edit)
    tables = Tables(database=f"i{next(_dbs)}")
    import_files(engine, tables, [path])
    got = json.loads(json.dumps(report_dict(fetch_aggregates(engine, tables, AggregateQuery()))))
    want = diagnose(load_paths([path])).to_dict()
    assert got["verdict"] == want["verdict"]
    assert [p for p in want["problems"] if "('forward'): ends before it starts" in p]
    assert [p for p in got["problems"] if p.startswith("1 span left out: ends before it starts")]


# --- a stage in only some requests -----------------------------------------------------------------


def test_a_stage_in_only_some_requests_is_named_in_the_evidence(engine, tmp_path: Path) -> None:
    """download dropped from 10 requests (a cache hit): present in 19 of 29 warm requests, below
    STAGE_PRESENT_MIN_FRACTION: both verdicts say its figures are over those 19."""
    def edit(i: int, spans: Spans) -> None:
        if i % 3 == 2:
            spans.remove(named(spans, "download"))

    got, want = reports(engine, edited(STABLE, tmp_path / "partial.jsonl", edit))
    assert got["verdict"] == want["verdict"]
    assert any(e.startswith("download appears in only") for e in got["verdict"]["evidence"])


# --- what the SQL does not check: said, not silently confident -------------------------------------


def _grouped(i: int, spans: Spans) -> None:
    """forward inside a custom group span ``model`` (request -> model -> forward)."""
    if not any(s["name"] == "forward" for s in spans):
        return  # a batch trace
    forward = named(spans, "forward")
    group = {**copy.deepcopy(forward), "name": "model", "spanId": f"{0xfeed0000 + i:016x}",
             "attributes": []}
    forward["parentSpanId"] = group["spanId"]
    spans.append(group)


def test_signals_inside_custom_groups_are_said_to_be_unchecked(engine, tmp_path: Path) -> None:
    """gc_pause with its forward spans inside a group span: the file report reads their signals
    and names the GC pauses; the SQL does not, and its report says so rather than giving a plain
    forward verdict silently. The scenario without groups has no such line."""
    source = TRACES / "gc_pause.otlp.jsonl"
    got, want = reports(engine, edited(source, tmp_path / "grouped.jsonl", _grouped))
    assert want["verdict"]["cause"] == "gc_pause"
    batches = NOT_CHECKED + BATCHES_UNREAD  # the scenario's batch traces: said apart
    lines = [p for p in got["problems"] if p.startswith(NOT_CHECKED) and not p.startswith(batches)]
    (line,) = lines
    assert "inside custom group spans (24 group spans)" in line
    plain, _ = reports(engine, source)
    assert not [p for p in plain["problems"] if p.startswith(NOT_CHECKED) and not p.startswith(batches)]


def _slower(spans: Spans, slow: float) -> None:
    """The request's forward (and so the request) takes ``slow`` times as long."""
    forward, request = named(spans, "forward"), named(spans, "request")
    extra = int((int(forward["endTimeUnixNano"]) - int(forward["startTimeUnixNano"])) * (slow - 1))
    shift(forward, 0, extra)
    shift(request, 0, extra)


def _after_idle(slow: float, idle_ms: int = 60_000, at: tuple[int, ...] = (20,)
                ) -> Callable[[int, Spans], None]:
    def edit(i: int, spans: Spans) -> None:
        moved = sum(idle_ms for j in at if i >= j)  # idle_ms before each request in ``at``
        for span in spans:
            shift(span, moved * MS)
        if i in at:  # ... which is ``slow`` x as slow in its forward
            _slower(spans, slow)
    return edit


def _new_input(slow: float, last: int = 29) -> Callable[[int, Spans], None]:
    def edit(i: int, spans: Spans) -> None:
        if 20 <= i <= last:  # requests 20..last send a larger image; the first of them is slow
            decode = named(spans, "decode")
            for a in decode["attributes"]:
                if a["key"] == "image.width":
                    a["value"] = {"intValue": "2560"}
        if i == 20:
            _slower(spans, slow)
    return edit


def _new_input_of_several_images(i: int, spans: Spans) -> None:
    """:func:`_new_input` 3x, the slow request decoding a second image (a second tester's input:
    a request slowed by its four images was "the first request of a new input shape", with
    warm-up advice): its input is only its first image's, so it is not set apart."""
    _new_input(3.0)(i, spans)
    if i == 20:
        _second_decode("other")(i, spans)


def _after_failed_start(slow: float) -> Callable[[int, Spans], None]:
    def edit(i: int, spans: Spans) -> None:
        if i == 0:  # the cold first request fails (model load)
            named(spans, "request")["status"] = {"code": 2}
        if i == 1:  # the first success after it is slow
            _slower(spans, slow)
    return edit


APART_CASES = {
    # name: (edit, the file report's reasons)
    "after 60 s idle, 3x slower": (_after_idle(3.0), ["after_idle"]),
    "after 60 s idle, 1.5x: under COLD_START_MIN_RATIO": (_after_idle(1.5), []),
    "after 31 s idle": (_after_idle(3.0, idle_ms=31_000), ["after_idle"]),
    "after 29 s idle: under IDLE_GAP_MIN_S": (_after_idle(3.0, idle_ms=29_000), []),
    "first of a new input, 3x slower": (_new_input(3.0), ["new_input"]),
    "first of a new input, 1.5x": (_new_input(1.5), []),
    "first of a new input, 5 comparable": (_new_input(3.0, last=25), ["new_input"]),
    "first of a new input, 4 comparable: under COMPARABLE_MIN_REQUESTS": (_new_input(3.0, last=24), []),
    "first success after a failed start": (_after_failed_start(3.0), ["after_failed_start"]),
    "first of a new input, 3x, of several images": (_new_input_of_several_images, []),
}


@pytest.mark.parametrize("case", APART_CASES)
def test_requests_set_apart_as_in_the_file_report(engine, tmp_path: Path, case: str) -> None:
    """Warm requests the file report sets apart as cold (cohorts.find_set_apart: after an idle
    gap, first of a new input in a started process, first success after a failed start; at
    least COLD_START_MIN_RATIO x the comparable median) leave the warm statistics in SQL too:
    the same list, counts, stage statistics and verdict. The cases on either side of each
    threshold check that the SQL flags no more than the file report does."""
    edit, reasons = APART_CASES[case]
    got, want = reports(engine, edited(STABLE, tmp_path / "apart.jsonl", edit))
    assert [a["reason"] for a in want["set_apart"]] == reasons
    assert got["set_apart"] == want["set_apart"]
    assert got["counts"] == want["counts"]
    assert got["verdict"] == want["verdict"]
    assert got["total"] == pytest.approx(want["total"], rel=1e-6)
    assert not [p for p in got["problems"] if p.startswith(NOT_CHECKED)]


def test_requests_set_apart_past_the_listed_ones_are_counted(engine, tmp_path: Path, monkeypatch) -> None:
    """Two requests set apart, one listed (MAX_APART_ROWS): both leave the warm requests, and a
    problem line counts the one not listed."""
    monkeypatch.setattr(clickhouse_apart, "MAX_APART_ROWS", 1)
    got, want = reports(engine, edited(STABLE, tmp_path / "apart2.jsonl", _after_idle(3.0, at=(10, 20))))
    assert len(want["set_apart"]) == 2
    assert got["set_apart"] == want["set_apart"][:1]
    assert got["counts"] == want["counts"]
    assert "1 more warm requests set apart as cold are not listed (the first 1 are)" in got["problems"]


def test_the_text_view_counts_requests_set_apart_as_cold(engine, tmp_path: Path) -> None:
    path = edited(STABLE, tmp_path / "apart_text.jsonl", _after_idle(3.0))
    tables = Tables(database=f"i{next(_dbs)}")
    import_files(engine, tables, [path])
    shown = text(fetch_aggregates(engine, tables, AggregateQuery()))
    assert "(30 requests: 28 warm, 2 cold (1 of them warm requests set apart), 0 failed;" in shown
    assert "reported apart from warm runs" in shown  # the verdict's evidence names it


# --- failed requests: what they failed with and where they stopped ------------------------------


def _failing(i: int, spans: Spans) -> None:
    """9 of 30 requests fail (30 %, past FAILED_MIN_FRACTION): 3 with ``error.type`` on the
    request span, 3 with an exception event on a failed forward, 3 with no type recorded."""
    if i == 0 or i % 3:
        return
    request = named(spans, "request")
    request["status"] = {"code": 2}
    if i % 9 == 0:
        request["attributes"].append({"key": "error.type", "value": {"stringValue": "TimeoutError"}})
    elif i % 9 == 3:
        forward = named(spans, "forward")
        forward["status"] = {"code": 2}
        forward["events"] = [{"timeUnixNano": forward["endTimeUnixNano"], "name": "exception",
                              "attributes": [{"key": "exception.type",
                                              "value": {"stringValue": "torch.OutOfMemoryError"}}]}]


def test_failures_name_their_error_types_and_where_they_stopped(engine, tmp_path: Path) -> None:
    """Failures first, with the kinds (error.type, else an exception event's type, else 'not
    recorded') and where the requests stopped: the same sentence in both reports."""
    got, want = reports(engine, edited(STABLE, tmp_path / "failing.jsonl", _failing))
    assert got["verdict"] == want["verdict"]
    line = got["verdict"]["evidence"][0]
    assert "(9 of 30; TimeoutError: 3, error type not recorded: 3, torch.OutOfMemoryError: 3;" in line
    assert "last stage forward: 6; failed in forward: 3)" in line


# --- incomplete traces, per-request span names ----------------------------------------------------


def test_incomplete_traces_and_root_stage_spans(engine, tmp_path: Path) -> None:
    """Two traces lose their request span (exported by a process that died), one forward span
    lost its parent id: the file report's two sentences, with its counts."""
    def edit(i: int, spans: Spans) -> None:
        if i in (4, 8):
            spans.remove(named(spans, "request"))
        if i == 10:
            del named(spans, "forward")["parentSpanId"]

    got, want = reports(engine, edited(STABLE, tmp_path / "incomplete.jsonl", edit))
    assert_same(got, want, expect="2 incomplete traces left out")
    assert any(p.startswith("1 stage span with no request span above") for p in got["problems"])


def test_per_request_span_names(engine, tmp_path: Path) -> None:
    """resize spans named by their URL: four carry a ``stage`` attribute and count as resize, two
    do not and are left out of the stage rows; both reports say so with the same counts. (Not
    decode: the SQL reads the image size from spans named decode only.)"""
    def edit(i: int, spans: Spans) -> None:
        if 1 <= i <= 6:
            resize = named(spans, "resize")
            resize["name"] = f"resize /img/{i}.jpg"
            if i <= 4:
                resize["attributes"].append({"key": "stage", "value": {"stringValue": "resize"}})

    got, want = reports(engine, edited(STABLE, tmp_path / "names.jsonl", edit))
    assert_same(got, want, expect="4 spans grouped by their 'stage' attribute (resize)")
    assert any("2 spans without a 'stage' attribute were left out" in p for p in got["problems"])


def test_span_id_clashes_are_found_whatever_the_time_slices(engine, tmp_path: Path) -> None:
    """The clash pass reads every id in one aggregation (the engine spills it past its memory
    threshold), not per time slice: with slices of 20 spans, a span copied 20 s later into its
    trace (another time slice) with its id still counts."""
    def edit(i: int, spans: Spans) -> None:
        if i == 5:
            other = copy.deepcopy(named(spans, "decode"))
            shift(other, 20_000 * MS)
            spans.append(other)

    tables = Tables(database=f"i{next(_dbs)}")
    import_files(engine, tables, [edited(STABLE, tmp_path / "far.jsonl", edit)])
    agg = fetch_aggregates(engine, tables, AggregateQuery(slice_spans=20))
    assert agg.issues.clash_spans == 1
    assert any(p.startswith("1 span shares a span id with a different span") for p in agg.problems)


# --- the cold request's sentence -------------------------------------------------------------------


def test_a_cold_request_marked_later_in_its_process(engine, tmp_path: Path) -> None:
    """``request.cold_start`` marks request 10 (a model reload), not the first: both reports say
    it is not the first of its process."""
    def edit(i: int, spans: Spans) -> None:
        named(spans, "request")["attributes"].append(
            {"key": "request.cold_start", "value": {"boolValue": i == 10}})

    got, want = reports(engine, edited(STABLE, tmp_path / "reload.jsonl", edit))
    assert got["verdict"] == want["verdict"]
    assert any("not the first of its process" in e for e in got["verdict"]["evidence"])


def test_a_cold_request_of_unknown_input(engine, tmp_path: Path) -> None:
    """The first request's decode span has no image size: compared with all warm requests, and
    both reports say its input is unknown."""
    def edit(i: int, spans: Spans) -> None:
        if i == 0:
            named(spans, "decode")["attributes"] = []
            named(spans, "request")["attributes"] = [
                a for a in named(spans, "request")["attributes"] if not a["key"].startswith("image.")]

    got, want = reports(engine, edited(STABLE, tmp_path / "unknown.jsonl", edit))
    assert got["verdict"] == want["verdict"]
    assert any("its input is unknown" in e for e in got["verdict"]["evidence"])


# --- time counted in two stages at once: the (overlap) figure and its caveat ----------------------


def _double_counted(i: int, spans: Spans) -> None:
    """queue's span runs on to the forward's end: the forward's time (which drives the swing) is
    counted in queue too, so queue explains as much as forward and the lead is at risk."""
    queue, forward = named(spans, "queue"), named(spans, "forward")
    queue["endTimeUnixNano"] = forward["endTimeUnixNano"]


def test_double_counted_time_is_the_same_figure_and_the_same_tentative_verdict(
        engine, tmp_path: Path) -> None:
    """stage_overlap in SQL: the overlap's distribution, share and explained variance match the
    file report's, and the overlap caveat (OVERLAP_MAX_PART_OF_LEAD) makes both verdicts
    tentative with its evidence and advice first; without the SQL figure the ClickHouse verdict
    would stay confident."""
    from otel_stages.analysis.stage_overlap import OVERLAP_ADVICE

    got, want = reports(engine, edited(TRACES / "gpu_busy.otlp.jsonl", tmp_path / "double.jsonl",
                                       _double_counted))
    assert want["verdict"]["stage"] in ("queue", "forward")  # either holds the other's time
    assert want["overlap"] is not None and want["verdict"]["tentative"]
    assert want["verdict"]["advice"][0] == OVERLAP_ADVICE
    assert got["verdict"] == want["verdict"]
    assert got["overlap"]["requests"] == want["overlap"]["requests"] == want["counts"]["warm"]
    for key in ("median_ms", "swing_ms", "share", "explains"):
        assert got["overlap"][key] == pytest.approx(want["overlap"][key], rel=1e-3, abs=1e-3), key


def test_no_overlap_figure_without_double_counted_time(engine, tmp_path: Path) -> None:
    got, want = reports(engine, edited(STABLE, tmp_path / "plain.jsonl", lambda i, spans: None))
    assert got["overlap"] is None and want["overlap"] is None
    assert not got["verdict"]["tentative"]


# --- --service picks whole traces -------------------------------------------------------------


def _split_services(source: Path, target: Path, *, other: str | None = None) -> Path:
    """``source`` with each trace's queue and forward spans moved to a ``gpu-worker`` resource
    (a request handed to a GPU worker process); with ``other``, a second copy of every trace
    (new trace ids, forward 3x as long) from service ``other`` alone."""
    docs = [json.loads(line) for line in source.read_text().splitlines()]
    out = []
    copies: dict[str, Spans] = {}
    for doc in docs:
        for rs in doc.get("resourceSpans", []):
            worker = copy.deepcopy(rs)
            for a in worker["resource"]["attributes"]:
                if a["key"] == "service.name":
                    a["value"] = {"stringValue": "gpu-worker"}
            for ss, ws in zip(rs["scopeSpans"], worker["scopeSpans"]):
                ws["spans"] = [s for s in ss["spans"] if s["name"] in ("queue", "forward")]
                ss["spans"] = [s for s in ss["spans"] if s["name"] not in ("queue", "forward")]
            out.append({"resourceSpans": [rs, worker]})
            if other:
                copied = copy.deepcopy(rs)
                for a in copied["resource"]["attributes"]:
                    if a["key"] == "service.name":
                        a["value"] = {"stringValue": other}
                for ss, ws in zip(copied["scopeSpans"], worker["scopeSpans"]):
                    spans = ss["spans"] + copy.deepcopy(ws["spans"])
                    for s in spans:
                        s["traceId"] = "f" + s["traceId"][1:]
                        copies.setdefault(s["traceId"], []).append(s)
                    ss["spans"] = spans
                out.append({"resourceSpans": [copied]})
    for spans in copies.values():  # (a trace's spans may lie in several lines)
        _slower(spans, 3.0)
    target.write_text("".join(json.dumps(doc) + "\n" for doc in out))
    return target


def test_service_picks_whole_traces(engine, tmp_path: Path) -> None:
    """--service vlm-server keeps the queue and forward spans its requests ran in another service
    (gpu-worker), as the file report of those traces alone does, and leaves out the traces of
    another service; a service with no spans finds no request."""
    alone = _split_services(STABLE, tmp_path / "split.jsonl")
    mixed = _split_services(STABLE, tmp_path / "mixed.jsonl", other="other-svc")
    want = json.loads(json.dumps(diagnose(load_paths([alone])).to_dict()))
    tables = Tables(database=f"i{next(_dbs)}")
    import_files(engine, tables, [mixed])

    def report(service: str) -> dict[str, Any]:
        agg = fetch_aggregates(engine, tables, AggregateQuery(service=service))
        return json.loads(json.dumps(report_dict(agg)))

    got = report("vlm-server")
    assert want["verdict"]["cause"] == "stable" and want["counts"]["warm"] == 29
    assert got["verdict"] == want["verdict"]
    assert got["counts"] == want["counts"]
    assert got["stages"]["forward"]["median_ms"] == pytest.approx(want["stages"]["forward"]["median_ms"])
    other = report("other-svc")
    assert other["counts"]["warm"] == 29
    assert other["stages"]["forward"]["median_ms"] > 2 * want["stages"]["forward"]["median_ms"]
    assert report("no-such-service")["requests"] == 0


# --- what the SQL does not read: said, and the verdict hedged ---------------------------------


def _output_tokens(i: int, spans: Spans) -> None:
    """Every request generated 16 tokens but the first, 512 (vLLM's completion tokens)."""
    request = named(spans, "request")
    request["attributes"].append({"key": "gen_ai.usage.completion_tokens",
                                  "value": {"intValue": "512" if i == 0 else "16"}})
    if i == 0:
        _slower(spans, 6.0)


def _size_on_resize(i: int, spans: Spans) -> None:
    """The image size on the resize span instead of decode; the first request's image is unique
    and slow."""
    decode, resize = named(spans, "decode"), named(spans, "resize")
    moved = [a for a in decode["attributes"] if a["key"].startswith("image.")]
    decode["attributes"] = [a for a in decode["attributes"] if not a["key"].startswith("image.")]
    if i == 0:
        moved = [{**a, "value": {"intValue": "4000"}} if a["key"] == "image.width" else a for a in moved]
        _slower(spans, 6.0)
    resize["attributes"].extend(moved)


def _size_on_custom(i: int, spans: Spans) -> None:
    """:func:`_size_on_resize`, the resize span named ``crop`` (a custom stage)."""
    _size_on_resize(i, spans)
    named(spans, "resize")["name"] = "crop"


def _size_on_group(i: int, spans: Spans) -> None:
    """The image size on a ``preprocess`` group span around decode and resize instead of on
    decode; the first request's image is unique and slow."""
    _size_on_resize(i, spans)
    decode, resize = named(spans, "decode"), named(spans, "resize")
    group = {**decode, "spanId": f"{i:08x}0000beef", "name": "preprocess",
             "startTimeUnixNano": decode["startTimeUnixNano"], "endTimeUnixNano": resize["endTimeUnixNano"],
             "attributes": resize["attributes"]}
    resize["attributes"] = []
    decode["parentSpanId"] = resize["parentSpanId"] = group["spanId"]
    spans.append(group)


_WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
          "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec"]


def _named_downloads(n: int) -> Callable[[int, Spans], None]:
    """download spans named 'download <word>' (``n`` words) with the stage attribute."""
    def edit(i: int, spans: Spans) -> None:
        download = named(spans, "download")
        download["name"] = f"download {_WORDS[i % n]}"
        download["attributes"].append({"key": "stage", "value": {"stringValue": "download"}})
    return edit


@pytest.mark.parametrize("edit, unread", [
    (_output_tokens, "prompt and output token counts (30 spans"),
    (_size_on_resize, "image sizes on stage spans other than decode (30 spans)"),
    (_size_on_custom, "image sizes on stage spans other than decode (30 spans)"),
    (_named_downloads(17), "21 distinct span names under requests (more than 20)"),
])
def test_what_the_sql_does_not_read_is_said_and_hedges_the_verdict(
        engine, tmp_path: Path, edit: Callable[[int, Spans], None], unread: str) -> None:
    """The file report splits these requests by what the SQL does not read (an output length,
    an image size on another stage, more than MAX_STAGE_NAMES names): its verdict is not the
    SQL's, so the SQL's says why and is tentative rather than confidently different."""
    got, want = reports(engine, edited(STABLE, tmp_path / "unread.jsonl", edit))
    (line,) = [p for p in got["problems"] if p.startswith(NOT_CHECKED)]
    assert line.startswith(NOT_CHECKED + unread)
    assert got["verdict"]["tentative"] and not want["verdict"]["tentative"]
    assert got["verdict"]["evidence"][0].startswith("the ClickHouse SQL does not read everything")


def test_an_image_size_on_a_group_span_is_read_as_the_file_report_reads_it(engine, tmp_path: Path) -> None:
    """A ``preprocess`` group span holds the image size (its decode none): the SQL read decode
    spans and the request span only, so every request was one unknown input where the file report
    told the slow first request's unique image apart."""
    got, want = reports(engine, edited(STABLE, tmp_path / "group_size.jsonl", _size_on_group))
    assert not [p for p in got["problems"] if p.startswith(NOT_CHECKED)]
    assert got["verdict"] == want["verdict"] and got["cold_start"] == want["cold_start"]
    assert got["cohorts"] == want["cohorts"]
    assert [(c["key"], c["requests"]) for c in want["cohorts"]] == [("1280x960", 29)]


def _sizes_on_two_groups(i: int, spans: Spans) -> None:
    """:func:`_size_on_group`, and a ``fetch`` group span around download (earlier) holding
    another size: the first group span by start gives it."""
    _size_on_group(i, spans)
    download = named(spans, "download")
    fetch = {**download, "spanId": f"{i:08x}0000f00d", "name": "fetch",
             "attributes": [{"key": "image.width", "value": {"intValue": "800"}},
                            {"key": "image.height", "value": {"intValue": "600"}}]}
    download["parentSpanId"] = fetch["spanId"]
    spans.append(fetch)


def test_image_sizes_on_two_group_spans_come_from_the_first(engine, tmp_path: Path) -> None:
    got, want = reports(engine, edited(STABLE, tmp_path / "two_groups.jsonl", _sizes_on_two_groups))
    assert got["verdict"] == want["verdict"] and got["cohorts"] == want["cohorts"]
    assert [(c["key"], c["requests"]) for c in want["cohorts"]] == [("800x600", 29)]


def test_twenty_distinct_names_are_read_as_the_file_report_does(engine, tmp_path: Path) -> None:
    """16 download names + 4 standard stages = MAX_STAGE_NAMES: no switch in the file report, so
    nothing unread, and the same confident verdict."""
    got, want = reports(engine, edited(STABLE, tmp_path / "names20.jsonl", _named_downloads(16)))
    assert not [p for p in got["problems"] if p.startswith(NOT_CHECKED)]
    assert got["verdict"] == want["verdict"]


def _fixed_custom_stages(n: int) -> Callable[[int, Spans], None]:
    """``n`` fixed custom stages (``safety_0``...) of 100 µs at the start of every request."""
    def edit(i: int, spans: Spans) -> None:
        request = named(spans, "request")
        start = int(request["startTimeUnixNano"])
        for k in range(n):
            spans.append({**named(spans, "download"), "spanId": f"{i:08x}{k:08x}", "name": f"safety_{k}",
                          "parentSpanId": request["spanId"], "attributes": [],
                          "startTimeUnixNano": str(start + k * 100_000),
                          "endTimeUnixNano": str(start + (k + 1) * 100_000)})
    return edit


def test_many_fixed_stage_names_that_recur_are_stages_in_both_reports(engine, tmp_path: Path) -> None:
    """16 fixed custom stages in every request + the 5 standard ones = 21 names: they recur
    (naming.RECURRING_NAME_MIN_SHARE), so the file report keeps them as stages, and the SQL,
    which never renamed them, has nothing unread: the same confident verdict."""
    got, want = reports(engine, edited(STABLE, tmp_path / "fixed21.jsonl", _fixed_custom_stages(16)))
    assert not [p for p in got["problems"] if p.startswith(NOT_CHECKED)]
    assert not [p for p in want["problems"] if "per-request" in p]
    assert got["verdict"] == want["verdict"]
    assert {f"safety_{k}" for k in range(16)} <= set(want["stages"]) and not want["verdict"]["tentative"]


def _second_decode(kind: str) -> Callable[[int, Spans], None]:
    """Each request's decode span split in two halves, the second a decode span of its own: of
    the same image (``same``: its width, height and bytes), of another image (``other``: a
    different width per request; ``moved``: the request's own image, the first span a small one
    every request shares), or without sizes (``unsized``)."""
    def edit(i: int, spans: Spans) -> None:
        decode = named(spans, "decode")
        start, end = int(decode["startTimeUnixNano"]), int(decode["endTimeUnixNano"])
        mid = (start + end) // 2
        attributes = {"same": decode["attributes"], "unsized": [],
                      "other": [{"key": "image.width", "value": {"intValue": str(100 + i)}},
                                {"key": "image.height", "value": {"intValue": "80"}},
                                {"key": "image.size", "value": {"intValue": "5000"}}],
                      "moved": decode["attributes"]}[kind]
        if kind == "moved":
            decode["attributes"] = [{"key": "image.width", "value": {"intValue": "64"}},
                                    {"key": "image.height", "value": {"intValue": "64"}},
                                    {"key": "image.size", "value": {"intValue": "900"}}]
        decode["endTimeUnixNano"] = str(mid)
        spans.append({**decode, "spanId": f"{i:08x}0000d2d2", "startTimeUnixNano": str(mid),
                      "endTimeUnixNano": str(end), "attributes": attributes})
    return edit


@pytest.mark.parametrize(("kind", "says", "fix"), [
    ("same", "decoded the same image more than once", advice.DECODE_ONCE),
    ("other", "decoded several images", None),
    ("unsized", "cannot be told from several images", advice.RECORD_DECODE_SIZES),
    ("moved", "decoded several images", advice.SEVERAL_IMAGES),  # first images: one size
])
def test_a_second_decode_span_is_told_by_its_sizes_in_both_reports(
        engine, tmp_path: Path, kind: str, says: str, fix: str | None) -> None:
    """A request's second decode span is a repeat only when it decoded the same image: both
    reports read each decode span's sizes alike, and say so in the same words."""
    path = TRACES / "preprocess_mixed_sizes.otlp.jsonl"
    got, want = reports(engine, edited(path, tmp_path / f"{kind}.jsonl", _second_decode(kind)))
    assert want["verdict"]["stage"] == "decode"
    assert got["verdict"] == want["verdict"]
    evidence, fixes = want["verdict"]["evidence"], want["verdict"]["advice"]
    assert [e for e in evidence if says in e], evidence
    assert (advice.DECODE_ONCE in fixes) == (kind == "same")
    assert fix is None or fix in fixes
    assert not any("more than once" in e for e in evidence) or kind == "same"
    assert not any("every request" in e for e in evidence), evidence


def _jpeg_then_other(i: int, spans: Spans) -> None:
    """:func:`_second_decode` ``other``, the first image a JPEG and the resize target 224x224:
    draft decoding could be judged for the first image alone."""
    _second_decode("other")(i, spans)
    _jpeg("JPEG")(i, spans)


def test_no_draft_estimate_from_the_first_of_several_images_in_both_reports(engine, tmp_path: Path) -> None:
    """The request's decode time is both images': no draft estimate is read from the first's
    size and format, in either report (a tester's input: the second image a large PNG)."""
    path = TRACES / "preprocess_mixed_sizes.otlp.jsonl"
    got, want = reports(engine, edited(path, tmp_path / "jpeg.jsonl", _jpeg_then_other))
    assert got["verdict"] == want["verdict"]
    assert not any("draft" in a for a in want["verdict"]["advice"]), want["verdict"]["advice"]
    _, alone = reports(engine, edited(path, tmp_path / "jpeg1.jsonl", _jpeg("JPEG")))
    assert any("draft mode" in a for a in alone["verdict"]["advice"])  # one image: estimated


def _jpeg(fmt: str) -> Callable[[int, Spans], None]:
    """The decode span's ``image.format`` ``fmt`` and a 224x224 resize target."""
    def edit(i: int, spans: Spans) -> None:
        named(spans, "decode")["attributes"].append({"key": "image.format", "value": {"stringValue": fmt}})
        named(spans, "resize")["attributes"] += [
            {"key": "image.target_width", "value": {"intValue": "224"}},
            {"key": "image.target_height", "value": {"intValue": "224"}}]
    return edit


@pytest.mark.parametrize(("fmt", "drafts"), [("image/jpeg", True), ("jpg", True), ("image/png", False),
                                           ("image/jpeg; q=0.9", True), ("image/pjpeg", True)])
def test_a_jpeg_by_its_mime_type_is_drafted_in_both_reports(engine, tmp_path: Path, fmt: str,
                                                             drafts: bool) -> None:
    path = TRACES / "preprocess_mixed_sizes.otlp.jsonl"
    got, want = reports(engine, edited(path, tmp_path / "mime.jsonl", _jpeg(fmt)))
    assert got["verdict"] == want["verdict"]
    assert any("draft mode" in a for a in want["verdict"]["advice"]) is drafts


def _grouped_images(i: int, spans: Spans) -> None:
    """:func:`_second_decode` ``other``, the two decode spans inside a custom group span."""
    _second_decode("other")(i, spans)
    decodes = [s for s in spans if s["name"] == "decode"]
    group = {**decodes[0], "spanId": f"{i:08x}0000abcd", "name": "preprocess_image",
             "endTimeUnixNano": decodes[1]["endTimeUnixNano"], "attributes": []}
    for decode in decodes:
        decode["parentSpanId"] = group["spanId"]
    spans.append(group)


def test_decode_spans_inside_custom_groups_are_said_to_be_unread_by_the_sql(engine, tmp_path: Path) -> None:
    """A tester's input: two images per request, decoded inside a custom group span. The file
    report reads both decode spans (several images); the SQL's decode facts read the spans
    directly under the request only, and said "every request had the same image" as a confident
    verdict: now it names what it did not read, and the verdict is tentative."""
    path = TRACES / "preprocess_mixed_sizes.otlp.jsonl"
    got, want = reports(engine, edited(path, tmp_path / "grouped.jsonl", _grouped_images))
    assert any("decoded several images" in e for e in want["verdict"]["evidence"])
    (line,) = [p for p in got["problems"] if p.startswith(NOT_CHECKED)]
    assert "decode / resize facts" in line and "(60 spans)" in line, line
    assert got["verdict"]["tentative"] and got["verdict"]["stage"] == want["verdict"]["stage"]
    plain, _ = reports(engine, edited(path, tmp_path / "direct.jsonl", _second_decode("other")))
    assert not [p for p in plain["problems"] if p.startswith(NOT_CHECKED)]


def test_a_file_imported_twice_reads_as_once(engine) -> None:
    """Importing the same file twice stores every span twice (the exporter's table has no key):
    the report, decode facts included ('decoded more than once' would be false), is the file
    report's of one copy."""
    path = TRACES / "preprocess_mixed_sizes.otlp.jsonl"
    tables = Tables(database=f"i{next(_dbs)}")
    import_files(engine, tables, [path])
    import_files(engine, tables, [path])
    got = json.loads(json.dumps(report_dict(fetch_aggregates(engine, tables, AggregateQuery()))))
    want = json.loads(json.dumps(diagnose(load_paths([path])).to_dict()))
    assert want["verdict"]["stage"] == "decode"
    assert got["verdict"] == want["verdict"]
    assert not any("more than once" in e for e in got["verdict"]["evidence"])


# --- GPU points from processes that ran no request -----------------------------------------------


#: An NVML UUID (the hw.id otel-stages' sampler and OpenLIT's collector write): one GPU whoever
#: reports it, so several senders' points of it are one series.
GPU_UUID = "GPU-5b1e6a4c-7f2d-4a0b-9c3e-1d2f3a4b5c6d"


def _gpu_elsewhere(source: Path, target: Path, processes: int) -> Path:
    """``source`` with its GPU metrics sent by ``processes`` exporter processes (service
    ``dcgm-exporter``, one ``service.instance.id`` each, the points dealt out among them in
    turn) instead of the service that ran the requests; with several, the GPU is named by its
    UUID (:data:`GPU_UUID`), which says they read one GPU."""
    out = []
    for line in source.read_text().splitlines():
        if processes > 1:
            line = line.replace('"stringValue":"GPU-0"', f'"stringValue":"{GPU_UUID}"')
        doc = json.loads(line)
        if "resourceMetrics" not in doc:
            out.append(doc)
            continue
        copies = []
        for k in range(processes):
            for rm in copy.deepcopy(doc["resourceMetrics"]):
                rm["resource"]["attributes"] = [
                    {"key": "service.name", "value": {"stringValue": "dcgm-exporter"}},
                    {"key": "service.instance.id", "value": {"stringValue": f"exporter-{k}"}}]
                for sm in rm["scopeMetrics"]:
                    for metric in sm["metrics"]:
                        points = metric["gauge"]["dataPoints"]
                        metric["gauge"]["dataPoints"] = points[k::processes]
                copies.append(rm)
        out.append({"resourceMetrics": copies})
    target.write_text("".join(json.dumps(doc) + "\n" for doc in out))
    return target


@pytest.mark.parametrize("processes", [1, MAX_FOREIGN_GPU_PROCESSES])
def test_gpu_points_of_an_exporter_process_meet_the_forwards(engine, tmp_path: Path, processes: int) -> None:
    """The GPU metrics come from exporter processes that ran no request (a DCGM exporter, a GPU
    worker): lined up with the forwards by time, as the file report does, the verdict is the
    file report's gpu_busy, not 'no GPU data: enable the GPU sampler'."""
    path = _gpu_elsewhere(TRACES / "gpu_busy.otlp.jsonl", tmp_path / "dcgm.jsonl", processes)
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == "gpu_busy"
    assert got["verdict"] == want["verdict"]
    assert not [p for p in got["problems"] if p.startswith(NOT_CHECKED)]


def test_gpu_points_of_too_many_exporter_processes_are_said_unread(engine, tmp_path: Path) -> None:
    """One exporter process more than MAX_FOREIGN_GPU_PROCESSES: not lined up (each host's
    forwards would meet every host's GPUs), said, and the verdict is tentative."""
    path = _gpu_elsewhere(TRACES / "gpu_busy.otlp.jsonl", tmp_path / "dcgm9.jsonl",
                          MAX_FOREIGN_GPU_PROCESSES + 1)
    got, _ = reports(engine, path)
    (line,) = [p for p in got["problems"] if p.startswith(NOT_CHECKED)]
    assert line.startswith(f"{NOT_CHECKED}GPU points from {MAX_FOREIGN_GPU_PROCESSES + 1} processes")
    assert got["verdict"]["tentative"] and got["verdict"]["cause"] != "gpu_busy"


def _nested_download(i: int, spans: Spans) -> None:
    """A download span inside the download span (the library's own ``with stage('download')``
    nested in another)."""
    outer = named(spans, "download")
    inner = {**copy.deepcopy(outer), "spanId": f"{0xd0000000 + i:016x}", "parentSpanId": outer["spanId"]}
    spans.append(inner)


def test_a_stage_nested_in_a_stage_is_detail_not_incomplete(engine, tmp_path: Path) -> None:
    """Stage spans whose parent is a stage span are detail inside that stage (analysis.requests):
    neither requests nor incomplete, in SQL too (its parent is present, just not a request)."""
    got, want = reports(engine, edited(STABLE, tmp_path / "nested.jsonl", _nested_download))
    assert want["counts"]["incomplete"] == 0
    assert got["counts"] == want["counts"]
    assert got["problems"] == want["problems"] == []
    assert got["verdict"] == want["verdict"]


def test_two_recordings_with_the_same_ids_give_a_tentative_verdict(engine, tmp_path: Path) -> None:
    """Two handed recordings made with the same seed share trace and span ids: merged, each
    report keeps the first span of each id, so the answer depends on the read order. Both
    reports, in both orders, say the verdict is tentative (span ids first)."""
    a, b = TRACES / "gpu_memory_pressure.otlp.jsonl", TRACES / "preprocess_mixed_sizes.otlp.jsonl"
    for first, second in ((a, b), (b, a)):
        merged = tmp_path / f"merged_{first.stem}.jsonl"
        merged.write_text(first.read_text() + second.read_text())
        got, want = reports(engine, merged)
        for verdict in (got["verdict"], want["verdict"]):
            assert verdict["tentative"]
            assert "share a span id with a different span" in verdict["evidence"][0]


PARITY = Path(__file__).parent / "data" / "traces" / "parity"  # README.md there says how each was made


@pytest.mark.parametrize("name, cause", [
    ("format_on_some_requests", "gpu_busy"),
    # two processes now (service.instance.id is unique only within one service.name): requests
    # 9-30 (vlm-server-v2) have no GPU points of their own, so no GPU verdict, in either report
    ("service_renamed_same_instance", "forward"),
    ("own_gpu_plus_exporter", "gpu_busy"),
    ("two_hosts_one_hw_id", "gpu_busy"),
])
def test_the_testers_parity_cases(engine, name: str, cause: str) -> None:
    """Inputs on which the ClickHouse report was confidently different (cohort format key,
    process key, GPU series of an exporter beside the process's own): now the same verdict,
    counts, set-apart list and GPU figures as the file report."""
    got, want = reports(engine, PARITY / f"{name}.otlp.jsonl")
    assert want["verdict"]["cause"] == cause
    assert got["verdict"] == want["verdict"]
    assert (got["counts"], got["set_apart"]) == (want["counts"], want["set_apart"])
    for key in ("level", "samples", "forwards_covered", "hw_id"):
        assert got["gpu"].get(key) == want["gpu"].get(key), key


SWING = Path(__file__).parent / "data" / "traces" / "gpu_swing"  # README.md there says what each is


@pytest.mark.parametrize("name, cause", [
    ("s1b_bimodal_2slow", "gpu_starved"),
    ("s1b_bimodal_inverse", "gpu_busy"),
    ("s1_contention_mix", "gpu_busy"),
    ("s7_batch_memory", "gpu_busy"),
])
def test_the_gpu_swing_cases(engine, name: str, cause: str) -> None:
    """The forward mechanism verdicts on the slow forwards (split at the warm forward median plus
    the noise band in SQL too; memory released within a forward computed in SQL): the same
    verdict and GPU figures as the file report."""
    got, want = reports(engine, SWING / f"{name}.otlp.jsonl")
    assert want["verdict"]["cause"] == cause
    assert got["verdict"] == want["verdict"]
    assert got["gpu"] == want["gpu"]


def test_memory_released_within_the_slow_forwards_in_sql_too(engine, tmp_path: Path) -> None:
    """s7_batch_memory with every other point inside a batch-8 forward back at 40 GiB: memory
    released within the slow forwards (repeated allocation and release, summed in time order in
    SQL as in the file report) is pressure in both reports."""
    gib = 1024**3
    lines = []
    for line in (SWING / "s7_batch_memory.otlp.jsonl").read_text().splitlines():
        doc = json.loads(line)
        for rm in doc.get("resourceMetrics", []):
            for sm in rm["scopeMetrics"]:
                for metric in sm["metrics"]:
                    if metric["name"] == "hw.gpu.memory.usage":
                        for i, point in enumerate(metric["gauge"]["dataPoints"]):
                            if point["asDouble"] > 41 * gib and i % 2:
                                point["asDouble"] = 40.0 * gib
        lines.append(json.dumps(doc))
    path = tmp_path / "churn.jsonl"
    path.write_text("\n".join(lines) + "\n")
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == "gpu_memory_pressure"
    assert got["verdict"] == want["verdict"]


# --- a utilization declared in % (unit "%") is a ratio in both reports --------------------------


@pytest.mark.parametrize("unit, value, cause", [
    ("%", 1.0, "gpu_starved"),     # DCGM-style percent of an idle GPU (not 100 % busy)
    ("%", 95.0, "gpu_busy"),
    ("1", 1.2, "gpu_starved"),     # over 1 cannot be a ratio: percent (the guess sits at 1.0)
    ("", 0.95, "gpu_busy"),        # undeclared and fractional, never over 1: a ratio
])
def test_the_gpu_unit_is_read_as_the_file_report_reads_it(engine, tmp_path: Path, unit: str,
                                                          value: float, cause: str) -> None:
    from tests.test_odd_values import _gpu_run

    got, want = reports(engine, _gpu_run(tmp_path, unit, value))
    assert want["verdict"]["cause"] == cause
    assert got["verdict"] == want["verdict"]


@pytest.mark.parametrize("unit, first, cause", [
    ("", None, None),         # only 0 and 1, no unit: ambiguous, left out and said (was gpu_busy)
    ("", 2, "gpu_starved"),   # one value above the guess: percent, judged
])
def test_an_undeclared_series_of_zeros_and_ones_is_left_out_by_both(
        engine, tmp_path: Path, unit: str, first: float | None, cause: str | None) -> None:
    """dcgm-exporter's integer percent of a near-idle GPU (1 during the forwards, 0 between),
    imported with MetricUnit '' (the exporter's empty unit kept empty): the SQL drops the series
    from the GPU samples as the file report does, and says so with the same line."""
    from tests.test_odd_values import AMBIGUOUS, _dcgm_run

    got, want = reports(engine, _dcgm_run(tmp_path, unit, 1, 0, first))
    assert got["verdict"] == want["verdict"]
    assert got["gpu"]["level"] == want["gpu"]["level"]
    said = [sorted(p for p in r["problems"] if p.startswith(AMBIGUOUS)) for r in (got, want)]
    assert said[0] == said[1]
    if cause is None:
        assert want["verdict"]["cause"] not in ("gpu_busy", "gpu_starved")
        assert want["gpu"]["level"] == "none" and len(said[1]) == 1
    else:
        assert want["verdict"]["cause"] == cause and said[1] == []



@pytest.mark.parametrize("case, cause", [
    ("busy_neighbour", "gpu_starved"),   # GPU 1 at 93..97 says the sender writes percent
    ("fixed_to_percent", "gpu_busy"),    # undeclared 95 then declared '%' 0.95: not 0.475
])
def test_the_unit_is_guessed_per_sender_on_its_undeclared_points(engine, tmp_path: Path,
                                                                  case: str, cause: str) -> None:
    """A DCGM exporter without requests (integer percent, no unit): its GPU 0 (the model's: 1 in
    the forwards, 0 between) beside its GPU 1 (another tenant, 93..97) is 0 % / 1 %, not left
    out; or its GPU 0 at 95 in the slow forwards, undeclared, then declared '%' from halfway:
    only the undeclared points are divided. Both reports alike."""
    from tests import odd_inputs

    def swing(i, r):
        return [("download", 5.0), ("decode", 10.0), ("resize", 4.0), ("queue", 2.0),
                ("forward", 100.0 + 300.0 * (i % 3 == 0) + r.random())]
    rows = odd_inputs.run(40, swing)
    path = odd_inputs.write(tmp_path / f"{case}.jsonl", rows)
    forwards = [(int(x["startTimeUnixNano"]), int(x["endTimeUnixNano"]))
                for spans in rows for x in spans if x["name"] == "forward"]
    slow = [(a, b) for a, b in forwards if b - a > 300_000_000]
    lo = min(int(x["startTimeUnixNano"]) for spans in rows for x in spans)
    hi = max(int(x["endTimeUnixNano"]) for spans in rows for x in spans)
    times = range(lo, hi, 20_000_000)

    def inside(t: int, windows: list[tuple[int, int]]) -> bool:
        return any(a <= t <= b for a, b in windows)
    series: list[tuple[str, str, list[tuple[int, float]]]] = []   # (unit, hw.id, points)
    if case == "busy_neighbour":
        series.append(("", "0", [(t, float(inside(t, forwards))) for t in times]))
        series.append(("", "1", [(t, 93.0 + k % 5) for k, t in enumerate(times)]))
    else:
        pct = [(t, 95.0 if inside(t, slow) else 60.0 if inside(t, forwards) else 2.0) for t in times]
        mid = (lo + hi) // 2
        series.append(("", "0", [(t, v) for t, v in pct if t < mid]))
        series.append(("%", "0", [(t, v) for t, v in pct if t >= mid]))
    metrics = [{"name": "hw.gpu.utilization", **({"unit": unit} if unit else {}),
                "gauge": {"dataPoints": [{"timeUnixNano": str(t), "asInt": str(int(v)),
                                          "attributes": [odd_inputs._attr("hw.id", hw)]}
                                         for t, v in points]}}
               for unit, hw, points in series]
    doc = {"resourceMetrics": [{"resource": {"attributes": [
        odd_inputs._attr("service.name", "dcgm-exporter")]},
        "scopeMetrics": [{"metrics": metrics}]}]}
    with path.open("a") as f:
        f.write(json.dumps(doc) + "\n")
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == cause
    assert got["verdict"] == want["verdict"] and got["gpu"] == want["gpu"]
    assert not [p for p in want["problems"] if "without a declared unit" in p]
    assert got["problems"] == want["problems"]

# --- GPU parity inputs: a steady pipeline whose forward is slow on some requests ----------------


def _slow_every(every: int, n: int = 30, seed: int = 1) -> list[Spans]:
    """``n`` requests (tests/odd_inputs.py: one trace each) of about 5 / 10 / 4 / 2 ms stages and a
    100 ms forward, 400 ms on every request ``i`` with ``i % every == 3`` (``every`` 0: none)."""
    from tests import odd_inputs

    def stages(i: int, r: Any) -> list[tuple[str, float]]:
        slow = every and i % every == 3
        return [("download", 5.0 + r.random()), ("decode", 10.0 + r.random()),
                ("resize", 4.0 + r.random()), ("queue", 2.0 + r.random()),
                ("forward", (400.0 if slow else 100.0) + r.random())]
    return odd_inputs.run(n, stages, seed=seed)


def _starved_slow(t: int, slow: list[tuple[int, int]], rows: list[Spans]) -> float:
    """A GPU at 5 % in the ``slow`` forward windows at time ``t``, 90 % in the other forwards of
    ``rows`` and idle (2 %) between them: lined up with the forwards (no busier between them than
    during them: ``gpu.falls``)."""
    if any(s <= t <= e for s, e in slow):
        return 0.05
    inside = any(int(f["startTimeUnixNano"]) <= t <= int(f["endTimeUnixNano"])
                 for spans in rows for f in spans if f["name"] == "forward")
    return 0.9 if inside else 0.02


def _span_range(rows: list[Spans]) -> tuple[int, int]:
    """The first start and last end (ns) of the spans of ``rows``."""
    return (min(int(s["startTimeUnixNano"]) for spans in rows for s in spans),
            max(int(s["endTimeUnixNano"]) for spans in rows for s in spans))


# --- GPU evidence within each input cohort ------------------------------------------------------


def _two_slow_in_six(i: int, r: Any) -> list[tuple[str, float]]:
    """Stages of request ``i`` (tests/odd_inputs.run): about 5 / 10 / 4 / 2 ms and a 100 ms
    forward, 400 ms for requests 6k and 6k + 1 (the first, cold, excepted)."""
    slow = i % 6 in (0, 1) and i > 0
    return [("download", 5.0 + r.random()), ("decode", 10.0 + r.random()),
            ("resize", 4.0 + r.random()), ("queue", 2.0 + r.random()),
            ("forward", (400.0 if slow else 100.0) + r.random())]


def _utilization_line(points: list[dict[str, Any]], unit: str = "1",
                      resource: list[dict[str, Any]] | None = None) -> str:
    """One OTLP/JSON line of ``hw.gpu.utilization`` gauge ``points`` declared in ``unit``, sent by
    ``resource`` (default: service ``svc``, instance ``i1``, as tests/odd_inputs.py writes)."""
    from tests import odd_inputs

    attrs = resource if resource is not None else [
        odd_inputs._attr("service.name", "svc"), odd_inputs._attr("service.instance.id", "i1")]
    return json.dumps({"resourceMetrics": [{"resource": {"attributes": attrs}, "scopeMetrics": [
        {"metrics": [{"name": "hw.gpu.utilization", "unit": unit, "gauge": {"dataPoints": points}}]}]}]})


def _cohort_gpu_run(tmp_path: Path) -> Path:
    """Two inputs in one process, each with slow forwards (400 ms against 100 ms): the GPU is busy
    (95 %) during the 640x480 requests' slow forwards and idle (10 %) during the 1280x960 ones',
    50 % in the fast forwards, 2 % between requests; one point every 20 ms."""
    from tests import odd_inputs

    rows = odd_inputs.run(60, _two_slow_in_six)
    windows = []
    for i, spans in enumerate(rows):
        size = (640, 480) if i % 2 == 0 else (1280, 960)
        for s in spans:
            if s["name"] == "decode":
                s["attributes"] += [odd_inputs._attr("image.width", size[0]),
                                    odd_inputs._attr("image.height", size[1])]
            if s["name"] == "forward":
                slow = int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) > 300 * MS
                windows.append((int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]),
                                (0.95 if i % 2 == 0 else 0.10) if slow else 0.5))
    path = odd_inputs.write(tmp_path / "cohort_gpu.jsonl", rows)
    first, last = _span_range(rows)
    points = []
    for t in range(first, last, 20 * MS):
        value = next((v for s, e, v in windows if s <= t <= e), 0.02)
        points.append({"timeUnixNano": str(t), "attributes": [odd_inputs._attr("hw.id", "GPU-0")],
                       "asDouble": value})
    with path.open("a") as f:
        f.write(_utilization_line(points) + "\n")
    return path


def test_each_cohort_is_judged_on_its_own_gpu_samples(engine, tmp_path: Path) -> None:
    # the SQL judged a cohort's GPU only when it was the only cohort: with two, neither got the
    # GPU cause the file report gave it
    got, want = reports(engine, _cohort_gpu_run(tmp_path))
    causes = {c["key"]: c["verdict"]["cause"] for c in want["cohorts"]}
    assert causes == {"640x480": "gpu_busy", "1280x960": "gpu_starved"}
    assert {c["key"]: c["verdict"] for c in got["cohorts"]} == {
        c["key"]: c["verdict"] for c in want["cohorts"]}
    assert got["verdict"] == want["verdict"]


@pytest.mark.parametrize("slow_value, fast_value, cause", [
    (5.0, 90.0, "gpu_starved"),    # percent on the spans (was "500% ... the other forwards 9000%")
    (0.05, 0.9, "gpu_starved"),    # the same as a ratio
    (95.0, 20.0, "gpu_busy"),
])
def test_span_attribute_utilization_in_percent_is_read_as_percent(
        engine, tmp_path: Path, slow_value: float, fast_value: float, cause: str) -> None:
    from tests import odd_inputs

    rows = _slow_every(7)
    for spans in rows:
        for s in spans:
            if s["name"] == "forward":
                slow = int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) > 300 * MS
                s["attributes"] += [
                    odd_inputs._attr("gpu.utilization.mean", slow_value if slow else fast_value),
                    odd_inputs._attr("gpu.sample_count", 8 if slow else 2)]
    got, want = reports(engine, odd_inputs.write(tmp_path / "span_pct.jsonl", rows))
    assert want["verdict"]["cause"] == cause
    assert got["verdict"] == want["verdict"]
    assert 0.0 <= want["gpu"]["mean_utilization"] <= 1.0
    assert got["gpu"]["mean_utilization"] == pytest.approx(want["gpu"]["mean_utilization"])


def test_two_senders_of_one_gpu_memory_are_not_memory_released(engine, tmp_path: Path) -> None:
    # a tester's input: the service's own sampler reads a flat 20 GiB and a GPU exporter (a
    # process with no requests) a flat 19 GiB of the same hw.id, 25 ms apart: merged into one
    # sequence, every 1 GiB step down from one to the other read as memory released, more of
    # them in longer forwards: gpu_memory_pressure and "stop allocating and freeing per request"
    from tests import odd_inputs

    rows = _slow_every(7)
    path = odd_inputs.write(tmp_path / "two_senders.jsonl", rows)
    first, last = _span_range(rows)
    gib = 2**30

    def gauges(service: str, instance: str, offset_ns: int, used: float) -> str:
        def points(value: float) -> list[dict[str, Any]]:
            return [{"timeUnixNano": str(t), "asDouble": value,
                     "attributes": [odd_inputs._attr("hw.id", "GPU-0")]}
                    for t in range(first + offset_ns, last, 150 * MS)]
        return json.dumps({"resourceMetrics": [{"resource": {"attributes": [
            odd_inputs._attr("service.name", service),
            odd_inputs._attr("service.instance.id", instance)]},
            "scopeMetrics": [{"metrics": [
                {"name": "hw.gpu.memory.usage", "unit": "By", "gauge": {"dataPoints": points(used)}},
                {"name": "hw.gpu.memory.limit", "unit": "By",
                 "gauge": {"dataPoints": points(24.0 * gib)}}]}]}]})
    with path.open("a") as f:
        f.write(gauges("svc", "i1", 0, 20.0 * gib) + "\n")
        f.write(gauges("dcgm-exporter", "node-a:9400", 25 * MS, 19.0 * gib) + "\n")
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == "forward"
    assert got["verdict"] == want["verdict"]
    memory = next(e for e in want["verdict"]["evidence"] if e.startswith("GPU memory during"))
    # the exporter names no host: its GPU-0 is a series of its own (two GPUs), each released 0
    assert re.search(r"released up to 0(\.0 GiB|% of it)", memory), memory


def test_two_senders_at_the_same_times_count_as_the_file_report_counts(engine, tmp_path: Path) -> None:
    # the service's sampler and a GPU exporter read GPU-0 at the same instants: the SQL counted
    # each instant once over all forwards (82) but both inside the slow ones (64), more than all
    from tests import odd_inputs

    rows = _slow_every(7)
    slow = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for spans in rows for s in spans
            if s["name"] == "forward" and int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) > 300 * MS]
    path = odd_inputs.write(tmp_path / "same_times.jsonl", rows)
    first, last = _span_range(rows)
    points = [{"timeUnixNano": str(t), "attributes": [odd_inputs._attr("hw.id", "GPU-0")],
               "asDouble": _starved_slow(t, slow, rows)}
              for t in range(first, last, 50 * MS)]
    with path.open("a") as f:
        for service, instance in (("svc", "i1"), ("dcgm-exporter", "node-a:9400")):
            f.write(json.dumps({"resourceMetrics": [{"resource": {"attributes": [
                odd_inputs._attr("service.name", service),
                odd_inputs._attr("service.instance.id", instance)]},
                "scopeMetrics": [{"metrics": [{"name": "hw.gpu.utilization", "unit": "1",
                                               "gauge": {"dataPoints": points}}]}]}]}) + "\n")
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == "gpu_starved"
    assert got["verdict"] == want["verdict"]
    for key in ("samples", "forwards_covered", "mean_utilization"):
        assert got["gpu"][key] == pytest.approx(want["gpu"][key]), key


def _two_hosts_memory(tmp_path: Path, hw_b: str, limit_a_gib: float, *, by_host: bool = False) -> Path:
    """Two hosts (instances inst-a, inst-b; ``by_host``: no instance ids, ``host.name`` inst-a and
    inst-b instead), 30 requests each; host b's every seventh forward is slow (400 ms) with its
    GPU's memory at 23.5 of 24 GiB in them (15 GiB otherwise); host a's card (``hw.id`` 0,
    ``limit_a_gib``) holds a flat 40 % of it. Memory read every 50 ms."""
    from tests import odd_inputs

    gib, lines = 2**30, []
    key = "host.name" if by_host else "service.instance.id"
    for host, hw, limit, slow_every in (("inst-a", "0", limit_a_gib, 0), ("inst-b", hw_b, 24.0, 7)):
        rows = _slow_every(slow_every, seed=len(lines) + 1)
        slow = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for spans in rows
                for s in spans if s["name"] == "forward"
                and int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) > 300 * MS]
        path = odd_inputs.write(tmp_path / f"{host}.jsonl", rows)
        lines += path.read_text().replace('"service.instance.id", "value": {"stringValue": "i1"}',
                                          f'"{key}", "value": {{"stringValue": "{host}"}}').splitlines()
        first, last = _span_range(rows)

        def used(t: int, limit: float = limit, slow_every: int = slow_every,
                 slow: list[tuple[int, int]] = slow) -> float:
            if not slow_every:
                return 0.4 * limit * gib
            return (23.5 if any(s <= t <= e for s, e in slow) else 15.0) * gib
        times = range(first, last, 50 * MS)
        lines.append(json.dumps({"resourceMetrics": [{"resource": {"attributes": [
            odd_inputs._attr("service.name", "svc"), odd_inputs._attr(key, host)]},
            "scopeMetrics": [{"metrics": [
                {"name": "hw.gpu.memory.usage", "unit": "By", "gauge": {"dataPoints": [
                    {"timeUnixNano": str(t), "asDouble": used(t),
                     "attributes": [odd_inputs._attr("hw.id", hw)]} for t in times]}},
                {"name": "hw.gpu.memory.limit", "unit": "By", "gauge": {"dataPoints": [
                    {"timeUnixNano": str(t), "asDouble": limit * gib,
                     "attributes": [odd_inputs._attr("hw.id", hw)]} for t in times]}}]}]}]}))
    out = tmp_path / f"two_hosts_{hw_b}_{key}.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.mark.parametrize("hw_b, limit_a_gib", [
    ("0", 80.0),            # both cards hw.id 0: host b's 24 GiB was judged against host a's 80 GiB
    ("GPU-b", 24.0),        # distinct ids: only one GPU of the fleet was read (host a's, no slow
                            # forwards): "too few forwards with a memory sample"
])
def test_each_hosts_gpu_memory_is_judged_against_its_own_limit(
        engine, tmp_path: Path, hw_b: str, limit_a_gib: float) -> None:
    got, want = reports(engine, _two_hosts_memory(tmp_path, hw_b, limit_a_gib))
    assert want["verdict"]["cause"] == "gpu_memory_pressure"
    assert got["verdict"] == want["verdict"]
    assert any("2 GPUs" in e for e in want["verdict"]["evidence"])


def test_processes_without_instance_ids_are_told_apart_by_host(engine, tmp_path: Path) -> None:
    # a tester's fleet: two hosts run service "svc" and set no service.instance.id (one process
    # per host), both report GPU "0": the two hosts were one process, so host b's 24 GiB card at
    # 23.5 GiB was one series with host a's 80 GiB card at 32 GiB (no pressure: 23.5 of 80), and
    # the falls from one host's reading to the other's read as memory released
    got, want = reports(engine, _two_hosts_memory(tmp_path, "0", 80.0, by_host=True))
    assert want["verdict"]["cause"] == "gpu_memory_pressure"
    assert any("2 GPUs" in e for e in want["verdict"]["evidence"])
    assert got["verdict"] == want["verdict"]
    for report in (got, want):
        assert [(r["service_name"], r["service_instance_id"], r["host_name"], r["requests"])
                for r in report["runs"]] == [("svc", None, "inst-a", 30), ("svc", None, "inst-b", 30)]


def _two_gpus_memory(tmp_path: Path, pressured: str, denser: str | None, utilization: str | None
                     ) -> Path:
    """One process (svc / i1) whose model spans two GPUs, hw.id 0 (80 GiB) and 1 (24 GiB), both
    reporting memory usage and limit every 50 ms (``denser``: that one every 25 ms); every
    seventh forward slow (400 ms). The ``pressured`` GPU sits at 94 % of its limit in the slow
    forwards and half of it otherwise, the other at a flat 40 %. ``utilization``: that GPU (or
    ``both``, alike) also reports hw.gpu.utilization every 50 ms, 30 % in the forwards and 5 %
    between them (it rises with them: the model's)."""
    from tests import odd_inputs

    rows = _slow_every(7)
    slow = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for spans in rows for s in spans
            if s["name"] == "forward" and int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) > 300 * MS]
    forwards = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for spans in rows for s in spans
                if s["name"] == "forward"]
    path = odd_inputs.write(tmp_path / f"two_gpus_{pressured}_{denser}_{utilization}.jsonl", rows)
    first, last = _span_range(rows)
    gib, metrics = 2**30, []
    for hw, limit in (("0", 80.0 * gib), ("1", 24.0 * gib)):
        def used(t: int, hw: str = hw, limit: float = limit) -> float:
            if hw != pressured:
                return 0.4 * limit
            return (0.94 if any(s <= t <= e for s, e in slow) else 0.5) * limit
        times = range(first, last, (25 if hw == denser else 50) * MS)
        attrs = [odd_inputs._attr("hw.id", hw)]
        metrics += [
            {"name": "hw.gpu.memory.usage", "unit": "By", "gauge": {"dataPoints": [
                {"timeUnixNano": str(t), "asDouble": used(t), "attributes": attrs} for t in times]}},
            {"name": "hw.gpu.memory.limit", "unit": "By", "gauge": {"dataPoints": [
                {"timeUnixNano": str(t), "asDouble": limit, "attributes": attrs} for t in times]}}]
        if utilization in (hw, "both"):
            metrics.append({"name": "hw.gpu.utilization", "unit": "1", "gauge": {"dataPoints": [
                {"timeUnixNano": str(t), "asDouble": 0.3 if any(s <= t <= e for s, e in forwards) else 0.05,
                 "attributes": attrs} for t in range(first, last, 50 * MS)]}})
    with path.open("a") as f:
        f.write(json.dumps({"resourceMetrics": [{"resource": {"attributes": [
            odd_inputs._attr("service.name", "svc"), odd_inputs._attr("service.instance.id", "i1")]},
            "scopeMetrics": [{"metrics": metrics}]}]}) + "\n")
    return path


@pytest.mark.parametrize("pressured, denser, utilization, cause, read", [
    # no utilization: every GPU is read (before f2305f1 the first hw.id was, a tie on points)
    ("1", None, None, "gpu_memory_pressure", "of each GPU's limit (2 GPUs, up to 80 GiB)"),
    # the utilization rising alike on both: a model on both GPUs, both read (before f2305f1 the
    # GPU with most points inside the forwards was: the idle one)
    ("0", "1", "both", "gpu_memory_pressure", "of each GPU's limit (2 GPUs, up to 80 GiB)"),
    # the utilization names GPU 0 (80 GiB) the model's: its memory is read, clear of its limit,
    # and GPU 1's pressure is a neighbour's (f2305f1 read both and called gpu_memory_pressure)
    ("1", "1", "0", "gpu_starved", "of 80 GiB"),
])
def test_the_gpus_of_a_process_read_for_memory_pressure(
        engine, tmp_path: Path, pressured: str, denser: str | None, utilization: str | None,
        cause: str, read: str) -> None:
    # a process whose points hold two GPUs, one near its limit in the slow forwards: the model's
    # GPU (the utilization's choice) is read when there is one, else every GPU
    got, want = reports(engine, _two_gpus_memory(tmp_path, pressured, denser, utilization))
    assert want["verdict"]["cause"] == cause, want["verdict"]["evidence"]
    assert got["verdict"] == want["verdict"]
    assert any(read in e for e in want["verdict"]["evidence"]), want["verdict"]["evidence"]


def _node_gpus_memory(tmp_path: Path, model_pressured: bool) -> Path:
    """One process (svc / i1) whose own points hold four GPUs of its node (hw.id 0..3, 80 GiB
    each, every 50 ms: NVML and DCGM report every GPU of the node), every seventh forward slow
    (400 ms). The model runs on GPU 2: its utilization is 30 % inside the forwards and 2 %
    between them, the others' a flat 30 %. GPU 0 holds 95 % of its limit throughout (a
    neighbour's preallocation), GPU 1 a flat 30 %, and GPU 3 churns (memory 50 % <-> 40 %
    between consecutive points) inside 3 of the 4 slow forwards and 5 of the 26 fast ones (a
    neighbour's allocations lining up by chance). GPU 2's memory: a flat 50 %, or
    (``model_pressured``) 94 % in the slow forwards."""
    from tests import odd_inputs

    rows = _slow_every(7)
    forwards = sorted((int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for spans in rows
                      for s in spans if s["name"] == "forward")
    slow = [(s, e) for s, e in forwards if e - s > 300 * MS]
    fast = [(s, e) for s, e in forwards if e - s <= 300 * MS]
    churning = slow[:3] + fast[1::5][:5]
    path = odd_inputs.write(tmp_path / f"node_gpus_{model_pressured}.jsonl", rows)
    first, last = _span_range(rows)
    times = range(first, last, 50 * MS)
    limit = 80.0 * 2**30

    def inside(t: int, windows: list[tuple[int, int]]) -> tuple[int, int] | None:
        return next(((s, e) for s, e in windows if s <= t <= e), None)

    def used(hw: str, t: int) -> float:
        if hw == "0":
            return 0.95
        if hw == "1":
            return 0.3
        if hw == "2":
            return 0.94 if model_pressured and inside(t, slow) else 0.5
        window = inside(t, churning)
        return 0.45 if window is None else 0.5 if (t - window[0]) // (50 * MS) % 2 == 0 else 0.4

    def busy(hw: str, t: int) -> float:
        return (0.3 if inside(t, forwards) else 0.02) if hw == "2" else 0.3

    metrics = []
    for hw in "0123":
        attrs = [odd_inputs._attr("hw.id", hw)]
        for name, unit, values in (("hw.gpu.memory.usage", "By", [used(hw, t) * limit for t in times]),
                                   ("hw.gpu.memory.limit", "By", [limit for _ in times]),
                                   ("hw.gpu.utilization", "1", [busy(hw, t) for t in times])):
            metrics.append({"name": name, "unit": unit, "gauge": {"dataPoints": [
                {"timeUnixNano": str(t), "asDouble": v, "attributes": attrs}
                for t, v in zip(times, values)]}})
    with path.open("a") as f:
        f.write(json.dumps({"resourceMetrics": [{"resource": {"attributes": [
            odd_inputs._attr("service.name", "svc"), odd_inputs._attr("service.instance.id", "i1")]},
            "scopeMetrics": [{"metrics": metrics}]}]}) + "\n")
    return path


@pytest.mark.parametrize("model_pressured, cause", [
    (False, "gpu_starved"),         # f2305f1: gpu_starved too (GPU 0's 95 % masked everything)
    (True, "gpu_memory_pressure"),  # f2305f1: gpu_starved (the fast forwards "under pressure")
])
def test_the_memory_of_the_models_gpu_is_read_on_a_node_of_gpus(
        engine, tmp_path: Path, model_pressured: bool, cause: str) -> None:
    # reading every GPU of the node made each forward "under pressure" by GPU 0's preallocation:
    # the pressure on the model's own GPU in the slow forwards was masked
    got, want = reports(engine, _node_gpus_memory(tmp_path, model_pressured))
    assert want["verdict"]["cause"] == cause, want["verdict"]["evidence"]
    assert got["verdict"] == want["verdict"]
    assert any("of 80 GiB" in e for e in want["verdict"]["evidence"]), want["verdict"]["evidence"]
    if model_pressured:
        assert any(e.startswith("hw.id 2: ") for e in want["verdict"]["evidence"])


@pytest.mark.parametrize("on_slow, slow_count, cause", [
    (4, 0, "gpu_starved"),  # the spans sample no slow forward: the metric points inside them judge
    (4, 4, "gpu_busy"),     # the spans sample all 4 (their own 0.95): the spans win, as before
    (2, 2, "gpu_starved"),  # 2 of 4, 4 samples (under MIN_GPU_SAMPLES): too thin, the points judge
    (2, 3, "gpu_busy"),     # 2 of 4, 6 samples: the spans can judge them, and win
])
def test_metric_points_judge_the_slow_forwards_the_span_attributes_miss(
        engine, tmp_path: Path, on_slow: int, slow_count: int, cause: str) -> None:
    # testers' inputs: forward spans carry gpu.utilization.mean 0.9 on the fast forwards and
    # gpu.sample_count 0 on the slow ones (or attributes on a few slow ones only), while
    # hw.gpu.utilization points at 5 % lie inside the slow ones: the span attributes won
    # ("judged on all forwards: 0 of the 4 slow forwards"; "too thin to call")
    from tests import odd_inputs

    rows = _slow_every(7)
    slow = []
    for spans in rows:
        for s in spans:
            if s["name"] == "forward":
                long = int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) > 300 * MS
                if long:
                    slow.append((int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])))
                if long and len(slow) > on_slow:
                    continue  # this slow forward carries no span attributes
                s["attributes"] += [odd_inputs._attr("gpu.utilization.mean", 0.95 if long else 0.9),
                                    odd_inputs._attr("gpu.sample_count", slow_count if long else 2)]
    path = odd_inputs.write(tmp_path / f"spans_miss_{on_slow}_{slow_count}.jsonl", rows)
    first, last = _span_range(rows)
    points = [{"timeUnixNano": str(t), "attributes": [odd_inputs._attr("hw.id", "GPU-0")],
               "asDouble": _starved_slow(t, slow, rows)}
              for t in range(first, last, 50 * MS)]
    with path.open("a") as f:
        f.write(json.dumps({"resourceMetrics": [{"resource": {"attributes": [
            odd_inputs._attr("service.name", "svc"), odd_inputs._attr("service.instance.id", "i1")]},
            "scopeMetrics": [{"metrics": [{"name": "hw.gpu.utilization", "unit": "1",
                                           "gauge": {"dataPoints": points}}]}]}]}) + "\n")
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == cause
    assert got["verdict"] == want["verdict"]
    assert want["gpu"]["source"] == ("metrics" if cause == "gpu_starved" else "span_attributes")


def test_each_process_span_attributes_have_their_own_unit(engine, tmp_path: Path) -> None:
    # a tester's fleet: inst-a writes ratios (its slow forwards at 0.95), inst-b percent (90.0 on
    # its forwards, none slow): one guess over the fleet divided inst-a's 0.95 by 100 ("1%":
    # gpu_starved for a busy GPU)
    from tests import odd_inputs

    lines = []
    for host, every, slow_value, fast_value in (("inst-a", 7, 0.95, 0.9), ("inst-b", 0, 90.0, 90.0)):
        rows = _slow_every(every, seed=len(lines) + 1)
        for spans in rows:
            for s in spans:
                if s["name"] == "forward":
                    long = int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) > 300 * MS
                    s["attributes"] += [
                        odd_inputs._attr("gpu.utilization.mean", slow_value if long else fast_value),
                        odd_inputs._attr("gpu.sample_count", 8 if long else 2)]
        path = odd_inputs.write(tmp_path / f"{host}.jsonl", rows)
        lines += path.read_text().replace('"i1"', f'"{host}"').splitlines()
    merged = tmp_path / "two_units.jsonl"
    merged.write_text("\n".join(lines) + "\n")
    got, want = reports(engine, merged)
    assert want["verdict"]["cause"] == "gpu_busy"
    assert want["gpu"]["slow_forward_mean_utilization"] == pytest.approx(0.95)
    assert got["verdict"] == want["verdict"]
    assert got["gpu"]["mean_utilization"] == pytest.approx(want["gpu"]["mean_utilization"])


def _span_gpu(rows: list[Spans], value: Callable[[int, bool], float | None]) -> None:
    """Sets ``gpu.utilization.mean`` = ``value(i, slow)`` (``None``: not set) and 4 samples on
    the forward span of each request ``i`` of ``rows`` (slow: longer than 300 ms)."""
    from tests import odd_inputs

    for i, spans in enumerate(rows):
        for s in spans:
            if s["name"] == "forward":
                slow = int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) > 300 * MS
                v = value(i, slow)
                if v is not None:
                    s["attributes"] += [odd_inputs._attr("gpu.utilization.mean", v),
                                        odd_inputs._attr("gpu.sample_count", 4)]


@pytest.mark.parametrize("strays", [1, 14, 15])
def test_a_process_that_mixes_ratios_and_percent_is_left_out(engine, tmp_path: Path,
                                                             strays: int) -> None:
    # a tester's: a ratio sampler (0.95 on the slow forwards, 0.9 on the others) with one stray
    # percent value (95.0) was read as percent: every 0.95 became 1 %, a confident gpu_starved
    # for a busy GPU. 28 warm readings (request 1 has none): 1 or 14 above 1 is mixed (fractions
    # at least half), 15 percent (the 13 fractions then read as a GPU near idle in those forwards)
    from tests import odd_inputs

    rows = _slow_every(7)
    _span_gpu(rows, lambda i, slow: None if i == 1 else 95.0 if i >= 30 - strays
              else 0.95 if slow else 0.9)
    path = odd_inputs.write(tmp_path / "mixed.jsonl", rows)
    got, want = reports(engine, path)
    assert got["verdict"] == want["verdict"]
    assert got["gpu"] == want["gpu"]
    mixed = [p for p in want["problems"] if "mix ratios and percent" in p]
    assert sorted(map(_examples_out, got["problems"])) == sorted(map(_examples_out, want["problems"]))
    if strays < 15:
        assert want["verdict"]["cause"] != "gpu_starved"
        assert want["gpu"]["level"] == "none" and want["gpu"]["unread_forwards"] == 28
        assert mixed == [mixed[0]] and f"{28 - strays} values between 0 and 1, {strays} above 1" in mixed[0]
        assert "service.name=svc,service.instance.id=i1" in mixed[0]
        assert advice.GPU_UNREAD in want["verdict"]["advice"]
    else:
        assert mixed == [] and want["gpu"]["source"] == "span_attributes"
        assert want["gpu"]["mean_utilization"] < 0.6


def test_a_process_unit_is_read_over_all_its_forwards_not_per_cohort(engine, tmp_path: Path) -> None:
    # one percent sampler, two inputs: 40 1280x960 requests at 60-90 %, 20 640x480 requests whose
    # GPU idles (0.4 and 0.5 %, means of 0 % and 1 % samples). Guessed per cohort, the 640x480
    # readings (none above 1) were ratios: 50 % in their slow forwards, no GPU cause for them
    from tests import odd_inputs

    rows = odd_inputs.run(60, _two_slow_in_six)
    small = {i for i in range(60) if i % 3 == 0}
    for i, spans in enumerate(rows):
        for s in spans:
            if s["name"] == "decode":
                s["attributes"] += [odd_inputs._attr("image.width", 640 if i in small else 1280),
                                    odd_inputs._attr("image.height", 480 if i in small else 960)]
    _span_gpu(rows, lambda i, slow: (0.5 if slow else 0.4) if i in small else 90.0 if slow else 60.0)
    got, want = reports(engine, odd_inputs.write(tmp_path / "one_unit.jsonl", rows))
    causes = {c["key"]: c["verdict"]["cause"] for c in want["cohorts"]}
    assert causes == {"640x480": "gpu_starved", "1280x960": "gpu_busy"}
    assert {c["key"]: c["verdict"] for c in got["cohorts"]} == {
        c["key"]: c["verdict"] for c in want["cohorts"]}
    assert got["verdict"] == want["verdict"]
    assert not [p for p in want["problems"] if "mix ratios and percent" in p]


@pytest.mark.parametrize("unit", ["1", ""])
def test_only_the_compute_engine_utilization_is_read(engine, tmp_path: Path, unit: str) -> None:
    # a tester's: hw.gpu.utilization split by hw.gpu.task (the hardware conventions' decoder /
    # encoder / general) on one hw.id: the general engine at 95 % in every forward, the video
    # engines idle. Averaged together the GPU read 32 %: a confident gpu_starved for a saturated GPU
    from tests import odd_inputs

    rows = _slow_every(7)
    path = odd_inputs.write(tmp_path / "tasks.jsonl", rows)
    windows = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))
               for spans in rows for s in spans if s["name"] == "forward"]
    first, last = _span_range(rows)
    points = []
    for t in range(first, last, 20 * MS):
        inside = any(s <= t <= e for s, e in windows)
        for task, value in (("general", 0.95 if inside else 0.03), ("decoder", 0.0), ("encoder", 0.0)):
            points.append({"timeUnixNano": str(t), "asDouble": value * (100 if unit == "" else 1),
                           "attributes": [odd_inputs._attr("hw.id", "GPU-0"),
                                          odd_inputs._attr("hw.gpu.task", task)]})
    with path.open("a") as f:
        f.write(_utilization_line(points, unit) + "\n")
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == "gpu_busy"
    assert want["gpu"]["slow_forward_mean_utilization"] == pytest.approx(0.95)
    assert got["verdict"] == want["verdict"]
    assert got["gpu"]["samples"] == want["gpu"]["samples"]
    assert sorted(map(_examples_out, got["problems"])) == sorted(map(_examples_out, want["problems"]))


def _replicas(tmp_path: Path, slow_ms: float) -> Path:
    """Two instances of one service, 30 requests each, steady (forward 70 ms +- 2 on node-b,
    ``slow_ms`` +- 2 on node-a), the GPU busy (0.93 on every forward)."""
    from tests import odd_inputs

    lines: list[str] = []
    for node, forward_ms in (("node-a", slow_ms), ("node-b", 70.0)):
        def stages(i: int, r: Any, forward_ms: float = forward_ms) -> list[tuple[str, float]]:
            return [("download", 5.0 + r.random()), ("decode", 10.0 + r.random()),
                    ("resize", 4.0 + r.random()), ("queue", 2.0 + r.random()),
                    ("forward", forward_ms + 4 * r.random() - 2)]
        rows = odd_inputs.run(30, stages, seed=len(lines) + 1)
        _span_gpu(rows, lambda i, slow: 0.93)
        path = odd_inputs.write(tmp_path / f"{node}.jsonl", rows)
        lines += path.read_text().replace('"i1"', f'"{node}"').splitlines()
    merged = tmp_path / "replicas.jsonl"
    merged.write_text("\n".join(lines) + "\n")
    return merged


def test_a_swing_between_replicas_is_said_and_tentative(engine, tmp_path: Path) -> None:
    # a tester's: one service on an A100 (forward 160 ms) and an H100 (70 ms) node, each steady,
    # the GPU busy on both: a confident gpu_busy "forward swings 98 ms" for what is a difference
    # between replicas
    got, want = reports(engine, _replicas(tmp_path, 160.0))
    assert want["verdict"]["tentative"] is True
    assert want["verdict"]["evidence"][0].startswith("the process explains 100%")
    assert "service.name=svc,service.instance.id=node-b, 29 warm requests" in want["verdict"]["evidence"][0]
    assert want["verdict"]["advice"][0].startswith(
        "compare service.name=svc,service.instance.id=node-a with service.name=svc,service.instance.id=node-b")
    assert want["process_mix"]["processes"] == 2 and want["process_mix"]["explains"] > 0.9
    assert got["verdict"] == want["verdict"]
    assert {k: v for k, v in got["process_mix"].items() if k != "explains"} == {
        k: v for k, v in want["process_mix"].items() if k != "explains"}
    assert got["process_mix"]["explains"] == pytest.approx(want["process_mix"]["explains"], abs=1e-4)


def test_replicas_within_the_noise_pool_as_one(engine, tmp_path: Path) -> None:
    # the same two nodes 1 ms apart (within-process noise +-2 ms): the process explains little,
    # no line, the verdict is not made tentative by it
    got, want = reports(engine, _replicas(tmp_path, 71.0))
    assert want["process_mix"]["explains"] < 0.5
    assert not any(e.startswith("the process explains") for e in want["verdict"]["evidence"])
    assert got["verdict"] == want["verdict"]
@pytest.mark.parametrize("pids", [True, False])
def test_worker_processes_without_an_instance_id_are_told_apart_by_pid(engine, tmp_path: Path,
                                                                      pids: bool) -> None:
    # a tester's: four gunicorn workers of one service on one host (service.name and host.name
    # alike, process.pid apart, no service.instance.id, no request.seq / request.cold_start, as
    # a producer other than otel-stages writes them), each loading its model on its first
    # request (2.5 s against 170 ms warm). Keyed by service and host, they were one process with
    # one cold request, the other three cold starts a confident "forward swings"
    from tests import odd_inputs

    lines: list[str] = []
    for worker in range(4):
        def stages(i: int, r: Any) -> list[tuple[str, float]]:
            return [("download", 5.0 + r.random()), ("decode", 10.0 + r.random()),
                    ("resize", 4.0 + r.random()), ("queue", 2.0 + r.random()),
                    ("forward", (2500.0 if i == 0 else 150.0) + r.random())]
        rows = odd_inputs.run(15, stages, seed=worker + 1)
        for spans in rows:
            spans[0]["attributes"] = [a for a in spans[0]["attributes"] if a["key"] != "request.seq"]
        path = odd_inputs.write(tmp_path / f"w{worker}.jsonl", rows)
        resource = [odd_inputs._attr("service.name", "svc"), odd_inputs._attr("host.name", "gpu-1")]
        if pids:
            resource.append(odd_inputs._attr("process.pid", 4100 + worker))
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            doc["resourceSpans"][0]["resource"]["attributes"] = resource
            lines.append(json.dumps(doc))
    merged = tmp_path / "workers.jsonl"
    merged.write_text("\n".join(lines) + "\n")
    got, want = reports(engine, merged)
    assert got["verdict"] == want["verdict"]
    assert got["counts"]["cold"] == want["counts"]["cold"]
    if pids:
        assert want["counts"]["cold"] == 4 and want["verdict"]["cause"] == "cold_start"
        assert not want["verdict"]["tentative"]
        assert sorted(r["process_pid"] for r in want["runs"]) == ["4100", "4101", "4102", "4103"]
        assert sorted(r["process_pid"] for r in got["runs"]) == ["4100", "4101", "4102", "4103"]
    else:  # one process as far as anything recorded tells: one cold request, and the three
        # first requests, which started while it ran and are as slow, waited for it (set apart
        # alike, not a warm-up of their own)
        assert [r["process_pid"] for r in want["runs"]] == [None]
        assert want["counts"]["cold"] == 4 and want["cold_start"]["count"] == 1
        assert [a["reason"] for a in want["set_apart"]] == ["behind_cold_start"] * 3
        assert got["set_apart"] == want["set_apart"]


def test_a_few_far_forward_stalls_share_the_verdict_with_the_download_swing(engine, tmp_path: Path) -> None:
    # a tester's: 100 warm requests, download at 20 ms or (2 in 5) 220 ms, forward steady at
    # 150 ms but for 3 stalls of 1.5 s: forward (85 % of the variance, from 3 runs) led the verdict
    # and the advice alone, download (the total's p95 - p5) was only "next"
    from tests import odd_inputs

    def stages(i: int, r: Any) -> list[tuple[str, float]]:
        return [("download", (220.0 if i % 5 in (1, 3) else 20.0) + r.random()),
                ("decode", 12.0 + r.random()), ("resize", 4.0 + r.random()), ("queue", 2.0),
                ("forward", (1650.0 if i in (17, 55, 83) else 150.0) + r.random())]
    path = odd_inputs.write(tmp_path / "tail.jsonl", odd_inputs.run(101, stages))
    got, want = reports(engine, path)
    assert (want["verdict"]["stage"], want["verdict"]["tentative"]) == ("forward", True)
    assert any(e.startswith("download makes the body of the swing") for e in want["verdict"]["evidence"])
    assert any(a.startswith("download: ") for a in want["verdict"]["advice"])
    assert got["verdict"] == want["verdict"]


def test_worker_generations_one_after_another_are_no_slower_replica(engine, tmp_path: Path) -> None:
    # a tester's: six generations of one recycled worker (pid 200..205, one after another), queue
    # wait rising from 2 to 120 ms over the recording: "the process explains 96 %... compare
    # pid=205 with pid=200" for what is a load that rose over time
    from tests import odd_inputs

    lines: list[str] = []
    for gen in range(6):
        def stages(i: int, r: Any, gen: int = gen) -> list[tuple[str, float]]:
            return [("download", 5.0 + r.random()), ("decode", 10.0 + r.random()),
                    ("resize", 4.0), ("queue", 2.0 + 118.0 * (gen * 40 + i) / 240),
                    ("forward", 100.0 + r.random())]
        rows = odd_inputs.run(40, stages, seed=gen + 1)
        for spans in rows:  # generation g runs from 20 g s on
            for sp in spans:
                for k in ("startTimeUnixNano", "endTimeUnixNano"):
                    sp[k] = str(int(sp[k]) + gen * 20 * 10**9)
        path = odd_inputs.write(tmp_path / f"g{gen}.jsonl", rows)
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            doc["resourceSpans"][0]["resource"]["attributes"] = [
                odd_inputs._attr("service.name", "svc"), odd_inputs._attr("host.name", "gpu-1"),
                odd_inputs._attr("process.pid", 200 + gen)]
            lines.append(json.dumps(doc))
    merged = tmp_path / "generations.jsonl"
    merged.write_text("\n".join(lines) + "\n")
    got, want = reports(engine, merged)
    assert want["process_mix"]["explains"] > 0.9 and want["process_mix"]["processes"] == 6
    assert want["verdict"]["cause"] == "queue" and not want["verdict"]["tentative"]
    assert not any(e.startswith("the process explains") for e in want["verdict"]["evidence"])
    assert got["verdict"] == want["verdict"]


def test_a_pid_written_as_a_double_on_the_metrics_is_the_same_process(engine, tmp_path: Path) -> None:
    # a tester's: two workers (pid "4100" / "4101" on the spans, 4100.0 / 4101.0 on their GPU
    # points, each its own GPU busy in its forwards): the file report keyed the points
    # "process.pid=4100.0" (Python's str of a double), matched no request process and made no GPU
    # call, where ClickHouse (pdata's AsString: "4100") said gpu_busy
    from tests import odd_inputs

    lines: list[str] = []
    for worker in range(2):
        rows = _slow_every(7, seed=worker + 1)
        path = odd_inputs.write(tmp_path / f"w{worker}.jsonl", rows)
        host = [odd_inputs._attr("service.name", "svc")]  # no host.name: the pid alone tells them
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            doc["resourceSpans"][0]["resource"]["attributes"] = [
                *host, odd_inputs._attr("process.pid", str(4100 + worker))]
            lines.append(json.dumps(doc))
        windows = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))
                   for spans in rows for s in spans if s["name"] == "forward"]
        first, last = _span_range(rows)
        busy = 0.95 - 0.1 * worker  # two levels: read together, which GPU is whose cannot be told
        points = [{"timeUnixNano": str(t), "asDouble": busy if any(a <= t <= b for a, b in windows) else 0.03,
                   "attributes": [odd_inputs._attr("hw.id", f"GPU-{worker}")]}
                  for t in range(first, last, 20 * MS)]
        lines.append(_utilization_line(points, resource=[
            *host, odd_inputs._attr("process.pid", 4100.0 + worker)]))
    merged = tmp_path / "pids.jsonl"
    merged.write_text("\n".join(lines) + "\n")
    got, want = reports(engine, merged)
    assert want["verdict"]["cause"] == "gpu_busy" and want["gpu"]["forwards_covered"] > 0
    assert got["verdict"] == want["verdict"]
    assert got["gpu"]["samples"] == want["gpu"]["samples"]
    assert sorted(r["process_pid"] for r in want["runs"]) == ["4100", "4101"]


def test_a_per_node_gpu_exporter_describes_its_own_node(engine, tmp_path: Path) -> None:
    # a tester's fleet: requests on node-a and node-b (host.name), no GPU points of their own, one
    # dcgm exporter per node, both naming their GPU "0": node-a's reads 5 % in node-a's slow
    # forwards, node-b's 100 % every 10 ms. Every exporter went to every request process and
    # node-b's GPU decided node-a's verdict (gpu_busy, "83%")
    from tests import odd_inputs

    def resource(service: str, instance: str, host: str) -> dict[str, Any]:
        return {"attributes": [odd_inputs._attr("service.name", service),
                               odd_inputs._attr("service.instance.id", instance),
                               odd_inputs._attr("host.name", host)]}

    lines, slow = [], []
    for node, every in (("node-a", 7), ("node-b", 0)):
        rows = _slow_every(every, seed=len(lines) + 1)
        for spans in rows:
            lines.append(json.dumps({"resourceSpans": [{"resource": resource("svc", f"inst-{node}", node),
                                                        "scopeSpans": [{"spans": spans}]}]}))
        if every:
            slow = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for spans in rows
                    for s in spans if s["name"] == "forward"
                    and int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) > 300 * MS]
        first, last = _span_range(rows)
        step = 50 * MS if every else 10 * MS
        points = [{"timeUnixNano": str(t), "attributes": [odd_inputs._attr("hw.id", "0")],
                   "asDouble": _starved_slow(t, slow, rows) if every else 1.0}
                  for t in range(first, last, step)]
        lines.append(json.dumps({"resourceMetrics": [{
            "resource": resource("dcgm-exporter", f"{node}:9400", node),
            "scopeMetrics": [{"metrics": [{"name": "hw.gpu.utilization", "unit": "1",
                                           "gauge": {"dataPoints": points}}]}]}]}))
    path = tmp_path / "node_exporters.jsonl"
    path.write_text("\n".join(lines) + "\n")
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == "gpu_starved"
    assert got["verdict"] == want["verdict"]
    for key in ("samples", "forwards_covered", "mean_utilization", "slow_forward_samples"):
        assert got["gpu"][key] == pytest.approx(want["gpu"][key]), key


@pytest.mark.parametrize("exporters, cause", [
    (("node-a", "node-c"), "gpu_starved"),  # node-c's exporter names no request host: not node-a's
    (("node-c",), "forward"),               # the only GPU data is another machine's: none here
])
def test_an_exporter_on_a_host_no_request_names_is_not_lined_up(
        engine, tmp_path: Path, exporters: tuple[str, ...], cause: str) -> None:
    # a tester's fleet: requests on node-a (its GPU at 5 % in the slow forwards), exporters naming
    # GPU "0" on node-a and on node-c (100 % every 10 ms): node-c's points went to node-a's
    # requests as a fallback and made gpu_busy ("83% over 177 samples")
    from tests import odd_inputs

    def resource(service: str, instance: str, host: str) -> dict[str, Any]:
        return {"attributes": [odd_inputs._attr("service.name", service),
                               odd_inputs._attr("service.instance.id", instance),
                               odd_inputs._attr("host.name", host)]}

    rows = _slow_every(7)
    lines = [json.dumps({"resourceSpans": [{"resource": resource("svc", "inst-a", "node-a"),
                                            "scopeSpans": [{"spans": spans}]}]}) for spans in rows]
    slow = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for spans in rows
            for s in spans if s["name"] == "forward"
            and int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) > 300 * MS]
    first, last = _span_range(rows)
    for node in exporters:
        own = node == "node-a"
        points = [{"timeUnixNano": str(t), "attributes": [odd_inputs._attr("hw.id", "0")],
                   "asDouble": _starved_slow(t, slow, rows) if own else 1.0}
                  for t in range(first, last, 50 * MS if own else 10 * MS)]
        lines.append(json.dumps({"resourceMetrics": [{
            "resource": resource("dcgm-exporter", f"{node}:9400", node),
            "scopeMetrics": [{"metrics": [{"name": "hw.gpu.utilization", "unit": "1",
                                           "gauge": {"dataPoints": points}}]}]}]}))
    path = tmp_path / f"exporters_{len(exporters)}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == cause
    assert got["verdict"] == want["verdict"]
    assert got["gpu"].get("samples") == want["gpu"].get("samples")


@pytest.mark.parametrize("idle_host", ["node-c", ""])
def test_two_exporters_naming_one_gpu_id_stay_two_gpus(engine, tmp_path: Path, idle_host: str) -> None:
    # a tester's fleet: the model server names no host.name; two node exporters (no requests)
    # each report GPU "0": node-b's rises to 95 % in the server's slow forwards (its GPU), the
    # other (node-c, or a host unknown) idles at 5 %. Merged into one series "0" the slow
    # forwards read 50 % (neither busy nor starved); apart, the GPU that rises with the forwards
    # is the model's
    from tests import odd_inputs

    rows = _slow_every(7)
    path = odd_inputs.write(tmp_path / f"exporters_{idle_host or 'nohost'}.jsonl", rows)
    slow = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for spans in rows for s in spans
            if s["name"] == "forward" and int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) > 300 * MS]
    fast = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for spans in rows for s in spans
            if s["name"] == "forward" and (int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) not in slow]
    first, last = _span_range(rows)

    def busy(t: int) -> float:
        return 0.95 if any(s <= t <= e for s, e in slow) else 0.5 if any(s <= t <= e for s, e in fast) else 0.02

    with path.open("a") as f:
        for name, host, level in (("dcgm-b", "node-b", busy), ("dcgm-c", idle_host, lambda t: 0.05)):
            attrs = [odd_inputs._attr("service.name", name)] + (
                [odd_inputs._attr("host.name", host)] if host else [])
            f.write(json.dumps({"resourceMetrics": [{"resource": {"attributes": attrs}, "scopeMetrics": [
                {"metrics": [{"name": "hw.gpu.utilization", "unit": "1", "gauge": {"dataPoints": [
                    {"timeUnixNano": str(t), "asDouble": level(t),
                     "attributes": [odd_inputs._attr("hw.id", "0")]}
                    for t in range(first, last, 20 * MS)]}}]}]}]}) + "\n")
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == "gpu_busy"
    assert got["verdict"] == want["verdict"]
    assert want["gpu"]["hw_id"] == got["gpu"]["hw_id"] == "0"
    for key in ("samples", "forwards_covered", "mean_utilization"):
        assert got["gpu"][key] == pytest.approx(want["gpu"][key]), key


# --- GPU exporters on hosts, placed or not --------------------------------------------------------


def _host_run(path: Path, instance: str, host: str, seed: int = 1) -> tuple[list[tuple[int, int]], int, int]:
    """Append 30 requests (every seventh forward slow, 400 ms) of ``svc`` / ``instance`` on ``host``
    to ``path``; returns the slow forward windows and the first start / last end (ns)."""
    from tests import odd_inputs

    rows = _slow_every(7, seed=seed)
    resource = {"attributes": [odd_inputs._attr("service.name", "svc"),
                               odd_inputs._attr("service.instance.id", instance),
                               odd_inputs._attr("host.name", host)]}
    with path.open("a") as f:
        for spans in rows:
            f.write(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
                {"scope": {"name": "otel_stages"}, "spans": spans}]}]}) + "\n")
    slow = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for spans in rows for s in spans
            if s["name"] == "forward" and int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) > 300 * MS]
    return slow, *_span_range(rows)


def _gpu_sender(path: Path, resource: list[tuple[str, str]], hw: str, times: range,
                level: Callable[[int], float]) -> None:
    """Append a hw.gpu.utilization series (unit 1) of ``hw`` read at ``times`` by a process with
    the ``resource`` attributes."""
    from tests import odd_inputs

    with path.open("a") as f:
        f.write(json.dumps({"resourceMetrics": [{"resource": {"attributes": [
            odd_inputs._attr(k, v) for k, v in resource]}, "scopeMetrics": [{"metrics": [
                {"name": "hw.gpu.utilization", "unit": "1", "gauge": {"dataPoints": [
                    {"timeUnixNano": str(t), "asDouble": level(t),
                     "attributes": [odd_inputs._attr("hw.id", hw)]} for t in times]}}]}]}]}) + "\n")


def _busy_in(slow: list[tuple[int, int]]) -> Callable[[int], float]:
    return lambda t: 0.95 if any(s <= t <= e for s, e in slow) else 0.3


@pytest.mark.parametrize("exporter_host, cause", [("node-x", "forward"), ("node-a", "gpu_busy")])
def test_an_exporter_on_a_host_no_request_process_names_is_said(
        engine, tmp_path: Path, exporter_host: str, cause: str) -> None:
    # testers' fleets: a GPU worker on another node, or Kubernetes' resource detector setting
    # host.name to each pod's name: the exporter's points went to no request process and the
    # report said "no GPU data: enable the GPU sampler" with nothing in problems
    path = tmp_path / f"placed_{exporter_host}.jsonl"
    slow, first, last = _host_run(path, "i1", "node-a")
    _gpu_sender(path, [("service.name", "dcgm"), ("host.name", exporter_host)], "0",
                range(first, last, 20 * MS), _busy_in(slow))
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == cause
    assert got["verdict"] == want["verdict"]
    said = [p for p in want["problems"] if "were lined up with no forward" in p]
    assert [p for p in got["problems"] if "were lined up with no forward" in p] == said
    assert len(said) == (exporter_host == "node-x")
    if said:
        assert said[0].startswith("GPU points of 1 process that ran no request") and "node-x" in said[0]


def test_exporters_each_on_its_own_request_node_are_not_capped(engine, tmp_path: Path) -> None:
    # a tester's fleet of 10 nodes, a request process and a dcgm-exporter on each: each exporter
    # goes to its own node's process only, yet the SQL counted all 10 against its cap of 8
    # ("not checked") and lost the GPU evidence the file report had
    path = tmp_path / "nodes.jsonl"
    for k in range(MAX_FOREIGN_GPU_PROCESSES + 2):
        slow, first, last = _host_run(path, f"i{k}", f"node-{k}", seed=k + 1)
        _gpu_sender(path, [("service.name", "dcgm"), ("service.instance.id", f"dcgm-{k}"),
                           ("host.name", f"node-{k}")], "0", range(first, last, 25 * MS), _busy_in(slow))
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == "gpu_busy"
    assert got["verdict"] == want["verdict"]
    assert not [p for p in got["problems"] if p.startswith(NOT_CHECKED)]


def test_one_gpu_read_by_two_senders_at_the_same_instants_is_chosen_alike(engine, tmp_path: Path) -> None:
    # a tester's node: the service's sampler names its GPU by UUID, the node's exporter the same
    # GPU by index "2", same instants and values: the two series tie and the file report took the
    # UUID, the SQL the index
    path = tmp_path / "tie.jsonl"
    slow, first, last = _host_run(path, "i1", "node-a")
    for resource, hw in (([("service.name", "dcgm"), ("host.name", "node-a")], "2"),
                         ([("service.name", "svc"), ("service.instance.id", "i1"), ("host.name", "node-a")],
                          "GPU-5b1e6a4c-7f2d-4a0b-9c3e-1d2f3a4b5c62")):
        _gpu_sender(path, resource, hw, range(first, last, 20 * MS), _busy_in(slow))
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == "gpu_busy"
    assert got["verdict"] == want["verdict"]
    assert got["gpu"]["hw_id"] == want["gpu"]["hw_id"] == "GPU-5b1e6a4c-7f2d-4a0b-9c3e-1d2f3a4b5c62"


def test_service_keeps_the_gpu_points_of_metrics_only_processes(engine, tmp_path: Path) -> None:
    # a tester's host: svc's requests and a dcgm-exporter (metrics only, the same host.name):
    # --service svc kept only the metric points of services with spans in svc's traces, so the
    # exporter's GPU went and the report said "no GPU data: enable the GPU sampler"
    from otel_stages.analysis.services import pick_service

    path = tmp_path / "service_dcgm.jsonl"
    slow, first, last = _host_run(path, "i1", "node-a")
    _gpu_sender(path, [("service.name", "dcgm"), ("host.name", "node-a")], "0",
                range(first, last, 20 * MS), _busy_in(slow))
    tables = Tables(database=f"i{next(_dbs)}")
    import_files(engine, tables, [path])
    got = json.loads(json.dumps(report_dict(fetch_aggregates(engine, tables, AggregateQuery(service="svc")))))
    want = json.loads(json.dumps(diagnose(pick_service(load_paths([path]), "svc")).to_dict()))
    assert want["verdict"]["cause"] == "gpu_busy"
    assert got["verdict"] == want["verdict"]


# --- two services sharing one service.instance.id: two processes ------------------------------


def _two_services_one_instance(source: Path, target: Path, apart: str) -> Path:
    """``source`` as ``svc-x`` and a copy as ``svc-y`` (trace ids reversed, 40 ms later; span lines
    only), both with ``service.instance.id`` ``pod-7`` (a pod name used as the id by both
    containers of a pod) and without ``request.seq``, so the earliest request of each process is
    its cold one; each service's first request is 10x as slow in its forward (a model load). With
    ``apart`` ``service.namespace``: both ``svc-x``, in namespaces ``shop`` and ``lab``."""
    docs = [json.loads(line) for line in source.read_text().splitlines()]
    out = []
    for doc in docs:
        if "resourceSpans" not in doc:  # (its metric lines are left out)
            continue
        for rs in doc["resourceSpans"]:
            kept = [a for a in rs["resource"]["attributes"] if a["key"] != "service.name"]
            rs["resource"]["attributes"] = [*kept, {"key": "service.name", "value": {"stringValue": "svc-x"}},
                                            {"key": "service.instance.id", "value": {"stringValue": "pod-7"}}]
            if apart == "service.namespace":
                rs["resource"]["attributes"].append({"key": apart, "value": {"stringValue": "shop"}})
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    s["attributes"] = [a for a in s.get("attributes", []) if a["key"] != "request.seq"]
        other = copy.deepcopy(doc)
        for rs in other["resourceSpans"]:
            for a in rs["resource"]["attributes"]:
                if a["key"] == apart:
                    a["value"] = {"stringValue": "svc-y" if apart == "service.name" else "lab"}
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    s["traceId"] = s["traceId"][::-1]
                    shift(s, 40 * MS)
        out += [doc, other]
    traces: dict[tuple[int, str], Spans] = {}
    for i, doc in enumerate(out):
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    traces.setdefault((i % 2, s["traceId"]), []).append(s)
    for service in (0, 1):  # each service's first request (its first trace)
        _slower(traces[next(k for k in traces if k[0] == service)], 10.0)
    target.write_text("".join(json.dumps(doc) + "\n" for doc in out))
    return target


@pytest.mark.parametrize("apart", ["service.name", "service.namespace"])
def test_two_services_sharing_an_instance_id_are_two_processes(engine, tmp_path: Path, apart: str) -> None:
    """svc-x and svc-y both set ``service.instance.id`` pod-7: the id is unique only within one
    service, so both reports read two runs and two cold starts (svc-y's slow first request is not
    read as a slow warm one). So do two namespaces' services of one name."""
    got, want = reports(engine, _two_services_one_instance(STABLE, tmp_path / "pod.jsonl", apart))
    other = "svc-y" if apart == "service.name" else "svc-x"
    assert [(r["service_name"], r["service_instance_id"], r["requests"]) for r in want["runs"]] == [
        ("svc-x", "pod-7", 30), (other, "pod-7", 30)]
    assert want["cold_start"]["count"] == 2 and want["counts"]["cold"] == 2
    assert got["runs"] == want["runs"]
    assert got["cold_start"] == want["cold_start"] and got["counts"] == want["counts"]
    assert got["verdict"] == want["verdict"]


def test_past_twenty_cohorts_both_reports_say_how_many_there_are(engine, tmp_path: Path) -> None:
    """60 requests in 25 input sizes: the file report lists every cohort, the ClickHouse report the
    largest 20 (AggregateQuery.top_cohorts); both say how many there are (a tester read 59 against
    20 as a disagreement)."""
    def sizes(i: int, spans: Spans) -> None:
        named(spans, "decode")["attributes"] += [
            {"key": "image.width", "value": {"intValue": str(640 + 16 * (i % 25))}},
            {"key": "image.height", "value": {"intValue": "480"}}]
    got, want = reports(engine, edited(STABLE, tmp_path / "sizes.jsonl", sizes))
    assert (len(want["cohorts"]), want["cohorts_total"]) == (25, 25)
    assert (len(got["cohorts"]), got["cohorts_total"]) == (AggregateQuery().top_cohorts, 25)
    assert {c["key"] for c in got["cohorts"]} <= {c["key"] for c in want["cohorts"]}


def _staleness_markers(source: Path, target: Path, flags: int | str = 1) -> Path:
    """``source`` with a point flagged "no recorded value" (OTLP flags 1, no value: a staleness
    marker) 1 ms after each hw.gpu.utilization point."""
    out = []
    for line in source.read_text().splitlines():
        doc = json.loads(line)
        for rm in doc.get("resourceMetrics", ()):
            for sm in rm["scopeMetrics"]:
                for metric in sm["metrics"]:
                    if metric["name"] == "hw.gpu.utilization":
                        points = metric["gauge"]["dataPoints"]
                        metric["gauge"]["dataPoints"] = [q for p in points for q in (p, {
                            "timeUnixNano": str(int(p["timeUnixNano"]) + 1_000_000),
                            "attributes": p["attributes"], "flags": flags})]
        out.append(doc)
    target.write_text("".join(json.dumps(doc) + "\n" for doc in out))
    return target


@pytest.mark.parametrize("flags", [1, "1"])  # proto3 JSON writes a uint32 as a number or a string
def test_points_with_no_recorded_value_are_neither_readings_nor_problems(engine, tmp_path: Path,
                                                                         flags: int | str) -> None:
    """A tester's gauge point with ``flags: 1`` and no value was a problem line in the file report
    ("no asDouble/asInt value") and none from ClickHouse; the Collector's exporter stores it with
    Value 0, which the SQL would read as an idle GPU. Both leave it out, and say nothing."""
    source = TRACES / "gpu_busy.otlp.jsonl"
    plain, _ = reports(engine, source)
    stale = _staleness_markers(source, tmp_path / "stale.jsonl", flags)
    got, want = reports(engine, stale)
    assert want["verdict"] == plain["verdict"] and want["gpu"] == plain["gpu"]
    assert got["gpu"] == want["gpu"] and got["verdict"] == want["verdict"]
    assert want["problems"] == plain["problems"]
    tables = Tables(database=f"stale{len(str(flags))}{type(flags).__name__}")
    assert import_files(engine, tables, [stale]).problems == []
    stored = engine.rows(f"SELECT countIf(Flags = 1 AND Value = 0) AS n FROM {tables.gauge_ref}")
    assert stored[0]["n"] > 0  # stored as the exporter stores it
