"""The HTML report: one self-contained file (Bokeh's JavaScript inlined, no network, no fonts
fetched) drawn from :class:`otel_stages.analysis.charts.ReportCharts`. Drawing only: every number
comes from the analysis through that structure.

Sections, top to bottom: verdict, evidence and advice; per-stage distributions of warm runs (box =
p5..p95, the swing; line = median; whiskers = min..max; a dot per request; the cold request as a
red diamond); cohorts side by side; a waterfall of the slowest, median and cold requests; GPU
utilization and memory over time with the forward spans shaded; decode and resize time against
image pixels and bytes; before/after per stage with the significance marks. A section without
data says so in words instead of drawing an empty plot.

Bokeh was chosen over Plotly and Vega-Altair by file size and render time in headless Chromium
(``benchmarks/plot_libraries.md``). Needs the ``html`` extra: ``pip install 'otel-stages[html]'``.
"""

from __future__ import annotations

import html
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
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
INSTALL_HINT = "the HTML report needs Bokeh: pip install 'otel-stages[html]'"
_PANEL_W, _PANEL_H, _WIDE_W = 260, 260, 1040


class HtmlUnavailable(RuntimeError):
    """Bokeh is not installed; the message says which extra to install."""


@dataclass
class _Section:
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


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


#: What BokehJS takes as the start of math text (then it loads MathJax from a CDN).
_MATH_OPENERS = ("$$", "\\[", "\\(")


def _plain(text: str) -> str:
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
    fig = _fig(small=True, width=_PANEL_W, height=_PANEL_H, x_range=["warm"], title=_plain(s.name))
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


def _distributions(c: ReportCharts) -> _Section:
    order = [s.name for s in c.stages]
    shown = [s for s in c.stages if s.warm is not None]
    intro = ("Warm requests, one panel per stage with its own scale. Box: p5 to p95 (the swing);"
             " black line: median; whiskers: min and max; dots: each warm request"
             + ("; red diamond: the cold request." if any(s.cold_ms for s in c.stages) else "."))
    if not shown:
        return _Section("stages", "Stage distributions", intro, None,
                        "No warm requests: nothing to draw (only cold or failed requests were found).")
    return _Section("stages", "Stage distributions (warm runs)", intro,
                    _grid([_stage_panel(s, order) for s in shown]))


def _cohorts(c: ReportCharts) -> _Section:
    from bokeh.layouts import row

    title = "Cohorts (requests with the same input size)"
    if not c.cohorts:
        return _Section("cohorts", title, "", None,
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
                              legend_label=[_plain(n) for n in names])
    _hover(stacked, bars, [("cohort", "@cohort"), ("stage", "$name"), ("median", "@$name{0.0} ms")])
    stacked.legend.location = "top_left"
    stacked.yaxis.axis_label = "ms"
    note = ""
    if len(c.cohorts) == 1:
        note = "Every warm request had the same input size, so there is one cohort."
    verdicts = [f"{k.key}: {k.cause}" + (f" ({k.stage})" if k.stage else "")
                for k in c.cohorts if k.cause]
    intro = "Largest cohort first." + (" Verdict per cohort: " + "; ".join(verdicts) if verdicts else "")
    return _Section("cohorts", title, intro + (" " + note if note else ""), row(totals, stacked))


def _waterfall(c: ReportCharts) -> _Section:
    from bokeh.models import ColumnDataSource

    title = "Waterfall: slowest, median and cold request"
    if not c.waterfall:
        return _Section("waterfall", title, "", None, "No requests to draw.")
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
            rows["stage"].append(_plain(seg.stage))
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
    return _Section("waterfall", title, intro, fig)


def _gpu(c: ReportCharts) -> _Section:
    from bokeh.layouts import column
    from bokeh.models import Range1d
    from bokeh.models.annotations import Span

    title = "GPU utilization and memory during the forward spans"
    if not c.gpu:
        return _Section("gpu", title, "", None,
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
        label = _plain(f"{g.model or 'GPU'} {g.hw_id[:12]}".strip())
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
    return _Section("gpu", title, "Dashed line: the memory limit." + note, column(util, mem))


def _images(c: ReportCharts) -> _Section:
    from bokeh.layouts import row
    from bokeh.models import ColumnDataSource

    title = "Decode and resize time against image size"
    points = [p for p in c.images if p.decode_ms is not None or p.resize_ms is not None]
    if not points:
        return _Section("images", title, "", None,
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
    return _Section("images", title, intro, row(*figs))


def _change(s: StageSeries) -> str:
    """``"forward +43%"`` (median change), ``"decode ±0%"`` under half a percent."""
    if s.change_pct is None:
        return s.name
    return f"{s.name} " + ("±0%" if abs(s.change_pct) < 0.5 else f"{s.change_pct:+.0f}%")


def _significance(s: StageSeries) -> str:
    if s.significant is None:
        return "significance not tested"
    return "significant (95%)" if s.significant else "within run-to-run noise"


def _baseline(c: ReportCharts) -> _Section:
    title = "Before / after (baseline comparison)"
    if not c.has_baseline:
        return _Section("baseline", title, "", None,
                        "No baseline given: run `otel-stages report AFTER --baseline BEFORE --html"
                        " FILE` to compare distributions before and after a change.")
    shown = [s for s in c.stages if s.warm is not None or s.baseline is not None]
    if not shown:
        return _Section("baseline", title, "", None, "Neither recording has warm requests.")
    order = [s.name for s in c.stages]
    figs = []
    for s in shown:
        fig = _fig(small=True, width=_PANEL_W, height=_PANEL_H, x_range=["before", "after"],
                   title=_plain(_change(s)))
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
    return _Section("baseline", title, intro + (f" {summary}" if summary else ""), _grid(figs))


_BUILDERS: tuple[Callable[[ReportCharts], _Section], ...] = (
    _distributions, _cohorts, _waterfall, _gpu, _images, _baseline)
#: Sections drawn, in page order, after the verdict (for progress bars: one unit each).
SECTION_COUNT = len(_BUILDERS)


def _verdict_html(c: ReportCharts) -> str:
    v = c.verdict
    cause = v.get("cause") or "no verdict"
    stage = f" <span class='stage'>stage: {_e(v['stage'])}</span>" if v.get("stage") else ""
    tentative = (" <span class='tentative'>tentative: fewer than 20 warm requests</span>"
                 if v.get("tentative") else "")
    counts = ", ".join(f"{v} {k}" for k, v in c.counts.items() if k != "requests")
    parts = [f"<h1>{_e(c.title)}</h1>",
             f"<p class='counts'>{c.counts.get('requests', 0)} requests ({_e(counts)})</p>",
             f"<div class='verdict'><h2>Verdict: <span class='cause'>{_e(cause)}</span>{stage}"
             f"{tentative}</h2>"]
    for name, key in (("Evidence", "evidence"), ("Advice", "advice")):
        items = v.get(key) or []
        if items:
            parts.append(f"<h3>{name}</h3><ul>" + "".join(f"<li>{_e(i)}</li>" for i in items) + "</ul>")
    parts.append("</div>")
    return "\n".join(parts)


_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; margin: 24px auto;
       max-width: 1100px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin: 28px 0 6px; }
h3 { font-size: 15px; margin: 12px 0 4px; } .counts { color: #555; margin-top: 0; }
.verdict { border-left: 4px solid #CC79A7; padding: 4px 16px; background: #FAF5F8; }
.cause { color: #8B1A5C; } .stage { font-weight: normal; color: #444; }
.tentative { font-size: 13px; background: #FFF3CD; border: 1px solid #E6C200; border-radius: 4px;
             padding: 1px 6px; font-weight: normal; }
.intro { color: #444; font-size: 14px; } .nodata { color: #666; font-style: italic;
         border: 1px dashed #BBB; padding: 12px; background: #FAFAFA; }
.problems { color: #7A5A00; font-size: 13px; }
"""


def render_html(charts: ReportCharts, *, tick: Callable[[], None] | None = None) -> str:
    """The whole report as one HTML document (str). ``tick`` is called once per section drawn
    (:data:`SECTION_COUNT` times). Raises :class:`HtmlUnavailable` without Bokeh."""
    try:
        from bokeh.document import Document
        from bokeh.embed import file_html
        from bokeh.resources import INLINE
    except ImportError as exc:
        raise HtmlUnavailable(INSTALL_HINT) from exc
    sections = []
    for build in _BUILDERS:
        sections.append(build(charts))
        if tick is not None:
            tick()
    # Text goes in as template *variables* (already escaped here), never as template source, so
    # nothing in a span name or message can reach Jinja as syntax.
    chunks: list[str] = []
    template: list[str] = []

    def text(fragment: str) -> None:
        chunks.append(fragment)
        template.append("{{ chunks[" + str(len(chunks) - 1) + "] }}")

    text(_verdict_html(charts))
    models = []
    for s in sections:
        chunk = f"<section id='{s.key}'><h2>{_e(s.title)}</h2>"
        if s.intro:
            chunk += f"<p class='intro'>{_e(s.intro)}</p>"
        if s.model is None:
            chunk += f"<p class='nodata'>{_e(s.note)}</p>"
        text(chunk)
        if s.model is not None:
            s.model.name = s.key  # section keys are fixed identifiers, never user text
            models.append(s.model)
            template.append("{{ embed(roots." + s.key + ") }}")
        text("</section>")
    if charts.problems:
        shown = charts.problems[:50]
        more = len(charts.problems) - len(shown)
        text("<section id='problems'><h2>Input problems</h2><ul class='problems'>"
             + "".join(f"<li>{_e(p)}</li>" for p in shown)
             + (f"<li>... and {more} more</li>" if more else "") + "</ul></section>")
    if not models:  # nothing to draw: plain HTML, no script at all
        return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(charts.title)}"
                f"</title><style>{_CSS}</style></head><body>{''.join(chunks)}</body></html>")
    page = ("{% block preamble %}<style>{{ css }}</style>{% endblock %}"
            "{% block contents %}" + "".join(template) + "{% endblock %}")
    doc = Document()
    with doc.models.freeze():  # one model-graph recompute for all roots, not one per root
        for model in models:
            doc.add_root(model)
    return str(file_html(doc, INLINE, title=charts.title, template=page,
                         template_variables={"chunks": chunks, "css": _CSS}))


def write_html(charts: ReportCharts, path: str | os.PathLike[str], *,
               tick: Callable[[], None] | None = None) -> Path:
    """Render and write atomically (a temporary file in the same folder, then renamed), so a
    reader never sees half a report. Returns the path. Raises :class:`HtmlUnavailable` without
    Bokeh, ``OSError`` when the file cannot be written."""
    target = Path(path)
    text = render_html(charts, tick=tick)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
