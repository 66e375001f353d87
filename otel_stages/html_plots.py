"""The HTML report's sections: one function per section, :class:`ReportCharts` in, a
:class:`Section` out (a Bokeh layout, or a sentence saying why there is nothing to draw, and
optionally a small table of the numbers). Drawing only; the primitives are in
:mod:`otel_stages.html_glyphs`, the page around the sections in :mod:`otel_stages.html_report`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from otel_stages.analysis.charts import COLD, SET_APART, UNACCOUNTED, ReportCharts, StageSeries
from otel_stages.analysis.units import ms, pct, signed_pct
from otel_stages.html_glyphs import (
    APART_COLOR,
    COLD_COLOR,
    FORWARD_FILL,
    PANEL_H,
    PANEL_W,
    STAGE_COLORS,
    TOTAL_COLOR,
    WIDE_W,
    Box,
    boxes,
    color,
    fig,
    grid,
    hover,
    plain,
)

#: Marks for single requests, as the intros name them.
_COLD_MARK = "red diamond: the first request of a process"
_APART_MARK = "orange triangle: a request set apart as cold (first of a new input, or after an idle gap)"


@dataclass
class Section:
    """One section of the page: ``key`` (its fixed id), ``title``, ``intro`` (text), and either a
    Bokeh ``model`` or a ``note`` saying why there is nothing to draw; ``table``: rows of text
    shown under the plot, the first row being the header (empty: no table); ``bullets``:
    sentences listed under the intro."""

    key: str
    title: str
    intro: str
    model: Any | None  # a Bokeh layout, or None: then ``note`` says why there is nothing to draw
    note: str = ""
    table: tuple[tuple[str, ...], ...] = ()
    bullets: tuple[str, ...] = ()  #: sentences listed under the intro


def _rows(c: ReportCharts) -> list[StageSeries]:
    """Every series with a panel: the stages, then the untraced time, then the total."""
    return [s for s in (*c.stages, c.unaccounted, c.total) if s is not None]


def _marks(series: list[StageSeries]) -> str:
    marks = [m for m, on in ((_COLD_MARK, any(s.cold_ms for s in series)),
                             (_APART_MARK, any(s.apart_ms for s in series))) if on]
    return ("; " + "; ".join(marks)) if marks else ""


def _stage_panel(s: StageSeries, order: list[str]) -> Any:
    assert s.warm is not None
    d = s.warm
    title = plain(s.name)
    panel = fig(small=True, width=PANEL_W, height=PANEL_H, x_range=["warm"], title=title)
    boxes(panel, [Box("warm", s.warm_ms, d, color(s.name, order), "warm", s.cold_ms, s.apart_ms)])
    panel.xaxis.major_label_text_font_size = "0px"
    panel.xaxis.major_tick_line_color = None
    panel.xaxis.axis_label = f"median {d.median_ms:.1f} / swing {d.p95_ms - d.p5_ms:.1f} ms"
    panel.xaxis.axis_label_text_font_size = "11px"
    panel.yaxis.axis_label = "ms"
    return panel


def _distributions(c: ReportCharts) -> Section:
    order = [s.name for s in c.stages]
    shown = [s for s in _rows(c) if s.warm is not None]
    intro = ("Warm requests, one panel per stage with its own scale, then the time outside every"
             " stage span (unaccounted) and the request total. Box: p5 to p95 (the swing); black"
             " line: median; whiskers: min and max; dots: each warm request" + _marks(_rows(c)) + ".")
    if not shown:
        return Section("stages", "Stage distributions", intro, None,
                       "No warm requests: nothing to draw (only cold or failed requests were found).")
    return Section("stages", "Stage distributions (warm runs)", intro,
                   grid([_stage_panel(s, order) for s in shown]))


def _verdict_label(cause: str | None, stage: str | None, tentative: bool) -> str:
    if not cause and not stage:
        return "-"
    label = f"{cause} ({stage})" if stage else str(cause)
    return label + (" - tentative" if tentative else "")


def _cohorts(c: ReportCharts) -> Section:
    from bokeh.layouts import row

    title = "Cohorts (requests with the same input)"
    if not c.cohorts:
        return Section("cohorts", title, "", None,
                       "No input sizes recorded (decode spans without image.width/image.height):"
                       " requests cannot be grouped by input.")
    keys = [f"{plain(k.key)} (n={len(k.totals_ms)})" for k in c.cohorts]
    totals = fig(width=WIDE_W // 2, height=320, x_range=keys, title="request total per cohort, ms")
    boxes(totals, [Box(label, k.totals_ms, k.total, TOTAL_COLOR, "total")
                   for label, k in zip(keys, c.cohorts)])
    totals.yaxis.axis_label = "ms"
    order = [s.name for s in c.stages]
    names = [n for n in [*order, UNACCOUNTED] if any(k.stage_medians_ms.get(n) for k in c.cohorts)]
    data: dict[str, list[Any]] = {"cohort": keys}
    for n in names:
        data[n] = [k.stage_medians_ms.get(n, 0.0) for k in c.cohorts]
    stacked = fig(width=WIDE_W // 2, height=320, x_range=keys, title="median ms per stage, stacked")
    bars = stacked.vbar_stack(names, x="cohort", width=0.6, source=data,
                              color=[color(n, order) for n in names],
                              legend_label=[plain(n) for n in names])
    hover(stacked, bars, [("cohort", "@cohort"), ("stage", "$name"), ("median", "@$name{0.0} ms")])
    legend = stacked.legend[0]
    legend.orientation = "horizontal"
    stacked.add_layout(legend, "below")  # outside the bars: never hides one
    stacked.yaxis.axis_label = "ms"
    mix = ("" if c.input_mix_explains is None else
           f" The input mix explains {pct(c.input_mix_explains)} of the request total's variance.")
    one = (" Every warm request had the same input, so there is one cohort."
           if len(c.cohorts) == 1 else "")
    table = [("input", "warm requests", "median total ms", "p95 total ms", "verdict within it")]
    table += [(k.key, str(len(k.totals_ms)), ms(k.total.median_ms), ms(k.total.p95_ms),
               _verdict_label(k.cause, k.stage, k.tentative)) for k in c.cohorts]
    intro = ("Largest cohort first, keyed as in the text report (image size, and the format or"
             f" prompt length when those vary).{mix}{one} A verdict marked tentative rests on fewer"
             " than 20 warm requests; - : too few requests for a verdict.")
    return Section("cohorts", title, intro, row(totals, stacked), table=tuple(table))


def _waterfall(c: ReportCharts) -> Section:
    from bokeh.models import ColumnDataSource

    title = "Waterfall: slowest, median and cold requests"
    if not c.waterfall:
        return Section("waterfall", title, "", None, "No requests to draw.")
    order = [s.name for s in c.stages]
    labels = [f"{plain(w.label)} ({w.total_ms:.0f} ms)" for w in c.waterfall]
    panel = fig(width=WIDE_W, height=150 + 60 * len(labels), y_range=list(reversed(labels)),
                title="stage spans from the request start, ms")
    panel.hbar(y=labels, left=[0.0] * len(labels), right=[w.total_ms for w in c.waterfall],
               height=0.7, fill_alpha=0, line_color="#999999")
    rows: dict[str, list[Any]] = {"y": [], "left": [], "right": [], "stage": [], "ms": [],
                                  "color": [], "trace": []}
    for label, w in zip(labels, c.waterfall):
        for seg in (*w.segments, *w.gaps):
            rows["y"].append(label)
            rows["left"].append(seg.start_ms)
            rows["right"].append(seg.start_ms + seg.duration_ms)
            rows["stage"].append(plain(seg.stage) if seg.stage != UNACCOUNTED
                                 else "unaccounted (no stage span)")
            rows["ms"].append(seg.duration_ms)
            rows["color"].append(color(seg.stage, order))
            rows["trace"].append(w.trace_id)
    bars = panel.hbar(y="y", left="left", right="right", height=0.5, color="color",
                      legend_field="stage", source=ColumnDataSource(rows))
    hover(panel, [bars], [("stage", "@stage"), ("duration", "@ms{0.0} ms"),
                          ("starts at", "@left{0.0} ms"), ("trace id", "@trace")])
    legend = panel.legend[0]
    legend.orientation = "horizontal"
    panel.add_layout(legend, "below")  # outside the bars: never hides a row
    panel.xaxis.axis_label = "ms since the request started"
    table = [("request", "seq", "total ms", "unaccounted ms", "trace id")]
    table += [(w.label, "-" if w.seq is None else str(w.seq), ms(w.total_ms), ms(w.unaccounted_ms),
               w.trace_id) for w in c.waterfall]
    intro = ("Each request's stage spans from its start; light grey: time inside the request that no"
             " stage span covers (unaccounted), as the text report counts it.")
    return Section("waterfall", title, intro, panel, table=tuple(table))


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
    util = fig(width=WIDE_W, height=260, title="utilization, % (shaded: forward spans)",
               y_range=(0, 105))
    windows = c.forward_windows_s
    if windows:
        util.quad(left=[a for a, _ in windows], right=[b for _, b in windows], bottom=0, top=105,
                  fill_color=FORWARD_FILL, fill_alpha=0.18, line_alpha=0, legend_label="forward span")
    mem = fig(width=WIDE_W, height=220, x_range=util.x_range, title="memory used, GiB")
    palette = ["#1F77B4", "#FF7F0E", "#2CA02C", "#9467BD", "#8C564B"]
    repeated = {g.hw_id for g in c.gpu if sum(h.hw_id == g.hw_id for h in c.gpu) > 1}
    for i, g in enumerate(c.gpu):
        ink = palette[i % len(palette)]
        # hw.id is unique only within a host: one id under two processes is two GPUs
        where = f" {g.process.partition('=')[2]}" if g.hw_id in repeated else ""
        label = plain(f"{g.model or 'GPU'} {g.hw_id[:12]}{where}".strip())
        if g.utilization:
            util.line([t for t, _ in g.utilization], [v * 100 for _, v in g.utilization],
                      color=ink, line_width=1.5, legend_label=label)
        if g.memory_used_bytes:
            mem.line([t for t, _ in g.memory_used_bytes], [v / 2**30 for _, v in g.memory_used_bytes],
                     color=ink, line_width=1.5, legend_label=label)
        if g.memory_limit_bytes:
            mem.add_layout(Span(location=g.memory_limit_bytes / 2**30, dimension="width",
                                line_color=ink, line_dash="dashed"))
    # from 0 to the limit: "near its limit" must be visible, not auto-zoomed away
    top = max([g.memory_limit_bytes or 0.0 for g in c.gpu]
              + [v for g in c.gpu for _, v in g.memory_used_bytes])
    if top > 0:
        mem.y_range = Range1d(start=0, end=top * 1.05 / 2**30)
    for panel in (util, mem):
        panel.xaxis.axis_label = "seconds since the first request"
        panel.legend.location = "top_left"
        panel.legend.click_policy = "hide"
    note = "" if windows else " No forward spans were recorded, so none are shaded."
    return Section("gpu", title, "Dashed line: the memory limit." + note, column(util, mem))


_OUTLINE = {COLD: COLD_COLOR, SET_APART: APART_COLOR}


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
        panel = fig(width=WIDE_W // 2, height=320, title=f"ms against {label}")
        for stage, marker, ink in (("decode", "circle", STAGE_COLORS["decode"]),
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
                "line": [_OUTLINE.get(p.kind, ink) for p in sel],
                "kind": [p.kind.replace("_", " ") for p in sel],
                "trace": [p.trace_id for p in sel],
            })
            glyph = panel.scatter("x", "ms", source=src, marker=marker, size=8, fill_color=ink,
                                  line_color="line", line_width=1.5, alpha=0.8, legend_label=stage)
            hover(panel, [glyph], [(stage, "@ms{0.0} ms"), ("image", "@size"), ("kB", "@kb{0}"),
                                   ("request", "@kind"), ("trace id", "@trace")])
        panel.xaxis.axis_label = label
        panel.yaxis.axis_label = "ms"
        if panel.legend:  # none without a glyph (sizes but no image.size: the kB panel is empty)
            panel.legend.location = "top_left"
        figs.append(panel)
    intro = ("One mark per successful request; a red outline marks the first request of a process,"
             " an orange one a request set apart as cold.")
    return Section("images", title, intro, row(*figs))


def _change(s: StageSeries) -> str:
    """``"forward +43%"`` (median change), ``"decode 0%"`` when it rounds to zero."""
    if s.change_pct is None:
        return s.name
    return f"{s.name} {signed_pct(s.change_pct)}"


def _significance(s: StageSeries) -> str:
    if s.significant is None:
        return "significance not tested"
    if s.inconclusive:
        return "inconclusive (not significant, not noise)"
    return "significant (95%)" if s.significant else "within run-to-run noise"


def _baseline_panel(s: StageSeries, order: list[str]) -> Any:
    panel = fig(small=True, width=PANEL_W, height=PANEL_H, x_range=["before", "after"],
                title=plain(_change(s)))
    items = []
    if s.baseline is not None:
        items.append(Box("before", s.baseline_ms, s.baseline, "#888888", "before"))
    if s.warm is not None:
        ink = color(s.name, order)
        if s.significant and s.change_pct is not None:
            ink = "#2CA02C" if s.change_pct < 0 else COLD_COLOR
        items.append(Box("after", s.warm_ms, s.warm, ink, "after"))
    boxes(panel, items)
    panel.yaxis.axis_label = "ms"
    panel.xaxis.axis_label = _significance(s)
    panel.xaxis.axis_label_text_font_size = "11px"
    if s.significant:
        panel.xaxis.axis_label_text_font_style = "bold"
    return panel


def _baseline(c: ReportCharts) -> Section:
    title = "Before / after (baseline comparison)"
    if not c.has_baseline:
        return Section("baseline", title, "", None,
                       "No baseline given: run `otel-stages report AFTER --baseline BEFORE --html"
                       " FILE` to compare distributions before and after a change.")
    rows = [*c.stages, *([c.total] if c.total is not None else [])]
    shown = [s for s in rows if s.warm is not None or s.baseline is not None]
    if not shown:
        return Section("baseline", title, "", None, "Neither recording has warm requests.")
    order = [s.name for s in c.stages]
    table = [("", "median before", "after", "change", "p95 before", "after",
              "outside run-to-run noise?")]
    for s in shown:
        b, a = s.baseline, s.warm
        table.append((s.name, ms(b.median_ms if b else None), ms(a.median_ms if a else None),
                      signed_pct(s.change_pct), ms(b.p95_ms if b else None),
                      ms(a.p95_ms if a else None),
                      "not tested" if s.significant is None else
                      "yes: significant (95%)" if s.significant else
                      "unsure: inconclusive" if s.inconclusive else "no"))
    intro = ("Warm requests per stage and the request total, baseline (before) and this recording"
             " (after). Title: change of the median; below: whether the change is outside run-to-run"
             " noise (95% confidence). A significant improvement is green, a significant"
             " regression red.")
    return Section("baseline", title, intro, grid([_baseline_panel(s, order) for s in shown]),
                   table=tuple(table), bullets=c.comparison)


SECTIONS: tuple[Callable[[ReportCharts], Section], ...] = (
    _distributions, _cohorts, _waterfall, _gpu, _images, _baseline)
#: Sections drawn, in page order, after the verdict (for progress bars: one unit each).
SECTION_COUNT = len(SECTIONS)
