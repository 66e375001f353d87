"""Instrumented image helpers: ``download`` -> ``decode`` -> ``resize``, each in its stage span.

* :func:`download` fetches bytes (http, https, or a ``data:`` URL decoded in place) through a
  pooled client (:mod:`otel_stages.transport`) under one total deadline and a size cap, follows
  redirects hop by hop (optionally same-host only, optionally refusing private addresses on
  every hop) and records ``url.full`` (secrets redacted, ``data:`` URLs summarised),
  ``url.scheme``, ``server.address`` (the host the body came from), ``http.response.status_code``,
  ``http.request.resend_count`` (redirects), ``image.media_type`` and ``image.size``.
* :func:`decode` forces Pillow's real decode *inside* the span (``Image.open`` is lazy), applies
  EXIF orientation, converts odd modes (CMYK, palette with transparency, 16-bit, alpha) and ICC
  profiles to sRGB RGB (:mod:`otel_stages.color`) and records ``image.width`` / ``image.height``
  (after orientation), ``image.size``, ``image.format``, ``image.mode`` (the source mode),
  ``image.icc_profile`` / ``image.icc_profile.action`` and, for animated images,
  ``image.frames`` and ``image.frame_index``.
* :func:`resize` records ``image.target_width`` / ``image.target_height``.
* :func:`decode` and :func:`resize` record where they ran: ``thread.name`` and
  ``otel_stages.event_loop.running`` (an asyncio event loop was running on that thread), which
  the report needs to tell "use a pool sized to the cores" from "move it off the event loop".

Every failure is an :class:`ImageError` (a ``ValueError``) with a precise message that never
contains a secret from the URL; it fails only its own request and is recorded on the stage span
(status ERROR, exception event).
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from typing import Any

import httpx
from opentelemetry.trace import Span
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from otel_stages import semconv, transport
from otel_stages.color import to_rgb, to_srgb
from otel_stages.stages import stage
from otel_stages.transport import http_client
from otel_stages.urls import SENSITIVE_QUERY_KEYS, parse_data_url, redact_url, scrub, url_secrets

__all__ = [
    "DEFAULT_MAX_BYTES", "DEFAULT_MAX_REDIRECTS", "DEFAULT_TIMEOUT_S", "SENSITIVE_QUERY_KEYS",
    "DownloadError", "ImageDecodeError", "ImageError", "decode", "download", "http_client",
    "redact_url", "resize", "to_rgb",
]

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_BYTES = 50 * 2**20  # 50 MiB: well above a 12 MP JPEG, far below memory trouble
DEFAULT_MAX_REDIRECTS = 5

_TEXT_PREFIXES = (b"<!doctype", b"<html", b"<?xml", b"{", b"[")


class ImageError(ValueError):
    """An image could not be fetched or decoded; the message says what and why."""


class DownloadError(ImageError):
    """Fetching the image failed: HTTP error status, timeout, connection error, refused redirect
    or address, invalid ``data:`` URL, or size cap."""


class ImageDecodeError(ImageError):
    """The bytes are not a decodable image (empty, truncated, not an image, decompression bomb)."""


def download(url: str, *, client: httpx.Client | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
             max_bytes: int = DEFAULT_MAX_BYTES, follow_redirects: bool | None = None,
             cross_host_redirects: bool = True, max_redirects: int = DEFAULT_MAX_REDIRECTS,
             block_private: bool = False) -> bytes:
    """GET ``url`` inside a ``download`` span and return the body bytes.

    ``client``: ``None`` (default) uses the process-wide pooled client (built on first use,
    *before* the span starts, so the span times the transfer; thread-safe; re-created after
    ``fork()``). A client from :func:`http_client` behaves the same. Any other ``httpx.Client``
    is used as is.

    ``timeout_s`` is one deadline for the whole download, redirects included. With the pooled
    client or one from :func:`http_client` it bounds everything: DNS, connect, TLS, slow headers,
    a body that drips. With another client it bounds each network operation and the body; a
    server that drips *headers* or a DNS lookup is bounded only by that client, and the error
    then says so. ``max_bytes`` caps the body (``Content-Length`` first, then while streaming).

    Redirects: followed hop by hop up to ``max_redirects`` when ``follow_redirects`` (default:
    yes, or the given plain client's own ``follow_redirects``); ``cross_host_redirects=False``
    refuses a redirect to another host. ``block_private=True`` refuses private, loopback,
    link-local and other non-public addresses, checked on the resolved address of every hop at
    connect time (needs the default client or one from ``http_client(block_private=True)``;
    ``ValueError`` otherwise).

    ``data:`` URLs are decoded here, without network (``max_bytes`` applies); telemetry records
    only their scheme, media type and length. ``url.full`` never holds credentials or secret
    query values (:func:`redact_url`).

    Raises :class:`DownloadError` on an invalid URL, a non-2xx status (an unfollowed redirect
    included), a refused redirect or address, timeout, transport error or a body over
    ``max_bytes``; its message names the redacted URL, never a secret.
    """
    if url[:5].lower() == "data:":
        return _download_data_url(url, max_bytes)
    if client is None:
        http = transport.shared_client(block_private)  # built outside the span: not the transfer
        follow = True if follow_redirects is None else follow_redirects
    else:
        http = client
        if block_private and not transport.guards_private(client):
            raise ValueError("block_private=True needs client=None or a client from "
                             "imaging.http_client(block_private=True): only they check the "
                             "resolved address of every connection")
        follow = follow_redirects if follow_redirects is not None else (
            transport.bounds_total_time(client) or client.follow_redirects)
    shown = redact_url(url)
    scheme = url.partition(":")[0].lower() if ":" in url else ""
    with stage(semconv.STAGE_DOWNLOAD, **{semconv.URL_FULL: shown, semconv.URL_SCHEME: scheme}) as span:
        fetch = _Fetch(http, url, shown, timeout_s, max_bytes, follow, cross_host_redirects,
                       max_redirects)
        with transport.deadline(fetch.deadline):
            data = fetch.run(span)
        span.set_attribute(semconv.IMAGE_SIZE, len(data))
        return data


class _Fetch:
    """One download over HTTP: the redirect loop, the body, and error messages."""

    def __init__(self, http: httpx.Client, url: str, shown: str, timeout_s: float, max_bytes: int,
                 follow: bool, cross_host: bool, max_redirects: int) -> None:
        self.http = http
        self.url = url
        self.shown = shown
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.follow = follow
        self.cross_host = cross_host
        self.max_redirects = max_redirects
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s
        self.secrets = url_secrets(url)
        self.bounded = transport.bounds_total_time(http)

    def fail(self, text: str, cause: BaseException | None = None) -> DownloadError:
        """A :class:`DownloadError` for ``text`` with secrets scrubbed; chained to ``cause``
        only when no message in the cause's chain holds a secret."""
        error = DownloadError(scrub(f"GET {self.shown}: {text}", self.secrets))
        chained = cause
        while chained is not None:
            if scrub(str(chained), self.secrets) != str(chained):
                cause = None
                break
            chained = chained.__cause__ or chained.__context__
        error.__cause__ = cause
        error.__suppress_context__ = True
        return error

    def run(self, span: Span) -> bytes:
        try:
            request = self.http.build_request("GET", self.url, timeout=self._timeout())
        except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError, TypeError) as exc:
            raise self.fail(f"{type(exc).__name__}: {exc}", exc) from None
        first_host = request.url.host
        hops = 0
        while True:
            response = self._send(request)
            try:
                next_request = response.next_request if response.has_redirect_location else None
                if next_request is not None and self.follow:
                    hops += 1
                    self._check_redirect(first_host, next_request, hops)
                    request = next_request
                    request.extensions["timeout"] = self._timeout().as_dict()
                    continue
                return self._body(response, span, hops)
            finally:
                response.close()

    def _timeout(self) -> httpx.Timeout:
        return httpx.Timeout(max(0.001, min(self.timeout_s, self.deadline - time.monotonic())))

    def _send(self, request: httpx.Request) -> httpx.Response:
        try:
            return self.http.send(request, stream=True, follow_redirects=False)
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, RuntimeError) as exc:
            raise self._mapped(exc) from None

    def _mapped(self, exc: BaseException) -> DownloadError:
        blocked = exc.__cause__ if isinstance(exc.__cause__, transport.BlockedAddress) else None
        if blocked is not None:
            return self.fail(f"refused: {blocked}")
        if isinstance(exc, httpx.TimeoutException) or time.monotonic() >= self.deadline:
            return self.fail(f"timed out after {self.timeout_s:g} s", exc)
        return self.fail(f"{type(exc).__name__}: {exc}", exc)

    def _check_redirect(self, first_host: str, request: httpx.Request, hops: int) -> None:
        if hops > self.max_redirects:
            raise self.fail(f"more than max_redirects={self.max_redirects} redirects")
        if request.url.scheme not in ("http", "https"):
            raise self.fail(f"redirect to a {request.url.scheme}: URL refused")
        if not self.cross_host and request.url.host != first_host:
            raise self.fail(f"redirect from host {first_host} to host {request.url.host} refused "
                            "(cross_host_redirects=False)")

    def _body(self, response: httpx.Response, span: Span, hops: int) -> bytes:
        set_attribute = span.set_attribute
        set_attribute(semconv.HTTP_RESPONSE_STATUS_CODE, response.status_code)
        set_attribute(semconv.SERVER_ADDRESS, response.url.host)
        if hops:
            set_attribute(semconv.HTTP_REQUEST_RESEND_COUNT, hops)
        media_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type:
            set_attribute(semconv.IMAGE_MEDIA_TYPE, media_type[:255])
        if not response.is_success:
            why = " (redirect not followed)" if response.has_redirect_location else ""
            raise self.fail(f"HTTP {response.status_code} {response.reason_phrase}{why}")
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            raise self.fail(f"Content-Length {declared} bytes exceeds max_bytes={self.max_bytes}")
        self._check_deadline()
        chunks, total = [], 0
        try:
            for chunk in response.iter_bytes():
                total += len(chunk)
                if total > self.max_bytes:
                    raise self.fail(f"body exceeds max_bytes={self.max_bytes}")
                self._check_deadline()
                chunks.append(chunk)
        except (httpx.HTTPError, httpx.StreamError, RuntimeError) as exc:
            raise self._mapped(exc) from None
        return b"".join(chunks)

    def _check_deadline(self) -> None:
        now = time.monotonic()
        if now <= self.deadline:
            return
        if self.bounded:
            raise self.fail(f"timed out after {self.timeout_s:g} s")
        raise self.fail(
            f"timed out after {self.timeout_s:g} s (took {now - self.started:.1f} s: with this "
            "httpx client the deadline bounds each network operation and the body, not DNS or "
            "slowly sent headers; use client=None or imaging.http_client() for a total deadline)")


def _download_data_url(url: str, max_bytes: int) -> bytes:
    """A ``data:`` URL, decoded in its ``download`` span (no network)."""
    shown = redact_url(url)
    with stage(semconv.STAGE_DOWNLOAD, **{semconv.URL_FULL: shown, semconv.URL_SCHEME: "data"}) as span:
        try:
            parsed = parse_data_url(url)
        except ValueError as exc:
            raise DownloadError(f"{shown}: {exc}") from None
        span.set_attribute(semconv.IMAGE_MEDIA_TYPE, parsed.media_type)
        if parsed.estimated_bytes() > max_bytes:
            raise DownloadError(f"{shown}: about {parsed.estimated_bytes()} bytes exceeds "
                                f"max_bytes={max_bytes}")
        try:
            data = parsed.decode()
        except ValueError as exc:
            raise DownloadError(f"{shown}: {exc}") from None
        if len(data) > max_bytes:
            raise DownloadError(f"{shown}: {len(data)} bytes exceeds max_bytes={max_bytes}")
        span.set_attribute(semconv.IMAGE_SIZE, len(data))
        return data


def _where() -> dict[str, Any]:
    """``thread.name`` and whether an asyncio event loop is running on this thread; computed
    before the stage span starts, so the span times only the user's work."""
    try:
        asyncio.get_running_loop()
        running = True
    except RuntimeError:
        running = False
    return {semconv.THREAD_NAME: threading.current_thread().name,
            semconv.EVENT_LOOP_RUNNING: running}


def decode(data: bytes, *, draft: tuple[int, int] | None = None) -> Image.Image:
    """Decode encoded image bytes into a fully loaded 8-bit sRGB RGB :class:`PIL.Image.Image`.

    Inside a ``decode`` span. Applies EXIF orientation (so width/height are as displayed) and the
    embedded ICC profile (:func:`otel_stages.color.to_srgb`: converted to sRGB, or dropped when
    unusable; the result never carries a profile). An animated image (GIF, WebP, APNG, MPO)
    decodes its first frame and records ``image.frames`` and ``image.frame_index`` = 0.
    Keeps Pillow's decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``; ``None`` disables).

    ``draft=(width, height)``: the size (as displayed) the caller will resize to. A JPEG is then
    decoded with Pillow's draft mode (``Image.draft``: libjpeg's DCT scaling) at the smallest
    1/2, 1/4 or 1/8 scale that is still at least that size, which skips most of the decode work
    for a large photo resized to a small model input; the span records ``image.draft_scale``.
    Other formats ignore ``draft``. ``image.width`` / ``image.height`` stay the source image's
    size either way (the returned image is smaller).

    Raises :class:`ImageDecodeError` for empty input, non-image bytes (e.g. an HTML error page),
    truncated or corrupt data, and images above the pixel limit; ``ValueError`` for a
    non-positive ``draft`` size.
    """
    if draft is not None and (draft[0] <= 0 or draft[1] <= 0):
        raise ValueError(f"decode: draft size must be positive, got {draft!r}")
    with stage(semconv.STAGE_DECODE, **{semconv.IMAGE_SIZE: len(data)}, **_where()) as span:
        image = _open(data)
        span.set_attribute(semconv.IMAGE_FORMAT, image.format or "unknown")
        span.set_attribute(semconv.IMAGE_MODE, image.mode)
        frames = _frame_count(image)
        if frames > 1:
            span.set_attributes({semconv.IMAGE_FRAMES: frames, semconv.IMAGE_FRAME_INDEX: 0})
        try:
            source = _displayed_size(image) if draft is not None else None
            if draft is not None and source is not None:
                scale = _draft(image, draft, swapped=source != image.size)
                if scale is not None:
                    span.set_attribute(semconv.IMAGE_DRAFT_SCALE, scale)
            image.load()  # Image.open only reads the header: decode here, inside the span
            image = ImageOps.exif_transpose(image) or image
            width, height = source or image.size
            span.set_attribute(semconv.IMAGE_WIDTH, width)
            span.set_attribute(semconv.IMAGE_HEIGHT, height)
            rgb, color = to_srgb(image)
        except Exception as exc:
            raise ImageDecodeError(f"corrupt or truncated {image.format} image "
                                   f"({len(data)} bytes): {type(exc).__name__}: {exc}") from exc
        if color.profile is not None:
            span.set_attributes({semconv.IMAGE_ICC_PROFILE: color.profile,
                                 semconv.IMAGE_ICC_PROFILE_ACTION: color.action or ""})
        return rgb


def _frame_count(image: Image.Image) -> int:
    """Frames in ``image`` (1 when not animated or unknown); leaves it on frame 0."""
    if not getattr(image, "is_animated", False):
        return 1
    try:
        count = int(getattr(image, "n_frames", 1))  # GIF: parses (not decodes) every frame
        image.seek(0)
    except (EOFError, OSError, ValueError):
        return 1  # a broken later frame: frame 0 may still decode, and load() will say if not
    return count


#: EXIF orientations that turn the picture by 90 degrees (width and height swap when displayed).
_SWAPPING_ORIENTATIONS = frozenset({5, 6, 7, 8})


def _displayed_size(image: Image.Image) -> tuple[int, int]:
    """``(width, height)`` as displayed, from the header and the EXIF orientation (no decode)."""
    orientation = image.getexif().get(ExifTags.Base.Orientation, 1)
    width, height = image.size
    return (height, width) if orientation in _SWAPPING_ORIENTATIONS else (width, height)


def _draft(image: Image.Image, target: tuple[int, int], *, swapped: bool) -> int | None:
    """Ask a JPEG loader for draft mode at ``target`` (displayed orientation); return the scale
    denominator Pillow chose (1, 2, 4 or 8), ``None`` when the format has no draft mode."""
    stored = (target[1], target[0]) if swapped else target
    full_width = image.width
    if image.draft(image.mode, stored) is None:
        return None
    return max(1, round(full_width / image.width))


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
                                         semconv.IMAGE_TARGET_HEIGHT: height}, **_where()):
        return image.resize((width, height), resample=resample, reducing_gap=3.0)
