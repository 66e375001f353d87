"""The HTML report without a browser: the adapter (analysis -> ReportCharts), the renderer's
sections and "no data" notes, escaping, and ``otel-stages report --html``.

The browser checks (the page renders, no network, no console errors) are in
tests/test_html_browser.py.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from otel_stages import semconv
from otel_stages.analysis import Recording, Span, diagnose, load_paths
from otel_stages.analysis.charts import ReportCharts, report_charts
from otel_stages.analysis.requests import find_requests
from otel_stages.cli import main

DATA = Path(__file__).parent / "data"
TRACES = DATA / "traces"
PAIR_BEFORE = DATA / "html" / "pair_regression.before.otlp.jsonl"
PAIR_AFTER = DATA / "html" / "pair_regression.after.otlp.jsonl"
MIXED = DATA / "html" / "mixed_cold_start.otlp.jsonl"

pytest.importorskip("bokeh", reason="the html extra is not installed (pip install -e '.[test]')")

from otel_stages.html_report import SECTION_COUNT, render_html, write_html  # noqa: E402


def _charts(path: Path, baseline: Path | None = None) -> ReportCharts:
    return report_charts(load_paths([path]), baseline=load_paths([baseline]) if baseline else None)


# --- the adapter ---------------------------------------------------------------------------------


def test_adapter_series_match_the_analysis_exactly() -> None:
    recording = load_paths([TRACES / "gpu_busy.otlp.jsonl"])
    report = diagnose(recording)
    charts = report_charts(recording, report=report)
    requests = find_requests(recording.spans)
    warm = [r for r in requests if not r.cold and not r.error]

    assert charts.counts["requests"] == report.requests == len(requests)
    assert charts.counts["warm"] == report.warm_requests
    assert [s.name for s in charts.stages] == list(report.stages)
    for series in charts.stages:  # the same numbers the text report shows, not recomputed ones
        stats = report.stages[series.name]
        assert series.warm is not None
        assert series.warm.median_ms == pytest.approx(stats.median_ms)
        assert series.warm.p95_ms == pytest.approx(stats.p95_ms)
        assert len(series.warm_ms) == stats.count
        assert series.cold_ms == tuple(r.stages_ms[series.name] for r in requests
                                       if r.cold and series.name in r.stages_ms)
    assert charts.verdict == report.to_dict()["verdict"]
    assert charts.verdict["cause"] == "gpu_busy"

    labels = [w.label for w in charts.waterfall]
    assert labels == ["slowest warm", "median warm", "cold"]
    slowest = charts.waterfall[0]
    assert slowest.total_ms == max(r.total_ms for r in warm)
    median = statistics.median(r.total_ms for r in warm)
    assert abs(charts.waterfall[1].total_ms - median) == min(abs(r.total_ms - median) for r in warm)
    # segments are the request's own spans, offset from its start, in time order
    req = next(r for r in requests if r.trace_id == slowest.trace_id)
    assert [s.stage for s in slowest.segments] == [s.name for s in req.spans]
    assert slowest.segments[0].start_ms == pytest.approx((req.spans[0].start_ns - req.start_ns) / 1e6)
    assert all(a.start_ms <= b.start_ms for a, b in zip(slowest.segments, slowest.segments[1:]))


def test_adapter_gpu_series_line_up_with_forward_windows() -> None:
    charts = _charts(TRACES / "gpu_busy.otlp.jsonl")
    assert len(charts.gpu) == 1
    gpu = charts.gpu[0]
    assert gpu.utilization and all(0.0 <= v <= 1.0 for _, v in gpu.utilization)
    assert gpu.memory_used_bytes and gpu.memory_limit_bytes and gpu.memory_limit_bytes > 0
    times = [t for t, _ in gpu.utilization]
    assert times == sorted(times)
    windows = charts.forward_windows_s
    assert windows and all(a < b for a, b in windows)
    # forwards and samples share one axis: most samples fall inside some forward window
    inside = sum(any(a <= t <= b for a, b in windows) for t in times)
    assert inside > len(times) / 2
    # the axis starts at the first request
    assert min(a for a, _ in windows) >= 0


#: A real Unix time (the report leaves out spans before 2000 as an unset clock).
T0 = 1_700_000_000 * 10**9


def test_percent_utilization_is_scaled_to_a_fraction() -> None:
    spans = [Span("t1", "r1", None, "request", T0, T0 + 10_000_000_000),
             Span("t1", "f1", "r1", "forward", T0 + 1_000_000_000, T0 + 9_000_000_000)]
    from otel_stages.analysis import MetricPoint

    points = [MetricPoint(semconv.HW_GPU_UTILIZATION, T0 + t * 1_000_000_000, 80.0,
                          {semconv.HW_ID: "GPU-1"}) for t in range(1, 9)]
    charts = report_charts(Recording(spans=spans, metrics=points))
    assert [v for _, v in charts.gpu[0].utilization] == [0.8] * 8


def test_gpu_samples_far_from_the_requests_are_left_out() -> None:
    from otel_stages.analysis import MetricPoint

    spans = [Span("t1", "r1", None, "request", T0 + 3600 * 10**9, T0 + 3601 * 10**9),
             Span("t1", "f1", "r1", "forward", T0 + 3600 * 10**9, T0 + 3601 * 10**9)]
    near = MetricPoint(semconv.HW_GPU_UTILIZATION, T0 + 3600 * 10**9 + 5 * 10**8, 0.9,
                       {semconv.HW_ID: "g"})
    far = MetricPoint(semconv.HW_GPU_UTILIZATION, T0 + 10**9, 0.1, {semconv.HW_ID: "g"})
    charts = report_charts(Recording(spans=spans, metrics=[far, near]))
    assert charts.gpu[0].utilization == ((0.5, 0.9),)


def test_cohorts_are_input_sizes_largest_first() -> None:
    charts = _charts(MIXED)
    keys = [c.key for c in charts.cohorts]
    assert set(keys) >= {"1024x768", "4032x3024"}
    sizes = [len(c.totals_ms) for c in charts.cohorts]
    assert sizes == sorted(sizes, reverse=True)
    assert sum(sizes) == charts.counts["warm"]
    for c in charts.cohorts:
        assert c.total.median_ms == pytest.approx(statistics.median(c.totals_ms))


def test_baseline_distributions_come_from_the_baseline_file() -> None:
    charts = _charts(PAIR_AFTER, PAIR_BEFORE)
    before = [r for r in find_requests(load_paths([PAIR_BEFORE]).spans) if not r.cold and not r.error]
    forward = next(s for s in charts.stages if s.name == "forward")
    assert forward.baseline_ms == tuple(r.stages_ms["forward"] for r in before)
    assert forward.warm is not None and forward.baseline is not None
    assert forward.warm.median_ms > forward.baseline.median_ms  # forward is 45 % slower after
    assert charts.has_baseline and charts.comparison


def test_significance_is_read_from_the_contract_when_the_analysis_gives_it() -> None:
    recording, baseline = load_paths([PAIR_AFTER]), load_paths([PAIR_BEFORE])
    report = diagnose(recording, baseline=baseline)
    contract = report.to_dict()

    class WithSignificance:  # the issue-7 analysis adds "significant" to each compared stage
        def to_dict(self) -> dict:
            out = json.loads(json.dumps(contract))
            out["comparison"]["stages"]["forward"]["significant"] = True
            out["comparison"]["stages"]["decode"]["significant"] = False
            return out

    charts = report_charts(recording, baseline=baseline, report=WithSignificance())  # type: ignore[arg-type]
    marks = {s.name: s.significant for s in charts.stages}
    assert marks["forward"] is True and marks["decode"] is False
    # every other stage: the analysis's own flag, passed through (a bool, never invented)
    assert all(isinstance(marks[n], bool) for n in marks)
    today = report_charts(recording, baseline=baseline, report=report)
    flags = {n: s["significant"] for n, s in contract["comparison"]["stages"].items()}
    assert {s.name: s.significant for s in today.stages if s.name in flags} == flags


def test_charts_are_plain_json_data() -> None:
    charts = _charts(PAIR_AFTER, PAIR_BEFORE)
    out = json.loads(json.dumps(charts.to_dict()))
    assert set(out) == {"title", "origin_unix_ns", "counts", "verdict", "stages", "cohorts",
                        "waterfall", "images", "gpu", "forward_windows_s", "comparison",
                        "has_baseline", "problems", "unaccounted", "total", "input_mix_explains"}
    assert out["stages"][0]["warm"]["median_ms"] == charts.stages[0].warm.median_ms  # type: ignore[union-attr]


def test_empty_recording_gives_empty_series() -> None:
    charts = report_charts(Recording())
    assert charts.counts["requests"] == 0
    assert charts.stages == () and charts.waterfall == () and charts.gpu == ()
    assert "No warm requests" in render_html(charts)


# --- the renderer --------------------------------------------------------------------------------


def _sections(page: str) -> dict[str, str]:
    """section id -> its HTML (up to the next section)."""
    parts = re.split(r"<section id='", page)[1:]
    return {p.split("'", 1)[0]: p for p in parts}


@pytest.fixture(scope="module")
def pair_page() -> str:
    return render_html(_charts(PAIR_AFTER, PAIR_BEFORE))


def test_every_section_is_drawn_in_order_when_the_data_is_there(pair_page: str) -> None:
    page = pair_page
    sections = _sections(page)
    assert list(sections) == ["stages", "cohorts", "waterfall", "gpu", "images", "baseline"]
    assert all("class='nodata'" not in html for html in sections.values())
    # verdict first, then the sections
    assert page.index("Verdict:") < page.index("<section id='stages'>")
    # one Bokeh root per section, and the JavaScript inlined (no external script or stylesheet)
    for key in sections:
        assert f'"name":"{key}"' in page
    assert "bokeh.min.js" in page
    # (BokehJS's code names CDN URLs for features not used here: math text, icon fonts; that
    # nothing is fetched is checked in a real browser, tests/test_html_browser.py)
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|@import", page)


def test_sections_without_data_say_so_instead_of_drawing() -> None:
    spans_only = Recording(spans=load_paths([TRACES / "stable.otlp.jsonl"]).spans)  # no GPU points
    page = render_html(report_charts(spans_only))
    sections = _sections(page)
    assert "No GPU data in this recording" in sections["gpu"]
    assert "No baseline given" in sections["baseline"]
    assert '"name":"gpu"' not in page and '"name":"baseline"' not in page
    assert '"name":"stages"' in page


def test_text_is_escaped_and_never_reaches_the_template_engine(tmp_path: Path) -> None:
    evil = "<img src=x onerror=alert(1)>{{ 7*7 }}{% raw %}"
    spans = [Span("t1", "r1", None, "request", T0, T0 + 50_000_000),
             Span("t1", "s1", "r1", "decode", T0, T0 + 10_000_000),
             Span("t1", "s2", "r1", evil, T0 + 10_000_000, T0 + 40_000_000)]
    charts = report_charts(Recording(spans=spans, problems=[f"bad line: {evil}"]), title=evil)
    page = render_html(charts)
    assert "<img src=x" not in page
    # shown literally (title, problems), not evaluated by Jinja ({{ 7*7 }} would become 49)
    assert page.count("&lt;img src=x onerror=alert(1)&gt;{{ 7*7 }}{% raw %}") >= 2


def test_render_ticks_once_per_section_and_writes_atomically(tmp_path: Path) -> None:
    ticks: list[int] = []
    out = write_html(_charts(TRACES / "cold_start.otlp.jsonl"), tmp_path / "r.html",
                     tick=lambda: ticks.append(1))
    assert len(ticks) == SECTION_COUNT
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left


# --- the CLI -------------------------------------------------------------------------------------


def test_report_html_writes_the_file_and_still_prints_the_report(tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.html"
    assert main(["report", str(PAIR_AFTER), "--baseline", str(PAIR_BEFORE), "--json",
                 "--html", str(out)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["requests"] > 0  # stdout is still the JSON, nothing else
    assert f"HTML report written to {out}" in captured.err
    assert "\x1b[" not in captured.err  # no progress bar when stderr is not a terminal
    assert list(_sections(out.read_text(encoding="utf-8"))) == [
        "stages", "cohorts", "waterfall", "gpu", "images", "baseline"]


@pytest.mark.parametrize(("args", "message", "status"), [
    (["--prometheus", "http://127.0.0.1:9"], "--html draws traces", 2),
    ([str(TRACES / "stable.otlp.jsonl")], "does not exist", 1),
])
def test_report_html_bad_combinations_fail_before_loading(args, message, status, tmp_path, capsys):
    target = tmp_path / "missing-folder" / "r.html"
    assert main(["report", *args, "--html", str(target)]) == status
    assert message in capsys.readouterr().err
    assert not target.parent.exists()


def test_report_html_without_bokeh_names_the_extra(tmp_path, capsys, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bokeh" else real(name, *a))
    assert main(["report", str(TRACES / "stable.otlp.jsonl"), "--html", str(tmp_path / "r.html")]) == 1
    assert "pip install 'otel-stages[html]'" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_report_html_with_no_requests_writes_nothing(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["report", str(empty), "--html", str(tmp_path / "r.html")]) == 1
    assert not (tmp_path / "r.html").exists()
    assert "no requests found" in capsys.readouterr().err


def test_report_help_names_units_and_the_extra(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps at the terminal width, even inside words
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--html FILE" in text and "otel-stages[html]" in text


# --- the final report contract: the charts draw exactly what the report counts ----------------------


def _contract_recording() -> Recording:
    """One process: a cold first request, 12 JPEG 1024x768 and 6 PNG 640x480 requests (formats vary,
    so the report's cohort keys carry them), the first PNG 3x slower than the others (set apart
    as a new input), and 2 ms between decode and forward that no stage span covers."""
    resource = {semconv.SERVICE_NAME: "svc", semconv.SERVICE_INSTANCE_ID: "i-1"}
    spans = []
    plan = [("JPEG", 1024, 768, 30.0)] * 13 + [("PNG", 640, 480, 90.0)] + [("PNG", 640, 480, 30.0)] * 5
    for i, (fmt, w, h, forward_ms) in enumerate(plan):
        t = T0 + i * 1_000_000_000
        trace = f"{i + 1:032x}"
        decode_end = t + 10_000_000 + i * 100_000
        forward_start = decode_end + 2_000_000  # untraced gap
        end = forward_start + int(forward_ms * 1e6)
        spans += [
            Span(trace, "r", None, "request", t, end, {semconv.REQUEST_SEQ: i + 1}, resource),
            Span(trace, "d", "r", "decode", t, decode_end,
                 {semconv.IMAGE_WIDTH: w, semconv.IMAGE_HEIGHT: h, semconv.IMAGE_SIZE: 100_000 + i,
                  semconv.IMAGE_FORMAT: fmt}, resource),
            Span(trace, "f", "r", "forward", forward_start, end, {}, resource),
        ]
    return Recording(spans=spans)


def test_cohorts_use_the_report_s_own_keys_and_verdicts() -> None:
    recording = _contract_recording()
    report = diagnose(recording)
    charts = report_charts(recording, report=report)
    contract = report.to_dict()["cohorts"]
    assert [c["key"] for c in contract] == ["1024x768 JPEG", "640x480 PNG"]
    assert [c.key for c in charts.cohorts] == [c["key"] for c in contract]
    assert [len(c.totals_ms) for c in charts.cohorts] == [c["requests"] for c in contract]
    for series, entry in zip(charts.cohorts, contract):
        assert series.total.median_ms == pytest.approx(entry["median_total_ms"], abs=1e-3)
        verdict = entry["verdict"] or {}
        assert (series.cause, series.tentative) == (verdict.get("cause"), bool(verdict.get("tentative")))
    assert charts.cohorts[0].tentative  # 12 warm requests: fewer than 20
    assert charts.input_mix_explains == report.to_dict()["input_mix_explains"]


def test_set_apart_and_cold_requests_are_marked_where_the_report_puts_them() -> None:
    recording = _contract_recording()
    report = diagnose(recording)
    charts = report_charts(recording, report=report)
    (apart,) = report.set_apart
    assert apart.reason == "new_input" and apart.cohort == "640x480 PNG"
    assert charts.counts == {"requests": 19, **report.to_dict()["counts"], "set_apart": 1,
                             "cold_failed": 0}
    forward = next(s for s in charts.stages if s.name == "forward")
    assert forward.apart_ms == (apart.request.stages_ms["forward"],)
    assert len(forward.warm_ms) == report.warm_requests == 17  # set-apart and cold are not warm
    assert forward.cold_ms == (30.0,)
    kinds = {p.trace_id: p.kind for p in charts.images}
    assert kinds[apart.request.trace_id] == "set_apart" and kinds[f"{1:032x}"] == "cold"
    labels = [w.label for w in charts.waterfall]
    assert labels[-1] == "set apart (new input)" and "cold" in labels
    # the slowest warm request is the report's slowest, never the set-apart one
    assert charts.waterfall[0].trace_id == report.slowest[0].trace_id
    page = render_html(charts)
    assert "1 first of a process, 1 set apart" in page and "orange triangle" in page


def test_the_waterfall_draws_the_unaccounted_time_the_report_counts() -> None:
    recording = _contract_recording()
    charts = report_charts(recording)
    for row in charts.waterfall:
        assert row.gaps and all(g.stage == "unaccounted" for g in row.gaps)
        assert sum(g.duration_ms for g in row.gaps) == pytest.approx(row.unaccounted_ms, abs=1e-6)
        assert row.unaccounted_ms == pytest.approx(2.0, abs=1e-6)
    assert charts.unaccounted is not None
    assert charts.unaccounted.warm is not None and charts.unaccounted.warm.median_ms == pytest.approx(2.0)


def test_gaps_cover_what_no_segment_covers() -> None:
    from otel_stages.analysis.charts import Segment, gaps

    segs = [Segment("a", 1.0, 2.0), Segment("b", 2.5, 1.0), Segment("c", 6.0, 10.0)]
    assert gaps(segs, 8.0) == (Segment("unaccounted", 0.0, 1.0), Segment("unaccounted", 3.5, 2.5))
    assert gaps([], 5.0) == (Segment("unaccounted", 0.0, 5.0),)


def test_the_total_carries_the_comparison_s_significance() -> None:
    recording, baseline = load_paths([PAIR_AFTER]), load_paths([PAIR_BEFORE])
    report = diagnose(recording, baseline=baseline)
    charts = report_charts(recording, baseline=baseline, report=report)
    total = report.to_dict()["comparison"]["total"]  # type: ignore[index]
    assert charts.total is not None
    assert charts.total.significant is total["significant"] is True  # forward +45 %: the total too
    assert charts.total.change_pct == total["change_pct"]
    assert charts.total.baseline is not None and charts.total.warm is not None
    page = render_html(charts)
    baseline_html = _sections(page)["baseline"]
    assert re.search(r"<td class='text'>total</td>.*?yes: significant \(95%\)", baseline_html)
    assert re.search(r"<td class='text'>decode</td>(?:(?!</tr>).)*<td class='text'>no</td>",
                     baseline_html)


def test_a_lone_surrogate_in_the_data_is_written_not_a_traceback(tmp_path) -> None:
    # a tester's: image.format "\udc00png" (valid JSON, no UTF-8) stopped --html with a
    # UnicodeEncodeError and no file; text and --json were fine
    from tests import odd_inputs

    rows = odd_inputs.run(30)
    for i, spans in enumerate(rows):
        decode = next(s for s in spans if s["name"] == "decode")
        decode["attributes"] += [odd_inputs._attr("image.width", 640), odd_inputs._attr("image.height", 480),
                                 odd_inputs._attr("image.format", "\udc00png" if i % 2 else "jpeg")]
        spans.append({**decode, "name": "tok\ud800enize", "spanId": f"{i + 1:016x}", "attributes": []})
    path = odd_inputs.write(tmp_path / "surrogate.jsonl", rows)
    target = tmp_path / "r.html"
    assert main(["report", str(path), "--html", str(target)]) == 0
    assert "tok?enize" in target.read_text(encoding="utf-8")
