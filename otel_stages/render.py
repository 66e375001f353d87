"""Readable text rendering of an analysis :class:`~otel_stages.analysis.Report` (formatting only).

Uses ``rich``: colors and box drawing on a terminal (at its width: ``COLUMNS`` / ``stty cols``);
plain text, no ANSI codes and a 100-column width (``COLUMNS`` when set) when the output is a file
or a pipe.

Tables are fitted to the width (:func:`otel_stages.terminal.fit_table`): numbers and trace ids are
never cut and stage names fold onto a second line; when a table does not fit, its lowest-priority
columns (min, max, ...) are left out with a note saying so, and trace ids move to a list under the
slowest-requests table.
"""

from __future__ import annotations

import datetime
import io
import sys
from typing import IO

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from otel_stages import semconv
from otel_stages.analysis import units
from otel_stages.analysis.caveats import OFFSET_MIN_EXPLAINS
from otel_stages.analysis.change import Change
from otel_stages.analysis.decision import COMPARABLE_MIN_REQUESTS, MIN_WARM_RUNS, cold_times
from otel_stages.analysis.figures import (
    REASON_AFTER_FAILED_START,
    REASON_BEHIND_COLD,
    REASON_NEW_INPUT,
    REASON_WARM_UP,
    SAME_INPUT,
)
from otel_stages.analysis.report import Report, Run
from otel_stages.terminal import Column, env_columns, fit_table, left_out_note, text_console

#: Width used when the output is not a terminal.
DEFAULT_WIDTH = 100
#: Problems listed in the text report (all of them are in the JSON).
MAX_PROBLEMS = 10
#: Input cohorts listed in the text report (all of them are in the JSON).
MAX_COHORTS = 8
_ms = units.ms
_pct = units.pct


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("MB", 1_000_000), ("kB", 1_000)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def _stages_table(report: Report, width: int) -> RenderableType:
    cols = [Column("stage", justify="left", fold=True), Column("min", 8), Column("median"),
            Column("p95", 4), Column("max", 7), Column("share", 5), Column("swing"), Column("explains", 6)]
    rows, styles = [], []
    n = report.warm_requests
    for s in report.stages.values():
        rows.append([s.name + ("*" if s.count < n else ""), _ms(s.min_ms), _ms(s.median_ms),
                     _ms(s.p95_ms), _ms(s.max_ms),
                     _pct(s.share), _ms(s.swing_ms), _pct(s.explains)])
        styles.append("bold" if s.name == report.verdict.stage else None)
    gap = report.unaccounted
    if gap is not None:
        rows.append(["(unaccounted)", "", _ms(gap.median_ms), "", "", _pct(gap.share),
                     _ms(gap.swing_ms), _pct(gap.explains)])
        styles.append("dim")
    both = report.overlap
    if both is not None:
        rows.append(["(overlap)", "", _ms(both.median_ms), "", "", "-" + _pct(both.share),
                     _ms(both.swing_ms), _pct(both.explains)])
        styles.append("dim")
    if report.total is not None:
        t = report.total
        rows.append(["total", _ms(t.min_ms), _ms(t.median_ms), _ms(t.p95_ms), _ms(t.max_ms),
                     "100%", _ms(t.swing_ms), ""])
        styles.append("italic")
    table, dropped = fit_table(cols, rows, width, styles)
    title = f"Warm-run stages, ms ({report.warm_requests} warm requests; share = part of all request"
    title += " time; swing = p95 - p5; explains = part of the total's variance)"
    notes = [
        Text(f"{name} groups {', '.join(kids)}: not a row of its own (its time is theirs)",
             style="dim")
        for name, kids in report.groups.items()
    ]
    if gap is not None:
        notes.append(Text("(unaccounted) = request time outside every stage span", style="dim"))
    if both is not None:
        notes.append(Text(f"(overlap) = time counted in two stages at once ({both.requests} of"
                          f" {n} requests): the stage shares add up to more than 100 %; less this"
                          " share they add up", style="dim"))
    partial = [s for s in report.stages.values() if s.count < n]
    if partial:
        each = "; ".join(f"{s.name} in {s.count} of {n}" for s in partial)
        notes.append(Text(f"* min / median / p95 / max / swing over the warm requests that have the"
                          f" stage only ({each}); share and explains count it as 0 ms elsewhere",
                          style="dim"))
    if any(s.explains is None for s in report.stages.values()):
        notes.append(Text(f"explains - = fewer than {MIN_WARM_RUNS} warm requests: too few to"
                          " tell", style="dim"))
    odd = [s for s in report.stages.values() if s.explains is not None
           and not -OFFSET_MIN_EXPLAINS <= s.explains <= 1 + OFFSET_MIN_EXPLAINS]
    if odd:
        notes.append(Text("explains below 0% or above 100%: stages that offset each other (one"
                          " slower when another is faster), their parts cancel; see the verdict",
                          style="dim"))
    return Group(Text(title, style="bold"), table, *left_out_note(dropped), *notes)


def _of_wait(share: float | None) -> str:
    """CPU pressure as a part of the slow runs' waiting; pressure also counts other tasks' waits,
    so past the stage's own waiting it is only shown as more than all of it."""
    return ">100%" if share is not None and share > 1.0 else _pct(share)


def _signals_table(report: Report, width: int) -> RenderableType:
    """Thread CPU time against waiting per stage, and the share of each stage's variance that
    GC, event-loop lag and throttling explain (analysis.mechanisms)."""
    cols = [Column("stage", justify="left", fold=True), Column("cpu"), Column("wait"),
            Column("core slow/fast", 8), Column("wait expl"), Column("slowdown", 5), Column("gc", 3),
            Column("lag", 6), Column("throttled", 7), Column("pressure", 9),
            Column("mechanism", 1, "left")]
    rows, styles = [], []
    for name, sig in report.signals.items():
        def part(p: object) -> str:
            return "-" if p is None else _pct(getattr(p, "explains", None))
        confirmed = sig.confirmed
        rows.append([
            name, _ms(sig.cpu.median_ms if sig.cpu else None),
            _ms(sig.wait.median_ms if sig.wait else None),
            f"{_pct(sig.slow_cpu_utilization)} / {_pct(sig.fast_cpu_utilization)}",
            part(sig.wait), _pct(sig.slowdown_explains), part(sig.gc), part(sig.lag),
            part(sig.throttled), _of_wait(sig.pressure_of_wait),
            confirmed.cause if confirmed else "-",
        ])
        styles.append("bold" if name == report.verdict.stage else None)
    table, dropped = fit_table(cols, rows, width, styles)
    title = ("Where the stage time went (cpu, wait = wall - cpu: ms medians; core = CPU/wall in the"
             " slowest quarter / faster half)")
    legend = ("wait expl, gc, lag (event loop), throttled: part of the stage's variance; slowdown:"
              " part of the variance of log(ms) that wall/cpu explains; pressure: CPU pressure"
              " (Linux PSI some) during the slow runs' waiting, as a part of it (> 100%: other tasks"
              " waited too; - = not recorded)")
    return Group(Text(title, style="bold"), table, *left_out_note(dropped), Text(legend, style="dim"))


def _cohort_table(report: Report, width: int) -> RenderableType:
    rows = []
    for c in report.cohorts[:MAX_COHORTS]:
        v = c.verdict
        verdict = "-" if v is None else (f"{v.cause} ({v.stage})" if v.stage else str(v.cause))
        if v is not None and v.tentative:
            verdict += " ?"
        rows.append([c.key, str(c.requests), _ms(c.median_total_ms), _ms(c.p95_total_ms), verdict])
    table, dropped = fit_table([Column("input", justify="left", fold=True), Column("requests"),
                           Column("median ms"), Column("p95 ms", 2), Column("verdict", justify="left")],
                          rows, width)
    mix = report.input_mix_explains
    title = f"Input cohorts ({len(report.cohorts)}; the input mix explains "
    title += ("an unknown part" if mix is None else _pct(mix)) + " of the total's variance)"
    notes: list[RenderableType] = []
    if len(report.cohorts) > MAX_COHORTS:
        notes.append(Text(f"... and {len(report.cohorts) - MAX_COHORTS} more (all in --json)",
                          style="dim"))
    if any(c.verdict is not None and c.verdict.tentative for c in report.cohorts):
        notes.append(Text("? = tentative: fewer than 20 warm requests in that cohort", style="dim"))
    return Group(Text(title, style="bold"), table, *left_out_note(dropped), *notes)


def _cold_table(report: Report, width: int) -> RenderableType:
    cold = report.cold_start
    assert cold is not None
    ratio = ""
    if cold.ratio is not None:
        if cold.compared_with == SAME_INPUT:
            ratio = (f", {cold_times(cold.ratio)} the median of the {cold.comparable_requests} warm requests"
                     f" with the same input ({cold.cohort or 'same cohort'}:"
                     f" {_ms(cold.comparable_median_total_ms)} ms)")
        else:
            why = ("its input is unknown" if not cold.input_known
                   else f"fewer than {COMPARABLE_MIN_REQUESTS} share its input")
            ratio = (f", {cold_times(cold.ratio)} the median of all {cold.comparable_requests} warm"
                     f" requests ({_ms(cold.comparable_median_total_ms)} ms; {why})")
    if cold.without_penalty:  # the figures are those that paid a cold start (cohorts.cold_figures)
        n = cold.count + cold.without_penalty
        who = (f"{cold.count} of the {n} cold requests{' (median)' if cold.count > 1 else ''},"
               f" those that paid a cold start (reported apart; the other {cold.without_penalty}"
               " within their warm runs)")
    elif cold.count == 1 and cold.failed:
        who = ("First request of the process (cold, failed after paying it: its times run until"
               " the failure; reported apart)")
    elif cold.count == 1:
        who = ("First request of the process (cold, reported apart)" if cold.first_of_process
               else f"Request marked cold by {semconv.REQUEST_COLD_START} or {semconv.REQUEST_SEQ} 1,"
                    " not the first of its process (reported apart)")
    else:
        who = f"{cold.count} first requests (median) (cold, reported apart)"
    rows = [[name, _ms(ms), _ms(cold.comparable_stages_ms.get(name))]  # COLD_UNTRACED last
            for name, ms in cold.stages_ms.items()]
    table, _ = fit_table([Column("stage", justify="left", fold=True), Column("cold ms"),
                     Column("comparable median ms")], rows, width)
    title = Text(f"{who}: {_ms(cold.total_ms)} ms{ratio}", style="bold")
    return Group(title, table)


def _set_apart_list(report: Report) -> RenderableType:
    lines = []
    for a in report.set_apart:
        if a.reason == REASON_NEW_INPUT:
            why = "first request of its input in the process"
        elif a.reason == REASON_AFTER_FAILED_START:
            why = "right after the process's first request failed"
        elif a.reason == REASON_WARM_UP:
            why = "warm-up after the process's cold request"
        elif a.reason == REASON_BEHIND_COLD:
            why = "started during the process's cold request (waiting for it, or on a process still warming)"
        elif a.idle_s is not None:
            why = f"after {a.idle_s:.0f} s idle"
        else:
            why = "after an idle gap"
        seq = "" if a.request.seq is None else f"seq {a.request.seq}, "
        lines.append(f"{seq}{a.cohort or 'unknown input'}: {_ms(a.request.total_ms)} ms, "
                     f"{a.ratio:.1f}x its input's median ({why}); trace {a.request.trace_id}")
    head = "Also reported apart as cold" if report.cold_start is not None else "Reported apart as cold"
    return _bullets(f"{head} ({len(lines)}):", lines, "bold", MAX_PROBLEMS)


#: Drop priorities of the slowest-requests table (higher goes first when the terminal is narrow):
#: trace ids first (they move to a list under the table, never cut), then bytes, then stage
#: columns from the smallest share of request time up, then the image size. The request's seq,
#: its total and the verdict's stage are always shown.
_DROP_TRACE, _DROP_BYTES, _DROP_STAGES, _DROP_IMAGE = 100, 90, 10, 5
UNACCOUNTED_COLUMN = "unaccounted"


def _slowest_table(report: Report, width: int) -> RenderableType:
    names = list(report.stages)
    for r in report.slowest:
        names += [n for n in r.stages_ms if n not in names]
    shares: dict[str, float] = {n: s.share for n, s in report.stages.items()}
    if report.unaccounted is not None:
        names.append(UNACCOUNTED_COLUMN)
        shares[UNACCOUNTED_COLUMN] = report.unaccounted.share
    ranked = sorted((n for n in names if n != report.verdict.stage),
                    key=lambda n: (-shares.get(n, 0.0), names.index(n)))
    drop = {n: _DROP_STAGES + i + 1 for i, n in enumerate(ranked)}  # smallest share: highest
    images = any(r.image_width is not None and r.image_height is not None for r in report.slowest)
    sizes = any(r.image_bytes is not None for r in report.slowest)
    cols = [Column("seq"), Column("total")]
    if images:
        cols.append(Column("image", _DROP_IMAGE))
    if sizes:
        cols.append(Column("bytes", _DROP_BYTES))
    cols += [Column(n, drop.get(n, 0), fold_header=True) for n in names]
    cols.append(Column("trace id", _DROP_TRACE, justify="left"))
    rows = []
    for r in report.slowest:
        row = ["-" if r.seq is None else str(r.seq), _ms(r.total_ms) + (" (error)" if r.error else "")]
        if images:
            row.append(f"{r.image_width}x{r.image_height}"
                       if r.image_width is not None and r.image_height is not None else "-")
        if sizes:
            row.append(_bytes(r.image_bytes))
        row += [_ms(r.unaccounted_ms if n == UNACCOUNTED_COLUMN else r.stages_ms.get(n))
                for n in names]
        row.append(r.trace_id)  # full 32 hex digits: pasted into Jaeger / Tempo
        rows.append(row)
    table, dropped = fit_table(cols, rows, width)
    title = f"{len(report.slowest)} slowest warm requests, ms per stage"
    if report.unaccounted is not None:
        title += " (unaccounted = outside every stage span)"
    parts: list[RenderableType] = [Text(title, style="bold"), table]
    if "trace id" in dropped:  # never cut an id: list them under the table instead
        dropped.remove("trace id")
        labels = [
            f"seq {r.seq}:" if r.seq is not None else f"{_ms(r.total_ms)} ms:" for r in report.slowest
        ]
        pad = max(len(label) for label in labels)
        parts.append(Text("trace ids:"))
        for label, r in zip(labels, report.slowest):
            parts.append(Text(f"  {label:<{pad}} {r.trace_id}"))
    parts[2:2] = left_out_note(dropped)
    return Group(*parts)


def _bullets(title: str, lines: list[str], style: str, limit: int | None = None) -> RenderableType:
    """``title`` then one ``- line`` per entry with a hanging indent; at most ``limit`` lines."""
    grid = Table.grid(padding=0)
    grid.add_column(width=4, no_wrap=True)
    grid.add_column(overflow="fold")  # a long word (path, env var) wraps, never ends in "..."
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
    if v.tentative:
        head.append(" - tentative", style="bold yellow")
    return Group(
        head,
        _bullets("Evidence:", v.evidence, "bold"),
        _bullets("Advice:", v.advice, "bold green"),
    )


def _changed(ch: Change, inconclusive: bool = False) -> str:
    if ch.median_ci is None:
        return "-"
    if ch.significant:
        return "yes"
    return "unsure" if inconclusive else "noise"  # never "noise" beside "the bottleneck is now X"


def _comparison(report: Report, width: int) -> RenderableType:
    c = report.comparison
    assert c is not None
    rows = [
        [name, _ms(ch.baseline_median_ms), _ms(ch.median_ms), units.signed_pct(ch.change_pct),
         _ms(ch.baseline_p95_ms), _ms(ch.p95_ms), units.signed_pct(ch.p95_change_pct),
         _changed(ch, name in c.inconclusive)]
        for name, ch in [*c.stages.items(), ("total", c.total)]
    ]
    table, dropped = fit_table([Column("stage", justify="left", fold=True), Column("median before", 2),
                           Column("after"), Column("change"), Column("p95 before", 3), Column("after", 1),
                           Column("change"), Column("changed")], rows, width)
    summary = _bullets("Summary:", c.summary, "bold")
    title = Text(f"Compared with the baseline ({_count(c.baseline_requests, 'request')}), ms;"
                 " changed = outside run-to-run noise (95% bootstrap intervals of median, p95,"
                 " swing; exact test of the requests beyond the baseline's slowest + 50%; unsure ="
                 " inconclusive)",
                 style="bold")
    return Group(title, table, *left_out_note(dropped), summary)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _utc(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S")


def _run_line(run: Run) -> str:
    who = run.service_name or "unknown service"
    if run.service_instance_id:
        who += f" instance {run.service_instance_id}"
    if run.host_name:
        who += f" on {run.host_name}"
    if run.process_pid:
        who += f" pid {run.process_pid}"
    return (f"{who}: {_count(run.requests, 'request')}, {_utc(run.first_unix_ns)} .."
            f" {_utc(run.last_unix_ns)[11:]} UTC")


def _header(report: Report) -> list[RenderableType]:
    counts = report.counts
    failed = f", {counts.failed} failed" if counts.failed else ""
    if counts.cold_failed:  # (a cold start that outlasted the client's deadline)
        failed += f" ({counts.cold_failed} of them cold)"
    incomplete = f"; {counts.incomplete} incomplete left out" if counts.incomplete else ""
    head = Text(
        f"otel-stages report: {_count(report.requests, 'request')} ({counts.warm} warm, {counts.cold} cold"
        f"{failed}{incomplete})",
        style="bold",
    )
    reported = [r for r in report.runs if r.reported]
    skipped = len(report.runs) - len(reported)
    if not report.runs:
        return [head]
    if skipped:
        title = (f"Newest of {len(report.runs)} runs read (--last-run; {skipped} older not"
                 " reported):")
    else:
        title = f"{len(report.runs)} run{'s' if len(report.runs) != 1 else ''} read:"
    return [Group(head, _bullets(title, [_run_line(r) for r in reported], "", MAX_PROBLEMS))]


def renderables(report: Report, width: int = DEFAULT_WIDTH) -> list[RenderableType]:
    """The report's sections, in display order, as rich renderables fitted to ``width`` columns
    (numbers, stage names and trace ids are never cut: low-priority columns are left out)."""
    parts = _header(report)
    if report.stages:
        parts.append(_stages_table(report, width))
    if report.signals:
        parts.append(_signals_table(report, width))
    if len(report.cohorts) > 1:
        parts.append(_cohort_table(report, width))
    if report.cold_start is not None:
        parts.append(_cold_table(report, width))
    if report.set_apart:
        parts.append(_set_apart_list(report))
    if report.slowest:
        parts.append(_slowest_table(report, width))
    parts.append(Text(report.gpu.describe()))
    if report.batches is not None:
        parts.append(_bullets("Batches:", report.batches.describe(), "bold"))
    parts.append(_verdict(report))
    if report.comparison is not None:
        parts.append(_comparison(report, width))
    if report.problems:
        parts.append(
            _bullets(f"Warnings ({len(report.problems)}):", report.problems, "bold yellow", MAX_PROBLEMS)
        )
    return parts


def render(report: Report, file: IO[str] | None = None, *, width: int | None = None) -> None:
    """Write the report to ``file`` (default stdout). On a terminal rich picks colors and width;
    otherwise plain text (no ANSI codes, no trailing spaces) at ``width`` (default: ``COLUMNS``
    when set, else :data:`DEFAULT_WIDTH`) columns. When ``file``'s encoding (cp1252, ASCII...) lacks the table
    rules' box-drawing characters, rules are ASCII; any other character it cannot hold is ``?``
    (:func:`otel_stages.terminal.text_console`)."""
    dest = sys.stdout if file is None else file
    plain_width = width if width is not None else env_columns() or DEFAULT_WIDTH
    with text_console(dest, plain_width, terminal_width=width) as console:
        for part in renderables(report, console.width):
            console.print(part)
            console.print()


def render_text(report: Report, *, width: int = DEFAULT_WIDTH) -> str:
    """The plain-text rendering (no ANSI codes) as a string."""
    buffer = io.StringIO()
    render(report, buffer, width=width)
    return buffer.getvalue()
