"""``otel-stages import FILE... --clickhouse URL [--traces-table T] [--gauge-table G]``.

Loads OTLP/JSON files (the Collector ``file`` exporter's format, what ``otel-stages`` writes by
default; gzip or zstd compressed too; ``-`` is standard input; folders are searched for the names
the file report reads: ``*.jsonl``, ``*.json``, ``*.ndjson``, each also with ``.gz`` / ``.zst``;
see :mod:`otel_stages.analysis.clickhouse_files`) into the tables of the Collector's
``clickhouse`` exporter, creating them with the exporter's DDL when missing, so files, a Collector
and ``otel-stages report --clickhouse URL`` meet in one schema. URL: ``chdb:PATH`` (embedded, data
in PATH) or ``http(s)://user@host:8123/database``.

Problems (bad lines, spans without times...) are warnings on stderr; the rest is imported.
Exit status: 0 something imported; 1 nothing imported or the database could not be used
(message on stderr); 2 usage error.
"""

from __future__ import annotations

import argparse
import sys

from otel_stages.analysis.clickhouse import Tables
from otel_stages.analysis.clickhouse_schema import (
    DEFAULT_GAUGE_TABLE,
    DEFAULT_TRACES_TABLE,
    quote_ident,
)

#: At most this many problems are echoed to stderr.
MAX_STDERR_PROBLEMS = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``import``'s arguments on ``parser``."""
    parser.add_argument("paths", nargs="+", metavar="FILE",
                        help="OTLP/JSON files (gzip or zstd compressed too; - for stdin) or folders"
                        " (searched for *.jsonl, *.json, *.ndjson, also .gz / .zst)")
    add_clickhouse_arguments(parser, required=True)


def add_clickhouse_arguments(parser: argparse._ActionsContainer, *, required: bool) -> None:
    """``--clickhouse URL``, ``--traces-table``, ``--gauge-table`` (shared with ``report``)."""
    parser.add_argument(
        "--clickhouse", metavar="URL", required=required,
        help="chdb:PATH (embedded ClickHouse, data in PATH) or http(s)://user@host:8123/database;"
        " password from $CLICKHOUSE_PASSWORD")
    parser.add_argument(
        "--traces-table", metavar="[DB.]TABLE", default=DEFAULT_TRACES_TABLE,
        help=f"spans table of the Collector's clickhouse exporter (default {DEFAULT_TRACES_TABLE})")
    parser.add_argument(
        "--gauge-table", metavar="[DB.]TABLE", default=DEFAULT_GAUGE_TABLE,
        help=f"gauge metrics table (default {DEFAULT_GAUGE_TABLE})")


def tables_from_args(args: argparse.Namespace, default_database: str) -> Tables:
    """The tables named by ``--traces-table`` / ``--gauge-table`` (``DB.TABLE`` or ``TABLE`` in
    ``default_database``). Raises ``ValueError`` for a name that is not a plain identifier or
    for two different databases."""
    parts = []
    for raw in (args.traces_table, args.gauge_table):
        database, _, table = raw.rpartition(".")
        quote_ident(table)
        quote_ident(database or default_database)
        parts.append((database or default_database, table))
    if parts[0][0] != parts[1][0]:
        raise ValueError("--traces-table and --gauge-table must be in the same database")
    return Tables(database=parts[0][0], traces=parts[0][1], gauge=parts[1][1])


def _warn(problems: list[str]) -> None:
    for problem in problems[:MAX_STDERR_PROBLEMS]:
        print(f"otel-stages: warning: {problem}", file=sys.stderr)
    if len(problems) > MAX_STDERR_PROBLEMS:
        print(f"otel-stages: warning: ... and {len(problems) - MAX_STDERR_PROBLEMS} more problems",
              file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Import, print what was written. Returns the exit status (see the module docstring)."""
    from otel_stages.analysis.clickhouse import connect, import_files, parse_url
    from otel_stages.analysis.http_source import SourceError

    try:
        target = parse_url(args.clickhouse)
        tables = tables_from_args(args, target.database)
    except ValueError as exc:
        print(f"otel-stages import: error: {exc}", file=sys.stderr)
        return 2
    try:
        with connect(target) as engine:
            summary = import_files(engine, tables, args.paths)
    except SourceError as exc:
        print(f"otel-stages: error: {exc}", file=sys.stderr)
        return 1
    _warn(summary.problems)
    skipped = (f"; {summary.skipped_points} metric points of other kinds (histogram, summary)"
               " not imported" if summary.skipped_points else "")
    print(f"imported {summary.spans} spans, {summary.gauge_points} gauge points and"
          f" {summary.sum_points} sum points from {summary.files} files into {target.display}"
          f" ({tables.traces_ref}, {tables.gauge_ref}, {tables.sum_ref}){skipped}")
    if summary.spans + summary.gauge_points + summary.sum_points == 0:
        print("otel-stages: error: nothing imported", file=sys.stderr)
        return 1
    return 0
