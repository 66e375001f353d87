"""The HTML report's plots: one function per section, :class:`ReportCharts` in, a Bokeh layout
(or a sentence saying why there is nothing to draw) out. Drawing only; the page around them is
:mod:`otel_stages.html_report`.

Bokeh's Python side costs about ten models per glyph renderer, each built and serialized, so a
box-plot figure draws all its boxes with three renderers and small panels get no toolbar
(``benchmarks/plot_libraries.md``). Telemetry text shown by BokehJS (stage names, GPU models)
goes through :func:`plain`, so it is never taken for math text (which would load MathJax from a
CDN).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from otel_stages.analysis.charts import ReportCharts, StageSeries

#: Colours per standard stage (Okabe-Ito, readable with colour-blindness); custom stages cycle
#: through the rest.
STAGE_COLORS = {"download": "#0072B2", "decode": "#E69F00", "resize": "#F0E442", "queue": "#009E73",
                "forward": "#CC79A7"}
_MORE_COLORS = ("#56B4E9", "#D55E00", "#999999", "#000000", "#882255", "#44AA99")
COLD_COLOR = "#D62728"
#: Forward spans on the GPU plot.
FORWARD_FILL = "#CC79A7"
_PANEL_W, _PANEL_H, _WIDE_W = 260, 260, 1040


@dataclass
class Section:
    """One section of the page: ``key`` (its fixed id), ``title``, ``intro`` (text), and either a
    Bokeh ``model`` or a ``note`` saying why there is nothing to draw."""

    key: str
    title: str
    intro: str
    model: Any | None  # a Bokeh layout, or None: then ``note`` says why there is nothing to draw
    note: str = ""


def _color(name: str, order: Sequence[str]) -> str:
    if name in STAGE_COLORS:
        return STAGE_COLORS[name]
    custom = [n for n in order if n not in STAGE_COLORS]
    return _MORE_COLORS[custom.index(name) % len(_MORE_COLORS)] if name in custom else "#777777"


#: What BokehJS takes as the start of math text (then it loads MathJax from a CDN).
_MATH_OPENERS = ("$$", "\\[", "\\(")


def plain(text: str) -> str:
    """Telemetry text (stage names, GPU models) for Bokeh titles and legends: a zero-width space
    splits every math delimiter, so the text is drawn as typed and nothing is fetched."""
    for opener in _MATH_OPENERS:
        text = text.replace(opener, opener[0] + "\u200b" + opener[1:])
    return text


def _fig(*, small: bool = False, **kwargs: Any) -> Any:
    """A figure; ``small`` panels (small multiples) get no toolbar, only the hover added later."""
    from bokeh.plotting import figure

    if small:
        fig: Any = figure(toolbar_location=None, tools="", **kwargs)
    else:
        fig = figure(toolbar_location="above", tools="pan,box_zoom,reset,save", **kwargs)
    fig.toolbar.logo = None
    fig.title.text_font_size = "12px"
    return fig


def _hover(fig: Any, renderers: list[Any], tooltips: list[tuple[str, str]]) -> None:
    from bokeh.models import HoverTool

    fig.add_tools(HoverTool(renderers=renderers, tooltips=tooltips))


@dataclass(frozen=True)
class _Box:
    """One box of :func:`_boxes`: at categorical ``factor``, ``values`` (ms) summarized by
    ``dist`` (the analysis's Distribution), drawn in ``color``; ``cold`` values as red diamonds."""

    factor: str
    values: Sequence[float]
    dist: Any
    color: str
    label: str
    cold: Sequence[float] = ()


#: Spread of the dots around a box's centre, as a fraction of the box width. Offsets follow the
#: golden-ratio sequence: evenly spread and the same on every render (screenshots compare).
_DOT_SPREAD = 0.8
_GOLDEN = 0.6180339887


def _boxes(fig: Any, boxes: Sequence[_Box], width: float = 0.5) -> None:
    """Per box: p5..p95 box, black median line, min..max whiskers, a dot per value, the cold
    values as red diamonds. Three glyph renderers for all boxes of the figure (each renderer is
    some ten Bokeh models, and the models are what takes time to build and serialize)."""
    from bokeh.models import ColumnDataSource

    half = width / 2
    fig.vbar(x=[b.factor for b in boxes], bottom=[b.dist.p5_ms for b in boxes],
             top=[b.dist.p95_ms for b in boxes], width=width, fill_color=[b.color for b in boxes],
             fill_alpha=0.25, line_color=[b.color for b in boxes])
    lines: dict[str, list[Any]] = {"x0": [], "x1": [], "y0": [], "y1": [], "color": [], "w": []}
    for b in boxes:
        d = b.dist
        for x0, x1, y0, y1, color, w in (
            (0.0, 0.0, d.min_ms, d.p5_ms, b.color, 1),
            (0.0, 0.0, d.p95_ms, d.max_ms, b.color, 1),
            (-half, half, d.median_ms, d.median_ms, "black", 2),
        ):
            lines["x0"].append((b.factor, x0))
            lines["x1"].append((b.factor, x1))
            lines["y0"].append(y0)
            lines["y1"].append(y1)
            lines["color"].append(color)
            lines["w"].append(w)
    fig.segment(x0="x0", x1="x1", y0="y0", y1="y1", line_color="color", line_width="w",
                source=ColumnDataSource(lines))
    dots: dict[str, list[Any]] = {"x": [], "ms": [], "what": [], "marker": [], "size": [],
                                  "color": []}
    for b in boxes:
        for i, ms in enumerate(b.values):
            offset = ((i * _GOLDEN) % 1.0 - 0.5) * width * _DOT_SPREAD
            dots["x"].append((b.factor, offset))
            dots["ms"].append(ms)
            dots["what"].append(f"{b.label} #{i + 1}")
            dots["marker"].append("circle")
            dots["size"].append(5)
            dots["color"].append(b.color)
        for i, ms in enumerate(b.cold):
            dots["x"].append((b.factor, 0.0))
            dots["ms"].append(ms)
            dots["what"].append("cold" if len(b.cold) == 1 else f"cold #{i + 1}")
            dots["marker"].append("diamond")
            dots["size"].append(13)
            dots["color"].append(COLD_COLOR)
    glyph = fig.scatter(x="x", y="ms", marker="marker", size="size", color="color", alpha=0.75,
                        source=ColumnDataSource(dots))
    _hover(fig, [glyph], [("", "@what"), ("ms", "@ms{0.0}")])


def _stage_panel(s: StageSeries, order: Sequence[str]) -> Any:
    assert s.warm is not None
    d = s.warm
    fig = _fig(small=True, width=_PANEL_W, height=_PANEL_H, x_range=["warm"], title=plain(s.name))
    _boxes(fig, [_Box("warm", s.warm_ms, d, _color(s.name, order), "warm", s.cold_ms)])
    fig.xaxis.major_label_text_font_size = "0px"
    fig.xaxis.major_tick_line_color = None
    fig.xaxis.axis_label = f"median {d.median_ms:.1f} / swing {d.p95_ms - d.p5_ms:.1f} ms"
    fig.xaxis.axis_label_text_font_size = "11px"
    fig.yaxis.axis_label = "ms"
    return fig


def _grid(figs: list[Any], ncols: int = 4) -> Any:
    from bokeh.layouts import column, row

    return column(*(row(*figs[i:i + ncols]) for i in range(0, len(figs), ncols)))


def _distributions(c: ReportCharts) -> Section:
    order = [s.name for s in c.stages]
    shown = [s for s in c.stages if s.warm is not None]
    intro = ("Warm requests, one panel per stage with its own scale. Box: p5 to p95 (the swing);"
             " black line: median; whiskers: min and max; dots: each warm request"
             + ("; red diamond: the cold request." if any(s.cold_ms for s in c.stages) else "."))
    if not shown:
        return Section("stages", "Stage distributions", intro, None,
                        "No warm requests: nothing to draw (only cold or failed requests were found).")
    return Section("stages", "Stage distributions (warm runs)", intro,
                    _grid([_stage_panel(s, order) for s in shown]))


def _cohorts(c: ReportCharts) -> Section:
    from bokeh.layouts import row

    title = "Cohorts (requests with the same input size)"
    if not c.cohorts:
        return Section("cohorts", title, "", None,
                        "No input sizes recorded (decode spans without image.width/image.height):"
                        " requests cannot be grouped by input.")
    keys = [f"{k.key} (n={len(k.totals_ms)})" for k in c.cohorts]
    totals = _fig(width=_WIDE_W // 2, height=320, x_range=keys, title="request total per cohort, ms")
    _boxes(totals, [_Box(label, k.totals_ms, k.total, "#4C72B0", "total")
                    for label, k in zip(keys, c.cohorts)])
    totals.yaxis.axis_label = "ms"
    order = [s.name for s in c.stages]
    names = [n for n in order if any(n in k.stage_medians_ms for k in c.cohorts)]
    data: dict[str, list[Any]] = {"cohort": keys}
    for n in names:
        data[n] = [k.stage_medians_ms.get(n, 0.0) for k in c.cohorts]
    stacked = _fig(width=_WIDE_W // 2, height=320, x_range=keys, title="median ms per stage, stacked")
    bars = stacked.vbar_stack(names, x="cohort", width=0.6, source=data,
                              color=[_color(n, order) for n in names],
                              legend_label=[plain(n) for n in names])
    _hover(stacked, bars, [("cohort", "@cohort"), ("stage", "$name"), ("median", "@$name{0.0} ms")])
    stacked.legend.location = "top_left"
    stacked.yaxis.axis_label = "ms"
    note = ""
    if len(c.cohorts) == 1:
        note = "Every warm request had the same input size, so there is one cohort."
    verdicts = [f"{k.key}: {k.cause}" + (f" ({k.stage})" if k.stage else "")
                for k in c.cohorts if k.cause]
    intro = "Largest cohort first." + (" Verdict per cohort: " + "; ".join(verdicts) if verdicts else "")
    return Section("cohorts", title, intro + (" " + note if note else ""), row(totals, stacked))


def _waterfall(c: ReportCharts) -> Section:
    from bokeh.models import ColumnDataSource

    title = "Waterfall: slowest, median and cold request"
    if not c.waterfall:
        return Section("waterfall", title, "", None, "No requests to draw.")
    order = [s.name for s in c.stages]
    labels = [f"{w.label} ({w.total_ms:.0f} ms)" for w in c.waterfall]
    fig = _fig(width=_WIDE_W, height=150 + 60 * len(labels), y_range=list(reversed(labels)),
               title="stage spans from the request start, ms")
    fig.hbar(y=labels, left=[0.0] * len(labels), right=[w.total_ms for w in c.waterfall],
             height=0.7, fill_color="#DDDDDD", line_color="#999999",
             legend_label="request (grey: no stage span)")
    rows: dict[str, list[Any]] = {"y": [], "left": [], "right": [], "stage": [], "ms": [],
                                  "color": [], "trace": []}
    for label, w in zip(labels, c.waterfall):
        for seg in w.segments:
            rows["y"].append(label)
            rows["left"].append(seg.start_ms)
            rows["right"].append(seg.start_ms + seg.duration_ms)
            rows["stage"].append(plain(seg.stage))
            rows["ms"].append(seg.duration_ms)
            rows["color"].append(_color(seg.stage, order))
            rows["trace"].append(w.trace_id)
    bars = fig.hbar(y="y", left="left", right="right", height=0.5, color="color",
                    legend_field="stage", source=ColumnDataSource(rows))
    _hover(fig, [bars], [("stage", "@stage"), ("duration", "@ms{0.0} ms"),
                         ("starts at", "@left{0.0} ms"), ("trace id", "@trace")])
    legend = fig.legend[0]
    legend.orientation = "horizontal"
    fig.add_layout(legend, "below")  # outside the bars: never hides a row
    fig.xaxis.axis_label = "ms since the request started"
    ids = "; ".join(f"{w.label}: trace {w.trace_id}" for w in c.waterfall)
    intro = f"Grey shows time inside the request that no stage span covers. {ids}"
    return Section("waterfall", title, intro, fig)


def _gpu(c: ReportCharts) -> Section:
    from bokeh.layouts import column
    from bokeh.models import Range1d
    from bokeh.models.annotations import Span

    title = "GPU utilization and memory during the forward spans"
    if not c.gpu:
        return Section("gpu", title, "", None,
                        "No GPU data in this recording (no hw.gpu.utilization or hw.gpu.memory.usage"
                        " points near the requests): enable the NVML sampler (OTEL_STAGES_GPU=auto on a"
                        " host with an NVIDIA driver) and include the metrics files.")
    util = _fig(width=_WIDE_W, height=260, title="utilization, % (shaded: forward spans)",
                y_range=(0, 105))
    windows = c.forward_windows_s
    if windows:
        util.quad(left=[a for a, _ in windows], right=[b for _, b in windows], bottom=0, top=105,
                  fill_color=FORWARD_FILL, fill_alpha=0.18, line_alpha=0, legend_label="forward span")
    mem = _fig(width=_WIDE_W, height=220, x_range=util.x_range, title="memory used, GiB")
    palette = ["#1F77B4", "#FF7F0E", "#2CA02C", "#9467BD", "#8C564B"]
    for i, g in enumerate(c.gpu):
        color = palette[i % len(palette)]
        label = plain(f"{g.model or 'GPU'} {g.hw_id[:12]}".strip())
        if g.utilization:
            util.line([t for t, _ in g.utilization], [v * 100 for _, v in g.utilization],
                      color=color, line_width=1.5, legend_label=label)
        if g.memory_used_bytes:
            mem.line([t for t, _ in g.memory_used_bytes], [v / 2**30 for _, v in g.memory_used_bytes],
                     color=color, line_width=1.5, legend_label=label)
        if g.memory_limit_bytes:
            mem.add_layout(Span(location=g.memory_limit_bytes / 2**30, dimension="width",
                                line_color=color, line_dash="dashed"))
    # from 0 to the limit: "near its limit" must be visible, not auto-zoomed away
    top = max([g.memory_limit_bytes or 0.0 for g in c.gpu]
              + [v for g in c.gpu for _, v in g.memory_used_bytes])
    if top > 0:
        mem.y_range = Range1d(start=0, end=top * 1.05 / 2**30)
    for fig in (util, mem):
        fig.xaxis.axis_label = "seconds since the first request"
        fig.legend.location = "top_left"
        fig.legend.click_policy = "hide"
    note = "" if windows else " No forward spans were recorded, so none are shaded."
    return Section("gpu", title, "Dashed line: the memory limit." + note, column(util, mem))


def _images(c: ReportCharts) -> Section:
    from bokeh.layouts import row
    from bokeh.models import ColumnDataSource

    title = "Decode and resize time against image size"
    points = [p for p in c.images if p.decode_ms is not None or p.resize_ms is not None]
    if not points:
        return Section("images", title, "", None,
                        "No image sizes with decode or resize spans in this recording.")
    figs = []
    for axis, label in (("mpx", "megapixels (as displayed)"), ("kb", "encoded kB")):
        fig = _fig(width=_WIDE_W // 2, height=320, title=f"ms against {label}")
        for stage, marker, color in (("decode", "circle", STAGE_COLORS["decode"]),
                                     ("resize", "triangle", "#0072B2")):
            sel = [p for p in points if getattr(p, f"{stage}_ms") is not None
                   and (p.pixels if axis == "mpx" else p.bytes) is not None]
            if not sel:
                continue
            src = ColumnDataSource({
                "x": [(p.pixels or 0) / 1e6 if axis == "mpx" else (p.bytes or 0) / 1e3 for p in sel],
                "ms": [getattr(p, f"{stage}_ms") for p in sel],
                "size": [f"{p.width}x{p.height}" for p in sel],
                "kb": [None if p.bytes is None else p.bytes / 1e3 for p in sel],
                "line": [COLD_COLOR if p.cold else color for p in sel],
                "trace": [p.trace_id for p in sel],
            })
            glyph = fig.scatter("x", "ms", source=src, marker=marker, size=8, fill_color=color,
                                line_color="line", line_width=1.5, alpha=0.8, legend_label=stage)
            _hover(fig, [glyph], [(stage, "@ms{0.0} ms"), ("image", "@size"), ("kB", "@kb{0}"),
                                  ("trace id", "@trace")])
        fig.xaxis.axis_label = label
        fig.yaxis.axis_label = "ms"
        fig.legend.location = "top_left"
        figs.append(fig)
    intro = "One mark per request; a red outline marks the cold request."
    return Section("images", title, intro, row(*figs))


def _change(s: StageSeries) -> str:
    """``"forward +43%"`` (median change), ``"decode ±0%"`` under half a percent."""
    if s.change_pct is None:
        return s.name
    return f"{s.name} " + ("±0%" if abs(s.change_pct) < 0.5 else f"{s.change_pct:+.0f}%")


def _significance(s: StageSeries) -> str:
    if s.significant is None:
        return "significance not tested"
    return "significant (95%)" if s.significant else "within run-to-run noise"


def _baseline(c: ReportCharts) -> Section:
    title = "Before / after (baseline comparison)"
    if not c.has_baseline:
        return Section("baseline", title, "", None,
                        "No baseline given: run `otel-stages report AFTER --baseline BEFORE --html"
                        " FILE` to compare distributions before and after a change.")
    shown = [s for s in c.stages if s.warm is not None or s.baseline is not None]
    if not shown:
        return Section("baseline", title, "", None, "Neither recording has warm requests.")
    order = [s.name for s in c.stages]
    figs = []
    for s in shown:
        fig = _fig(small=True, width=_PANEL_W, height=_PANEL_H, x_range=["before", "after"],
                   title=plain(_change(s)))
        boxes = []
        if s.baseline is not None:
            boxes.append(_Box("before", s.baseline_ms, s.baseline, "#888888", "before"))
        if s.warm is not None:
            color = _color(s.name, order)
            if s.significant and s.change_pct is not None:
                color = "#2CA02C" if s.change_pct < 0 else COLD_COLOR
            boxes.append(_Box("after", s.warm_ms, s.warm, color, "after"))
        _boxes(fig, boxes)
        fig.yaxis.axis_label = "ms"
        fig.xaxis.axis_label = _significance(s)
        fig.xaxis.axis_label_text_font_size = "11px"
        if s.significant:
            fig.xaxis.axis_label_text_font_style = "bold"
        figs.append(fig)
    intro = ("Warm requests per stage, baseline (before) and this recording (after). Title: change"
             " of the median; below: whether the change is outside run-to-run noise (95%"
             " confidence). A significant improvement is green, a significant regression red.")
    summary = " ".join(c.comparison)
    return Section("baseline", title, intro + (f" {summary}" if summary else ""), _grid(figs))


SECTIONS: tuple[Callable[[ReportCharts], Section], ...] = (
    _distributions, _cohorts, _waterfall, _gpu, _images, _baseline)
#: Sections drawn, in page order, after the verdict (for progress bars: one unit each).
SECTION_COUNT = len(SECTIONS)
