"""``otel-stages report --clickhouse URL [--service S] [--since D] [--top N] [--json]``.

The statistics are computed inside ClickHouse (see :mod:`otel_stages.analysis.clickhouse_sql`);
only aggregates come back, and :mod:`otel_stages.analysis.clickhouse_figures` turns them into the
rules' :class:`~otel_stages.analysis.figures.Figures` for
:func:`otel_stages.analysis.decision.decide`, the one rule set of every source. With ``--json``
the report's keys (:func:`~otel_stages.analysis.clickhouse_figures.report_dict`), else a short
table and the verdict.

Window: ``--since D`` reads requests that started in the last D; without it a server is read for
the last hour, as the other remote sources, and an embedded ``chdb:`` database in full (it holds
what was imported into it). ``--limit`` does not apply: every request in the window counts.
Exit status: 0 requests found; 1 none, or the database could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from otel_stages.analysis import clickhouse_figures
from otel_stages.analysis.clickhouse import connect, fetch_aggregates, parse_url, services_seen
from otel_stages.analysis.clickhouse_result import FleetAggregates
from otel_stages.analysis.clickhouse_sql import AggregateQuery
from otel_stages.analysis.http_source import SourceError
from otel_stages.analysis.services import no_request_line, no_service_line
from otel_stages.commands.import_otlp import tables_from_args


def usage_problem(args: argparse.Namespace) -> str | None:
    """Why these ``report`` arguments do not go with ``--clickhouse``, or ``None``."""
    if args.paths or args.jaeger or args.tempo or args.prometheus:
        return "--clickhouse is a source of its own: no PATH, --jaeger, --tempo or --prometheus"
    if args.limit is not None:
        return "--limit does not cap a ClickHouse report: it aggregates every request in the window"
    if args.query is not None:
        return "--query is a TraceQL query for --tempo"
    if args.baseline:
        return "--baseline is not supported with --clickhouse yet"
    if args.fail_on_regression is not None:
        return "--fail-on-regression compares with a baseline, which --clickhouse does not read yet"
    if args.last_run:
        return ("--last-run is not applied by the ClickHouse SQL: pick the run with --service and"
                " --since, or report the exported files (PATH) with --last-run")
    if args.html:
        return ("--html draws each request's spans, which a ClickHouse report does not fetch:"
                " report the exported files (PATH), Jaeger or Tempo with --html")
    if getattr(args, "stage_map", None):
        return ("--stage-map is not applied by the ClickHouse SQL: report the exported files (PATH)"
                " or Jaeger / Tempo with --stage-map instead")
    return None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _pct(share: float | None) -> str:
    """A share as a whole percent; a small negative one shows as 0%, not -0%."""
    if share is None:
        return "-"
    text = f"{share:.0%}"
    return "0%" if text == "-0%" else text


def text(agg: FleetAggregates) -> str:
    """A short plain-text view: counts, total and stage rows, GPU, the largest cohorts."""
    c = agg.counts
    lines = [
        f"otel-stages: aggregates from {agg.url} ({c.requests} requests: {c.warm} warm,"
        f" {c.cold - c.cold_failed + c.set_apart} cold"
        + (f" ({c.set_apart} of them warm requests set apart)" if c.set_apart else "")
        + f", {c.failed} failed"
        + (f" ({c.cold_failed} of them cold)" if c.cold_failed else "")
        + f"; {c.incomplete} incomplete; {c.runs}"
        f" {'process' if c.runs == 1 else 'processes'};"
        f" quantiles: {agg.quantile_function})",
        "",
        f"{'':<10}{'min ms':>10}{'median ms':>11}{'p95 ms':>10}{'max ms':>10}{'swing ms':>10}"
        f"{'explains':>10}",
    ]
    if agg.total:
        t = agg.total
        lines.append(f"{'total':<10}{_ms(t.min_ms):>10}{_ms(t.median_ms):>11}{_ms(t.p95_ms):>10}"
                     f"{_ms(t.max_ms):>10}{_ms(t.swing_ms):>10}{'':>10}")
    for s in agg.stages.values():
        r = s.ran
        lines.append(f"{s.name:<10}{_ms(r.min_ms):>10}{_ms(r.median_ms):>11}{_ms(r.p95_ms):>10}"
                     f"{_ms(r.max_ms):>10}{_ms(r.swing_ms):>10}"
                     f"{_pct(clickhouse_figures.shown_explains(agg, s.explained)):>10}")
    g = agg.gpu
    if g.source:
        lines += ["", f"GPU utilization during forward: {g.mean_utilization or 0:.0%} mean over"
                      f" {g.samples} samples, {g.forwards_covered} of {g.forwards} warm forwards"
                      f" covered ({g.source})"]
    if agg.cohorts:
        lines += ["", "inputs: " + ", ".join(
            f"{k.key} ({k.total.count} requests, median {_ms(k.total.median_ms)} ms)"
            for k in agg.cohorts[:5])
            + (f" (the largest 5 of {agg.cohorts_total})" if agg.cohorts_total > 5 else "")]
    if agg.overlap is not None:
        o = agg.overlap
        lines.append(f"{'(overlap)':<10}{'':>10}{_ms(o.median_ms):>11}{'':>10}{'':>10}"
                     f"{_ms(o.swing_ms):>10}{_pct(o.explains):>10}")
        lines.append(f"(overlap) = time counted in two stages at once, in {o.requests} warm requests"
                     f" ({o.share:.0%} of request time): subtract it for the stages to add up")
    lines += [f"problem: {p}" for p in agg.problems]
    v = clickhouse_figures.verdict(agg)
    lines += ["", f"verdict: {v.cause or 'none'}" + (f" ({v.stage})" if v.stage else "")
              + (" (tentative)" if v.tentative else "")]
    lines += [f"  - {e}" for e in v.evidence]
    lines += [f"  advice: {a}" for a in v.advice]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, default_since_ns: int) -> int:
    """Aggregate in ClickHouse and print; see the module docstring for window and exit status."""
    try:
        target = parse_url(args.clickhouse)
        tables = tables_from_args(args, target.database)
    except ValueError as exc:
        print(f"otel-stages report: error: {exc}", file=sys.stderr)
        return 2
    since_ns = args.since if args.since else (default_since_ns if target.kind == "http" else None)
    now_ns = time.time_ns()
    query = AggregateQuery(
        start_ns=None if since_ns is None else now_ns - since_ns,
        end_ns=None if since_ns is None else now_ns,
        service=args.service, top_slowest=args.top,
    )
    try:
        with connect(target, reading=tables.traces_name) as engine:
            agg = fetch_aggregates(engine, tables, query, url=target.display)
            no_service = ""  # as the file report: the services seen when --service matched none
            if agg.counts.requests == 0 and query.service:
                seen, services, found = services_seen(engine, tables, query)
                if agg.service_hosts:  # its spans are stages of other services' requests
                    no_service = f": {no_request_line(query.service, agg.service_hosts)}"
                elif not found:
                    no_service = f": {no_service_line(query.service, seen, services)}"
    except SourceError as exc:
        print(f"otel-stages: error: {exc}", file=sys.stderr)
        return 1
    for problem in agg.problems:
        print(f"otel-stages: warning: {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps(clickhouse_figures.report_dict(agg), indent=2))
    elif agg.counts.requests:
        sys.stdout.write(text(agg))
    if agg.counts.requests == 0:
        where = "" if since_ns is None else " in that window (widen it with --since)"
        print(f"otel-stages: error: no requests found in {tables.traces_ref} at {target.display}"
              f"{where}{no_service}", file=sys.stderr)
        return 1
    return 0
