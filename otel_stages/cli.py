"""The ``otel-stages`` command line.

Each subcommand lives in its own module that exposes ``add_arguments(parser)`` and
``run(args) -> int``; this module only builds the parser and dispatches, importing a command's
module when that command runs (so ``otel-stages report`` never imports the demo's model runtime).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# name -> (module implementing add_arguments/run, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "report": ("otel_stages.commands.report", "diagnose per-stage latency from recorded traces"),
    "demo": ("otel_stages.commands.demo", "run a traced image+prompt inference pipeline and report"),
    "collector-config": ("otel_stages.commands.collector_config",
                         "print the bundled OpenTelemetry Collector config"),
    "gpu": ("otel_stages.commands.gpu",
            "live view of GPU utilization, memory and power as the sampler sees it"),
    "decode-bench": ("otel_stages.commands.decode_bench",
                     "time image decode and resize, with and without JPEG draft mode"),
    "import": ("otel_stages.commands.import_otlp",
               "load OTLP/JSON files into the Collector clickhouse exporter's tables"),
}


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every subcommand's arguments registered."""
    parser = argparse.ArgumentParser(
        prog="otel-stages",
        description="Tell why multimodal inference latency jumps around, stage by stage.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"otel-stages {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # -v also after the subcommand; SUPPRESS keeps a -v given before it
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="log debug messages")
        importlib.import_module(module_name).add_arguments(p)
        p.set_defaults(_module=module_name)
    return parser


def version() -> str:
    """The package version (``otel_stages._version``, which the build also reads)."""
    from otel_stages._version import __version__

    return __version__


def _tolerant_stdout() -> None:
    """Characters stdout's encoding cannot hold (box drawing, a stage name in another script on
    an ASCII or cp1252 terminal) become ``?`` (``µ`` becomes ``u``: terminal.FALLBACK_ERRORS)
    instead of raising ``UnicodeEncodeError``."""
    from otel_stages.terminal import FALLBACK_ERRORS

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors=FALLBACK_ERRORS)  # type: ignore[union-attr]
        except (AttributeError, ValueError):  # not a TextIOWrapper (captured, replaced) or closed
            pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); return the process exit code.

    Exit codes: 0 success, 1 the command failed (message on stderr), 2 usage error.
    """
    try:
        _tolerant_stdout()
        args = build_parser().parse_args(argv)
        logging.basicConfig(
            level=logging.DEBUG if args.verbose else logging.WARNING,
            format="otel-stages: %(levelname)s %(name)s: %(message)s",
        )
        return int(importlib.import_module(args._module).run(args) or 0)
    except KeyboardInterrupt:  # also while the parser imports the commands' modules
        return 130
    except BrokenPipeError:  # e.g. `otel-stages report | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
