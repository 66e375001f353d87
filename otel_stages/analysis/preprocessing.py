"""Decode / resize facts that name concrete fixes for the ``preprocess`` verdict: JPEG draft
decoding, a cache for repeated inputs, a pool sized to the cores, moving work off the event loop.
Pure; linear in the warm requests. The advice sentences are in :mod:`otel_stages.analysis.advice`;
the evidence sentences are here (:func:`evidence_lines`), so both come from one
:class:`~otel_stages.analysis.figures.PreprocessFacts` and cannot disagree.

Each fact comes from the spans' own attributes (DESIGN.md section 2, :mod:`otel_stages.imaging`):

* **Draft decoding.** A JPEG decoded in full and then resized to a much smaller target can be
  decoded at 1/2, 1/4 or 1/8 scale (Pillow ``Image.draft``: libjpeg's DCT scaling). The scale is
  Pillow's own rule (``PIL/JpegImagePlugin.py``, ``JpegImageFile.draft``): ``min(W // tw, H // th)``
  rounded down to 8, 4, 2 or 1, from the source size (``image.width`` / ``image.height``) and the
  resize target (``image.target_width`` / ``image.target_height``). Draft decoding skips most of
  the work per output pixel (inverse DCT, upsampling, colour conversion) but none of the entropy
  decoding, whose cost follows the encoded bytes (``image.size``). So per request::

      draft ms ~= decode ms * (k * bytes + pixels / scale**2) / (k * bytes + pixels)

  with k = :data:`BYTE_COST_PIXELS`. ``benchmarks/draft_model.py`` checks the model against real
  decodes (BENCHMARKS.md: it mostly understates what ``imaging.decode`` gains, and is a rough
  figure for a bare Pillow decode); ``otel-stages decode-bench IMAGE --size WxH`` measures the
  same ratio on the user's own files, and the advice says so. Requests that recorded ``image.draft_scale``
  are drafted already and left out; PNG, WebP and the rest have no draft mode.
* **Repeated inputs.** A warm request whose image has the width, height and encoded bytes of one
  already decoded in the same process decoded it again; a cache of decoded images would have
  skipped it. When every warm request has the same image (a fixed-input run, as the method asks),
  repetition is the experiment's, not the traffic's, and nothing is claimed.
* **Where the work ran.** ``thread.name`` and ``otel_stages.event_loop.running`` on decode / resize
  spans: on an event loop's thread the fix is to move the work off the loop; on several threads,
  one pool sized to the cores; on one thread of sequential requests, neither.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TypeVar

from otel_stages import semconv
from otel_stages.analysis.figures import DraftEstimate, PreprocessFacts, RepeatedInputs, ThreadUse
from otel_stages.analysis.requests import Request, process_key
from otel_stages.analysis.units import duration, pct

#: Pillow formats whose loader has a draft mode (MPO is a JPEG container: JpegImageFile).
DRAFT_FORMATS = frozenset({"JPEG", "MPO"})
#: Pillow's draft scales, largest first (``JpegImageFile.draft``).
_SCALES = (8, 4, 2, 1)
#: Draft decoding reduces a JPEG only when it is at least this many times the target in both
#: sides (Pillow's smallest reduction is 1/2 per side).
DRAFT_MIN_SCALE = 2
#: Decode cost of one encoded byte (entropy decoding, which draft mode does not skip) in units of
#: the cost of one output pixel (inverse DCT, upsampling, colour conversion, which it scales down).
#: Fits on real and generated photos range from about 1 (``imaging.decode``: colour management is
#: per-pixel work too) to 7 (bare Pillow) on a noisy machine (``benchmarks/draft_model.py``); 4 is
#: on the conservative side for this library's spans: the estimate rather understates the gain.
BYTE_COST_PIXELS = 4.0
#: Draft decoding is advised when the estimated speed-up on the decodes it applies to is at least
#: this: below it the estimate is within the model's own error (about 15 %).
DRAFT_MIN_SPEEDUP = 1.25
#: ... and those decodes are at least this part of all warm decode time (a fix for a sliver of the
#: decodes is not worth naming first).
DRAFT_MIN_SHARE = 0.2
#: A cache for decoded images is advised when repeated decodes are at least this part of all warm
#: decode time.
CACHE_MIN_SHARE = 0.2
#: Decode / resize on at least this many threads of one process: a pool sized to the cores is the
#: advice (on one thread of sequential requests a pool would not change a request's latency).
POOL_MIN_THREADS = 2
#: Thread names quoted in the evidence.
_NAMES_SHOWN = 3


def draft_scale(width: int, height: int, target_width: int, target_height: int) -> int:
    """The scale Pillow's JPEG draft mode picks to decode ``width x height`` for a
    ``target_width x target_height`` resize: 8, 4, 2 or 1 (no reduction). Sizes in pixels."""
    if target_width <= 0 or target_height <= 0:
        return 1
    ratio = min(width // target_width, height // target_height)
    return next((s for s in _SCALES if ratio >= s), 1)  # upscaling (ratio 0): no reduction


def estimated_speedup(pixels: int, size_bytes: int, scale: int) -> float:
    """Estimated full decode time / draft decode time for a JPEG of ``pixels`` pixels and
    ``size_bytes`` encoded bytes decoded at 1/``scale`` per side (module docstring). >= 1."""
    if scale <= 1 or pixels <= 0:
        return 1.0
    fixed = BYTE_COST_PIXELS * max(size_bytes, 0)
    return (fixed + pixels) / (fixed + pixels / scale**2)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


_T = TypeVar("_T")


def _mode(values: Sequence[_T]) -> _T:
    """The most common value (the first seen among equals)."""
    return Counter(values).most_common(1)[0][0]


def _draft(warm: Sequence[Request], total_decode_ms: float) -> tuple[DraftEstimate | None, int]:
    """The draft estimate over warm decodes, and how many undrafted JPEG decodes lack a target."""
    rows: list[tuple[float, float, int, str, str]] = []  # decode ms, draft ms, scale, source, target
    untargeted = 0
    for r in warm:
        ms = r.stages_ms.get(semconv.STAGE_DECODE)
        if ms is None or r.image_format not in DRAFT_FORMATS:
            continue
        if r.stage_attribute(semconv.STAGE_DECODE, semconv.IMAGE_DRAFT_SCALE) is not None:
            continue
        tw = _int(r.stage_attribute(semconv.STAGE_RESIZE, semconv.IMAGE_TARGET_WIDTH))
        th = _int(r.stage_attribute(semconv.STAGE_RESIZE, semconv.IMAGE_TARGET_HEIGHT))
        if tw is None or th is None:
            untargeted += 1
            continue
        if r.image_width is None or r.image_height is None or r.image_bytes is None:
            continue
        scale = draft_scale(r.image_width, r.image_height, tw, th)
        if scale < DRAFT_MIN_SCALE:
            continue
        speedup = estimated_speedup(r.image_width * r.image_height, r.image_bytes, scale)
        rows.append((ms, ms / speedup, scale, f"{r.image_width}x{r.image_height}", f"{tw}x{th}"))
    if not rows:
        return None, untargeted
    full = sum(row[0] for row in rows)
    drafted = sum(row[1] for row in rows)
    speedup = full / drafted if drafted > 0 else 1.0
    share = full / total_decode_ms if total_decode_ms > 0 else 0.0
    weight: dict[tuple[int, str, str], float] = defaultdict(float)  # decode ms by scale, sizes
    for row in rows:
        weight[(row[2], row[3], row[4])] += row[0]
    scale, source, target = max(weight, key=lambda k: weight[k])
    estimate = DraftEstimate(
        requests=len(rows),
        scale=scale,
        source=source,
        target=target,
        decode_ms=full,
        speedup=speedup,
        share=share,
        worth=speedup >= DRAFT_MIN_SPEEDUP and share >= DRAFT_MIN_SHARE,
    )
    return estimate, untargeted


def _repeats(warm: Sequence[Request], total_decode_ms: float) -> RepeatedInputs | None:
    seen: dict[str, set[tuple[int, int, int]]] = defaultdict(set)
    images: set[tuple[str, tuple[int, int, int]]] = set()
    identities: set[tuple[int, int, int]] = set()
    count, ms = 0, 0.0
    for r in sorted(warm, key=lambda q: q.start_ns):
        decode = r.stages_ms.get(semconv.STAGE_DECODE)
        if decode is None or r.image_width is None or r.image_height is None or r.image_bytes is None:
            continue
        ident = (r.image_width, r.image_height, r.image_bytes)
        identities.add(ident)
        process = process_key(r.resource)
        if ident in seen[process]:
            count += 1
            ms += decode
            images.add((process, ident))
        seen[process].add(ident)
    if not count:
        return None
    share = ms / total_decode_ms if total_decode_ms > 0 else 0.0
    return RepeatedInputs(requests=count, images=len(images), decode_ms=ms, share=share,
                          worth=len(identities) > 1 and share >= CACHE_MIN_SHARE)


def _threads(warm: Sequence[Request]) -> ThreadUse | None:
    names: dict[str, set[str]] = defaultdict(set)
    loop_names: set[str] = set()
    spans = on_loop = loop_known = 0
    for r in warm:
        for span in r.spans:
            if span.name not in (semconv.STAGE_DECODE, semconv.STAGE_RESIZE):
                continue
            spans += 1
            name = span.attributes.get(semconv.THREAD_NAME)
            if isinstance(name, str) and name:
                names[process_key(r.resource)].add(name)
            running = span.attributes.get(semconv.EVENT_LOOP_RUNNING)
            if isinstance(running, bool):
                loop_known += 1
                on_loop += running
                if running and isinstance(name, str) and name:
                    loop_names.add(name)
    if not spans:
        return None
    widest = max(names.values(), key=len, default=set())
    threads = len(widest) if names else None
    return ThreadUse(spans=spans, threads=threads, names=tuple(sorted(widest)[:_NAMES_SHOWN]),
                     on_loop=on_loop, loop_known=loop_known,
                     several=threads is not None and threads >= POOL_MIN_THREADS,
                     loop_names=tuple(sorted(loop_names)[:_NAMES_SHOWN]))


def preprocess_facts(warm: Sequence[Request]) -> PreprocessFacts:
    """The facts (module docstring) over ``warm`` requests. Never raises for odd attributes
    (wrong types count as absent)."""
    decodes = [r for r in warm if semconv.STAGE_DECODE in r.stages_ms]
    total = sum(r.stages_ms[semconv.STAGE_DECODE] for r in decodes)
    jpeg = [r for r in decodes if r.image_format in DRAFT_FORMATS]
    scales = [s for r in jpeg
              if (s := _int(r.stage_attribute(semconv.STAGE_DECODE, semconv.IMAGE_DRAFT_SCALE)))]
    draft, untargeted = _draft(warm, total)
    unknown_format = any(not r.image_format for r in decodes)
    twice = sum(1 for r in decodes if sum(s.name == semconv.STAGE_DECODE for s in r.spans) > 1)
    return PreprocessFacts(
        decodes=len(decodes),
        jpeg=len(jpeg),
        drafted=len(scales),
        drafted_scale=_mode(scales) if scales else None,
        draft_unknown=draft is None and not scales and (unknown_format or untargeted > 0),
        draft=draft,
        repeats=_repeats(warm, total),
        threads=_threads(warm),
        decoded_twice=twice,
    )


def evidence_lines(facts: PreprocessFacts) -> list[str]:
    """Sentences with the numbers behind the preprocessing advice (only facts that were seen)."""
    lines = []
    if facts.drafted:
        lines.append(f"JPEG draft decoding is already on: {facts.drafted} of {facts.jpeg} warm JPEG"
                     f" decodes recorded image.draft_scale (mostly 1/{facts.drafted_scale})")
    d = facts.draft
    if d is not None:
        lines.append(
            f"{d.requests} warm decode{'s' if d.requests != 1 else ''} ({pct(d.share)} of all"
            f" decode time) are JPEGs at least {DRAFT_MIN_SCALE}x the resize target in both sides"
            f" (most of their decode time: {d.source} -> {d.target}): draft decoding (there at"
            f" 1/{d.scale} scale) would make them about {d.speedup:.1f}x faster,"
            f" {duration(d.saved_ms)} less decode time in all (estimated from their pixels and"
            " bytes for decodes on an idle core; CPU contention can make the gain larger)")
    rep = facts.repeats
    if rep is not None and rep.worth:
        lines.append(
            f"{rep.requests} warm decode{'s' if rep.requests != 1 else ''} ({pct(rep.share)} of all"
            f" decode time, {duration(rep.decode_ms)}) repeated an image already decoded in the"
            f" same process (same width, height and bytes; {rep.images} distinct"
            f" image{'s' if rep.images != 1 else ''})")
    if facts.decoded_twice:
        lines.append(f"{facts.decoded_twice} warm request{'s' if facts.decoded_twice != 1 else ''}"
                     " decoded the image more than once")
    t = facts.threads
    if t is not None:
        if t.on_loop:
            on = f" ({', '.join(t.loop_names)})" if t.loop_names else ""
            lines.append(f"decode/resize ran on a thread with a running asyncio event loop{on} in"
                         f" {t.on_loop} of {t.loop_known} spans: while they ran, that loop served"
                         " no other request")
        elif t.threads is not None:
            where = "" if t.loop_known < t.spans else ", never on an asyncio event loop"
            if t.several:
                lines.append(f"decode/resize ran on {t.threads} threads of one process{_named(t)}"
                             f"{where}")
            else:
                lines.append(f"decode/resize ran on one thread{_named(t)}{where}")
    return lines


def _named(t: ThreadUse) -> str:
    if not t.names:
        return ""
    more = ", ..." if t.threads is not None and t.threads > len(t.names) else ""
    return f" ({', '.join(t.names)}{more})"
