"""Concrete preprocessing advice (issue 12 item 4): JPEG draft decoding with an estimate from the
traces' own sizes, a cache for repeated inputs, a pool sized to the cores, moving work off the
event loop; evidence and advice from one set of facts, so they never contradict.

Each threshold of :mod:`otel_stages.analysis.preprocessing` is tested just below and just above
with literal values (changing a threshold fails a test), and each rule both ways (deleting a rule
fails a test). Pillow's draft-scale rule is checked against real Pillow on real JPEGs; the
instrumentation's ``thread.name`` / ``otel_stages.event_loop.running`` against real threads and
a real asyncio loop; ``tests/scenario_service.py`` records a service through the real SDK.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image

from otel_stages import imaging, semconv
from otel_stages.analysis import Recording, Span, diagnose, load_paths
from otel_stages.analysis import advice as advice_text
from otel_stages.analysis.figures import PreprocessFacts
from otel_stages.analysis.preprocessing import (
    FORMAT_MISSING,
    SEVERAL_IMAGES_MIN_SHARE,
    TARGET_MISSING,
    draft_format,
    draft_scale,
    estimated_speedup,
    evidence_lines,
    preprocess_facts,
)
from otel_stages.analysis.requests import Request, find_requests

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000 * 10**9
MS = 1_000_000


def recording(rows: Sequence[dict[str, object]]) -> Recording:
    """One request per row: ``decode_ms``, ``fmt``, ``w``/``h``/``bytes``, ``target`` (w, h),
    ``draft`` (image.draft_scale), ``thread``, ``loop``, ``process``; each request is
    request -> decode -> resize -> forward, 1 s apart. The first request of each process is
    marked cold."""
    spans: list[Span] = []
    seen: set[object] = set()
    for i, row in enumerate(rows):
        t = T0 + i * 1000 * MS
        trace = f"{i:032x}"
        process = row.get("process", "p1")
        resource = {semconv.SERVICE_NAME: "svc", semconv.SERVICE_INSTANCE_ID: str(process)}
        decode_ms = float(row.get("decode_ms", 40.0))  # type: ignore[arg-type]
        where: dict[str, object] = {}
        if "thread" in row:
            where[semconv.THREAD_NAME] = row["thread"]
        if "loop" in row:
            where[semconv.EVENT_LOOP_RUNNING] = row["loop"]
        dec: dict[str, object] = {semconv.IMAGE_WIDTH: row.get("w", 4000),
                                  semconv.IMAGE_HEIGHT: row.get("h", 3000),
                                  semconv.IMAGE_SIZE: row.get("bytes", 3_000_000), **where}
        if row.get("fmt", "JPEG") is not None:
            dec[semconv.IMAGE_FORMAT] = row.get("fmt", "JPEG")
        if "draft" in row:
            dec[semconv.IMAGE_DRAFT_SCALE] = row["draft"]
        res: dict[str, object] = dict(where)
        target = row.get("target", (224, 224))
        if target is not None:
            tw, th = target  # type: ignore[misc]
            res.update({semconv.IMAGE_TARGET_WIDTH: tw, semconv.IMAGE_TARGET_HEIGHT: th})
        end = t + int((decode_ms + 30) * MS)
        cold = process not in seen
        seen.add(process)
        spans += [
            Span(trace, "r", None, "request", t, end, {semconv.REQUEST_SEQ: i + 1,
                                                       semconv.REQUEST_COLD_START: cold},
                 resource),
            Span(trace, "d", "r", "decode", t, t + int(decode_ms * MS), dec, resource),  # type: ignore[arg-type]
            Span(trace, "z", "r", "resize", t + int(decode_ms * MS), t + int((decode_ms + 10) * MS),
                 res, resource),  # type: ignore[arg-type]
            Span(trace, "f", "r", "forward", t + int((decode_ms + 10) * MS), end, {}, resource),
        ]
        for extra in range(int(row.get("decodes", 1)) - 1):  # type: ignore[call-overload]
            spans.append(Span(trace, f"d{extra}", "r", "decode", t, t + MS, dec, resource))  # type: ignore[arg-type]
        for k, image in enumerate(row.get("images", ())):  # type: ignore[arg-type]
            spans.append(Span(trace, f"i{k}", "r", "decode", t + MS, t + 2 * MS,
                              _image_attributes(image), resource))
    return Recording(spans=spans)


def _image_attributes(image: tuple[int | None, ...]) -> dict[str, object]:
    """A further decode span's ``image.width`` / ``image.height`` / ``image.size`` (``None``:
    not recorded)."""
    keys = (semconv.IMAGE_WIDTH, semconv.IMAGE_HEIGHT, semconv.IMAGE_SIZE)
    return {k: v for k, v in zip(keys, image, strict=True) if v is not None}


def warm(rows: Sequence[dict[str, object]]) -> list[Request]:
    return [r for r in find_requests(recording(rows).spans) if not r.cold]


def facts(rows: Sequence[dict[str, object]]) -> PreprocessFacts:
    return preprocess_facts(warm(rows))


def fixes(rows: Sequence[dict[str, object]]) -> list[str]:
    return advice_text.preprocess_fixes(facts(rows))


def cold_then(rows: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """A cold first request (left out of the warm facts), then ``rows``."""
    return [dict(rows[0]), *rows]


# --- Pillow's draft scale, checked against Pillow itself ------------------------------------------


def _jpeg(size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (90, 120, 200)).save(out, "JPEG")
    return out.getvalue()


@pytest.mark.parametrize(("size", "target", "scale"), [
    ((447, 447), (224, 224), 1),   # just under twice the target: Pillow cannot reduce
    ((448, 448), (224, 224), 2),   # twice: 1/2 (DRAFT_MIN_SCALE)
    ((1792, 1344), (224, 224), 4),  # 8x wide but 6x high: the smaller ratio decides
    ((4000, 3000), (224, 224), 8),  # 17x / 13x: libjpeg's smallest scale
    ((900, 300), (224, 224), 1),   # one side under 2x
    ((100, 80), (224, 224), 1),    # upscaling
])
def test_draft_scale_is_pillows_own_rule(size, target, scale) -> None:
    assert draft_scale(*size, *target) == scale
    image = Image.open(io.BytesIO(_jpeg(size)))
    image.draft("RGB", target)
    assert -(-size[0] // image.size[0]) == scale  # what Pillow really chose


def test_estimated_speedup_model() -> None:
    # (k * bytes + pixels) / (k * bytes + pixels / scale**2) with k = BYTE_COST_PIXELS = 4
    assert estimated_speedup(12_000_000, 3_000_000, 8) == pytest.approx(24e6 / 12.1875e6)
    assert estimated_speedup(12_000_000, 1_000_000, 2) == pytest.approx(16e6 / 7e6)
    assert estimated_speedup(12_000_000, 3_000_000, 1) == 1.0


# --- draft: thresholds and rules ------------------------------------------------------------------


def _draft_rows(**row: object) -> list[dict[str, object]]:
    return cold_then([dict(row) for _ in range(10)])


@pytest.mark.parametrize(("fmt", "drafts"), [
    ("JPEG", True), ("jpeg", True), ("image/jpeg", True), ("JPG", True), ("image/JPG", True),
    ("MPO", True), ("PNG", False), ("image/png", False), ("JPEG2000", False), ("xjpeg", False),
    ("image/pjpeg", True),
])
def test_a_jpeg_is_told_by_pillows_name_or_its_mime_type(fmt: str, drafts: bool) -> None:
    """A tester's input: ``image/jpeg`` or ``jpeg`` on 4032x3024 decodes gave no draft advice and
    asked for nothing."""
    assert draft_format(fmt) is drafts
    f = facts(_draft_rows(fmt=fmt))
    assert (f.draft is not None) is drafts and f.jpeg == (10 if drafts else 0)


def test_draft_min_scale_2() -> None:
    assert facts(_draft_rows(w=447, h=447, bytes=50_000)).draft is None
    d = facts(_draft_rows(w=448, h=448, bytes=50_000)).draft
    assert d is not None and d.scale == 2 and d.requests == 10


@pytest.mark.parametrize(("size_bytes", "worth"), [
    (700_000, False),  # 1000x1000 at 1/2: 1.244x, under DRAFT_MIN_SPEEDUP 1.25
    (670_000, True),   # 1.256x
])
def test_draft_min_speedup_1_25(size_bytes: int, worth: bool) -> None:
    rows = _draft_rows(w=1000, h=1000, bytes=size_bytes, target=(500, 500))
    d = facts(rows).draft
    assert d is not None and d.share == 1.0 and d.worth is worth
    assert any("draft mode" in a for a in fixes(rows)) is worth


@pytest.mark.parametrize(("png_ms", "worth"), [
    (4 * 40.0 / 0.19 - 4 * 40.0, False),  # the JPEGs are 19 % of decode time (DRAFT_MIN_SHARE 0.2)
    (4 * 40.0 / 0.21 - 4 * 40.0, True),   # 21 %
])
def test_draft_min_share_0_2(png_ms: float, worth: bool) -> None:
    rows = cold_then([*({"decode_ms": 40.0} for _ in range(4)),
                      *({"fmt": "PNG", "w": 640, "h": 480, "bytes": 200_000,
                         "decode_ms": png_ms / 6} for _ in range(6))])
    d = facts(rows).draft
    assert d is not None and d.requests == 4 and d.speedup > 1.5 and d.worth is worth


def test_draft_estimate_names_the_sizes_carrying_most_decode_time() -> None:
    rows = cold_then([*({"w": 1024, "h": 768, "bytes": 200_000, "decode_ms": 10.0}
                        for _ in range(8)),
                      *({"w": 4000, "h": 3000, "decode_ms": 300.0} for _ in range(3))])
    d = facts(rows).draft
    assert d is not None and (d.source, d.target, d.scale) == ("4000x3000", "224x224", 8)
    advice = advice_text.draft_advice(d)
    assert "draft=(224, 224)" in advice and "4000x3000 -> 224x224" in advice
    assert "otel-stages decode-bench IMAGE --size 224x224" in advice  # measures it on real files


def test_no_draft_advice_when_already_drafted_for_pngs_or_without_a_target() -> None:
    drafted = _draft_rows(draft=8)
    assert facts(drafted).draft is None and facts(drafted).drafted == 10
    assert not any("draft" in a for a in fixes(drafted))
    assert any("already on" in e for e in evidence_lines(facts(drafted)))

    png = _draft_rows(fmt="PNG")
    assert facts(png).draft is None and not any("draft" in a for a in fixes(png))

    untargeted = _draft_rows(target=None)
    assert facts(untargeted).draft is None
    # each says only what is missing
    assert advice_text.record_draft_facts([TARGET_MISSING]) in fixes(untargeted)
    assert not any("image.format" in a for a in fixes(untargeted))
    unknown_format = _draft_rows(fmt=None)
    assert advice_text.record_draft_facts([FORMAT_MISSING]) in fixes(unknown_format)
    assert not any("target_width" in a for a in fixes(unknown_format))
    both = cold_then([{"fmt": None}, *({"target": None} for _ in range(9))])
    assert advice_text.record_draft_facts([FORMAT_MISSING, TARGET_MISSING]) in fixes(both)
    assert not any("record image.format" in a for a in fixes(png))  # a known non-JPEG needs nothing


# --- repeated inputs ----------------------------------------------------------------------------


def _repeat_rows(share: float) -> list[dict[str, object]]:
    """9 distinct images decoded once, then one of them again: the repeat is ``share`` of decode."""
    distinct = [{"bytes": 1_000_000 + i, "decode_ms": 40.0} for i in range(9)]
    again = dict(distinct[0], decode_ms=share * 9 * 40.0 / (1 - share))
    return cold_then([*distinct, again])


@pytest.mark.parametrize(("share", "worth"), [(0.19, False), (0.21, True)])  # CACHE_MIN_SHARE 0.2
def test_cache_min_share_0_2(share: float, worth: bool) -> None:
    rep = facts(_repeat_rows(share)).repeats
    assert rep is not None and rep.requests == 1 and rep.share == pytest.approx(share)
    assert rep.worth is worth
    assert any(a.startswith("cache decoded images") for a in fixes(_repeat_rows(share))) is worth


def test_a_fixed_input_run_is_not_a_reason_to_cache() -> None:
    rows = _draft_rows()  # the same image every time: the method's fixed-input run
    rep = facts(rows).repeats
    assert rep is not None and rep.share == pytest.approx(0.9) and not rep.worth  # 9 of 10 repeat
    assert not any("cache" in a for a in fixes(rows))


def test_repeats_count_within_a_process_only() -> None:
    rows = [{"bytes": 1, "process": "a"}, {"bytes": 2, "process": "b"},
            {"bytes": 3, "process": "a"}, {"bytes": 3, "process": "b"}]
    assert facts(rows).repeats is None  # image 3 once in each process: nothing repeated


# --- threads and the event loop -----------------------------------------------------------------


def _thread_rows(threads: Sequence[str], loop: Sequence[bool] | None) -> list[dict[str, object]]:
    rows = []
    for i, name in enumerate(threads):
        row: dict[str, object] = {"thread": name}
        if loop is not None:
            row["loop"] = loop[i]
        rows.append(row)
    return cold_then(rows)


def test_pool_min_threads_2() -> None:
    one = _thread_rows(["MainThread"] * 6, [False] * 6)
    two = _thread_rows(["MainThread", "worker_0"] * 3, [False] * 6)
    assert facts(one).threads is not None and facts(one).threads.threads == 1  # type: ignore[union-attr]
    assert not any("thread pool" in a for a in fixes(one))
    assert any("ran on 2 threads" in a for a in fixes(two))
    assert any("ran on one thread (MainThread), never on an asyncio event loop" in e
               for e in evidence_lines(facts(one)))


def test_event_loop_advice_only_with_a_loop() -> None:
    none_on_loop = _thread_rows(["MainThread"] * 6, [False] * 6)
    one_on_loop = _thread_rows(["MainThread"] * 6, [False] * 5 + [True])
    assert advice_text.OFF_LOOP not in fixes(none_on_loop)
    assert advice_text.OFF_LOOP in fixes(one_on_loop)
    assert facts(one_on_loop).threads.on_loop == 2  # type: ignore[union-attr]  # decode + resize
    line = next(e for e in evidence_lines(facts(one_on_loop)) if "event loop" in e)
    assert "(MainThread) in 2 of 12 spans" in line
    # on the loop's thread a pool-sizing line would contradict "move it off the loop"
    several_on_loop = _thread_rows(["MainThread", "w0"] * 3, [True, False] * 3)
    assert advice_text.OFF_LOOP in fixes(several_on_loop)
    assert not any("thread pool sized" in a for a in fixes(several_on_loop))


def test_unknown_threads_ask_for_the_attributes_and_claim_nothing() -> None:
    rows = _thread_rows(["x"] * 3, None)
    no_names = cold_then([{} for _ in range(4)])
    assert advice_text.RECORD_THREADS in fixes(no_names)
    assert not any("event loop" in e for e in evidence_lines(facts(no_names)))
    # names known, loop not recorded: threads are counted, the loop is never claimed either way
    lines = evidence_lines(facts(rows))
    assert any("ran on one thread (x)" in e for e in lines)
    assert not any("event loop" in e for e in lines)


def test_decode_once_only_when_a_request_decoded_twice() -> None:
    assert advice_text.DECODE_ONCE not in fixes(_draft_rows())
    assert advice_text.DECODE_ONCE in fixes(cold_then([{}, {"decodes": 2}, {}]))


FIRST = (4000, 3000, 3_000_000)  # the first decode span's image in recording()


@pytest.mark.parametrize(("images", "twice", "several", "untold"), [
    ([FIRST], 1, 0, 0),                             # the same image decoded again
    ([(640, 480, 60_000)], 0, 1, 0),                # a second image
    ([(4000, 3000, 2_999_999)], 0, 1, 0),           # same pixels, other bytes: another image
    ([FIRST, (640, 480, 60_000)], 1, 1, 0),         # both
    ([(640, 480, None)], 0, 0, 1),                  # no bytes on the second span: cannot tell
    ([(None, None, None), (None, None, None)], 0, 0, 1),
    ([(640, 480, 60_000), (None, None, None)], 0, 1, 0),  # two images known already
])
def test_a_second_decode_span_is_a_repeat_or_another_image_by_its_sizes(images, twice, several,
                                                                         untold) -> None:
    rows = cold_then([{"images": images} for _ in range(3)])
    f = facts(rows)
    assert (f.decoded_twice, f.several_images, f.decodes_untold) == (3 * twice, 3 * several,
                                                                     3 * untold)
    lines, advice = evidence_lines(f), fixes(rows)
    assert (advice_text.DECODE_ONCE in advice) == bool(twice)
    assert any("decoded the same image more than once" in e for e in lines) == bool(twice)
    assert any("decoded several images" in e for e in lines) == bool(several)
    assert (advice_text.RECORD_DECODE_SIZES in advice) == bool(untold)
    assert any("cannot be told from several images" in e for e in lines) == bool(untold)


def test_requests_of_several_images_are_not_one_size_nor_decoded_twice() -> None:
    """Every request's first image is 4000x3000 (so the size figures see one size); each also
    decodes two other images, of sizes that differ between requests, and decode swings with
    them. The evidence must not say every request had the same image, nor that it was decoded
    twice; the advice neither blames contention for one size nor says to decode once."""
    rows = cold_then([{"decode_ms": 40.0 + 20.0 * (i % 5) + (300.0 if i % 7 == 0 else 0.0),
                       "images": [(640 + 64 * (i % 5), 480, 50_000 + i), (320, 240, 9_000 + i)]}
                      for i in range(24)])
    evidence, advice = _verdict_lines(rows)
    assert advice[0] == advice_text.SEVERAL_IMAGES
    assert advice_text.ONE_SIZE not in advice and advice_text.DECODE_ONCE not in advice
    assert not any("every request" in e or "more than once" in e for e in evidence), evidence
    assert any("24 warm requests decoded several images" in e for e in evidence), evidence


def test_sizes_missing_on_a_second_decode_span_is_not_one_size() -> None:
    """A tester's input: the second decode span of each request has no sizes. Its image may be
    any size, so "every request had the same image" (and "the swing is not the input") cannot be
    claimed; the advice asks for the sizes."""
    rows = cold_then([{"decode_ms": 40.0 + (300.0 if i % 7 == 0 else 0.0),
                       "images": [(None, None, None)]} for i in range(24)])
    evidence, advice = _verdict_lines(rows)
    assert advice_text.ONE_SIZE not in advice and advice[0] == advice_text.RECORD_DECODE_SIZES
    assert advice_text.SIZE_UNKNOWN not in advice  # width and height are there: not asked for
    assert advice.count(advice_text.RECORD_DECODE_SIZES) == 1
    assert not any("every request" in e for e in evidence), evidence


@pytest.mark.parametrize(("several", "follows", "lead"), [
    (2, False, True),    # 2 of 40 warm decodes: SEVERAL_IMAGES_MIN_SHARE
    (1, False, False),   # 1 of 40: the others' sizes say what to do
    (1, None, True),     # first images of one size: the other images are all that varies
    (40, True, False),   # cost follows the (first) image size: cap the inputs
    (0, None, False),
])
def test_the_several_images_advice_leads_from_a_share_or_one_first_size(several, follows,
                                                                         lead) -> None:
    assert SEVERAL_IMAGES_MIN_SHARE == 0.05
    facts_ = PreprocessFacts(decodes=40, several_images=several)
    assert advice_text.several_images_lead(facts_, follows) is lead
    first = advice_text.for_cause("preprocess", follows_size=follows, preprocess=facts_)[0]
    assert (first == advice_text.SEVERAL_IMAGES) is lead


def test_a_request_of_several_images_gives_no_draft_estimate_and_no_repeat() -> None:
    """A tester's input: a small JPEG first (the same two sizes again and again), then a large
    unique PNG: the request's decode time is mostly the PNG's, so neither "draft the JPEGs" nor
    "cache the repeated images" may be read from the first image's size and format."""
    rows = cold_then([{"w": 4000 + i % 2, "h": 3000, "bytes": 3_000_000, "decode_ms": 250.0,
                       "images": [(4000, 3000, 9_000_000 + i)]} for i in range(24)])
    f = facts(rows)
    assert f.several_images == 24 and f.jpeg == 24
    assert f.draft is None and f.repeats is None and not f.draft_missing
    one = facts(cold_then([{"w": 4000 + i % 2, "h": 3000, "bytes": 3_000_000, "decode_ms": 250.0}
                           for i in range(24)]))
    assert one.draft is not None and one.repeats is not None  # the same requests with one image


@pytest.mark.parametrize(("several", "size_lines"), [(2, False), (1, True)])  # of ~21 warm
def test_size_figures_of_first_images_are_left_out_when_requests_decode_several(
        several: int, size_lines: bool) -> None:
    """The second tester's input: cost follows the sum of a request's images, and "decode time
    does not follow image pixels" came from the first images alone. From
    SEVERAL_IMAGES_MIN_SHARE of the warm decodes with several images the size figures are left
    out; a stray one among many leaves them."""
    chosen = (8, 12)[:several]  # not the first of their input (those are set apart)
    rows = cold_then([{"w": 640 + 64 * (i % 4), "h": 480, "bytes": 50_000 + i,
                       "decode_ms": 40.0 + (600.0 if i in chosen else 0.0) + 5.0 * (i % 3),
                       "images": [(4000, 3000, 9_000_000 + i)] if i in chosen else []}
                      for i in range(24)])
    evidence, _ = _verdict_lines(rows)
    assert any("input sizes (decode)" in e for e in evidence) is size_lines, evidence
    assert any("follow image" in e for e in evidence) is size_lines


def test_one_image_per_request_of_one_size_is_still_one_size() -> None:
    rows = cold_then([{"decode_ms": 40.0 + (300.0 if i % 7 == 0 else 0.0)} for i in range(24)])
    evidence, advice = _verdict_lines(rows)
    assert advice[0] == advice_text.ONE_SIZE
    assert any("every request had the same 4000x3000 image" in e for e in evidence)


def test_without_per_request_data_the_advice_says_what_it_cannot_know() -> None:
    lines = advice_text.preprocess_fixes(None)
    assert lines == advice_text.NO_REQUEST_FACTS
    assert not any("off the" in a or "pool" in a for a in lines)  # no fix claimed without data


# --- through the diagnosis: evidence and advice agree -----------------------------------------------


def _verdict_lines(rows: Sequence[dict[str, object]]) -> tuple[list[str], list[str]]:
    v = diagnose(recording(rows)).verdict
    assert v.cause == "preprocess", v.evidence
    return v.evidence, v.advice


def test_the_preprocess_verdict_carries_the_facts_and_their_advice() -> None:
    # decode swings (a few 12 MP JPEGs among small ones) on two pool threads, none on a loop
    rows = cold_then([*({"w": 640, "h": 480, "bytes": 60_000 + i, "decode_ms": 8.0,
                         "thread": f"w{i % 2}", "loop": False} for i in range(20)),
                      *({"w": 4000, "h": 3000, "bytes": 3_000_000 + i, "decode_ms": 400.0,
                         "thread": f"w{i % 2}", "loop": False} for i in range(4))])
    evidence, advice = _verdict_lines(rows)
    assert advice[0] == advice_text.CAP_SIZE  # cost follows size
    assert any("draft mode" in a and "4000x3000 -> 224x224" in a for a in advice)
    assert any("ran on 2 threads" in a for a in advice)
    assert any("are JPEGs at least 2x the resize target" in e for e in evidence)
    assert any("decode/resize ran on 2 threads of one process" in e for e in evidence)
    assert advice_text.OFF_LOOP not in advice and advice_text.RECORD_THREADS not in advice
    assert not any("cache" in a for a in advice)  # every image distinct


def test_no_cap_advice_when_every_input_has_one_size() -> None:
    rows = cold_then([{"decode_ms": 20.0 + (300.0 if i % 7 == 0 else 0.0), "thread": "main",
                       "loop": True} for i in range(24)])
    evidence, advice = _verdict_lines(rows)
    assert advice[0] == advice_text.ONE_SIZE and advice_text.CAP_SIZE not in advice
    assert advice_text.OFF_LOOP in advice
    assert any("running asyncio event loop (main)" in e for e in evidence)


def test_evidence_and_advice_never_contradict_on_the_shared_cases() -> None:
    for path in sorted((ROOT / "tests" / "data").rglob("*.otlp.jsonl")):
        v = diagnose(load_paths([path])).verdict
        if v.cause != "preprocess":
            continue
        text = " ".join(v.evidence)
        if advice_text.OFF_LOOP in v.advice:
            assert "running asyncio event loop" in text, path
        if any("draft mode" in a for a in v.advice):
            assert "are JPEGs at least 2x" in text, path
        if any(a.startswith("cache decoded") for a in v.advice):
            assert "repeated an image" in text, path
        if any("every request had the same" in e for e in v.evidence):
            assert advice_text.CAP_SIZE not in v.advice, path


# --- the instrumentation records where decode / resize ran --------------------------------------------


def test_decode_and_resize_record_the_thread_and_the_event_loop(captured) -> None:
    data = _jpeg((64, 48))

    def work() -> None:
        imaging.resize(imaging.decode(data), (32, 24))

    async def on_loop() -> None:
        work()

    asyncio.run(on_loop())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pool") as pool:
        pool.submit(work).result()
    spans = [s for s in captured.spans if s.name in ("decode", "resize")]
    assert [(s.name, s.attributes[semconv.THREAD_NAME], s.attributes[semconv.EVENT_LOOP_RUNNING])
            for s in spans] == [("decode", "MainThread", True), ("resize", "MainThread", True),
                                ("decode", "pool_0", False), ("resize", "pool_0", False)]


def test_a_service_recorded_through_the_sdk_gives_these_facts(tmp_path: Path) -> None:
    """tests/scenario_service.py through the real SDK and file exporter, read back by the report:
    facts that do not depend on this machine's timing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "scenario_service.py"),
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = diagnose(load_paths([tmp_path]))
    assert report.request_sets is not None
    f = preprocess_facts(report.request_sets.warm)
    assert f.draft is not None and (f.draft.source, f.draft.target, f.draft.scale) == (
        "1600x1200", "224x224", 4)
    assert f.draft.requests == 26  # 22 sequential + 4 on the loop; the PNGs have no draft mode
    assert f.threads is not None and f.threads.threads == 4  # MainThread and 3 pool workers
    assert f.threads.on_loop == 8 and f.threads.loop_names == ("MainThread",)
    assert f.repeats is not None and f.repeats.images == 2 and f.repeats.worth
    assert [(a.reason, a.cohort) for a in report.set_apart] == [("new_input", "640x480 PNG")]


def test_draft_model_benchmark_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util
    import json

    path = ROOT / "benchmarks" / "draft_model.py"
    spec = importlib.util.spec_from_file_location("draft_model_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--smoke"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["byte_cost_pixels"] == 4.0 and out["rounds"] == 2
    assert {r["scale"] for r in out["rows"]} == {2, 4, 8}
    for r in out["rows"]:
        w, h = map(int, r["size"].split("x"))
        assert r["model"] == round(estimated_speedup(w * h, r["bytes"], r["scale"]), 2)
        assert r["imaging_measured"] > 0 and r["pillow_measured"] > 0


@pytest.mark.parametrize(("fmt", "read"), [
    ("image/jpeg; q=0.9", "JPEG"), (" JPEG ", "JPEG"), ("image/png; x=jpeg", "PNG"),
    ("; JPEG", None), ("true", None),
])
def test_a_formats_mime_parameters_and_blanks_are_left_out(fmt: str, read: str | None) -> None:
    # a MIME type with parameters was no format: no draft advice, only a request to record it
    from otel_stages.analysis.requests import usable_format

    assert usable_format(fmt) == read
    f = facts(_draft_rows(fmt=fmt))
    assert (f.draft is not None) is (read is not None and draft_format(read))
