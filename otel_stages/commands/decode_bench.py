"""``otel-stages decode-bench IMAGE... [--repeat N] [--size WxH] [--json]``.

Decodes each image ``N`` times (the first run reported apart), then decodes and resizes it ``N``
times with a full decode and with Pillow's JPEG draft mode, and prints one row per image: size,
bytes, first decode ms, warm decode min / median / max ms, resize ms, draft speed-up; then the
findings (cost follows pixels or bytes across images, an image whose decode is unstable).
Timing is done by :mod:`otel_stages.decode_bench`, the table by
:mod:`otel_stages.analysis.decode_table`.

A progress bar goes to stderr on a terminal only (never with ``--json`` or when stdout or stderr is
piped).

Exit status: 0 every image measured; 1 some image could not be read or decoded (the others are
still measured and printed; the reason is on stderr and in the JSON row's ``error``); 2 usage.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

from otel_stages.commands import int_at_least

if TYPE_CHECKING:
    from otel_stages.analysis.decode_table import DecodeBench

#: Decodes per image by default: DESIGN.md's 20+ runs of a fixed input.
DEFAULT_REPEAT = 20
#: Resize target by default: the usual vision-encoder input (ViT, CLIP, the demo's model).
DEFAULT_SIZE = (224, 224)
#: Largest resize target accepted (per side, pixels): far above any model input.
MAX_SIDE = 16384
_SIZE = re.compile(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*")


def parse_size(raw: str) -> tuple[int, int]:
    """``"224x224"`` -> ``(224, 224)`` (pixels, each side 1..MAX_SIDE); argparse error otherwise."""
    match = _SIZE.fullmatch(raw)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT in pixels such as 224x224, got {raw!r}")
    width, height = int(match.group(1)), int(match.group(2))
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise argparse.ArgumentTypeError(f"each side must be 1 to {MAX_SIDE} pixels, got {raw!r}")
    return width, height


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``decode-bench``'s arguments on ``parser``."""
    parser.epilog = (
        "Times are milliseconds of wall time (perf_counter) for otel_stages.imaging.decode and"
        " .resize, the calls an instrumented service makes. Exit status: 0 all images measured,"
        " 1 an image could not be read or decoded (the others are still shown), 2 usage error."
    )
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files (JPEG, PNG, WebP, ...)")
    parser.add_argument(
        "--repeat", type=int_at_least(2), default=DEFAULT_REPEAT, metavar="N",
        help=f"decodes per image, the first reported apart, and as many decode+resize rounds"
        f" (default {DEFAULT_REPEAT}; 6+ to judge whether one image's decode is unstable)",
    )
    parser.add_argument(
        "--size", type=parse_size, default=DEFAULT_SIZE, metavar="WxH",
        help=f"resize target in pixels, width x height (default {DEFAULT_SIZE[0]}x{DEFAULT_SIZE[1]});"
        " JPEG draft mode decodes at the smallest 1/2, 1/4 or 1/8 scale still at least this size",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def run(args: argparse.Namespace) -> int:
    """Measure, summarize, print. Returns the exit status (see the module docstring)."""
    from otel_stages.analysis.decode_table import DecodeTimings, summarize
    from otel_stages.decode_bench import measure, runs_per_image
    from otel_stages.progress import progress, show_progress

    timings: list[DecodeTimings] = []
    total = len(args.images) * runs_per_image(args.repeat)
    with progress("decode-bench", total, enabled=show_progress(args.json), unit="runs") as bar:
        for name in args.images:
            try:
                data = Path(name).read_bytes()
            except OSError as exc:
                timings.append(DecodeTimings(name=name, size_bytes=0,
                                             error=f"cannot read: {exc.strerror or exc}"))
                bar.advance(runs_per_image(args.repeat))
                continue
            result = measure(name, data, repeat=args.repeat, target=args.size, tick=bar.advance)
            if result.error is not None:  # the rest of this image's runs are skipped
                bar.advance(runs_per_image(args.repeat))
            timings.append(result)
    bench = summarize(timings, repeat=args.repeat, target=args.size)
    failed = [r for r in bench.rows if r.error is not None]
    for r in failed:
        print(f"otel-stages decode-bench: error: {r.name}: {r.error}", file=sys.stderr)
    if args.json:
        print(json.dumps(bench.to_dict(), indent=2))
    else:
        render(bench, sys.stdout)
    return 1 if failed else 0


def _bytes(value: int) -> str:
    for unit, size in (("MB", 1_000_000), ("kB", 1_000)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render(bench: DecodeBench, file: IO[str]) -> None:
    """The table and findings as text: colour (an unstable image's row yellow, a failed one red)
    and the terminal's width on a terminal, plain text (no escape codes, 120 columns) otherwise."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from otel_stages.terminal import is_terminal

    tty = is_terminal(file)
    buffer = io.StringIO()
    # off a terminal: no colour at all; on one, rich decides (NO_COLOR, TERM=dumb turn it off)
    console = Console(file=file if tty else buffer, force_terminal=tty, no_color=True if not tty else None,
                      width=None if tty else 120, highlight=False, markup=False, emoji=False)
    w, h = bench.target
    console.print(Text(f"decode-bench: {bench.repeat} decodes per image (first apart), then"
                       f" {bench.repeat} rounds of decode + resize to {w}x{h}; times in ms",
                       style="bold"))
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("image", overflow="fold")  # a long path wraps, never cut
    for header in ("size", "bytes", "first", "min", "median", "max", "resize", "draft speed-up"):
        table.add_column(header, justify="right", no_wrap=True)
    for r in bench.rows:
        if r.error is not None:
            table.add_row(r.name, "-", _bytes(r.size_bytes) if r.size_bytes else "-", "error",
                          "", "", "", "", "", style="red")
            continue
        if r.draft_speedup is not None:
            speedup = f"{r.draft_speedup:.1f}x (1/{r.draft_scale})"
        else:
            speedup = "n/a" if r.draft_scale is None else "none (1/1)"
        table.add_row(r.name, f"{r.width}x{r.height}", _bytes(r.size_bytes), _ms(r.first_decode_ms),
                      _ms(r.decode_min_ms), _ms(r.decode_median_ms), _ms(r.decode_max_ms),
                      _ms(r.resize_median_ms), speedup,
                      style="yellow" if r.unstable else None)
    console.print(table)
    for line in bench.findings:
        console.print(Text(f"- {line}"))
    for r in bench.rows:
        if r.error is not None:
            console.print(Text(f"- {r.name}: not measured: {r.error}", style="red"))
    if not tty:
        file.write("\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n")
