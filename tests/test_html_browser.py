"""The HTML report in a real browser: Debian's headless Chromium driven by playwright.

The demo runs (small settings) under the stand-in NVML library (tests/fakenvml, the only fake:
this machine has no GPU), so its recording has GPU samples; ``otel-stages report --html`` renders
it; Chromium opens the file with every network request blocked and recorded, waits until BokehJS
has drawn every plot, and takes a full-page screenshot. Checks: each section's plot is there, the
page made no request besides its own file, logged no console error, and the screenshot is not
blank (ink, colours, and the stage colours of the plots). A second page (a before/after pair)
covers the baseline section. Control pages prove each check can fail.

Chromium comes from ``.ci/install-tools.sh`` (package ``chromium``), playwright from the test
extra; the flags are the ones this machine needs (no sandbox as root, no background networking).
Without Chromium or playwright the tests skip with the reason, unless ``CI`` is set: then they
fail. ``OTEL_STAGES_SCREENSHOT_DIR``: also save the screenshots there, to look at them.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from otel_stages.cli import main

ROOT = Path(__file__).resolve().parents[1]
HTML_DATA = ROOT / "tests" / "data" / "html"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: Every section that draws a plot when its data is there (html_report's order).
ALL_SECTIONS = ["stages", "cohorts", "waterfall", "gpu", "images", "baseline"]
#: Ready: the document loaded and, when BokehJS is on the page, it has drawn every root.
READY_JS = ("document.readyState === 'complete' && (window.Bokeh === undefined || "
            "(Bokeh.documents.length > 0 && Bokeh.documents[0].is_idle))")
ROOTS_JS = "window.Bokeh === undefined ? [] : Bokeh.documents[0].roots().map(r => r.name)"
CANVASES_JS = """() => { let n = 0; const walk = (root) => { for (const el of root.querySelectorAll('*')) {
  if (el.tagName === 'CANVAS' && el.width > 0 && el.height > 0) n++; if (el.shadowRoot) walk(el.shadowRoot);
} }; walk(document); return n; }"""


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(what: str) -> None:
    msg = f"{what} is not installed (run .ci/install-tools.sh and pip install -e '.[test]')"
    if _ci():
        pytest.fail(f"{msg}; CI is set, so the browser check must run", pytrace=False)
    pytest.skip(msg)


@dataclass
class Page:
    """What the browser saw: ``requests`` other than the page's own file, console ``errors``
    (and uncaught exceptions), the Bokeh ``roots`` drawn, the number of drawn ``canvases``,
    the full-page ``png``."""

    requests: list[str]
    errors: list[str]
    roots: list[str]
    canvases: int
    png: bytes


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        _missing("chromium (Debian package 'chromium')")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright (Python package, in the test extra)")
    try:
        import bokeh  # noqa: F401
    except ImportError:
        _missing("bokeh (the html extra, in the test extra)")
    with sync_playwright() as pw:
        instance = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


def open_page(browser: Any, path: Path, name: str) -> Page:
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    url = path.resolve().as_uri()
    requests: list[str] = []
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))

    def route(r: Any) -> None:  # the page's own file loads; anything else is recorded, blocked
        if r.request.url == url:
            r.continue_()
        else:
            requests.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(url, wait_until="load")
    page.wait_for_function(READY_JS, timeout=120_000)
    roots = page.evaluate(ROOTS_JS)
    canvases = page.evaluate(CANVASES_JS)
    png = page.screenshot(full_page=True)
    page.close()
    keep = os.environ.get("OTEL_STAGES_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / f"{name}.png").write_bytes(png)
    return Page(requests, errors, roots, canvases, png)


def ink(png: bytes) -> tuple[float, int]:
    """(fraction of pixels that are not near-white, number of distinct colours) of a screenshot."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    image = image.resize((max(1, image.width // 2), max(1, image.height // 2)))
    colors = image.getcolors(maxcolors=1 << 24) or []
    total = image.width * image.height
    inked = sum(n for n, rgb in colors if sum(rgb) < 3 * 235)
    return inked / total, len(colors)


def pixels_near(png: bytes, rgb: tuple[int, int, int], tolerance: int = 40) -> int:
    """How many pixels lie within ``tolerance`` (per channel) of ``rgb``."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    return sum(
        n for n, c in image.getcolors(maxcolors=1 << 24) or []
        if all(abs(a - b) <= tolerance for a, b in zip(c, rgb))
    )


def assert_renders_cleanly(page: Page, sections: list[str]) -> None:
    assert page.requests == [], f"the page fetched: {page.requests}"
    assert page.errors == [], f"console errors: {page.errors}"
    assert page.roots == sections
    assert page.canvases >= len(sections)
    fraction, colors = ink(page.png)
    assert fraction > 0.05 and colors > 200, f"blank-looking page: {fraction:.1%} ink, {colors} colours"


@dataclass
class Demo:
    """The demo's recordings: ``plain`` and ``draft`` (``--decode-draft``, the same plan after a
    change), and ``html``: the HTML report of ``plain``."""

    plain: Path
    draft: Path
    html: Path


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """The demo, run small under the stand-in NVML library, twice (before and after the one real
    change it offers, JPEG draft decoding), and the HTML report of the first run."""
    sys.path.insert(0, str(ROOT / "tests" / "fakenvml"))
    try:
        import build as fakenvml_build
    finally:
        sys.path.pop(0)
    folder = tmp_path_factory.mktemp("demo_html")
    try:
        lib = fakenvml_build.build(folder / "lib")
    except FileNotFoundError as exc:
        _missing(f"gcc ({exc})")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAKE_NVML_"))}
    env.update({"LD_LIBRARY_PATH": str(lib), "PYTHONPATH": str(ROOT), "OTEL_STAGES_GPU": "on",
                "OTEL_STAGES_GPU_INTERVAL_S": "0.1", "FAKE_NVML_PERIOD_MS": "300",
                "FAKE_NVML_SAMPLE_US": "50000"})
    runs = {}
    for name, extra in (("plain", []), ("draft", ["--decode-draft"])):
        runs[name] = folder / name
        done = subprocess.run(
            [sys.executable, "-m", "otel_stages.cli", "demo", "--requests", "8", "--mixed", "4",
             "--data-dir", str(runs[name]), "--json", *extra],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    out = folder / "demo.html"
    assert main(["report", str(runs["plain"]), "--html", str(out)]) == 0
    return Demo(runs["plain"], runs["draft"], out)


@pytest.mark.slow
def test_demo_report_renders_every_plot_offline_without_errors(browser, demo: Demo) -> None:
    page = open_page(browser, demo.html, "demo-report")
    # the demo has no baseline: every other section draws, the baseline one says why it cannot
    assert_renders_cleanly(page, ALL_SECTIONS[:-1])
    text = demo.html.read_text(encoding="utf-8")
    assert "No baseline given" in text
    # the plots drew in the stage colours (decode orange, forward pink), not just the text
    assert pixels_near(page.png, (0xE6, 0x9F, 0x00)) > 500
    assert pixels_near(page.png, (0xCC, 0x79, 0xA7)) > 500
    # the report's own figures: the verdict is tentative (8 + 4 requests), the waterfall lists the
    # unaccounted time, and the untraced time has its own panel
    assert "tentative: only " in text and " warm requests: this verdict is tentative" in text
    assert "unaccounted (no stage span)" in text and "<th>unaccounted ms</th>" in text
    # no request was set apart, so no orange triangle (the check above can fail)
    assert pixels_near(page.png, (0xFF, 0x9F, 0x4A), tolerance=12) == 0


@pytest.mark.slow
def test_demo_before_after_draft_decoding_marks_the_change(browser, demo: Demo, tmp_path: Path) -> None:
    """A real change (--decode-draft) against the same plan before it: the baseline section draws
    every stage and the total, with the comparison's own significance flags."""
    out = tmp_path / "demo-pair.html"
    assert main(["report", str(demo.draft), "--baseline", str(demo.plain), "--html", str(out)]) == 0
    page = open_page(browser, out, "demo-pair-report")
    assert_renders_cleanly(page, ALL_SECTIONS)
    from otel_stages.analysis import diagnose, load_paths

    report = diagnose(load_paths([demo.draft]), baseline=load_paths([demo.plain]))
    assert report.comparison is not None
    rows = _sections_html(out)["baseline"]
    for name, change in [*report.comparison.stages.items(), ("total", report.comparison.total)]:
        mark = "not tested" if change.median_ci is None else (
            "yes: significant (95%)" if change.significant else
            "unsure: inconclusive" if name in report.comparison.inconclusive else "no")
        assert re.search(rf"<td class='text'>{name}</td>.*?<td class='text'>{re.escape(mark)}</td>",
                         rows), (name, mark)


@pytest.fixture(scope="module")
def scenario_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/scenario_service.py recorded (real SDK and Pillow, JPEG and PNG, a pool, an event
    loop, a new-input request set apart as cold) and its HTML report. Its verdict depends on this
    machine's timing; the figures checked here do not."""
    folder = tmp_path_factory.mktemp("scenario")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "scenario_service.py"),
                           str(folder / "data")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = folder / "scenario.html"
    assert main(["report", str(folder / "data"), "--html", str(out)]) == 0
    return out


@pytest.mark.slow
def test_cohorts_set_apart_and_unaccounted_are_drawn_as_the_report_counts_them(
        browser, scenario_html: Path) -> None:
    page = open_page(browser, scenario_html, "scenario-report")
    assert_renders_cleanly(page, ["stages", "cohorts", "waterfall", "images"])
    sections = _sections_html(scenario_html)
    # cohorts keyed as the report keys them (format joins the key when formats vary), side by
    # side, with the PNG cohort's tentative verdict
    assert "1600x1200 JPEG" in sections["cohorts"] and "640x480 PNG" in sections["cohorts"]
    # its few warm requests make any verdict within it tentative; whether it has one (or "-": no
    # swing to name) depends on this machine's timing
    row = re.search(r"<td class='text'>640x480 PNG</td>(.*?)</tr>", sections["cohorts"])
    assert row is not None
    verdict = re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1))[-1]
    assert verdict == "-" or verdict.endswith(" - tentative"), verdict
    # the new-input request set apart as cold: a waterfall row, and orange triangles in the plots
    assert "set apart (new input)" in sections["waterfall"]
    assert "orange triangle: a request set apart as cold" in sections["stages"]
    # (#FF7F0E at the marks' alpha 0.75 over white; decode's orange dots stay outside 12)
    assert pixels_near(page.png, (0xFF, 0x9F, 0x4A), tolerance=12) > 100
    # the untraced sleep between decode and resize is drawn as unaccounted time (legend in the
    # plot's data) and counted in the waterfall's table
    assert "unaccounted (no stage span)" in scenario_html.read_text(encoding="utf-8")
    assert "<th>unaccounted ms</th>" in sections["waterfall"]


def _sections_html(path: Path) -> dict[str, str]:
    parts = re.split(r"<section id='", path.read_text(encoding="utf-8"))[1:]
    return {p.split("'", 1)[0]: p for p in parts}


@pytest.mark.slow
def test_before_after_report_renders_the_baseline_section(browser, tmp_path: Path) -> None:
    out = tmp_path / "pair.html"
    assert main(["report", str(HTML_DATA / "pair_regression.after.otlp.jsonl"), "--baseline",
                 str(HTML_DATA / "pair_regression.before.otlp.jsonl"), "--html", str(out)]) == 0
    assert_renders_cleanly(open_page(browser, out, "pair-report"), ALL_SECTIONS)


def test_math_like_stage_names_fetch_nothing(browser, tmp_path: Path) -> None:
    """BokehJS loads MathJax from a CDN for text in $$...$$: telemetry text must never trigger it."""
    from otel_stages.analysis import Recording, Span
    from otel_stages.analysis.charts import report_charts
    from otel_stages.html_report import write_html

    spans = []
    for i in range(6):
        t = 1_700_000_000 * 10**9 + i * 100_000_000  # a real Unix time: the report keeps it
        spans += [Span(f"t{i}", "r", None, "request", t, t + 60_000_000),
                  Span(f"t{i}", "a", "r", "$$x^2$$", t, t + 10_000_000 * (1 + i % 3)),
                  Span(f"t{i}", "b", "r", r"\(y\)", t + 30_000_000, t + 50_000_000)]
    out = write_html(report_charts(Recording(spans=spans)), tmp_path / "math.html")
    page = open_page(browser, out, "math-names")
    assert page.requests == [] and page.errors == []
    assert "stages" in page.roots and "waterfall" in page.roots  # the names were drawn


# --- the checks themselves can fail --------------------------------------------------------------


def test_controls_a_blank_page_a_fetch_and_a_console_error_are_caught(browser, tmp_path: Path) -> None:
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    fraction, colors = ink(open_page(browser, blank, "control-blank").png)
    assert fraction < 0.01 and colors < 10

    noisy = tmp_path / "noisy.html"
    noisy.write_text("<!DOCTYPE html><html><head><script src='http://127.0.0.1:9/lib.js'></script>"
                     "</head><body><h1>x</h1><script>console.error('boom')</script></body></html>")
    page = open_page(browser, noisy, "control-noisy")
    assert page.requests == ["http://127.0.0.1:9/lib.js"]
    assert any("boom" in e for e in page.errors)
    with pytest.raises(AssertionError, match="the page fetched"):
        assert_renders_cleanly(page, [])
