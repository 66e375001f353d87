"""``otel-stages gpu``: live view of what the GPU sampler sees (utilization, memory, power,
driver sample period and clock), per device. Exit code 1 when NVML is unavailable."""

from __future__ import annotations

import argparse
import sys

from otel_stages.commands import int_at_least
from otel_stages.config import SETTINGS


def _interval_s(raw: str) -> float:
    """Same bounds as the service's ``gpu_interval_s`` setting (one table, one rule)."""
    parse = next(s.parse for s in SETTINGS if s.name == "gpu_interval_s")
    try:
        return float(parse(raw))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{raw!r}: {exc}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("Reads NVML directly (as the service's sampler does). Exit codes: 0 ok, "
                     "1 NVML unavailable or no GPU.")
    parser.add_argument("--interval-s", type=_interval_s, default=1.0, metavar="S",
                        help="seconds between refreshes (default 1)")
    parser.add_argument("--count", type=int_at_least(1), default=None, metavar="N",
                        help="stop after N refreshes (default: until Ctrl-C)")
    parser.add_argument("--once", action="store_true", help="one refresh, right after init")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per refresh (units in the key names: _bytes, _w, _c,"
                        " _ms; utilization and sm_activity 0..1)")


def run(args: argparse.Namespace) -> int:
    from otel_stages.gpu import live
    from otel_stages.gpu.nvml import NvmlBackend

    count = 1 if args.once else args.count
    return live.run(NvmlBackend(), interval_s=args.interval_s, count=count, as_json=args.json,
                    out=sys.stdout, err=sys.stderr)
