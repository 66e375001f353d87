"""The HTML report: one self-contained file (Bokeh's JavaScript inlined, no network, no fonts
fetched) drawn from :class:`otel_stages.analysis.charts.ReportCharts`. Drawing only: every number
comes from the analysis through that structure.

Sections, top to bottom: verdict, evidence and advice; per-stage distributions of warm runs (box =
p5..p95, the swing; line = median; whiskers = min..max; a dot per request; the cold request as a
red diamond, a request set apart as cold as an orange triangle; then the time outside every
stage span and the request total); cohorts side by side with their verdicts; a waterfall of the
slowest, median, cold and set-apart requests with the unaccounted time drawn; GPU utilization and
memory over time with the forward spans shaded; decode and resize time against image pixels and
bytes; before/after per stage and for the total with the significance marks. A section without
data says so in words instead of drawing an empty plot; sections with numbers add a small table.

Bokeh was chosen over Plotly and Vega-Altair by file size and render time in headless Chromium
(``benchmarks/plot_libraries.md``). Needs the ``html`` extra: ``pip install 'otel-stages[html]'``.
"""

from __future__ import annotations

import html
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from otel_stages.analysis.charts import ReportCharts
from otel_stages.html_plots import SECTION_COUNT, SECTIONS, Section

__all__ = ["SECTION_COUNT", "HtmlUnavailable", "render_html", "write_html"]

INSTALL_HINT = "the HTML report needs Bokeh: pip install 'otel-stages[html]'"


class HtmlUnavailable(RuntimeError):
    """Bokeh is not installed; the message says which extra to install."""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _counts(c: ReportCharts) -> str:
    """``48 requests: 46 warm, 1 cold (1 first of a process, 0 set apart), 1 failed; 2 incomplete
    traces left out``, from the contract's counts."""
    n = c.counts
    text = f"{n.get('requests', 0)} requests: {n.get('warm', 0)} warm"
    if "cold" in n:
        apart = n.get("set_apart", 0)
        text += f", {n['cold']} cold"
        if apart:
            text += f" ({n['cold'] - apart} first of a process, {apart} set apart)"
    if "failed" in n:
        text += f", {n['failed']} failed"
        if n.get("cold_failed"):  # (a cold start that outlasted the client's deadline)
            text += f" ({n['cold_failed']} of them cold)"
    if n.get("incomplete"):
        text += f"; {n['incomplete']} incomplete traces left out"
    return text


def tentative_reasons(verdict: Mapping[str, Any]) -> list[str]:
    """Why a tentative verdict is tentative, from the contract's ``verdict`` object: the evidence
    lines that say so (too few warm requests, overlapping stages), and the failure line when most
    requests failed (:mod:`otel_stages.analysis.caveats`), in the evidence's order; the text
    report shows the same lines in its evidence."""
    evidence = [str(e) for e in verdict.get("evidence") or []]
    found = [e for e in evidence if "tentative" in e or " of requests failed (" in e]
    return found or ["see the evidence"]


def _verdict_html(c: ReportCharts) -> str:
    v = c.verdict
    cause = v.get("cause") or "no verdict"
    stage = f" <span class='stage'>stage: {_e(v['stage'])}</span>" if v.get("stage") else ""
    tentative = (f" <span class='tentative'>tentative: {_e('; '.join(tentative_reasons(v)))}"
                 "</span>" if v.get("tentative") else "")
    parts = [f"<h1>{_e(c.title)}</h1>", f"<p class='counts'>{_e(_counts(c))}</p>",
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
table.numbers { border-collapse: collapse; font-size: 13px; margin: 8px 0 4px; }
table.numbers th, table.numbers td { padding: 2px 10px; border-bottom: 1px solid #E4E4E4; }
table.numbers th { text-align: left; color: #444; } table.numbers td { text-align: right; }
table.numbers td.text { text-align: left; }
ul.notes { font-size: 14px; color: #333; }
"""


_NUMBER = re.compile(r"^[+-]?[0-9][0-9.,]*%?$")


def _table(section: Section) -> str:
    """The section's table: columns of numbers (``-`` for unknown) right-aligned, text left."""
    if not section.table:
        return ""
    head, *rows = section.table
    numeric = [all(_NUMBER.match(row[i]) or row[i] == "-" for row in rows) for i in range(len(head))]
    out = "<table class='numbers'><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"
    for row in rows:
        out += "<tr>" + "".join(
            f"<td>{_e(cell)}</td>" if numeric[i] else f"<td class='text'>{_e(cell)}</td>"
            for i, cell in enumerate(row)) + "</tr>"
    return out + "</table>"


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
    for build in SECTIONS:
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
        if s.bullets:
            chunk += "<ul class='notes'>" + "".join(f"<li>{_e(b)}</li>" for b in s.bullets) + "</ul>"
        if s.model is None:
            chunk += f"<p class='nodata'>{_e(s.note)}</p>"
        text(chunk)
        if s.model is not None:
            s.model.name = s.key  # section keys are fixed identifiers, never user text
            models.append(s.model)
            template.append("{{ embed(roots." + s.key + ") }}")
        text(_table(s) + "</section>")
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
        # a lone surrogate in a span name or attribute (valid JSON, no UTF-8) is written as "?"
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as out:
            out.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
