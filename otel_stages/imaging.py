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
import threading
import time
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
from PIL import Image, ImageCms, ImageOps, UnidentifiedImageError

from otel_stages import semconv
from otel_stages.stages import stage

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_BYTES = 50 * 2**20  # 50 MiB: well above a 12 MP JPEG, far below memory trouble

_TEXT_PREFIXES = (b"<!doctype", b"<html", b"<?xml", b"{", b"[")

#: Query keys whose values are secrets in signed URLs (OpenTelemetry HTTP semconv list, lower case).
SENSITIVE_QUERY_KEYS = frozenset({"awsaccesskeyid", "signature", "sig", "x-goog-signature",
                                  "x-amz-signature", "x-amz-credential", "x-amz-security-token"})


class ImageError(ValueError):
    """An image could not be fetched or decoded; the message says what and why."""


class DownloadError(ImageError):
    """Fetching the image failed: HTTP error status, timeout, connection error or size cap."""


class ImageDecodeError(ImageError):
    """The bytes are not a decodable image (empty, truncated, not an image, decompression bomb)."""


def download(url: str, *, client: httpx.Client | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
             max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """GET ``url`` inside a ``download`` span and return the body bytes.

    ``timeout_s`` bounds the whole download: each network operation, and the total time to read
    the body (a server dripping bytes cannot hold a request forever). With the default client the
    deadline also covers slow headers (the connection is closed when it passes). ``max_bytes`` caps
    the body (``Content-Length`` first, then while streaming). Pass a shared ``client`` to reuse
    connections. ``url.full`` is recorded with credentials and signed-URL query values redacted.
    Raises :class:`DownloadError` on an invalid URL, a non-2xx status (a redirect the client does
    not follow included), timeout, transport error or a body over ``max_bytes``.
    """
    shown = redact_url(url)
    with stage(semconv.STAGE_DOWNLOAD, **{semconv.URL_FULL: shown}) as span:
        own = client is None
        http = client or httpx.Client(timeout=timeout_s, follow_redirects=True)
        # Own client: closing it from a timer aborts a stalled read (httpx has no total timeout).
        watchdog = threading.Timer(timeout_s, http.close) if own else None
        deadline = time.monotonic() + timeout_s
        try:
            if watchdog is not None:
                watchdog.daemon = True
                watchdog.start()
            with http.stream("GET", url, timeout=timeout_s) as response:
                span.set_attribute(semconv.HTTP_RESPONSE_STATUS_CODE, response.status_code)
                if not response.is_success:
                    raise DownloadError(f"GET {shown}: HTTP {response.status_code} {response.reason_phrase}")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                    raise DownloadError(f"GET {shown}: Content-Length {declared} bytes exceeds "
                                        f"max_bytes={max_bytes}")
                chunks, total = [], 0
                for chunk in response.iter_bytes():
                    total += len(chunk)
                    if total > max_bytes:
                        raise DownloadError(f"GET {shown}: body exceeds max_bytes={max_bytes}")
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("body not complete before the deadline")
                    chunks.append(chunk)
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, RuntimeError) as exc:
            # Past the deadline, a read error is the watchdog closing the connection.
            if isinstance(exc, httpx.TimeoutException) or time.monotonic() >= deadline:
                raise DownloadError(f"GET {shown}: timed out after {timeout_s} s") from exc
            raise DownloadError(f"GET {shown}: {type(exc).__name__}: {exc}") from exc
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if own:
                http.close()
        data = b"".join(chunks)
        span.set_attribute(semconv.IMAGE_SIZE, len(data))
        return data


def redact_url(url: str) -> str:
    """``url`` with user:password and signed-URL query values replaced by ``REDACTED``.

    Follows the OpenTelemetry HTTP conventions for ``url.full`` (credentials and the query keys
    in :data:`SENSITIVE_QUERY_KEYS` are redacted). Unparsable input is returned as is.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "REDACTED:REDACTED@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in SENSITIVE_QUERY_KEYS for k, _ in pairs):
            query = urlencode([(k, "REDACTED" if k.lower() in SENSITIVE_QUERY_KEYS else v)
                               for k, v in pairs], safe="/")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def decode(data: bytes, *, draft: tuple[int, int] | None = None) -> Image.Image:
    """Decode encoded image bytes into a fully loaded RGB :class:`PIL.Image.Image`.

    Inside a ``decode`` span. Applies EXIF orientation (so width/height are as displayed).
    Keeps Pillow's decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``; ``None`` disables).
    ``draft=(width, height)``: for JPEGs, let the decoder scale by 1/2, 1/4 or 1/8 while decoding
    (Pillow's ``Image.draft``), to the smallest size still at least ``draft`` (pass the size the
    image is resized to next); other formats decode in full. ``image.width`` / ``image.height``
    stay the encoded image's size (the input), not the drafted one.
    Raises :class:`ImageDecodeError` for empty input, non-image bytes (e.g. an HTML error page),
    truncated or corrupt data, and images above the pixel limit.
    """
    with stage(semconv.STAGE_DECODE, **{semconv.IMAGE_SIZE: len(data)}) as span:
        image = _open(data)
        span.set_attribute(semconv.IMAGE_FORMAT, image.format or "unknown")
        span.set_attribute(semconv.IMAGE_MODE, image.mode)
        full = image.size
        if draft is not None and image.format == "JPEG":
            image.draft(image.mode, draft)  # DCT scaling: configure before load
        scaled = image.size
        try:
            image.load()  # Image.open only reads the header: decode here, inside the span
            image = ImageOps.exif_transpose(image) or image
            # as displayed: EXIF orientation may have swapped the (possibly drafted) sides
            width, height = full if image.size == scaled else (full[1], full[0])
            span.set_attribute(semconv.IMAGE_WIDTH, width)
            span.set_attribute(semconv.IMAGE_HEIGHT, height)
            return to_rgb(image)
        except Exception as exc:
            raise ImageDecodeError(f"corrupt or truncated {image.format} image "
                                   f"({len(data)} bytes): {type(exc).__name__}: {exc}") from exc


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
    except Exception as exc:
        raise ImageDecodeError(f"corrupt image header ({len(data)} bytes): "
                               f"{type(exc).__name__}: {exc}") from exc
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
        wide = image.convert("F")
        if mode.startswith("I;16"):
            scale = 1 / 256  # 16-bit samples keep their top 8 bits, whatever the content
        elif mode == "I":
            # 32-bit container of unknown depth (old Pillow opened 16-bit PNGs as "I"): assume
            # 16-bit when any sample needs it, else 8-bit.
            scale = 1 / 256 if wide.getextrema()[1] > 255 else 1.0
        else:
            scale = 255.0 if wide.getextrema()[1] <= 1.0 else 1.0  # float images in 0..1
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
