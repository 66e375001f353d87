"""Measure how long one image takes to decode and resize, with and without JPEG draft mode.

The work timed is the library's own: :func:`otel_stages.imaging.decode` (Pillow decode, EXIF
orientation, conversion to RGB) and :func:`otel_stages.imaging.resize` (bicubic with
``reducing_gap``), the same calls an instrumented service makes, so the numbers match its
``decode`` / ``resize`` spans. Timed with ``time.perf_counter_ns`` around each call.

Order, for ``repeat`` = N:

1. N decodes of the same bytes; the first is kept apart (a process's first decode of a format also
   loads the codec);
2. N rounds of decode + resize to the target, full decode and draft decode (``decode(draft=...)``)
   in each round, alternating which goes first, so a drift in machine load hits both alike and
   the speed-up is a ratio measured in the same rounds.

:func:`otel_stages.analysis.decode_table.summarize` turns the result into the table.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable

from PIL import Image, UnidentifiedImageError

from otel_stages import imaging
from otel_stages.analysis.decode_table import DecodeTimings

#: Counted once per timed decode or decode + resize (for a progress bar).
Tick = Callable[[], None]


def runs_per_image(repeat: int, draft: bool = True) -> int:
    """How many times :func:`measure` calls ``tick`` for one image (progress bar total)."""
    return repeat + repeat * (2 if draft else 1)


def _ms(start_ns: int) -> float:
    return (time.perf_counter_ns() - start_ns) / 1e6


def _format(data: bytes) -> str:
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.format or "unknown"
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return "unknown"


def measure(
    name: str, data: bytes, *, repeat: int, target: tuple[int, int], tick: Tick | None = None
) -> DecodeTimings:
    """Time ``repeat`` decodes of ``data``, then ``repeat`` rounds of decode + resize to ``target``
    (``(width, height)`` pixels) with a full and, for a JPEG, a draft decode.

    Returns :class:`DecodeTimings` (ms); an image that does not decode gives one with ``error``
    set to :class:`otel_stages.imaging.ImageError`'s message (nothing raised). Raises
    ``ValueError`` for ``repeat < 1`` or a non-positive target.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    if target[0] <= 0 or target[1] <= 0:
        raise ValueError(f"target size must be positive, got {target!r}")
    count = tick or (lambda: None)
    fmt = _format(data)
    decode_ms: list[float] = []
    try:
        for _ in range(repeat):
            start = time.perf_counter_ns()
            image = imaging.decode(data)
            decode_ms.append(_ms(start))
            count()
    except imaging.ImageError as exc:
        return DecodeTimings(name=name, size_bytes=len(data), format=fmt, error=str(exc))
    width, height = image.size
    del image
    draft = fmt == "JPEG"
    resize_ms: list[float] = []
    full_ms: list[float] = []
    draft_ms: list[float] = []
    draft_scale: int | None = None
    for round_no in range(repeat):
        paths = ("full", "draft") if round_no % 2 == 0 else ("draft", "full")
        for path in paths:
            if path == "draft" and not draft:
                continue
            start = time.perf_counter_ns()
            decoded = imaging.decode(data, draft=target if path == "draft" else None)
            middle = time.perf_counter_ns()
            imaging.resize(decoded, target)
            end = time.perf_counter_ns()
            if path == "full":
                resize_ms.append((end - middle) / 1e6)
                full_ms.append((end - start) / 1e6)
            else:
                draft_ms.append((end - start) / 1e6)
                draft_scale = max(1, round(width / decoded.width))
            count()
    return DecodeTimings(
        name=name,
        size_bytes=len(data),
        width=width,
        height=height,
        format=fmt,
        target=target,
        first_decode_ms=decode_ms[0],
        decode_ms=tuple(decode_ms[1:]),
        resize_ms=tuple(resize_ms),
        decode_resize_ms=tuple(full_ms),
        draft_decode_resize_ms=tuple(draft_ms),
        draft_scale=draft_scale,
    )
