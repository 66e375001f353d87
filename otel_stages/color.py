"""Pixels to 8-bit sRGB: Pillow mode conversion and ICC colour profiles (Pillow ``ImageCms``).

:func:`to_srgb` is what :func:`otel_stages.imaging.decode` runs on every image:

* an embedded ICC profile that describes sRGB needs nothing (the tag is dropped: sRGB is what
  untagged pixels mean);
* any other usable profile (Display P3, Adobe RGB, a CMYK press profile, a grey profile) is
  applied with LittleCMS (perceptual intent) so the pixels become sRGB; the transform is built
  once per profile and mode and cached;
* a profile that cannot be applied (corrupt, or made for another colour space than the pixels')
  is dropped, and the pixels are converted without it;

in every case the returned image carries no ``icc_profile``: whatever it had described the
*source* pixels, and carrying it on converted RGB pixels would mislead every later reader (it
survives re-saving). The caller learns what happened from :class:`ColorInfo`.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass

from PIL import Image, ImageCms

from otel_stages import semconv

_SRGB = ImageCms.createProfile("sRGB")
_CACHED_TRANSFORMS = 32
#: Modes a profile can be applied to directly, and the mode LittleCMS writes for them.
_CMS_MODES = {"RGB": "RGB", "RGBA": "RGBA", "CMYK": "RGB", "L": "RGB", "LA": "RGBA"}


@dataclass(frozen=True)
class ColorInfo:
    """What :func:`to_srgb` did: ``profile`` is the embedded profile's description (``None``
    when there was none, ``"unreadable"`` when it could not be parsed); ``action`` one of
    ``semconv.ICC_CONVERTED`` / ``ICC_SRGB`` / ``ICC_DROPPED`` (``None`` without a profile)."""

    profile: str | None = None
    action: str | None = None


@functools.lru_cache(maxsize=_CACHED_TRANSFORMS)
def _transform(icc: bytes, in_mode: str, out_mode: str) -> ImageCms.ImageCmsTransform:
    source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
    return ImageCms.buildTransform(source, _SRGB, in_mode, out_mode,
                                   renderingIntent=ImageCms.Intent.PERCEPTUAL)


#: The ICC colour space a profile must describe for each mode (its header's data colour space).
_SPACE_OF_MODE = {"RGB": "RGB", "RGBA": "RGB", "P": "RGB", "CMYK": "CMYK", "L": "GRAY", "LA": "GRAY"}


@functools.lru_cache(maxsize=_CACHED_TRANSFORMS)
def _describe(icc: bytes) -> tuple[str, str]:
    """(description, data colour space such as ``RGB`` / ``CMYK`` / ``GRAY``) of a profile."""
    profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
    return (ImageCms.getProfileDescription(profile).strip(),
            str(profile.profile.xcolor_space).strip())


def to_srgb(image: Image.Image) -> tuple[Image.Image, ColorInfo]:
    """``image`` as 8-bit RGB sRGB pixels without an ``icc_profile``, and what was done about
    its profile (see the module docstring). Raises what Pillow raises for broken pixel data."""
    icc = image.info.get("icc_profile")
    if not icc:
        return _untagged(to_rgb(image)), ColorInfo()
    try:
        description, space = _describe(bytes(icc))
    except (ImageCms.PyCMSError, OSError, ValueError):
        return _untagged(to_rgb(image)), ColorInfo("unreadable", semconv.ICC_DROPPED)
    description = description or "unnamed"
    if space != _SPACE_OF_MODE.get(image.mode):  # e.g. an RGB profile on CMYK pixels
        return _untagged(to_rgb(_untagged(image))), ColorInfo(description, semconv.ICC_DROPPED)
    if space == "RGB" and "srgb" in description.lower():
        return _untagged(to_rgb(image)), ColorInfo(description, semconv.ICC_SRGB)
    source = image
    if source.mode == "P":
        source = source.convert("RGBA" if "transparency" in source.info else "RGB")
    out_mode = _CMS_MODES.get(source.mode)
    if out_mode is not None:
        try:
            converted = _transform(bytes(icc), source.mode, out_mode).apply(source)
        except (ImageCms.PyCMSError, OSError, ValueError):
            pass  # e.g. a CMYK profile on RGB pixels: it cannot describe them
        else:
            return _untagged(to_rgb(_untagged(converted))), ColorInfo(description, semconv.ICC_CONVERTED)
    return _untagged(to_rgb(_untagged(image))), ColorInfo(description, semconv.ICC_DROPPED)


def _untagged(image: Image.Image) -> Image.Image:
    image.info.pop("icc_profile", None)
    return image


def _max_sample(image: Image.Image) -> float:
    extrema = image.getextrema()  # one band: (min, max)
    return float(extrema[1])  # type: ignore[arg-type]


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB without wrecking tones (no colour management: see
    :func:`to_srgb`).

    Transparency (RGBA, LA, palette with a transparent index) is composited over white; 16-bit
    and 32-bit greyscale are scaled to 8 bits (a plain ``convert`` would clip them to white).
    """
    mode = image.mode
    if mode == "RGB":
        return image
    if mode.startswith("I") or mode == "F":
        wide = image.convert("F")
        if mode.startswith("I;16"):
            scale = 1 / 256  # 16-bit samples keep their top 8 bits, whatever the content
        elif mode == "I":
            # 32-bit container of unknown depth (old Pillow opened 16-bit PNGs as "I"): assume
            # 16-bit when any sample needs it, else 8-bit.
            scale = 1 / 256 if _max_sample(wide) > 255 else 1.0
        else:
            scale = 255.0 if _max_sample(wide) <= 1.0 else 1.0  # float images in 0..1
        return wide.point(lambda v: v * scale).convert("L").convert("RGB")
    if mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
