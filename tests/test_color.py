"""decode(): ICC colour profiles (converted to sRGB, or dropped, never carried on RGB pixels) and
animated inputs (frame count and frame used), through Pillow with real encoded files."""

from __future__ import annotations

import io

import pytest
from PIL import Image, ImageCms

from otel_stages import imaging, semconv
from tests.iccprofile import rgb_profile

SRGB_ICC = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


def _encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def _resaved_profile(image: Image.Image) -> bytes | None:
    return Image.open(io.BytesIO(_encode(image, "PNG"))).info.get("icc_profile")


@pytest.mark.parametrize("icc", [b"\x00garbage, not a profile" * 8, SRGB_ICC],
                         ids=["corrupt", "rgb-profile-on-cmyk"])
def test_cmyk_with_an_unusable_profile_drops_it(icc, captured):
    data = _encode(Image.new("CMYK", (32, 16), (0, 200, 200, 0)), "JPEG", icc_profile=icc)
    assert Image.open(io.BytesIO(data)).info["icc_profile"] == icc  # the input really carries it
    out = imaging.decode(data)
    assert out.mode == "RGB" and "icc_profile" not in out.info
    assert _resaved_profile(out) is None  # re-saving cannot resurrect it
    r, g, b = out.getpixel((5, 5))
    assert r > 200 and g < 90 and b < 90  # still the red the CMYK values describe
    span = captured.one("decode")
    assert span.attributes[semconv.IMAGE_ICC_PROFILE_ACTION] == semconv.ICC_DROPPED
    assert span.attributes[semconv.IMAGE_MODE] == "CMYK"


def test_wide_gamut_rgb_is_converted_to_srgb(captured):
    p3 = rgb_profile("Test Display P3")
    data = _encode(Image.new("RGB", (16, 16), (128, 0, 0)), "PNG", icc_profile=p3)
    out = imaging.decode(data)
    # P3 red at 128 (gamma 2.2, linear 0.22) is 1.22x more red in sRGB's primaries: about 142
    r, g, b = out.getpixel((3, 3))
    assert 138 <= r <= 146 and g <= 2 and b <= 2
    assert "icc_profile" not in out.info
    span = captured.one("decode")
    assert span.attributes[semconv.IMAGE_ICC_PROFILE] == "Test Display P3"
    assert span.attributes[semconv.IMAGE_ICC_PROFILE_ACTION] == semconv.ICC_CONVERTED


def test_srgb_tagged_pixels_are_left_alone(captured):
    data = _encode(Image.new("RGB", (8, 8), (128, 10, 200)), "PNG", icc_profile=SRGB_ICC)
    out = imaging.decode(data)
    assert out.getpixel((1, 1)) == (128, 10, 200)
    assert captured.one("decode").attributes[semconv.IMAGE_ICC_PROFILE_ACTION] == semconv.ICC_SRGB


def test_untagged_image_records_no_profile(captured):
    imaging.decode(_encode(Image.new("RGB", (8, 8)), "PNG"))
    attrs = captured.one("decode").attributes
    assert semconv.IMAGE_ICC_PROFILE not in attrs and semconv.IMAGE_FRAMES not in attrs


def test_wide_gamut_rgba_is_converted_and_composited(captured):
    p3 = rgb_profile("Test Display P3")
    data = _encode(Image.new("RGBA", (8, 8), (128, 0, 0, 255)), "PNG", icc_profile=p3)
    out = imaging.decode(data)
    assert out.mode == "RGB" and 138 <= out.getpixel((0, 0))[0] <= 146
    assert captured.one("decode").attributes[semconv.IMAGE_ICC_PROFILE_ACTION] == semconv.ICC_CONVERTED


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "PNG"])
def test_animated_images_record_frame_count_and_decode_the_first(fmt, captured):
    frames = [Image.new("RGB", (20, 10), colour) for colour in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    data = _encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)
    out = imaging.decode(data)
    assert out.size == (20, 10)
    r, g, b = out.getpixel((5, 5))
    assert r > 200 and g < 60 and b < 60  # frame 0 (red), not a later one
    attrs = captured.one("decode").attributes
    assert attrs[semconv.IMAGE_FRAMES] == 3
    assert attrs[semconv.IMAGE_FRAME_INDEX] == 0


def test_single_frame_gif_is_not_reported_as_animated(captured):
    imaging.decode(_encode(Image.new("RGB", (8, 8), (1, 2, 3)), "GIF"))
    assert semconv.IMAGE_FRAMES not in captured.one("decode").attributes
