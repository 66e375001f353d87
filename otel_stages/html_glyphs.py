"""Drawing primitives of the HTML report (Bokeh): figures, colours, hover tools and the box plot
with a dot per request. The sections are in :mod:`otel_stages.html_plots`.

Bokeh's Python side costs about ten models per glyph renderer, each built and serialized, so a
box-plot figure draws all its boxes with three renderers and small panels get no toolbar
(``benchmarks/plot_libraries.md``). Telemetry text shown by BokehJS (stage names, GPU models)
goes through :func:`plain`, so it is never taken for math text (which would load MathJax from a
CDN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Colours per standard stage (Okabe-Ito, readable with colour-blindness); custom stages cycle
#: through the rest.
STAGE_COLORS = {"download": "#0072B2", "decode": "#E69F00", "resize": "#F0E442", "queue": "#009E73",
                "forward": "#CC79A7"}
_MORE_COLORS = ("#56B4E9", "#D55E00", "#999999", "#000000", "#882255", "#44AA99")
COLD_COLOR = "#D62728"
#: Requests the report set apart as cold (first of a new input, or after an idle gap).
APART_COLOR = "#FF7F0E"
#: Time inside a request that no stage span covers.
UNACCOUNTED_COLOR = "#BBBBBB"
#: The request total's box.
TOTAL_COLOR = "#4C72B0"
#: Forward spans on the GPU plot.
FORWARD_FILL = "#CC79A7"
PANEL_W, PANEL_H, WIDE_W = 260, 260, 1040


def color(name: str, order: Sequence[str]) -> str:
    """The colour of stage ``name`` (``order``: every stage drawn, so custom ones keep theirs)."""
    if name in STAGE_COLORS:
        return STAGE_COLORS[name]
    if name == "unaccounted":
        return UNACCOUNTED_COLOR
    if name == "total":
        return TOTAL_COLOR
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


def fig(*, small: bool = False, **kwargs: Any) -> Any:
    """A figure; ``small`` panels (small multiples) get no toolbar, only the hover added later."""
    from bokeh.plotting import figure

    if small:
        made: Any = figure(toolbar_location=None, tools="", **kwargs)
    else:
        made = figure(toolbar_location="above", tools="pan,box_zoom,reset,save", **kwargs)
    made.toolbar.logo = None
    made.title.text_font_size = "12px"
    return made


def hover(target: Any, renderers: list[Any], tooltips: list[tuple[str, str]]) -> None:
    """Add a hover tool for ``renderers`` to the figure ``target``."""
    from bokeh.models import HoverTool

    target.add_tools(HoverTool(renderers=renderers, tooltips=tooltips))


@dataclass(frozen=True)
class Box:
    """One box of :func:`boxes`: at categorical ``factor``, ``values`` (ms) summarized by
    ``dist`` (the analysis's Distribution), drawn in ``color``; ``cold`` values (first request of
    a process) as red diamonds, ``apart`` values (set apart as cold) as orange triangles."""

    factor: str
    values: Sequence[float]
    dist: Any
    color: str
    label: str
    cold: Sequence[float] = ()
    apart: Sequence[float] = ()


#: Spread of the dots around a box's centre, as a fraction of the box width. Offsets follow the
#: golden-ratio sequence: evenly spread and the same on every render (screenshots compare).
_DOT_SPREAD = 0.8
_GOLDEN = 0.6180339887


def boxes(target: Any, items: Sequence[Box], width: float = 0.5) -> None:
    """Per box: p5..p95 box, black median line, min..max whiskers, a dot per value, the cold
    values as red diamonds and the set-apart ones as orange triangles. Three glyph renderers for
    all boxes of the figure (each renderer is some ten Bokeh models, and the models are what takes
    time to build and serialize)."""
    from bokeh.models import ColumnDataSource

    half = width / 2
    target.vbar(x=[b.factor for b in items], bottom=[b.dist.p5_ms for b in items],
                top=[b.dist.p95_ms for b in items], width=width,
                fill_color=[b.color for b in items], fill_alpha=0.25,
                line_color=[b.color for b in items])
    lines: dict[str, list[Any]] = {"x0": [], "x1": [], "y0": [], "y1": [], "color": [], "w": []}
    for b in items:
        d = b.dist
        for x0, x1, y0, y1, ink, w in (
            (0.0, 0.0, d.min_ms, d.p5_ms, b.color, 1),
            (0.0, 0.0, d.p95_ms, d.max_ms, b.color, 1),
            (-half, half, d.median_ms, d.median_ms, "black", 2),
        ):
            lines["x0"].append((b.factor, x0))
            lines["x1"].append((b.factor, x1))
            lines["y0"].append(y0)
            lines["y1"].append(y1)
            lines["color"].append(ink)
            lines["w"].append(w)
    target.segment(x0="x0", x1="x1", y0="y0", y1="y1", line_color="color", line_width="w",
                   source=ColumnDataSource(lines))
    dots: dict[str, list[Any]] = {"x": [], "ms": [], "what": [], "marker": [], "size": [],
                                  "color": []}
    for b in items:
        for i, ms in enumerate(b.values):
            offset = ((i * _GOLDEN) % 1.0 - 0.5) * width * _DOT_SPREAD
            dots["x"].append((b.factor, offset))
            dots["ms"].append(ms)
            dots["what"].append(f"{b.label} #{i + 1}")
            dots["marker"].append("circle")
            dots["size"].append(5)
            dots["color"].append(b.color)
        # side by side, so a cold request and a set-apart one of the same duration both show
        for kind, values, marker, ink, at in (
                ("cold", b.cold, "diamond", COLD_COLOR, -0.2 * width),
                ("set apart", b.apart, "triangle", APART_COLOR, 0.2 * width)):
            for i, ms in enumerate(values):
                dots["x"].append((b.factor, at if b.cold and b.apart else 0.0))
                dots["ms"].append(ms)
                dots["what"].append(kind if len(values) == 1 else f"{kind} #{i + 1}")
                dots["marker"].append(marker)
                dots["size"].append(13)
                dots["color"].append(ink)
    glyph = target.scatter(x="x", y="ms", marker="marker", size="size", color="color",
                           alpha=0.75, source=ColumnDataSource(dots))
    hover(target, [glyph], [("", "@what"), ("ms", "@ms{0.0}")])


def grid(figs: list[Any], ncols: int = 4) -> Any:
    """``figs`` in rows of ``ncols``."""
    from bokeh.layouts import column, row

    return column(*(row(*figs[i:i + ncols]) for i in range(0, len(figs), ncols)))
