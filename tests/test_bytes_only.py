"""One pixel size, the decode time following the encoded bytes (a tester's input: 1600x1200 JPEGs
of 300 kB beside PNGs of 3.5 MB decoding 6x slower): the evidence said "every request had the
same 1600x1200 image, so decode cost cannot follow size" and the advice "cost follows image size
... cap them". Now the evidence says the time follows what the bytes carry (format, compression)
and the advice is about the format; r pinned on both sides of ``FOLLOWS_SIZE_MIN_R``; the file
report and the ClickHouse report agree on an edited scenario."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_stages.analysis import advice
from otel_stages.analysis.advice import for_cause
from otel_stages.analysis.evidence import FOLLOWS_SIZE_MIN_R, sized_evidence
from tests.test_clickhouse_issues import MS, STABLE, Spans, edited, engine, named, reports, shift  # noqa: F401


@pytest.mark.parametrize(("r", "bytes_only"), [(0.7, True), (0.699, False), (-0.95, True)])
def test_one_pixel_size_and_time_following_bytes(r: float, bytes_only: bool) -> None:
    assert FOLLOWS_SIZE_MIN_R == 0.7
    ev = sized_evidence("decode", [("bytes", r)], [(1600, 1200, 89, 86.4)], 0, 89)
    assert ev.bytes_only is bytes_only
    assert any("had the same 1600x1200 pixels, so decode time follows what the encoded bytes"
               in line for line in ev.lines) is bytes_only
    # never both "cannot follow size" and "follows"
    assert any("cannot follow size" in line for line in ev.lines) is not bytes_only
    first = for_cause("preprocess", follows_size=ev.follows_size, one_size=ev.one_size,
                      bytes_only=ev.bytes_only)[0]
    assert first == (advice.BYTES_NOT_PIXELS if bytes_only else advice.ONE_SIZE)


def test_sizes_that_vary_still_cap_them() -> None:
    ev = sized_evidence("decode", [("pixels", 0.9), ("bytes", 0.9)],
                        [(640, 480, 40, 10.0), (4032, 3024, 40, 90.0)], 0, 80)
    assert not ev.bytes_only
    assert for_cause("preprocess", follows_size=ev.follows_size, bytes_only=ev.bytes_only)[0] == advice.CAP_SIZE


def test_some_sizes_unreadable_names_how_many_had_one() -> None:
    ev = sized_evidence("decode", [("bytes", 0.9)], [(1600, 1200, 80, 86.4)], 9, 89)
    assert ev.bytes_only
    assert any(line.startswith("every request with a readable size (80 of 89) had the same 1600x1200 pixels")
               for line in ev.lines), ev.lines


def _png_beside_jpeg(i: int, spans: Spans) -> None:
    """Every second request's image (same pixels) is 3.5 MB and decodes 80 ms longer."""
    if i % 2:
        decode = named(spans, "decode")
        for a in decode["attributes"]:
            if a["key"] == "image.size":
                a["value"] = {"intValue": "3500000"}
        end = int(decode["endTimeUnixNano"])
        decode["endTimeUnixNano"] = str(end + 80 * MS)
        for span in spans:
            if span is not decode and int(span["startTimeUnixNano"]) >= end:
                shift(span, 80 * MS)
        request = named(spans, "request")
        request["endTimeUnixNano"] = str(int(request["endTimeUnixNano"]) + 80 * MS)


def test_bytes_not_pixels_read_alike_in_both_reports(engine, tmp_path: Path) -> None:  # noqa: F811
    got, want = reports(engine, edited(STABLE, tmp_path / "png.jsonl", _png_beside_jpeg))
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    assert (v["cause"], v["stage"]) == ("preprocess", "decode"), v
    assert any("pixels, so decode time follows what the encoded bytes carry" in e for e in v["evidence"]), v
    assert not any("cannot follow size" in e for e in v["evidence"])
    assert v["advice"][0] == advice.BYTES_NOT_PIXELS


def test_other_images_are_no_one_pixel_size() -> None:
    # a request's size is its first image's: one size among them is not one input
    ev = sized_evidence("decode", [("bytes", 0.9)], [(1600, 1200, 89, 86.4)], 0, 100, other_images=1)
    assert not ev.bytes_only
    assert not any("pixels, so decode time" in line for line in ev.lines)
