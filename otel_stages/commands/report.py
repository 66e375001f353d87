"""``otel-stages report [PATH ...] [--json] [--baseline PATH ...] [--top N]``.

Reads OTLP/JSON lines files or folders (default: the embedded exporter's folder,
``OTEL_STAGES_DATA_DIR`` or ``./otel-stages-data``), diagnoses them and prints the report as text
or, with ``--json``, as one JSON object (``indent=2``).

Input problems (bad lines, missing files) never stop the report: each is printed to stderr as
``otel-stages: warning: <file>:<line>: ...`` and listed under ``problems``.

Exit status: 0 when at least one request was found; 1 when none was (the message says why on
stderr; with ``--json`` the JSON object is still printed, with ``"requests": 0`` and
``"verdict": {"cause": null, ...}``, so scripts can parse it either way).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from otel_stages import config
from otel_stages.analysis import diagnose, load_paths
from otel_stages.analysis.report import DEFAULT_TOP

#: At most this many problems are echoed to stderr (all of them stay in the JSON).
MAX_STDERR_PROBLEMS = 20


def default_data_dir() -> str:
    """The embedded exporter's folder: ``OTEL_STAGES_DATA_DIR`` if set, else ``otel-stages-data``."""
    return os.environ.get("OTEL_STAGES_DATA_DIR", "").strip() or config.DEFAULT_DATA_DIR


def _non_negative_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {raw!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``report``'s arguments on ``parser``."""
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="OTLP/JSON lines files or folders (searched recursively for *.jsonl / *.json);"
        " default: $OTEL_STAGES_DATA_DIR or ./otel-stages-data",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--baseline",
        nargs="+",
        action="extend",
        metavar="PATH",
        default=None,
        help="files or folders recorded before a change: compare against them",
    )
    parser.add_argument(
        "--top",
        type=_non_negative_int,
        default=DEFAULT_TOP,
        metavar="N",
        help=f"list the N slowest warm requests (default {DEFAULT_TOP})",
    )


def _warn(problems: list[str]) -> None:
    for problem in problems[:MAX_STDERR_PROBLEMS]:
        print(f"otel-stages: warning: {problem}", file=sys.stderr)
    if len(problems) > MAX_STDERR_PROBLEMS:
        print(
            f"otel-stages: warning: ... and {len(problems) - MAX_STDERR_PROBLEMS} more problems"
            " (all are listed under \"problems\" with --json)",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    """Load, diagnose, print. Returns the exit status (see the module docstring)."""
    paths = list(args.paths) or [default_data_dir()]
    telemetry = load_paths(paths)
    baseline = load_paths(args.baseline) if args.baseline else None
    report = diagnose(telemetry, baseline=baseline, top=args.top)
    _warn(report.problems)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif report.requests:
        from otel_stages.render import render  # rich only when text is wanted

        render(report, sys.stdout)
    if report.requests == 0:
        where = ", ".join(paths)
        hint = (
            " (record some first with `otel-stages demo`, or pass trace files/folders)"
            if not args.paths
            else ""
        )
        print(f"otel-stages: error: no requests found in {where}{hint}", file=sys.stderr)
        return 1
    return 0
