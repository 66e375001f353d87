"""``otel-stages collector-config``: print (or write) the bundled OpenTelemetry Collector config."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from otel_stages.collector_config import COLLECTOR_CONTRIB_VERSION, collector_config_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        f"Written for otelcol-contrib {COLLECTOR_CONTRIB_VERSION}. Endpoints are "
        "${env:NAME:-default} placeholders, e.g. OTEL_STAGES_TRACES_ENDPOINT, "
        "OTEL_STAGES_METRICS_ENDPOINT."
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        type=Path,
        help="write the config to FILE instead of standard output",
    )


def run(args: argparse.Namespace) -> int:
    text = collector_config_text()
    if args.output is None:
        binary = getattr(sys.stdout, "buffer", None)
        if binary is None:
            sys.stdout.write(text)
        else:  # YAML is UTF-8 whatever the terminal's locale (a C/ASCII locale would refuse it)
            sys.stdout.flush()
            binary.write(text.encode("utf-8"))
            binary.flush()
        return 0
    try:
        args.output.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"otel-stages: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
