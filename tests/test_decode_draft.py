"""imaging.decode(draft=...) (Pillow JPEG draft decoding, the demo's --decode-draft knob) on real
images: the pixels come out smaller but never below the target, the span still records the
input's size as displayed, and other formats decode in full."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_stages import imaging, semconv
from otel_stages.cli import build_parser

IMAGES = Path(__file__).parent / "data" / "images"
EXPECT = json.loads((IMAGES / "expect.json").read_text())
TARGET = (224, 224)


@pytest.mark.parametrize("name", ["photo_4032x3024.jpg", "photo_1920x1080.jpg",
                                  "exif_rotated_640x480.jpg", "cmyk_640x480.jpg"])
def test_draft_decodes_jpegs_smaller_but_records_the_input_size(name, captured):
    data = (IMAGES / name).read_bytes()
    full = imaging.decode(data)
    drafted = imaging.decode(data, draft=TARGET)
    width, height = EXPECT[name]["wh"]
    assert full.size == (width, height)
    assert drafted.mode == "RGB"
    assert min(drafted.size) >= min(TARGET)  # never below what the resize needs
    if min(width, height) >= 2 * min(TARGET):
        assert drafted.width < width and drafted.height < height  # really decoded smaller
    # as displayed: EXIF orientation applies to the drafted pixels too
    assert (drafted.width >= drafted.height) == (width >= height)
    spans = captured.by_name("decode")
    assert [(s.attributes[semconv.IMAGE_WIDTH], s.attributes[semconv.IMAGE_HEIGHT])
            for s in spans] == [(width, height)] * 2


def test_draft_leaves_other_formats_alone(captured):
    data = (IMAGES / "rgba_800x600.png").read_bytes()
    assert imaging.decode(data, draft=TARGET).size == (800, 600)


def test_demo_has_the_decode_draft_knob():
    args = build_parser().parse_args(["demo", "--decode-draft"])
    assert args.decode_draft is True
    assert build_parser().parse_args(["demo"]).decode_draft is False
