"""Instrumented image helpers: ``download`` -> ``decode`` -> ``resize``, each in its stage span.

* :func:`download` fetches bytes with httpx (timeout, size cap) and records ``image.size``,
  ``url.full`` and ``http.response.status_code``.
* :func:`decode` forces Pillow's real decode *inside* the span (``Image.open`` is lazy), applies
  EXIF orientation, converts odd modes (CMYK, palette with transparency, 16-bit, alpha) to RGB
  correctly and records ``image.width`` / ``image.height`` (after orientation), ``image.size``,
  ``image.format`` and ``image.mode`` (the source mode).
* :func:`resize` records ``image.target_width`` / ``image.target_height``.

Every failure is an :class:`ImageError` (a ``ValueError``) with a precise message; it fails only
its own request and is recorded on the stage span (status ERROR, exception event).
"""

from __future__ import annotations

import io

import httpx
from PIL import Image, ImageCms, ImageOps, UnidentifiedImageError

from otel_stages import semconv
from otel_stages.stages import stage

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_BYTES = 50 * 2**20  # 50 MiB: well above a 12 MP JPEG, far below memory trouble

_TEXT_PREFIXES = (b"<!doctype", b"<html", b"<?xml", b"{", b"[")


class ImageError(ValueError):
    """An image could not be fetched or decoded; the message says what and why."""


class DownloadError(ImageError):
    """Fetching the image failed: HTTP error status, timeout, connection error or size cap."""


class ImageDecodeError(ImageError):
    """The bytes are not a decodable image (empty, truncated, not an image, decompression bomb)."""


def download(url: str, *, client: httpx.Client | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
             max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """GET ``url`` inside a ``download`` span and return the body bytes.

    ``timeout_s`` applies to connect and to each read; ``max_bytes`` caps the body (checked
    against ``Content-Length`` first, then while streaming). Pass a shared ``client`` to reuse
    connections. Raises :class:`DownloadError` on a non-2xx status, timeout, transport error or
    when the body exceeds ``max_bytes``.
    """
    with stage(semconv.STAGE_DOWNLOAD, **{semconv.URL_FULL: url}) as span:
        own = client is None
        http = client or httpx.Client(timeout=timeout_s, follow_redirects=True)
        try:
            with http.stream("GET", url, timeout=timeout_s) as response:
                span.set_attribute(semconv.HTTP_RESPONSE_STATUS_CODE, response.status_code)
                if response.status_code >= 400:
                    raise DownloadError(f"GET {url}: HTTP {response.status_code} {response.reason_phrase}")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                    raise DownloadError(f"GET {url}: Content-Length {declared} bytes exceeds "
                                        f"max_bytes={max_bytes}")
                chunks, total = [], 0
                for chunk in response.iter_bytes():
                    total += len(chunk)
                    if total > max_bytes:
                        raise DownloadError(f"GET {url}: body exceeds max_bytes={max_bytes}")
                    chunks.append(chunk)
        except httpx.TimeoutException as exc:
            raise DownloadError(f"GET {url}: timed out after {timeout_s} s ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise DownloadError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
        finally:
            if own:
                http.close()
        data = b"".join(chunks)
        span.set_attribute(semconv.IMAGE_SIZE, len(data))
        return data


def decode(data: bytes) -> Image.Image:
    """Decode encoded image bytes into a fully loaded RGB :class:`PIL.Image.Image`.

    Inside a ``decode`` span. Applies EXIF orientation (so width/height are as displayed).
    Keeps Pillow's decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``; ``None`` disables).
    Raises :class:`ImageDecodeError` for empty input, non-image bytes (e.g. an HTML error page),
    truncated or corrupt data, and images above the pixel limit.
    """
    with stage(semconv.STAGE_DECODE, **{semconv.IMAGE_SIZE: len(data)}) as span:
        image = _open(data)
        span.set_attribute(semconv.IMAGE_FORMAT, image.format or "unknown")
        span.set_attribute(semconv.IMAGE_MODE, image.mode)
        try:
            image.load()  # Image.open only reads the header: decode here, inside the span
            image = ImageOps.exif_transpose(image) or image
        except (OSError, SyntaxError, ValueError) as exc:  # Pillow's corrupt/truncated signals
            raise ImageDecodeError(f"corrupt or truncated {image.format} image "
                                   f"({len(data)} bytes): {exc}") from exc
        span.set_attribute(semconv.IMAGE_WIDTH, image.width)
        span.set_attribute(semconv.IMAGE_HEIGHT, image.height)
        return to_rgb(image)


def _open(data: bytes) -> Image.Image:
    if not data:
        raise ImageDecodeError("empty input: 0 bytes, nothing to decode")
    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise ImageDecodeError(f"decompression bomb refused: {exc}") from exc
    except UnidentifiedImageError as exc:
        head = data[:64].lstrip().lower()
        hint = (" (looks like text/HTML, e.g. an error page served instead of the image)"
                if head.startswith(_TEXT_PREFIXES) else "")
        raise ImageDecodeError(f"not a recognised image format ({len(data)} bytes, first bytes "
                               f"{data[:16]!r}){hint}") from exc
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and image.width * image.height > limit:
        # Pillow only warns between 1x and 2x the limit; a service should refuse.
        raise ImageDecodeError(
            f"decompression bomb refused: {image.width}x{image.height} = "
            f"{image.width * image.height} pixels exceeds Image.MAX_IMAGE_PIXELS={limit}")
    return image


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB without wrecking colours.

    CMYK with an embedded ICC profile goes through LittleCMS to sRGB; transparency (RGBA, LA,
    palette with a transparent index) is composited over white; 16-bit and 32-bit greyscale are
    scaled to 8 bits (a plain ``convert`` would clip them to white).
    """
    mode = image.mode
    if mode == "RGB":
        return image
    if mode == "CMYK":
        icc = image.info.get("icc_profile")
        if icc:
            try:
                source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
                return ImageCms.profileToProfile(image, source, ImageCms.createProfile("sRGB"),
                                                 outputMode="RGB")
            except (ImageCms.PyCMSError, OSError):
                pass  # broken profile: Pillow's plain conversion is still a sane picture
        return image.convert("RGB")
    if mode.startswith("I") or mode == "F":
        # 16-bit samples keep their top 8 bits; float images in 0..1 are stretched to 0..255.
        wide = image.convert("F")
        hi = wide.getextrema()[1]
        scale = 255.0 if mode == "F" and hi <= 1.0 else (1 / 256 if hi > 255 else 1.0)
        return wide.point(lambda v: v * scale).convert("L").convert("RGB")
    if mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def resize(image: Image.Image, size: tuple[int, int],
           resample: Image.Resampling = Image.Resampling.BICUBIC) -> Image.Image:
    """Resize ``image`` to ``size`` = ``(width, height)`` pixels inside a ``resize`` span.

    Uses Pillow's ``reducing_gap`` so large downscales are fast without aliasing.
    Raises ``ValueError`` for a non-positive size.
    """
    width, height = size
    if width <= 0 or height <= 0:
        raise ValueError(f"resize: size must be positive, got {size!r}")
    with stage(semconv.STAGE_RESIZE, **{semconv.IMAGE_TARGET_WIDTH: width,
                                         semconv.IMAGE_TARGET_HEIGHT: height}):
        return image.resize((width, height), resample=resample, reducing_gap=3.0)
