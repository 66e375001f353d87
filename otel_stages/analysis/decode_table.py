"""The ``otel-stages decode-bench`` table: measured decode / resize times -> per-image rows and
findings. Pure (no timing, no I/O); :mod:`otel_stages.decode_bench` does the measuring.

Per image: the first decode apart (a process's first decode also pays for loading the codec),
warm decode min / median / max, the resize after a full decode, and the speed-up of Pillow's JPEG
draft mode for decode + resize to the target size (``full median / draft median``, both measured
in the same interleaved rounds).

Findings, with named thresholds:

- an image's warm decode is *unstable* when its swing (p95 - p5, as in the report) reaches
  ``UNSTABLE_MIN_SWING_FRACTION`` of its median and at least ``UNSTABLE_MIN_SWING_MS`` (below that
  it is timer and scheduler noise), over at least ``MIN_RUNS_FOR_STABILITY`` warm decodes;
- across images, decode cost *follows input size* when the Pearson r between median decode ms and
  pixels (or bytes) reaches :data:`otel_stages.analysis.evidence.FOLLOWS_SIZE_MIN_R`, over at least
  3 images of different sizes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from otel_stages.analysis.evidence import FOLLOWS_SIZE_MIN_R
from otel_stages.analysis.stats import correlation, percentile

#: Warm decodes of one image swing (p95 - p5) by at least this fraction of their median: unstable.
#: Repeated decodes of the same bytes do the same work, so on an idle core they agree within ~10 %;
#: half the median is far outside that (CPU contention, throttling, memory pressure).
UNSTABLE_MIN_SWING_FRACTION = 0.5
#: ... and by at least this many ms: a 0.3 ms thumbnail that takes 0.6 ms once is timer noise.
UNSTABLE_MIN_SWING_MS = 1.0
#: Fewer warm decodes than this cannot tell a swing from one unlucky run: stability not judged.
MIN_RUNS_FOR_STABILITY = 5
#: Correlation needs at least this many images of different sizes.
MIN_IMAGES_FOR_SIZE = 3


@dataclass(frozen=True)
class DecodeTimings:
    """What :func:`otel_stages.decode_bench.measure` measured for one image (ms throughout).

    ``width`` / ``height``: pixels as displayed (after EXIF orientation); ``size_bytes``: encoded
    bytes; ``target``: the resize target ``(width, height)``. ``first_decode_ms``: the first decode
    of this image in the process; ``decode_ms``: the warm decodes after it. ``resize_ms``,
    ``decode_resize_ms``: per round of the full path (decode, then resize); ``draft_decode_resize_ms``:
    the same rounds with draft decoding (empty when the format has no draft mode);
    ``draft_scale``: 1/2/4/8 as chosen by Pillow, ``None`` without draft. ``error``: why the image
    could not be measured (then the lists are empty).
    """

    name: str
    size_bytes: int
    width: int = 0
    height: int = 0
    format: str = ""
    target: tuple[int, int] = (0, 0)
    first_decode_ms: float | None = None
    decode_ms: tuple[float, ...] = ()
    resize_ms: tuple[float, ...] = ()
    decode_resize_ms: tuple[float, ...] = ()
    draft_decode_resize_ms: tuple[float, ...] = ()
    draft_scale: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class DecodeRow:
    """One image's row of the table (ms; ``None`` where not measured).

    ``draft_speedup`` = median full decode+resize / median draft decode+resize (``None`` without
    draft mode, or when Pillow's draft scale is 1: the target is too close to the image size for
    any reduction); ``unstable`` is ``None`` when there were too few warm decodes to judge.
    """

    name: str
    width: int
    height: int
    size_bytes: int
    format: str
    first_decode_ms: float | None
    decode_min_ms: float | None
    decode_median_ms: float | None
    decode_max_ms: float | None
    decode_swing_ms: float | None
    resize_median_ms: float | None
    decode_resize_median_ms: float | None
    draft_decode_resize_median_ms: float | None
    draft_scale: int | None
    draft_speedup: float | None
    unstable: bool | None
    error: str | None = None

    @property
    def pixels(self) -> int:
        """width * height."""
        return self.width * self.height

    @property
    def ms_per_megapixel(self) -> float | None:
        """Median warm decode ms per million pixels."""
        if self.decode_median_ms is None or not self.pixels:
            return None
        return self.decode_median_ms / (self.pixels / 1e6)

    def to_dict(self) -> dict[str, object]:
        """JSON form (ms rounded to microseconds)."""
        return {
            "name": self.name,
            "width": self.width,
            "height": self.height,
            "bytes": self.size_bytes,
            "format": self.format,
            "first_decode_ms": _r(self.first_decode_ms),
            "decode_min_ms": _r(self.decode_min_ms),
            "decode_median_ms": _r(self.decode_median_ms),
            "decode_max_ms": _r(self.decode_max_ms),
            "decode_swing_ms": _r(self.decode_swing_ms),
            "decode_ms_per_megapixel": _r(self.ms_per_megapixel),
            "resize_median_ms": _r(self.resize_median_ms),
            "decode_resize_median_ms": _r(self.decode_resize_median_ms),
            "draft_decode_resize_median_ms": _r(self.draft_decode_resize_median_ms),
            "draft_scale": self.draft_scale,
            "draft_speedup": None if self.draft_speedup is None else round(self.draft_speedup, 2),
            "unstable": self.unstable,
            "error": self.error,
        }


@dataclass(frozen=True)
class DecodeBench:
    """The whole table: ``rows`` in input order, ``follows`` = ``{"pixels": r, "bytes": r}``
    (``None`` values when undefined), and ``findings``: sentences with the numbers."""

    rows: tuple[DecodeRow, ...]
    repeat: int
    target: tuple[int, int]
    follows: dict[str, float | None] = field(default_factory=dict)
    findings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """``otel-stages decode-bench --json``."""
        return {
            "repeat": self.repeat,
            "size": {"width": self.target[0], "height": self.target[1]},
            "images": [row.to_dict() for row in self.rows],
            "follows_size": {k: None if v is None else round(v, 3) for k, v in self.follows.items()},
            "findings": list(self.findings),
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def is_unstable(decode_ms: Sequence[float]) -> bool | None:
    """The stability rule of the module docstring; ``None`` below ``MIN_RUNS_FOR_STABILITY`` runs."""
    if len(decode_ms) < MIN_RUNS_FOR_STABILITY:
        return None
    swing = percentile(decode_ms, 95) - percentile(decode_ms, 5)
    median = statistics.median(decode_ms)
    return swing >= UNSTABLE_MIN_SWING_MS and swing >= UNSTABLE_MIN_SWING_FRACTION * median


def row(t: DecodeTimings) -> DecodeRow:
    """Summarize one image's timings."""
    full = _median(t.decode_resize_ms)
    draft = _median(t.draft_decode_resize_ms)
    swing = (percentile(t.decode_ms, 95) - percentile(t.decode_ms, 5)) if t.decode_ms else None
    return DecodeRow(
        name=t.name,
        width=t.width,
        height=t.height,
        size_bytes=t.size_bytes,
        format=t.format,
        first_decode_ms=t.first_decode_ms,
        decode_min_ms=min(t.decode_ms) if t.decode_ms else None,
        decode_median_ms=_median(t.decode_ms),
        decode_max_ms=max(t.decode_ms) if t.decode_ms else None,
        decode_swing_ms=swing,
        resize_median_ms=_median(t.resize_ms),
        decode_resize_median_ms=full,
        draft_decode_resize_median_ms=draft,
        draft_scale=t.draft_scale,
        # at scale 1 draft mode decodes the full image: a ratio would only measure noise
        draft_speedup=full / draft if full is not None and draft and (t.draft_scale or 1) > 1 else None,
        unstable=is_unstable(t.decode_ms),
        error=t.error,
    )


def summarize(timings: Sequence[DecodeTimings], *, repeat: int, target: tuple[int, int]) -> DecodeBench:
    """Rows plus the findings of the module docstring. Never raises for odd input."""
    rows = tuple(row(t) for t in timings)
    good = [r for r in rows if r.error is None and r.decode_median_ms is not None]
    findings: list[str] = []
    for r in good:
        if r.unstable:
            findings.append(
                f"{r.name}: warm decode is unstable: {_ms(r.decode_min_ms)} .. {_ms(r.decode_max_ms)}"
                f" ms (swing {_ms(r.decode_swing_ms)} ms around a median of {_ms(r.decode_median_ms)}"
                " ms) for the same bytes: look for CPU contention or throttling, not image size"
            )
        if r.draft_speedup is not None and r.draft_scale and r.draft_scale > 1:
            findings.append(
                f"{r.name}: JPEG draft mode (decode at 1/{r.draft_scale} size) makes decode + resize to"
                f" {target[0]}x{target[1]} {r.draft_speedup:.1f}x faster"
                f" ({_ms(r.decode_resize_median_ms)} -> {_ms(r.draft_decode_resize_median_ms)} ms)"
            )
    if any(r.unstable is None for r in good):
        findings.append(
            f"stability not judged for images with fewer than {MIN_RUNS_FOR_STABILITY} warm decodes"
            f" (use --repeat {MIN_RUNS_FOR_STABILITY + 1} or more)"
        )
    follows: dict[str, float | None] = {"pixels": None, "bytes": None}
    distinct = {(r.pixels, r.size_bytes) for r in good}
    if len(good) >= MIN_IMAGES_FOR_SIZE and len(distinct) >= MIN_IMAGES_FOR_SIZE:
        medians = [r.decode_median_ms or 0.0 for r in good]
        follows = {
            "pixels": correlation(medians, [float(r.pixels) for r in good]),
            "bytes": correlation(medians, [float(r.size_bytes) for r in good]),
        }
        findings.append(_follows_sentence(follows, len(good)))
    elif good:
        findings.append(
            f"whether decode cost follows input size needs {MIN_IMAGES_FOR_SIZE}+ images of different"
            f" sizes ({len(distinct)} given)"
        )
    return DecodeBench(rows=rows, repeat=repeat, target=target, follows=follows,
                       findings=tuple(findings))


def _follows_sentence(follows: dict[str, float | None], n: int) -> str:
    known = {k: v for k, v in follows.items() if v is not None}
    if not known:
        return f"decode cost vs input size: undefined over {n} images (no variation)"
    yes = [f"{k} (r = {v:.2f})" for k, v in known.items() if abs(v) >= FOLLOWS_SIZE_MIN_R]
    no = [f"{k} (r = {v:.2f})" for k, v in known.items() if abs(v) < FOLLOWS_SIZE_MIN_R]
    if yes and no:
        return f"decode cost follows image {' and '.join(yes)}, not {' or '.join(no)}, over {n} images"
    if yes:
        return f"decode cost follows image {' and '.join(yes)} over {n} images"
    return (
        f"decode cost does not follow image {' or '.join(no)} over {n} images: look at format,"
        " quality and mode rather than size"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
