"""A cold request's input includes every image it decoded, in both reports (a tester: 40 requests
of one 1024x768 JPEG; the first also decoded a 4032x3024 photo, 2 s of decode, and both reports
said "cold start (decode), 49.7x the warm requests with the same input" because a request's cohort
key is its first image's). A request of several decode spans meets only warm requests that decoded
the same images (:func:`otel_stages.analysis.cohorts.decoded_images`, ``images_sig`` in SQL): a
fixed multi-image input keeps its cold start, another input is "not comparable"."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from otel_stages import semconv
from otel_stages.analysis import Span, diagnose, load_paths
from otel_stages.analysis.cohorts import COMPARABLE_MIN_REQUESTS, UNKNOWN_IMAGE, decoded_images
from otel_stages.analysis.figures import ALL_WARM, SAME_INPUT
from otel_stages.analysis.requests import Request

BASE_NS = 1_790_000_000_000_000_000
MS = 10**6
FIRST = (1024, 768, 200_000)  # the first image of every request (its cohort key)
PHOTO = (4032, 3024, 9_000_000)  # a large second image
ICON = (64, 64, 3_000)  # a small second image: decodes in well under a millisecond
NOT_COMPARABLE = "not comparable (its input differs), so not called a cold start"

Image = tuple[int | None, int | None, int | None]


def _attr(key: str, value: object) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def _write(path: Path, requests: Sequence[Sequence[tuple[Image, float]]], *,
           cold_forward_ms: float = 0.0, grouped: bool = False, process: int = 1,
           append: bool = False, idle_before: int | None = None) -> Path:
    """One OTLP/JSON line per request, 1 s apart, seq 1.. (seq 1 is the cold one): its decode
    spans (``(image, ms)`` each: width, height, bytes, ``None`` not recorded) back to back, then
    resize 5 ms and forward 20 ms (``cold_forward_ms`` more in the first request). ``grouped``:
    the decode spans sit in a custom ``preprocess`` group span under the request. ``process``:
    its ``service.instance.id`` (``i1``, ...); ``append``: add to the file (another process).
    ``idle_before``: the requests from this index on start 60 s later (an idle gap)."""
    rng = random.Random(7)
    resource = {"attributes": [_attr("service.name", "svc"), _attr("service.instance.id", f"i{process}")]}
    lines = []
    for i, decodes in enumerate(requests):
        trace, rid = f"{process:08x}{i + 1:024x}", f"{i + 1:016x}"
        t0 = BASE_NS + i * 1000 * MS + (60_000 * MS if idle_before is not None and i >= idle_before else 0)
        t = t0 + MS // 10
        stages: list[tuple[str, float, list[dict[str, Any]]]] = [
            ("decode", ms, [*(_attr(key, v) for key, v in zip(
                (semconv.IMAGE_WIDTH, semconv.IMAGE_HEIGHT, semconv.IMAGE_SIZE), image) if v is not None),
                _attr(semconv.IMAGE_FORMAT, "JPEG")])
            for image, ms in decodes]
        stages += [("resize", 5 + rng.random() * 0.2, []),
                   ("forward", 20 + rng.random() * 0.2 + (cold_forward_ms if i == 0 else 0), [])]
        spans = []
        group = f"{i + 1:08x}{0xfff:08x}"
        if grouped:
            spans.append({"traceId": trace, "spanId": group, "parentSpanId": rid, "name": "preprocess",
                          "kind": 1, "startTimeUnixNano": str(t),
                          "endTimeUnixNano": str(t + int(sum(ms for _, ms in decodes) * MS) + 1000),
                          "attributes": [], "status": {}})
        for k, (name, ms, attrs) in enumerate(stages):
            parent = group if grouped and name == "decode" else rid
            spans.append({"traceId": trace, "spanId": f"{i + 1:08x}{k + 1:08x}", "parentSpanId": parent,
                          "name": name, "kind": 1, "startTimeUnixNano": str(t),
                          "endTimeUnixNano": str(t + int(ms * MS)), "attributes": attrs, "status": {}})
            t += int(ms * MS)
        end = t + MS // 10
        spans.insert(0, {"traceId": trace, "spanId": rid, "name": "request", "kind": 1,
                         "startTimeUnixNano": str(t0), "endTimeUnixNano": str(end),
                         "attributes": [_attr(semconv.REQUEST_SEQ, i + 1)], "status": {}})
        lines.append(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
            {"scope": {"name": "otel_stages"}, "spans": spans}]}]}))
    with path.open("a" if append else "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _decode_ms(rng: random.Random) -> float:
    return 10 + rng.random() * 2


def _run(n: int, cold: Sequence[tuple[Image, float]], warm: Sequence[Sequence[Image]]
         ) -> list[list[tuple[Image, float]]]:
    """``n`` requests: the cold one decodes ``cold``; warm request ``i`` decodes
    ``warm[i % len(warm)]``, the first image ~11 ms, further ones 0.5 ms."""
    rng = random.Random(3)
    out = [list(cold)]
    for i in range(1, n):
        images = warm[i % len(warm)]
        out.append([(image, _decode_ms(rng) if k == 0 else 0.5) for k, image in enumerate(images)])
    return out


def _file(path: Path) -> dict[str, Any]:
    return json.loads(json.dumps(diagnose(load_paths([path])).to_dict()))


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("chdb")
    from otel_stages.analysis.clickhouse import connect, parse_url
    with connect(parse_url(f"chdb:{tmp_path_factory.mktemp('chdb')}")) as eng:
        yield eng


def _both(engine: Any, path: Path) -> dict[str, Any]:
    """The file report, after checking the ClickHouse report gives the same cold figures and
    verdict."""
    from tests.test_clickhouse_issues import reports
    got, want = reports(engine, path)
    assert got["cold_start"] == want["cold_start"]
    assert got["verdict"] == want["verdict"]
    assert got["cohorts"] == want["cohorts"]  # a cohort's own verdict reads its cold inputs too
    return want


# --- the images of a request ----------------------------------------------------------------------


def _request(*images: Image) -> Request:
    spans = tuple(Span("t", f"d{k}", "r", "decode", k, k + 1, {key: v for key, v in zip(
        (semconv.IMAGE_WIDTH, semconv.IMAGE_HEIGHT, semconv.IMAGE_SIZE), image) if v is not None})
        for k, image in enumerate(images))
    return Request("t", "r", 0, 10.0, {"decode": 2.0}, spans=spans)


def test_decoded_images_are_a_multiset_of_the_decode_spans() -> None:
    assert decoded_images(_request(FIRST)) is None  # one decode span: its cohort key says it all
    assert decoded_images(_request()) is None
    assert decoded_images(_request(FIRST, PHOTO)) == decoded_images(_request(PHOTO, FIRST))
    assert decoded_images(_request(FIRST, FIRST)) == (FIRST[:2], FIRST[:2])  # one image twice
    assert decoded_images(_request(FIRST, FIRST)) != decoded_images(_request(FIRST, FIRST, FIRST))
    # a span without its width or height is one unknown image; the bytes do not matter (a third
    # tester: two uploads of one size never share bytes, and no multi-image cold start was called)
    assert decoded_images(_request(FIRST, (None, 3024, 9_000))) == (UNKNOWN_IMAGE, FIRST[:2])
    assert decoded_images(_request(FIRST, (4032, 3024, None))) == (FIRST[:2], (4032, 3024))
    assert decoded_images(_request(FIRST, PHOTO)) == decoded_images(
        _request((1024, 768, 1), (4032, 3024, 2)))


# --- both reports -------------------------------------------------------------------------------


@pytest.mark.parametrize("grouped", [False, True])
def test_a_cold_request_that_decoded_a_second_photo_is_no_cold_start(
        engine, tmp_path: Path, grouped: bool) -> None:
    """The tester's run: same first image, plus a 4032x3024 photo decoded for 1990 ms. Its input
    differs from every warm request's: not comparable, so not called a cold start (both said
    "cold_start (decode), 49.7x the median of the 39 warm requests with the same input"). The
    same with the decode spans inside a custom ``preprocess`` group."""
    cold = [(FIRST, 10.0), (PHOTO, 1990.0)]
    want = _both(engine, _write(tmp_path / "photo.jsonl", _run(40, cold, [[FIRST]]), grouped=grouped))
    assert want["verdict"]["cause"] != "cold_start"
    assert want["cold_start"]["compared_with"] == ALL_WARM
    assert any(NOT_COMPARABLE in line for line in want["verdict"]["evidence"])
    assert not any("warm decode up" in a or "at startup" in a for a in want["verdict"]["advice"])


@pytest.mark.parametrize("grouped", [False, True])
def test_a_fixed_two_image_input_keeps_its_cold_start(engine, tmp_path: Path, grouped: bool) -> None:
    """Every request sends the same two images (a fixed multi-image benchmark input); the first
    pays 2 s in forward: compared with the warm requests of the same two images, a cold start
    (also with the decode spans in a custom group)."""
    two = [FIRST, ICON]
    cold = [(FIRST, 11.0), (ICON, 0.5)]
    want = _both(engine, _write(tmp_path / "fixed_two.jsonl", _run(40, cold, [two]),
                                cold_forward_ms=2000, grouped=grouped))
    assert want["verdict"]["cause"] == "cold_start"
    assert want["verdict"]["tentative"] is False
    assert want["cold_start"]["compared_with"] == SAME_INPUT
    assert want["cold_start"]["ratio"] > 40


def test_two_photos_of_one_size_with_other_bytes_keep_the_cold_start(engine, tmp_path: Path) -> None:
    """A third tester's: every request sends two 1024x768 photos, each upload with its own bytes,
    and the first pays 2 s in forward: keyed by bytes, no warm request shared the cold one's
    images and the verdict was "stable"; by pixels it is the cold start."""
    rng = random.Random(11)
    runs = [[((1024, 768, rng.randrange(150_000, 250_000)), 11.0 if k == 0 else 0.5) for k in range(2)]
            for _ in range(40)]
    want = _both(engine, _write(tmp_path / "uploads.jsonl", runs, cold_forward_ms=2000))
    assert want["verdict"]["cause"] == "cold_start", want["verdict"]
    assert want["cold_start"]["compared_with"] == SAME_INPUT


def test_a_one_image_cold_request_among_two_image_warm_ones_is_not_comparable(
        engine, tmp_path: Path) -> None:
    """Warm requests decode two images; the slow cold one only the first: another input."""
    cold = [(FIRST, 2000.0)]
    want = _both(engine, _write(tmp_path / "one_among_two.jsonl", _run(40, cold, [[FIRST, ICON]])))
    assert want["verdict"]["cause"] != "cold_start"
    assert want["cold_start"]["compared_with"] == ALL_WARM
    assert any(NOT_COMPARABLE in line for line in want["verdict"]["evidence"])


@pytest.mark.parametrize(("peers", "claimed"), [(4, False), (5, True)])
def test_a_two_image_cold_request_needs_enough_warm_requests_of_its_images(
        engine, tmp_path: Path, peers: int, claimed: bool) -> None:
    """COMPARABLE_MIN_REQUESTS (5) warm requests with the cold request's two images: compared
    with them, a cold start; 4: not comparable (the other 35 decoded the first image only)."""
    assert COMPARABLE_MIN_REQUESTS == 5
    cold = [(FIRST, 11.0), (ICON, 0.5)]
    runs = _run(40, cold, [[FIRST]])
    rng = random.Random(5)
    for i in range(1, peers + 1):  # these warm requests decode the same two images
        runs[i * 7] = [(FIRST, _decode_ms(rng)), (ICON, 0.5)]
    want = _both(engine, _write(tmp_path / f"peers_{peers}.jsonl", runs, cold_forward_ms=2000))
    assert (want["verdict"]["cause"] == "cold_start") is claimed
    assert want["cold_start"]["compared_with"] == (SAME_INPUT if claimed else ALL_WARM)
    assert any(NOT_COMPARABLE in line for line in want["verdict"]["evidence"]) is not claimed
    if claimed:
        assert want["cold_start"]["comparable_requests"] == peers


def test_a_decode_span_without_sizes_counts_as_one_unknown_image(engine, tmp_path: Path) -> None:
    """Warm requests decode their image and one more without sizes; the cold one two more without
    sizes: three images against two, not comparable (the unknown images hash alike, so the SQL
    tells them apart by their count)."""
    unsized: Image = (None, None, None)
    cold = [(FIRST, 11.0), (unsized, 0.5), (unsized, 0.5)]
    runs = _run(40, cold, [[FIRST, unsized]])
    want = _both(engine, _write(tmp_path / "unsized.jsonl", runs, cold_forward_ms=2000))
    assert want["verdict"]["cause"] != "cold_start"
    assert any(NOT_COMPARABLE in line for line in want["verdict"]["evidence"])
    # the same two images as the warm ones: a cold start
    runs[0] = [(FIRST, 11.0), (unsized, 0.5)]
    want = _both(engine, _write(tmp_path / "unsized_same.jsonl", runs, cold_forward_ms=2000))
    assert want["verdict"]["cause"] == "cold_start"
    assert want["cold_start"]["compared_with"] == SAME_INPUT


@pytest.mark.parametrize("grouped", [False, True])
def test_another_second_image_is_another_input(engine, tmp_path: Path, grouped: bool) -> None:
    """Every request decodes two images, the warm ones a 64x64 icon second, the cold one a
    4032x3024 photo: as many decode spans, other images, so not comparable (also with the decode
    spans in a custom group, whose images the SQL reads apart)."""
    cold = [(FIRST, 11.0), (PHOTO, 1990.0)]
    runs = _run(40, cold, [[FIRST, ICON]])
    want = _both(engine, _write(tmp_path / "other_second.jsonl", runs, grouped=grouped))
    assert want["verdict"]["cause"] != "cold_start"
    assert want["cold_start"]["compared_with"] == ALL_WARM
    assert any(NOT_COMPARABLE in line for line in want["verdict"]["evidence"])


def test_each_cold_input_needs_its_own_warm_requests(engine, tmp_path: Path) -> None:
    """Two processes whose cold requests decoded two images each, other second images: one input
    has COMPARABLE_MIN_REQUESTS (5) warm requests, the other 4; the first is compared with its
    own, the second left out (not every cold request compared with all warm requests)."""
    path = tmp_path / "two_processes.jsonl"
    rng = random.Random(9)
    for process, (second, peers) in enumerate([(ICON, 5), (PHOTO, 4)], start=1):
        runs = _run(30, [(FIRST, 11.0), (second, 0.5)], [[FIRST]])
        for i in range(1, peers + 1):
            runs[i * 5] = [(FIRST, _decode_ms(rng)), (second, 0.5)]
        _write(path, runs, cold_forward_ms=2000, process=process, append=process > 1)
    want = _both(engine, path)
    assert want["cold_start"]["compared_with"] == SAME_INPUT
    assert (want["cold_start"]["count"], want["cold_start"]["left_out"]) == (1, 1)
    assert want["cold_start"]["comparable_requests"] == 5


@pytest.mark.parametrize(("second", "apart"), [(PHOTO, False), (ICON, True)])
def test_a_request_after_an_idle_gap_is_compared_with_its_images(
        engine, tmp_path: Path, second: Image, apart: bool) -> None:
    """After 60 s idle, a request decodes its image and a second one for 2 s. Six warm requests
    decoded the 64x64 icon second, the rest one image: with the photo second no warm request had
    its input, so it is a warm request (not set apart as cold after the idle gap); with the icon
    second it is compared with those six and set apart."""
    runs = _run(40, [(FIRST, 11.0)], [[FIRST]])
    rng = random.Random(11)
    for i in range(1, 7):
        runs[i * 3] = [(FIRST, _decode_ms(rng)), (ICON, 0.5)]
    runs[30] = [(FIRST, 11.0), (second, 2000.0)]
    from tests.test_clickhouse_issues import reports
    got, want = reports(engine, _write(tmp_path / "idle.jsonl", runs, idle_before=30))
    assert (got["set_apart"], got["counts"], got["verdict"]) == (
        want["set_apart"], want["counts"], want["verdict"])
    assert bool(want["set_apart"]) is apart
    assert want["counts"]["warm"] == (38 if apart else 39)
