"""Readable text rendering of an analysis :class:`~otel_stages.analysis.Report` (formatting only).

Uses ``rich``: colors and box drawing on a terminal; plain text, no ANSI codes and a 100-column
width when the output is a file or a pipe.
"""

from __future__ import annotations

import io
import sys
from typing import IO

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from otel_stages import semconv
from otel_stages.analysis.report import Report

#: Width used when the output is not a terminal.
DEFAULT_WIDTH = 100
#: Problems listed in the text report (all of them are in the JSON).
MAX_PROBLEMS = 10


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return "0%" if abs(value) < 0.005 else f"{value:.0%}"


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("MB", 1_000_000), ("kB", 1_000)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def _stages_table(report: Report) -> RenderableType:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("stage")
    for label in ("min", "median", "p95", "max", "share", "swing", "explains"):
        table.add_column(label, justify="right")
    for s in report.stages.values():
        style = "bold" if s.name == report.verdict.stage else None
        table.add_row(
            s.name,
            _ms(s.min_ms),
            _ms(s.median_ms),
            _ms(s.p95_ms),
            _ms(s.max_ms),
            _pct(s.share),
            _ms(s.swing_ms),
            _pct(s.explained),
            style=style,
        )
    if report.total is not None:
        t = report.total
        table.add_row(
            "total", _ms(t.min_ms), _ms(t.median_ms), _ms(t.p95_ms), _ms(t.max_ms), "100%",
            _ms(t.swing_ms), "", style="italic",
        )
    title = f"Warm-run stages, ms ({report.warm_requests} warm requests; swing = p95 - p5,"
    title += " explains = share of the total's variance)"
    return Group(Text(title, style="bold"), table)


def _cold_table(report: Report) -> RenderableType:
    cold = report.cold_start
    assert cold is not None
    ratio = ""
    if cold.ratio is not None:
        ratio = f", {cold.ratio:.1f}x the warm median of {_ms(cold.warm_median_total_ms)} ms"
    who = "First request of the process" if cold.count == 1 else f"{cold.count} first requests (median)"
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("stage")
    table.add_column("cold ms", justify="right")
    table.add_column("warm median ms", justify="right")
    for name, ms in cold.stages_ms.items():
        warm = report.stages.get(name)
        table.add_row(name, _ms(ms), _ms(warm.median_ms if warm else None))
    title = Text(f"{who} (cold, reported apart): {_ms(cold.total_ms)} ms{ratio}", style="bold")
    return Group(title, table)


def _slowest_table(report: Report) -> RenderableType:
    extra = report.verdict.stage
    if extra in (None, semconv.STAGE_DECODE, semconv.STAGE_RESIZE):
        extra = None
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for label, justify in (("seq", "right"), ("total ms", "right"), ("image", "right"),
                           ("bytes", "right"), ("decode ms", "right"), ("resize ms", "right")):
        table.add_column(label, justify=justify)
    if extra:
        table.add_column(f"{extra} ms", justify="right")
    table.add_column("trace")
    for r in report.slowest:
        image = "-"
        if r.image_width is not None and r.image_height is not None:
            image = f"{r.image_width}x{r.image_height}"
        row = [
            "-" if r.seq is None else str(r.seq),
            _ms(r.total_ms) + (" (error)" if r.error else ""),
            image,
            _bytes(r.image_bytes),
            _ms(r.stages_ms.get(semconv.STAGE_DECODE)),
            _ms(r.stages_ms.get(semconv.STAGE_RESIZE)),
        ]
        if extra:
            row.append(_ms(r.stages_ms.get(extra)))
        row.append(r.trace_id[:16])
        table.add_row(*row)
    return Group(Text(f"{len(report.slowest)} slowest warm requests", style="bold"), table)


def _bullets(title: str, lines: list[str], style: str, limit: int | None = None) -> RenderableType:
    """``title`` then one ``- line`` per entry with a hanging indent; at most ``limit`` lines."""
    grid = Table.grid(padding=0)
    grid.add_column(width=4, no_wrap=True)
    grid.add_column()
    shown = lines if limit is None else lines[:limit]
    for line in shown:
        grid.add_row("  - ", Text(line))
    if len(shown) < len(lines):
        grid.add_row("", Text(f"... and {len(lines) - len(shown)} more"))
    return Group(Text(title, style=style), grid)


def _verdict(report: Report) -> RenderableType:
    v = report.verdict
    head = Text("Verdict: ", style="bold")
    head.append(str(v.cause) if v.cause else "no verdict", style="bold magenta")
    if v.stage:
        head.append(f" (stage: {v.stage})", style="bold")
    return Group(
        head,
        _bullets("Evidence:", v.evidence, "bold"),
        _bullets("Advice:", v.advice, "bold green"),
    )


def _comparison(report: Report) -> RenderableType:
    c = report.comparison
    assert c is not None
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("stage")
    for label in ("before ms", "after ms", "change ms", "change %"):
        table.add_column(label, justify="right")
    for name, ch in [*c.stages.items(), ("total", c.total)]:
        table.add_row(
            name,
            _ms(ch.baseline_median_ms),
            _ms(ch.median_ms),
            "-" if ch.change_ms is None else f"{ch.change_ms:+.1f}",
            "-" if ch.change_pct is None else f"{ch.change_pct:+.0f}%",
        )
    summary = Text("\n".join(c.summary), style="bold")
    title = Text(f"Compared with the baseline ({c.baseline_requests} requests), medians", style="bold")
    return Group(title, table, summary)


def renderables(report: Report) -> list[RenderableType]:
    """The report's sections, in display order, as rich renderables."""
    cold = 0 if report.cold_start is None else report.cold_start.count
    parts: list[RenderableType] = [
        Text(
            f"otel-stages report: {report.requests} requests ({report.warm_requests} warm, {cold} cold)",
            style="bold",
        )
    ]
    if report.stages:
        parts.append(_stages_table(report))
    if report.cold_start is not None:
        parts.append(_cold_table(report))
    if report.slowest:
        parts.append(_slowest_table(report))
    parts.append(Text(report.gpu.describe()))
    parts.append(_verdict(report))
    if report.comparison is not None:
        parts.append(_comparison(report))
    if report.problems:
        parts.append(
            _bullets(f"Warnings ({len(report.problems)}):", report.problems, "bold yellow", MAX_PROBLEMS)
        )
    return parts


def _is_tty(file: IO[str]) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


def render(report: Report, file: IO[str] | None = None, *, width: int | None = None) -> None:
    """Write the report to ``file`` (default stdout). On a terminal rich picks colors and width;
    otherwise plain text (no ANSI codes, no trailing spaces) at ``width`` (default
    :data:`DEFAULT_WIDTH`) columns."""
    file = sys.stdout if file is None else file
    tty = _is_tty(file)
    target = file if tty else io.StringIO()
    console = Console(
        file=target,
        force_terminal=tty,
        no_color=not tty,
        width=width if width is not None else (None if tty else DEFAULT_WIDTH),
        highlight=False,
        markup=False,  # stage names and messages are data, not markup
        emoji=False,
    )
    for part in renderables(report):
        console.print(part)
        console.print()
    if not tty:
        file.write("\n".join(line.rstrip() for line in target.getvalue().splitlines()) + "\n")


def render_text(report: Report, *, width: int = DEFAULT_WIDTH) -> str:
    """The plain-text rendering (no ANSI codes) as a string."""
    buffer = io.StringIO()
    render(report, buffer, width=width)
    return buffer.getvalue()
