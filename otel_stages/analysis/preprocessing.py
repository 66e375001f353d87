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
* **Several decode spans in one request.** Each decode span's own ``image.width``,
  ``image.height`` and ``image.size`` tell its image: two with the same three decoded one image
  twice (decode once is the fix); two that differ decoded several images (a multi-image prompt:
  nothing to fix; a request's size is its first image's, so from :data:`SEVERAL_IMAGES_MIN_SHARE`
  of the warm decodes no size figures are given); without all three on every span the two cannot
  be told, and the advice asks for them. Such requests (several images,
  or sizes missing) give no draft estimate and no repeated input: their decode time is not their
  first image's.
* **Where the work ran.** ``thread.name`` and ``otel_stages.event_loop.running`` on decode / resize
  spans: on an event loop's thread the fix is to move the work off the loop; on several threads,
  one pool sized to the cores; on one thread of sequential requests, neither.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, NamedTuple, TypeVar

from otel_stages import semconv
from otel_stages.analysis.figures import DraftEstimate, PreprocessFacts, RepeatedInputs, ThreadUse
from otel_stages.analysis.image_formats import canonical_format
from otel_stages.analysis.model import AttributeValue
from otel_stages.analysis.requests import Request, process_key, usable_int
from otel_stages.analysis.units import duration, pct

#: Pillow formats whose loader has a draft mode (MPO is a JPEG container: JpegImageFile), by
#: Pillow's name: other spellings (``jpg``, ``image/jpeg``, ``image/pjpeg``) are read as these
#: (:func:`~otel_stages.analysis.image_formats.canonical_format`).
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
#: The size advice says requests decoded several images (:data:`~otel_stages.analysis.advice.SEVERAL_IMAGES`)
#: when at least this part of the warm decodes did, or when their first images are one size (then
#: the other images are the only sizes that vary); a stray multi-image request among many does not
#: displace what the others' sizes say.
SEVERAL_IMAGES_MIN_SHARE = 0.05
#: Thread names quoted in the evidence.
_NAMES_SHOWN = 3


def draft_format(image_format: str | None) -> bool:
    """Whether ``image_format`` (``image.format`` as :func:`~otel_stages.analysis.requests.usable_format`
    reads it: Pillow's name; another spelling, a MIME type without its parameters in any case,
    is named so first) is one of :data:`DRAFT_FORMATS`."""
    if not image_format:
        return False
    return canonical_format(image_format) in DRAFT_FORMATS


def draft_scale(width: int, height: int, target_width: int, target_height: int) -> int:
    """The scale Pillow's JPEG draft mode picks to decode ``width x height`` for a
    ``target_width x target_height`` resize: 8, 4, 2 or 1 (no reduction). Sizes in pixels."""
    if target_width <= 0 or target_height <= 0:
        return 1
    ratio = min(width // target_width, height // target_height)
    return next((s for s in _SCALES if ratio >= s), 1)  # upscaling (ratio 0): no reduction


#: What :func:`draft_missing` names.
FORMAT_MISSING = f"{semconv.IMAGE_FORMAT} on the decode span"
TARGET_MISSING = (f"{semconv.IMAGE_TARGET_WIDTH} / {semconv.IMAGE_TARGET_HEIGHT} on the resize"
                  " span")


def draft_missing(judged: bool, unknown_format: bool, untargeted: bool) -> tuple[str, ...]:
    """What to record so that draft decoding can be judged: nothing when it was (``judged``: an
    estimate, or decodes already drafted); else :data:`FORMAT_MISSING` when some decodes had no
    ``image.format`` (``unknown_format``) and :data:`TARGET_MISSING` when JPEG decodes had no
    resize target (``untargeted``), in that order."""
    if judged:
        return ()
    return tuple(what for what, missing in ((FORMAT_MISSING, unknown_format),
                                            (TARGET_MISSING, untargeted)) if missing)


def estimated_speedup(pixels: int, size_bytes: int, scale: int) -> float:
    """Estimated full decode time / draft decode time for a JPEG of ``pixels`` pixels and
    ``size_bytes`` encoded bytes decoded at 1/``scale`` per side (module docstring). >= 1."""
    if scale <= 1 or pixels <= 0:
        return 1.0
    fixed = BYTE_COST_PIXELS * max(size_bytes, 0)
    return (fixed + pixels) / (fixed + pixels / scale**2)


def _int(value: object) -> int | None:
    number = usable_int(value)
    return number if number is not None and number > 0 else None


_T = TypeVar("_T")


def _mode(values: Sequence[_T]) -> _T:
    """The most common value (the first seen among equals)."""
    return Counter(values).most_common(1)[0][0]


class _Row(NamedTuple):
    """What the facts read of one warm request (:func:`_row`)."""

    decode_ms: float | None
    format_known: bool
    jpeg: bool
    #: ``image.draft_scale`` of a JPEG decode (a positive int), else ``None``
    drafted: int | None
    #: the draft estimate of an undrafted JPEG decode: speedup, scale, source size, target size
    draft: tuple[float, int, str, str] | None
    #: an undrafted JPEG decode without a resize target
    untargeted: bool
    #: width, height and bytes of a decoded image
    ident: tuple[int, int, int] | None
    process: str
    start_ns: int
    #: ``thread.name`` and ``otel_stages.event_loop.running`` of each decode / resize span
    threads: tuple[tuple[AttributeValue, AttributeValue], ...]
    decode_spans: int
    #: distinct images (width, height and bytes all known) among the decode spans
    decode_images: int
    #: a decode span's image (width, height and bytes) also on another decode span
    decode_repeat: bool


_MISSING = object()
_WIDTH, _HEIGHT, _SIZE = semconv.IMAGE_WIDTH, semconv.IMAGE_HEIGHT, semconv.IMAGE_SIZE


def _row(r: Request, process: str, shared: dict[Any, Any]) -> _Row:
    """One pass over the request's spans; the attributes read as :meth:`Request.stage_attribute
    <otel_stages.analysis.requests.Request.stage_attribute>` would (the first span of the stage
    that has the key). Tuples that repeat across requests (sizes, threads, estimates) are taken
    from ``shared``: a fleet has few distinct ones and hundreds of thousands of requests."""
    threads = []
    decode_spans = 0
    images: list[tuple[int, int, int]] = []
    scale_attr: object = _MISSING
    tw_attr: object = _MISSING
    th_attr: object = _MISSING
    for span in r.spans:
        name = span.name
        attrs = span.attributes
        if name == semconv.STAGE_DECODE:
            decode_spans += 1
            image = (_int(attrs.get(_WIDTH)), _int(attrs.get(_HEIGHT)), _int(attrs.get(_SIZE)))
            if None not in image:
                images.append(image)  # type: ignore[arg-type]
            if scale_attr is _MISSING and semconv.IMAGE_DRAFT_SCALE in attrs:
                scale_attr = attrs[semconv.IMAGE_DRAFT_SCALE]
        elif name == semconv.STAGE_RESIZE:
            if tw_attr is _MISSING and semconv.IMAGE_TARGET_WIDTH in attrs:
                tw_attr = attrs[semconv.IMAGE_TARGET_WIDTH]
            if th_attr is _MISSING and semconv.IMAGE_TARGET_HEIGHT in attrs:
                th_attr = attrs[semconv.IMAGE_TARGET_HEIGHT]
        else:
            continue
        threads.append((attrs.get(semconv.THREAD_NAME), attrs.get(semconv.EVENT_LOOP_RUNNING)))
    ms = r.stages_ms.get(semconv.STAGE_DECODE)
    jpeg = draft_format(r.image_format)
    drafted = draft = None
    untargeted = False
    ident = None
    distinct = len(set(images)) if len(images) > 1 else len(images)
    # several images (or sizes missing on some decode span): the request's size is its first
    # image's, its decode time all of them, so no draft estimate or repeat is read from it
    one_image = decode_spans <= 1 or (distinct == 1 and len(images) == decode_spans)
    if ms is not None and one_image:
        width, height, size = r.image_width, r.image_height, r.image_bytes
        if width is not None and height is not None and size is not None:
            ident = (width, height, size)
            ident = shared.setdefault(ident, ident)
        if jpeg:
            drafted = _int(None if scale_attr is _MISSING else scale_attr)
            if scale_attr is _MISSING or scale_attr is None:
                tw = _int(None if tw_attr is _MISSING else tw_attr)
                th = _int(None if th_attr is _MISSING else th_attr)
                inputs = (width, height, size, tw, th)
                found = shared.get(inputs)
                if found is None:
                    found = shared[inputs] = _draft_row(width, height, size, tw, th)
                draft, untargeted = found
    spans = tuple(threads)
    # with the types: 1, 1.0 and True are equal keys, and the values must stay as recorded
    key = ("threads", spans, tuple(type(v) for pair in spans for v in pair))
    return _Row(ms, bool(r.image_format), jpeg, drafted, draft, untargeted, ident, process,
                r.start_ns, shared.setdefault(key, spans), decode_spans, distinct,
                distinct < len(images))


def _draft_row(width: int | None, height: int | None, size: int | None, tw: int | None,
               th: int | None) -> tuple[tuple[float, int, str, str] | None, bool]:
    """An undrafted JPEG decode (source and resize target sizes): its draft estimate, and
    whether it lacks a target."""
    if tw is None or th is None:
        return None, True
    if width is None or height is None or size is None:
        return None, False
    scale = draft_scale(width, height, tw, th)
    if scale < DRAFT_MIN_SCALE:
        return None, False
    speedup = estimated_speedup(width * height, size, scale)
    return (speedup, scale, f"{width}x{height}", f"{tw}x{th}"), False


class PreprocessRows:
    """What :func:`preprocess_facts` reads of each request, in one walk over its spans (a fleet's
    recording has hundreds of thousands of requests). Facts over subsets of one list of requests
    can share one (each request is read once); it holds on to the requests it has read."""

    def __init__(self) -> None:
        self._rows: dict[int, tuple[Request, _Row]] = {}
        # process keys by resource (loaders share one resource dict per process)
        self._processes: dict[int, tuple[dict[str, AttributeValue], str]] = {}
        self._shared: dict[Any, Any] = {}

    def of(self, warm: Sequence[Request]) -> list[_Row]:
        """The row of each request, in order."""
        rows = self._rows
        processes = self._processes
        out = []
        for r in warm:
            hit = rows.get(id(r))
            if hit is None or hit[0] is not r:
                process = processes.get(id(r.resource))
                if process is None or process[0] is not r.resource:
                    process = processes[id(r.resource)] = (r.resource, process_key(r.resource))
                hit = rows[id(r)] = (r, _row(r, process[1], self._shared))
            out.append(hit[1])
        return out


def _draft(rows: Sequence[_Row], total_decode_ms: float) -> tuple[DraftEstimate | None, int]:
    """The draft estimate over warm decodes, and how many undrafted JPEG decodes lack a target."""
    # decode ms, draft ms, scale, source size, target size
    drafts = [(row.decode_ms, row.decode_ms / row.draft[0], *row.draft[1:]) for row in rows
              if row.draft is not None and row.decode_ms is not None]
    untargeted = sum(row.untargeted for row in rows)
    if not drafts:
        return None, untargeted
    full = sum(d[0] for d in drafts)
    drafted = sum(d[1] for d in drafts)
    speedup = full / drafted if drafted > 0 else 1.0
    share = full / total_decode_ms if total_decode_ms > 0 else 0.0
    weight: dict[tuple[int, str, str], float] = defaultdict(float)  # decode ms by scale, sizes
    for d in drafts:
        weight[(d[2], d[3], d[4])] += d[0]
    scale, source, target = max(weight, key=lambda k: weight[k])
    estimate = DraftEstimate(
        requests=len(drafts),
        scale=scale,
        source=source,
        target=target,
        decode_ms=full,
        speedup=speedup,
        share=share,
        worth=speedup >= DRAFT_MIN_SPEEDUP and share >= DRAFT_MIN_SHARE,
    )
    return estimate, untargeted


_by_start = attrgetter("start_ns")


def _repeats(rows: Sequence[_Row], total_decode_ms: float) -> RepeatedInputs | None:
    seen: dict[str, set[tuple[int, int, int]]] = defaultdict(set)
    images: set[tuple[str, tuple[int, int, int]]] = set()
    identities: set[tuple[int, int, int]] = set()
    count, ms = 0, 0.0
    for row in sorted(rows, key=_by_start):
        ident, decode = row.ident, row.decode_ms
        if decode is None or ident is None:
            continue
        identities.add(ident)
        process = row.process
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


def _threads(rows: Sequence[_Row]) -> ThreadUse | None:
    names: dict[str, set[str]] = defaultdict(set)
    loop_names: set[str] = set()
    spans = on_loop = loop_known = 0
    for row in rows:
        for name, running in row.threads:
            spans += 1
            if isinstance(name, str) and name:
                names[row.process].add(name)
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


def preprocess_facts(warm: Sequence[Request], rows: PreprocessRows | None = None) -> PreprocessFacts:
    """The facts (module docstring) over ``warm`` requests. ``rows``: a :class:`PreprocessRows`
    to read the requests through (one per diagnosis: each request is read once). Never raises
    for odd attributes (wrong types count as absent)."""
    read = (rows or PreprocessRows()).of(warm)
    decodes = [row for row in read if row.decode_ms is not None]
    total = sum(row.decode_ms for row in decodes if row.decode_ms is not None)
    jpeg = [row for row in decodes if row.jpeg]
    scales = [row.drafted for row in jpeg if row.drafted]
    draft, untargeted = _draft(read, total)
    unknown_format = any(not row.format_known for row in decodes)
    twice = sum(1 for row in decodes if row.decode_repeat)
    several = sum(1 for row in decodes if row.decode_images > 1)
    untold = sum(1 for row in decodes
                 if row.decode_spans > 1 and not row.decode_repeat and row.decode_images < 2)
    return PreprocessFacts(
        decodes=len(decodes),
        jpeg=len(jpeg),
        drafted=len(scales),
        drafted_scale=_mode(scales) if scales else None,
        draft_missing=draft_missing(draft is not None or bool(scales), unknown_format,
                                    untargeted > 0),
        draft=draft,
        repeats=_repeats(read, total),
        threads=_threads(read),
        decoded_twice=twice,
        several_images=several,
        decodes_untold=untold,
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
        lines.append(f"{_requests(facts.decoded_twice)} decoded the same image more than once (two"
                     " decode spans with the same width, height and bytes)")
    if facts.several_images:
        lines.append(f"{_requests(facts.several_images)} decoded several images (decode spans of"
                     " different width, height or bytes): a request's size is its first image's,"
                     " not its input's")
    if facts.decodes_untold:
        lines.append(f"{_requests(facts.decodes_untold)} had more than one decode span without"
                     f" {_WIDTH}, {_HEIGHT} and {_SIZE} on each: a repeated decode of one image"
                     " cannot be told from several images")
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


def _requests(count: int) -> str:
    return f"{count} warm request{'s' if count != 1 else ''}"


def _named(t: ThreadUse) -> str:
    if not t.names:
        return ""
    more = ", ..." if t.threads is not None and t.threads > len(t.names) else ""
    return f" ({', '.join(t.names)}{more})"
