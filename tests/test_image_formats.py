"""One name per image format (:mod:`otel_stages.analysis.image_formats`): ``image.format`` spelled
two ways for one format split one input into two cohorts. A tester's two replicas side by side on
identical 1024x768 JPEGs, one writing ``JPEG`` and the other ``image/jpeg``, the second on a GPU
twice as slow: the report said "the input mix explains 99% (1024x768 JPEG ... 1024x768
image/jpeg): compare like with like", "each input is steady", "cap the costliest inputs", where the
swing was between the replicas. Both reports (files, and the SQL on real chDB) now read one name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import chdb
import pytest
from PIL import Image

from otel_stages.analysis.clickhouse_sql import format_text
from otel_stages.analysis.image_formats import EXTRA_ALIASES, canonical_format, format_aliases
from otel_stages.analysis.requests import NO_FORMAT, usable_format
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports  # noqa: F401  (engine: a fixture)

#: Spellings a service writes for common formats -> Pillow's name.
SPELLINGS = {
    "JPEG": "JPEG", "jpeg": "JPEG", "Jpeg": "JPEG", "jpg": "JPEG", "JPG": "JPEG", "jfif": "JPEG",
    "image/jpeg": "JPEG", "IMAGE/JPEG": "JPEG", "image/jpg": "JPEG", "image/pjpeg": "JPEG",
    "image/png": "PNG", "image/x-png": "PNG", "png": "PNG", "apng": "PNG",
    "image/webp": "WEBP", "image/gif": "GIF", "image/bmp": "BMP", "image/x-ms-bmp": "BMP",
    "image/tiff": "TIFF", "image/tif": "TIFF", "tif": "TIFF", "image/heic": "HEIF",
    "image/heif": "HEIF", "heic": "HEIF", "image/avif": "AVIF", "image/x-icon": "ICO",
    "image/vnd.microsoft.icon": "ICO", "MPO": "JPEG", "image/mpo": "JPEG", "image/jp2": "JPEG2000", "jpeg2000": "JPEG2000",
    "application/pdf": "PDF",
    # unknown to Pillow: itself, a MIME type in lower case, a name in upper case
    "image/svg+xml": "image/svg+xml", "Image/SVG+XML": "image/svg+xml", "jxl": "JXL",
}


@pytest.mark.parametrize("spelling, name", SPELLINGS.items())
def test_each_spelling_reads_as_pillows_name(spelling: str, name: str) -> None:
    assert canonical_format(spelling) == name
    assert usable_format(f" {spelling}; q=0.9 ") == name  # parameters and blanks left out first


def test_the_names_come_from_pillows_own_tables() -> None:
    # every MIME type and extension Pillow registers reads as a format Pillow gives it, and a
    # format name as itself: the table is Pillow's, not a hand list
    Image.init()
    names = {*Image.ID, *Image.MIME}
    for name in names - {"MPO"}:  # SAME_CODING: a camera's JPEG with extra frames is a JPEG
        assert canonical_format(name.lower()) == name
    for mime in set(Image.MIME.values()) - {"image/mpo"}:
        assert Image.MIME[canonical_format(mime)] == mime, mime  # BMP / DIB share image/bmp
    for ext, name in Image.registered_extensions().items():
        if ext.lstrip(".").upper() not in names:  # .mpeg is MPEG's own name
            assert canonical_format(ext.lstrip(".")) == name, ext
            assert canonical_format(f"image/{ext.lstrip('.')}") == name, ext
    assert canonical_format("image/bmp") == "BMP"  # the format the type names, not DIB
    # the hand list holds only what Pillow registers nowhere
    assert not set(EXTRA_ALIASES) & {m.lower() for m in Image.MIME.values()} - {"image/avif"}


def test_the_librarys_placeholder_for_no_format_is_none() -> None:
    # imaging.decode writes "unknown" when Pillow names no format: as if none were recorded
    assert NO_FORMAT == "UNKNOWN"
    assert usable_format("unknown") is None and usable_format("UNKNOWN") is None
    assert usable_format("image/unknown") == "image/unknown"


#: What the SQL is given: every spelling above, and text that is no format.
TEXTS = [*SPELLINGS, " image/jpeg; q=0.9", "image/jpeg\n", "\tPNG\r\n", "unknown", "Unknown", "true", "3", "", "a b", "é"]


def test_the_sql_reads_each_spelling_as_the_file_report_does() -> None:
    query = "SELECT " + ", ".join(format_text(f"'{t}'") for t in TEXTS) + " FORMAT TSV"
    engine_reads = str(chdb.query(query)).strip("\n").split("\t")
    assert engine_reads == [usable_format(t) or "" for t in TEXTS]
    assert engine_reads[:len(SPELLINGS)] == list(SPELLINGS.values())


def test_the_table_is_read_once() -> None:
    assert format_aliases() is format_aliases()


def _replicas(tmp_path: Path, formats: tuple[str, str], forward_ms: tuple[float, float]) -> Path:
    """Two instances of one service side by side (``node-a``, ``node-b``), 30 requests each, every
    decode a 1024x768 image of 120 kB whose ``image.format`` is ``formats[i]``, the forward
    ``forward_ms[i]`` +- 2 ms."""
    lines: list[str] = []
    for i, (node, fmt, forward) in enumerate(zip(("node-a", "node-b"), formats, forward_ms)):
        def stages(_: int, r: Any, forward: float = forward) -> list[tuple[str, float]]:
            return [("download", 5.0 + r.random()), ("decode", 12.0 + r.random()),
                    ("resize", 3.0), ("queue", 1.0 + r.random()),
                    ("forward", forward + 4 * r.random() - 2)]
        rows = odd_inputs.run(30, stages, seed=i + 1)
        for spans in rows:
            decode = next(s for s in spans if s["name"] == "decode")
            decode["attributes"] += [
                {"key": "image.width", "value": {"intValue": "1024"}},
                {"key": "image.height", "value": {"intValue": "768"}},
                {"key": "image.size", "value": {"intValue": "120000"}},
                {"key": "image.format", "value": {"stringValue": fmt}}]
        path = odd_inputs.write(tmp_path / f"{node}.jsonl", rows)
        lines += path.read_text().replace('"i1"', f'"{node}"').splitlines()
    merged = tmp_path / "replicas.jsonl"
    merged.write_text("\n".join(lines) + "\n")
    return merged


def _keys(report: dict[str, Any]) -> list[str]:
    return [c["key"] for c in report["cohorts"]]


@pytest.mark.parametrize("formats", [("JPEG", "JPEG"), ("JPEG", "image/jpeg"),
                                     ("jpg", "image/pjpeg; q=0.9")])
def test_one_format_spelled_two_ways_is_one_input(engine, tmp_path: Path,  # noqa: F811
                                                  formats: tuple[str, str]) -> None:
    # the tester's recording: replica b (forward 120 ms, the slower) against replica a (60 ms), identical
    # inputs; the swing lies between the replicas whatever each wrote for the format
    got, want = reports(engine, _replicas(tmp_path, formats, (60.0, 120.0)))
    assert _keys(want) == ["1024x768"] and _keys(got) == _keys(want)
    evidence, advice = want["verdict"]["evidence"], want["verdict"]["advice"]
    assert evidence[0].startswith("the process explains"), evidence[0]
    assert advice[0].startswith("compare service.name=svc,service.instance.id=node-b with"), advice
    assert not any("input mix" in e or "each input is steady" in e for e in evidence), evidence
    assert not any("costliest inputs" in a for a in advice), advice
    assert got["verdict"] == want["verdict"]


def test_two_formats_stay_two_inputs_named_as_pillow_names_them(engine, tmp_path: Path  # noqa: F811
                                                                ) -> None:
    # the same replicas on JPEGs and PNGs (image/png): two inputs, named JPEG and PNG, the input
    # mix (which is the replicas here too) said first, in both reports
    got, want = reports(engine, _replicas(tmp_path, ("JPEG", "image/png"), (60.0, 120.0)))
    assert sorted(_keys(want)) == ["1024x768 JPEG", "1024x768 PNG"]
    assert sorted(_keys(got)) == sorted(_keys(want))
    assert want["verdict"]["evidence"][0].startswith("the input mix explains")
    assert "1024x768 PNG" in want["verdict"]["evidence"][0]
    assert not any("image/png" in e for e in want["verdict"]["evidence"])
    assert got["verdict"] == want["verdict"]

