"""Evidence from per-request data, for the rules in :mod:`otel_stages.analysis.decision`: does a
stage's time follow image size or a span attribute (Pearson r across warm requests)? The rules
work on aggregates only, so :func:`stage_evidence` computes this for every stage up front."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace

from otel_stages import semconv
from otel_stages.analysis.figures import PreprocessFacts, StageEvidence
from otel_stages.analysis.preprocessing import SEVERAL_IMAGES_MIN_SHARE, PreprocessRows, preprocess_facts
from otel_stages.analysis.preprocessing import evidence_lines as preprocess_lines
from otel_stages.analysis.requests import Request, usable_float
from otel_stages.analysis.stats import correlation
from otel_stages.analysis.units import duration

#: |Pearson r| at or above this between stage ms and image pixels/bytes means "cost follows size".
FOLLOWS_SIZE_MIN_R = 0.7
#: Two correlations this close are reported as equal ("follows pixels and bytes").
CLOSE_R = 0.05

_Key = Callable[[Request], "int | None"]


def size_evidence(warm: Sequence[Request], stage: str, other_images: int = 0) -> StageEvidence:
    """Whether ``stage`` ms follows image pixels / bytes across ``warm`` requests
    (:func:`sized_evidence`; ``other_images``: the warm requests of several images, or untold).

    ``lines``: one sentence for both measures (e.g. ``decode time follows image pixels (r = 0.95)
    and bytes (r = 0.91)``, the closer one first), then the per-size medians or the one size.
    ``follows_size``: ``True`` (|r| >= FOLLOWS_SIZE_MIN_R for pixels or bytes), ``False`` (sizes
    vary but cost does not follow), ``None`` (sizes unknown or all equal). ``one_size``: every
    request with a known size had the same width x height (and cost does not follow bytes).
    """
    # one pass over the requests (a fleet's hundreds of thousands) for both correlations and sizes
    pixel_ms: list[float] = []
    pixels: list[float] = []
    byte_ms: list[float] = []
    sizes: list[float] = []
    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    for req in warm:
        ms = req.stages_ms.get(stage)
        if ms is None:
            continue
        width, height, size = req.image_width, req.image_height, req.image_bytes
        if width is not None and height is not None:
            pixel_ms.append(ms)
            pixels.append(float(width * height))
            groups[(width, height)].append(ms)
        if size is not None:
            byte_ms.append(ms)
            sizes.append(float(size))
    rs = {
        "pixels": correlation(pixel_ms, pixels) if pixel_ms else None,
        "bytes": correlation(byte_ms, sizes) if byte_ms else None,
    }
    known = [(w, r) for w, r in rs.items() if r is not None]
    ran = sum(1 for req in warm if stage in req.stages_ms)
    sized = [(w, h, len(v), statistics.median(v)) for (w, h), v in groups.items()]
    return sized_evidence(stage, known, sized, ran - len(pixel_ms), ran, other_images)


#: Input sizes listed in the evidence (the smallest first).
MAX_SIZE_LINES = 6


def sized_evidence(stage: str, known: Sequence[tuple[str, float]],
                   sizes: Sequence[tuple[int, int, int, float]], unknown: int, ran: int,
                   other_images: int = 0) -> StageEvidence:
    """The size evidence of ``stage`` from its figures, for the file report and the SQL alike:
    ``known`` the Pearson r per measure (``[("pixels", r), ("bytes", r)]``), ``sizes`` =
    ``(width, height, requests, median ms)`` per input size, ``unknown`` of the ``ran`` requests
    without a readable size, ``other_images`` requests whose decode spans held other images than
    the first or may have (:func:`other_images`: their size is their first image's, so one size
    among them is not one input; from ``preprocessing.SEVERAL_IMAGES_MIN_SHARE`` of the ``ran``
    requests, no size figures at all: empty evidence)."""
    if other_images and other_images >= SEVERAL_IMAGES_MIN_SHARE * ran:
        # a request's size is its first image's, its time all of its images': no size figures
        return StageEvidence()
    lines = [size_sentence(stage, known)] if known else []
    follows = None if not known else max(abs(r) for _, r in known) >= FOLLOWS_SIZE_MIN_R
    if len(sizes) > 1:
        parts = [f"{w}x{h}: {n} requests, median {duration(m)}"
                 for w, h, n, m in sorted(sizes, key=lambda x: (x[0] * x[1], x[0], x[1]))
                 [:MAX_SIZE_LINES]]
        lines.append(f"{len(sizes)} input sizes ({stage}): " + "; ".join(parts))
    # one pixel size, the time following the encoded bytes: the format or compression differs
    # (a PNG beside JPEGs of the same pixels), which capping the pixels would not change
    bytes_only = len(sizes) == 1 and follows is True and not other_images
    if len(sizes) == 1 and not other_images:
        w, h, _, _ = sizes[0]
        lines.append(bytes_only_sentence(stage, w, h, unknown, ran) if bytes_only
                     else one_size_sentence(stage, w, h, unknown, ran))
    # same pixels, and bytes do not explain it; not when some sizes are unknown (they may differ)
    one_size = len(sizes) == 1 and not unknown and follows is not True and not other_images
    return StageEvidence(tuple(lines), None if one_size else follows, one_size,
                         bytes_only=bytes_only)


def other_images(facts: PreprocessFacts) -> int:
    """Warm requests whose decode spans decoded several images, or more than one decode span
    without the sizes to tell (``PreprocessFacts.several_images`` + ``decodes_untold``): for them
    the request's size (its first image's) may not be its input."""
    return facts.several_images + facts.decodes_untold


def one_size_sentence(stage: str, width: int, height: int, unknown: int, ran: int) -> str:
    """The evidence line when every request with a known size had one ``width`` x ``height``:
    ``unknown`` of the ``ran`` requests where ``stage`` ran had no readable size."""
    if not unknown:
        return f"every request had the same {width}x{height} image, so {stage} cost cannot follow size"
    return (f"every request with a readable size had the same {width}x{height} image, but {unknown}"
            f" of {ran} had none (image.width / image.height missing or unreadable), so whether"
            f" {stage} cost follows size cannot be told")


def bytes_only_sentence(stage: str, width: int, height: int, unknown: int, ran: int) -> str:
    """The evidence line when every request with a known size had one ``width`` x ``height`` and
    ``stage``'s time follows the encoded bytes (``unknown`` of the ``ran`` requests had no readable
    size)."""
    who = ("every request" if not unknown else
           f"every request with a readable size ({ran - unknown} of {ran})")
    return (f"{who} had the same {width}x{height} pixels, so {stage} time follows what the encoded"
            " bytes carry (the image format or its compression), not the pixels")


def size_sentence(stage: str, known: Sequence[tuple[str, float]]) -> str:
    """One sentence for the measures in ``known`` (``[("pixels", r), ("bytes", r)]``): which the
    time follows (the closer one first) and which it does not (in the given order)."""
    follow = [(w, r) for w, r in known if abs(r) >= FOLLOWS_SIZE_MIN_R]
    miss = [(w, r) for w, r in known if abs(r) < FOLLOWS_SIZE_MIN_R]
    closest = sorted(follow, key=lambda wr: -abs(wr[1]))

    def each(items: Sequence[tuple[str, float]], joiner: str) -> str:
        return joiner.join(f"{w} (r = {r:.2f})" for w, r in items)

    if len(follow) == 2:
        (a, ra), (b, rb) = closest
        if abs(ra) - abs(rb) < CLOSE_R:  # alike: keep the given order
            (a, ra), (b, rb) = follow
            return f"{stage} time follows image size: {a} (r = {ra:.2f}) and {b} (r = {rb:.2f})"
        return (
            f"{stage} time follows image size, {a} (r = {ra:.2f}) more closely than {b}"
            f" (r = {rb:.2f})"
        )
    if follow and miss:
        return f"{stage} time follows image {each(follow, '')}, not {each(miss, '')}"
    if follow:
        return f"{stage} time follows image {each(follow, '')}"
    return f"{stage} time does not follow image {each(miss, ' or ')}"


def _corr(warm: Sequence[Request], stage: str, key: _Key) -> float | None:
    xs: list[float] = []
    ys: list[float] = []
    for r in warm:  # one pass, no pairs: this runs over every warm request of a fleet, per stage
        ms = r.stages_ms.get(stage)
        if ms is not None and (v := key(r)) is not None:
            xs.append(ms)
            ys.append(float(v))
    return correlation(xs, ys) if xs else None


def follow_evidence(warm: Sequence[Request], stage: str, what: str, key: _Key) -> list[str]:
    """``["download time follows image bytes (r = 0.93)"]``, or ``[]`` when r is undefined."""
    r = _corr(warm, stage, key)
    if r is None:
        return []
    verb = "follows" if abs(r) >= FOLLOWS_SIZE_MIN_R else "does not follow"
    return [f"{stage} time {verb} {what} (r = {r:.2f})"]


def attribute_evidence(warm: Sequence[Request], stage: str, key: str) -> list[str]:
    """``["queue time vs queue.depth: r = 0.81"]`` from a numeric attribute of the stage span."""
    pairs = [
        (r.stages_ms[stage], v)
        for r in warm
        if stage in r.stages_ms
        and (v := usable_float(r.stage_attribute(stage, key))) is not None  # text too, as the SQL
    ]
    r = correlation([p[0] for p in pairs], [p[1] for p in pairs]) if pairs else None
    return [] if r is None else [f"{stage} time vs {key}: r = {r:.2f}"]


def stage_evidence(warm: Sequence[Request], stages: Sequence[str],
                   rows: PreprocessRows | None = None) -> dict[str, StageEvidence]:
    """Per-request evidence for each of ``stages``: size for decode / resize (plus the facts behind
    the concrete preprocessing advice, :mod:`otel_stages.analysis.preprocessing`, read through
    ``rows`` when given) and for a ``preprocess`` stage (size only), image bytes for download,
    ``queue.depth`` for queue; nothing for the others (forward's evidence is the GPU's)."""
    out: dict[str, StageEvidence] = {}
    facts = None
    for stage in stages:
        if stage in (semconv.STAGE_DECODE, semconv.STAGE_RESIZE):
            facts = facts or preprocess_facts(warm, rows)
            size = size_evidence(warm, stage, other_images(facts))
            out[stage] = replace(size, lines=(*size.lines, *preprocess_lines(facts)), preprocess=facts)
        elif stage == semconv.STAGE_PREPROCESS:  # a stage map's (or a custom) preprocess: sizes only
            out[stage] = size_evidence(warm, stage)
        elif stage == semconv.STAGE_DOWNLOAD:
            lines = follow_evidence(warm, stage, "image bytes", lambda r: r.image_bytes)
            out[stage] = StageEvidence(tuple(lines))
        elif stage == semconv.STAGE_QUEUE:
            out[stage] = StageEvidence(tuple(attribute_evidence(warm, stage, semconv.QUEUE_DEPTH)))
    return out
