"""How well the report's draft-decoding estimate predicts real draft decodes.

Not a test: run ``python benchmarks/draft_model.py`` and read the JSON. The report estimates what
JPEG draft decoding would save from a trace's own sizes (:mod:`otel_stages.analysis.preprocessing`):

    full / draft ~= (k * bytes + pixels) / (k * bytes + pixels / scale**2),  k = BYTE_COST_PIXELS

Here real JPEGs (the camera photos in tests/data/images and the demo's photo-like JPEGs at two
qualities) are decoded in full and in draft mode at 1/2, 1/4 and 1/8 scale, interleaved, ``ROUNDS``
times, two ways: with :func:`otel_stages.imaging.decode` (what a ``decode`` span of this library
times: decode, EXIF orientation, colour management) and with bare Pillow (``Image.open``,
``draft``, ``load``: a service's own minimal decode). Per row: the ratio of the fastest runs (the
least disturbed by other load on a shared machine) for both, the model's ratio, its error against
each, and the ``k`` that would fit each exactly.

Target: the model never overstates a measured speed-up by more than 25 % (the advice says "an
estimated N x"; a larger real gain is welcome, a smaller one would mislead);
``otel-stages decode-bench`` measures a user's own files.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from PIL import Image

from otel_stages import imaging
from otel_stages.analysis.preprocessing import BYTE_COST_PIXELS, draft_scale, estimated_speedup
from otel_stages.demo.images import photo
from otel_stages.testing import capture_spans

ROUNDS = 15
CASES = Path(__file__).resolve().parents[1] / "tests" / "data" / "images"  # real camera photos
REAL = ("photo_4032x3024.jpg", "photo_1920x1080.jpg", "photo_320x240.jpg")


def _jpeg(size: tuple[int, int], quality: int) -> bytes:
    out = io.BytesIO()
    photo(size, 3).save(out, "JPEG", quality=quality)
    return out.getvalue()


def images(smoke: bool) -> dict[str, bytes]:
    """Name -> JPEG bytes: the camera photos of tests/data/images, and generated photos (only a
    small generated one when ``smoke``)."""
    found = {} if smoke else {n: (CASES / n).read_bytes() for n in REAL if (CASES / n).is_file()}
    sizes = [(640, 480)] if smoke else [(4000, 3000), (1024, 768)]
    for w, h in sizes:
        for q in (75, 95):
            found[f"demo {w}x{h} q{q}"] = _jpeg((w, h), q)
    return found


def _ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1e6


def _pillow(data: bytes, target: tuple[int, int] | None) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    if target is not None:
        image.draft("RGB", target)
    image.load()
    return image


def _ratio(full: Callable[[], object], draft: Callable[[], object], rounds: int
           ) -> tuple[float, float]:
    """(fastest full / fastest draft, fastest full ms), rounds interleaved, first call apart."""
    full()
    draft()
    full_ms: list[float] = []
    draft_ms: list[float] = []
    for i in range(rounds):
        for which in ((full, full_ms), (draft, draft_ms))[:: 1 if i % 2 == 0 else -1]:
            which[1].append(_ms(which[0]))
    return min(full_ms) / min(draft_ms), min(full_ms)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="one small image, two rounds (tests)")
    args = parser.parse_args(argv)
    rounds = 2 if args.smoke else ROUNDS
    rows = []
    with capture_spans():  # spans as in a service, kept in memory
        for name, data in images(args.smoke).items():
            w, h = Image.open(io.BytesIO(data)).size
            for scale in (2, 4, 8):
                target = (max(1, w // scale), max(1, h // scale))
                if draft_scale(w, h, *target) != scale:
                    continue
                model = estimated_speedup(w * h, len(data), scale)
                row: dict[str, object] = {"image": name, "size": f"{w}x{h}", "bytes": len(data),
                                          "scale": scale, "model": round(model, 2)}
                ways: tuple[tuple[str, Callable[[], object], Callable[[], object]], ...] = (
                    ("imaging", partial(imaging.decode, data),
                     partial(imaging.decode, data, draft=target)),
                    ("pillow", partial(_pillow, data, None), partial(_pillow, data, target)),
                )
                for way, full, draft in ways:
                    measured, full_ms = _ratio(full, draft, rounds)
                    fit = (w * h * (1 - measured / scale**2) / (len(data) * (measured - 1))
                           if measured > 1 else None)
                    row.update({f"{way}_full_ms": round(full_ms, 2),
                                f"{way}_measured": round(measured, 2),
                                f"{way}_error_pct": round(100 * (model - measured) / measured, 1),
                                f"{way}_k_fit": None if fit is None else round(fit, 2)})
                rows.append(row)
    json.dump({"byte_cost_pixels": BYTE_COST_PIXELS, "rounds": rounds, "rows": rows}, sys.stdout,
              indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
