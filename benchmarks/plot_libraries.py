"""Which plotting library for ``otel-stages report --html``: file size and render time, side by side.

Not a test: run ``python benchmarks/plot_libraries.py [--repeat N] [--json]`` (needs Debian's
``chromium`` and ``pip install plotly bokeh altair vl-convert-python playwright``). Results and the
choice: ``benchmarks/plot_libraries.md``.

The same four plots, the ones the HTML report draws, built from the same synthetic data in each
library, written as ONE self-contained HTML file each (the library's JavaScript inlined, no
network), at two scales (a demo-sized recording and a large one):

1. per-stage box plots with every warm request as a point (5 stages x ``requests``);
2. a stacked horizontal waterfall (3 requests x 5 stages);
3. decode ms against image pixels (``requests`` points);
4. GPU utilization over time (``gpu_samples`` points) with forward spans as shaded bands.

Measured per library and scale: HTML bytes, Python build time, and render time in headless
Chromium: ``performance.now()`` (ms since navigation start) at the first animation frame where
every plot has drawn its marks, plus whether the page made any request besides its own file and
whether it logged a console error. Libraries are interleaved within each repeat, medians reported.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STAGES = ["download", "decode", "resize", "queue", "forward"]
SCALES = {"demo": {"requests": 48, "gpu_samples": 300, "forwards": 30},
          "large": {"requests": 2000, "gpu_samples": 20000, "forwards": 1500}}
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PLOTS = 4


def make_data(requests: int, gpu_samples: int, forwards: int, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    stage_ms = {s: [rng.lognormvariate(mu, 0.4) for _ in range(requests)]
                for s, mu in zip(STAGES, (1.0, 3.0, 1.5, 2.0, 4.0))}
    pixels = [rng.choice((160 * 120, 1024 * 768, 4000 * 3000)) for _ in range(requests)]
    decode = [p / 2e5 + rng.gauss(0, 2) for p in pixels]
    t_s = [i * 0.05 for i in range(gpu_samples)]
    util = [min(1.0, max(0.0, 0.5 + 0.4 * rng.uniform(-1, 1))) for _ in t_s]
    span = t_s[-1] / forwards
    windows = [(i * span, i * span + span * 0.6) for i in range(forwards)]
    waterfall = []
    for label in ("slowest", "median", "cold"):
        start, segs = 0.0, []
        for s in STAGES:
            d = rng.uniform(5, 60)
            segs.append((s, start, d))
            start += d
        waterfall.append((label, segs))
    return {"stage_ms": stage_ms, "pixels": pixels, "decode": decode, "t_s": t_s, "util": util,
            "windows": windows, "waterfall": waterfall}


def build_plotly(data: dict[str, Any], path: Path) -> None:
    import plotly.graph_objects as go

    figs = []
    box = go.Figure([go.Box(y=v, name=s, boxpoints="all", jitter=0.4) for s, v in data["stage_ms"].items()])
    figs.append(box)
    wf = go.Figure()
    for i, s in enumerate(STAGES):
        wf.add_bar(y=[label for label, _ in data["waterfall"]],
                   x=[segs[i][2] for _, segs in data["waterfall"]],
                   base=[segs[i][1] for _, segs in data["waterfall"]], orientation="h", name=s)
    figs.append(wf)
    figs.append(go.Figure(go.Scatter(x=data["pixels"], y=data["decode"], mode="markers")))
    xs: list[float | None] = []
    ys: list[float | None] = []
    for a, b in data["windows"]:
        xs += [a, a, b, b, None]
        ys += [0, 1, 1, 0, None]
    gpu = go.Figure([go.Scatter(x=xs, y=ys, fill="toself", mode="none", name="forward"),
                     go.Scatter(x=data["t_s"], y=data["util"], mode="lines", name="utilization")])
    figs.append(gpu)
    parts = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs)]
    path.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
                    + "".join(parts) + "</body></html>", encoding="utf-8")


def build_bokeh(data: dict[str, Any], path: Path) -> None:
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import ColumnDataSource, Whisker
    from bokeh.plotting import figure
    from bokeh.resources import INLINE
    from bokeh.transform import jitter

    box = figure(x_range=STAGES, width=800, height=300)
    q = {s: statistics.quantiles(v, n=4) for s, v in data["stage_ms"].items()}
    box.vbar(x=STAGES, bottom=[q[s][0] for s in STAGES], top=[q[s][2] for s in STAGES], width=0.6,
             fill_alpha=0.3)
    src = ColumnDataSource({"stage": [s for s in STAGES for _ in data["stage_ms"][s]],
                            "ms": [v for s in STAGES for v in data["stage_ms"][s]]})
    box.scatter(x=jitter("stage", 0.3, range=box.x_range), y="ms", source=src, size=4)
    box.add_layout(Whisker(base="stage", upper="top", lower="bottom", source=ColumnDataSource(
        {"stage": STAGES, "top": [max(data["stage_ms"][s]) for s in STAGES],
         "bottom": [min(data["stage_ms"][s]) for s in STAGES]})))
    labels = [label for label, _ in data["waterfall"]]
    wf = figure(y_range=labels, width=800, height=200)
    for i in range(len(STAGES)):
        wf.hbar(y=labels, left=[segs[i][1] for _, segs in data["waterfall"]],
                right=[segs[i][1] + segs[i][2] for _, segs in data["waterfall"]], height=0.6)
    sc = figure(width=800, height=300)
    sc.scatter(data["pixels"], data["decode"], size=5)
    gpu = figure(width=800, height=300)
    gpu.quad(left=[a for a, _ in data["windows"]], right=[b for _, b in data["windows"]], bottom=0,
             top=1, fill_alpha=0.2, line_alpha=0)
    gpu.line(data["t_s"], data["util"])
    path.write_text(file_html(column(box, wf, sc, gpu), INLINE, "bench"), encoding="utf-8")


def build_altair(data: dict[str, Any], path: Path) -> None:
    import altair as alt

    alt.data_transformers.disable_max_rows()
    rows = [{"stage": s, "ms": v} for s in STAGES for v in data["stage_ms"][s]]
    base = alt.Chart(alt.Data(values=rows))
    box = base.mark_boxplot(extent="min-max").encode(x="stage:N", y="ms:Q") + base.mark_point().encode(
        x="stage:N", y="ms:Q", xOffset="jit:Q").transform_calculate(jit="random()")
    wf_rows = [{"label": label, "stage": s, "start": a, "end": a + d}
               for label, segs in data["waterfall"] for s, a, d in segs]
    wf = alt.Chart(alt.Data(values=wf_rows)).mark_bar().encode(y="label:N", x="start:Q", x2="end:Q",
                                                               color="stage:N")
    sc = alt.Chart(alt.Data(values=[{"px": p, "ms": d} for p, d in zip(data["pixels"], data["decode"])]
                            )).mark_point().encode(x="px:Q", y="ms:Q")
    bands = alt.Chart(alt.Data(values=[{"a": a, "b": b} for a, b in data["windows"]])).mark_rect(
        opacity=0.2).encode(x="a:Q", x2="b:Q")
    line = alt.Chart(alt.Data(values=[{"t": t, "u": u} for t, u in zip(data["t_s"], data["util"])]
                              )).mark_line().encode(x="t:Q", y="u:Q")
    chart = alt.vconcat(box.properties(width=700), wf.properties(width=700),
                        sc.properties(width=700), (bands + line).properties(width=700))
    chart.save(str(path), inline=True)


BUILDERS: dict[str, Callable[[dict[str, Any], Path], None]] = {
    "plotly": build_plotly, "bokeh": build_bokeh, "altair": build_altair}

# JavaScript predicates: true once every plot has drawn its marks.
READY = {
    "plotly": "[...document.querySelectorAll('.js-plotly-plot')].filter("
              f"d => d._fullLayout && d.querySelector('.main-svg')).length >= {PLOTS}",
    # Bokeh draws into canvases inside shadow roots; its document is idle once rendered.
    "bokeh": "window.Bokeh !== undefined && Bokeh.documents.length > 0 && "
             "Bokeh.documents[0].is_idle",
    "altair": "document.querySelector('.vega-embed canvas, .vega-embed svg.marks') !== null",
}


def versions() -> dict[str, str]:
    import importlib.metadata as md

    return {n: md.version(n) for n in ("plotly", "bokeh", "altair", "vl-convert-python", "playwright")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="render runs per library (default 5)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    out: dict[str, Any] = {"versions": versions(), "results": {}}
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        out["chromium"] = browser.version
        for scale, params in SCALES.items():
            data = make_data(**params)
            files, build_s = {}, {}
            for lib, build in BUILDERS.items():
                path = Path(tmp) / f"{scale}-{lib}.html"
                t0 = time.perf_counter()
                build(data, path)
                build_s[lib] = time.perf_counter() - t0
                files[lib] = path
            render: dict[str, list[float]] = {lib: [] for lib in BUILDERS}
            requests: dict[str, set[str]] = {lib: set() for lib in BUILDERS}
            errors: dict[str, list[str]] = {lib: [] for lib in BUILDERS}
            for _ in range(args.repeat):
                for lib, path in files.items():  # interleaved
                    page = browser.new_page(viewport={"width": 1000, "height": 1400})
                    url = path.as_uri()
                    seen, logged = requests[lib], errors[lib]
                    page.on("request", lambda r, seen=seen, url=url: r.url != url and seen.add(r.url))
                    page.on("console", lambda m, logged=logged: m.type == "error" and logged.append(m.text))
                    page.on("pageerror", lambda e, logged=logged: logged.append(str(e)))
                    page.goto(url)
                    page.wait_for_function(READY[lib], polling="raf", timeout=60_000)
                    render[lib].append(page.evaluate("performance.now()"))
                    page.close()
            out["results"][scale] = {
                lib: {"html_bytes": files[lib].stat().st_size,
                      "build_ms": round(build_s[lib] * 1000, 1),
                      "render_ms_median": round(statistics.median(render[lib]), 1),
                      "render_ms_min": round(min(render[lib]), 1),
                      "other_requests": sorted(requests[lib]), "console_errors": errors[lib][:3]}
                for lib in BUILDERS
            }
        browser.close()
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(json.dumps(out["versions"]), "chromium", out["chromium"])
    print(f"{'scale':<7}{'library':<8}{'HTML kB':>9}{'build ms':>10}{'render ms':>11}{'min ms':>8}"
          "  requests/errors")
    for scale, libs in out["results"].items():
        for lib, r in libs.items():
            print(f"{scale:<7}{lib:<8}{r['html_bytes'] / 1000:>9.0f}{r['build_ms']:>10.0f}"
                  f"{r['render_ms_median']:>11.0f}{r['render_ms_min']:>8.0f}  "
                  f"{len(r['other_requests'])}/{len(r['console_errors'])}")


if __name__ == "__main__":
    main()
