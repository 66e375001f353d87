"""Image helpers on the handed corpus (tests/data/images) and a real local HTTP server."""

from __future__ import annotations

import http.server
import io
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import pytest
from opentelemetry.trace import StatusCode
from PIL import Image

import otel_stages as ots
from otel_stages import imaging, semconv
from tests.conftest import DATA

IMAGES = DATA / "images"
EXPECT = json.loads((IMAGES / "expect.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_corpus_behaves_as_expected(name, captured):
    data = (IMAGES / name).read_bytes()
    expect = EXPECT[name]
    if expect["ok"]:
        image = imaging.decode(data)
        assert list(image.size) == expect["wh"]
        assert image.mode == "RGB"
        span = captured.one("decode")
        assert [span.attributes[semconv.IMAGE_WIDTH], span.attributes[semconv.IMAGE_HEIGHT]] == expect["wh"]
        assert span.attributes[semconv.IMAGE_SIZE] == len(data)
        assert span.attributes[semconv.IMAGE_FORMAT] in ("JPEG", "PNG")
    else:
        with pytest.raises(imaging.ImageDecodeError) as info:
            imaging.decode(data)
        span = captured.one("decode")
        assert span.status.status_code is StatusCode.ERROR
        assert str(info.value) in span.status.description


@pytest.mark.parametrize("name, needle", [
    ("empty.jpg", "empty input: 0 bytes"),
    ("truncated.jpg", "truncated"),
    ("html_error_page.jpg", "looks like text/HTML"),
    ("bomb_60000x60000.png", "decompression bomb"),
])
def test_error_messages_are_precise(name, needle, captured):
    with pytest.raises(imaging.ImageDecodeError, match=needle):
        imaging.decode((IMAGES / name).read_bytes())


def test_sixteen_bit_grey_keeps_its_tones_instead_of_clipping_to_white():
    raw = Image.open(IMAGES / "gray16_512.png")
    raw.load()
    assert raw.mode.startswith("I")
    wide = raw.convert("I")
    out = imaging.decode((IMAGES / "gray16_512.png").read_bytes())
    for xy in [(0, 0), (100, 200), (511, 511), (256, 17)]:
        assert out.getpixel(xy)[0] == wide.getpixel(xy) >> 8
    lo, hi = out.convert("L").getextrema()
    assert hi - lo > 100  # a real gradient, not a flat white picture


def test_transparent_palette_composites_over_white():
    src = Image.open(IMAGES / "palette_transparent.png")
    assert src.mode == "P" and "transparency" in src.info
    rgba = src.convert("RGBA")
    out = imaging.decode((IMAGES / "palette_transparent.png").read_bytes())
    transparent = [(x, y) for x in range(0, 300, 7) for y in range(0, 200, 7) if rgba.getpixel((x, y))[3] == 0]
    assert transparent, "fixture should have transparent pixels"
    assert all(out.getpixel(xy) == (255, 255, 255) for xy in transparent)


def test_exif_orientation_is_applied_to_pixels_not_just_size():
    data = (IMAGES / "exif_rotated_640x480.jpg").read_bytes()
    raw = Image.open(io.BytesIO(data))
    assert raw.getexif().get(0x0112) not in (None, 1)
    out = imaging.decode(data)
    assert out.size == (raw.height, raw.width)


def test_resize_records_target(captured):
    image = Image.new("RGB", (640, 480))
    out = imaging.resize(image, (224, 224))
    assert out.size == (224, 224)
    span = captured.one("resize")
    assert span.attributes[semconv.IMAGE_TARGET_WIDTH] == 224
    assert span.attributes[semconv.IMAGE_TARGET_HEIGHT] == 224
    with pytest.raises(ValueError):
        imaging.resize(image, (0, 10))


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, bytes]] = {}
    release = threading.Event()

    def do_GET(self):
        try:
            self._get()
        except ConnectionError:  # the client gave up (deadline tests): expected
            pass

    def _get(self):
        if self.path == "/stall":
            self.release.wait(5)  # holds the response until the test is done with it
            return
        if self.path.startswith("/drip"):
            # One byte every 0.1 s: each read is quick, the whole is never done in time.
            if self.path == "/drip-headers":
                for ch in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200:
                    if self.release.wait(0.1):
                        return
                    self.wfile.write(bytes([ch]))
                    self.wfile.flush()
                return
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(100000):
                if self.release.wait(0.1):
                    return
                self.wfile.write(b"x")
                self.wfile.flush()
            return
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/p.jpg")
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"moved")
            return
        body = self.routes.get(self.path)
        if body is None:
            self.send_error(404, "no such image")
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextmanager
def image_server(routes: dict[str, bytes]) -> Iterator[str]:
    _Handler.routes = routes
    _Handler.release = threading.Event()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        _Handler.release.set()
        server.shutdown()
        server.server_close()


def test_download_over_real_http(captured):
    photo = (IMAGES / "photo_320x240.jpg").read_bytes()
    with image_server({"/p.jpg": photo}) as base:
        assert imaging.download(f"{base}/p.jpg") == photo
        span = captured.one("download")
        assert span.attributes[semconv.IMAGE_SIZE] == len(photo)
        assert span.attributes[semconv.HTTP_RESPONSE_STATUS_CODE] == 200
        assert span.attributes[semconv.URL_FULL] == f"{base}/p.jpg"

        with pytest.raises(imaging.DownloadError, match="HTTP 404"):
            imaging.download(f"{base}/missing.jpg")
        with pytest.raises(imaging.DownloadError, match="exceeds max_bytes=1000"):
            imaging.download(f"{base}/p.jpg", max_bytes=1000)
        with pytest.raises(imaging.DownloadError, match="timed out after 0.2 s"):
            imaging.download(f"{base}/stall", timeout_s=0.2)
    errors = [s for s in captured.by_name("download") if s.status.status_code is StatusCode.ERROR]
    assert len(errors) == 3


def test_bad_image_fails_only_its_own_request(captured):
    inputs = [(IMAGES / "photo_320x240.jpg").read_bytes(), b"<html>oops</html>",
              (IMAGES / "rgba_800x600.png").read_bytes()]
    outcomes = []
    for data in inputs:
        try:
            with ots.request():
                imaging.resize(imaging.decode(data), (64, 64))
            outcomes.append("ok")
        except imaging.ImageError as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes == ["ok", "ImageDecodeError", "ok"]
    reqs = captured.by_name("request")
    assert [r.status.status_code for r in reqs] == [StatusCode.UNSET, StatusCode.ERROR, StatusCode.UNSET]
    assert len(captured.by_name("resize")) == 2


@pytest.mark.parametrize("path", ["/drip", "/drip-headers"])
def test_download_deadline_covers_a_server_that_drips_bytes(path, captured):
    import time

    with image_server({}) as base:
        started = time.monotonic()
        with pytest.raises(imaging.DownloadError, match="timed out after 0.5 s"):
            imaging.download(f"{base}{path}", timeout_s=0.5)
        assert time.monotonic() - started < 3  # not 0.1 s per byte forever


def test_download_with_a_client_that_does_not_follow_redirects_fails_clearly(captured):
    import httpx

    photo = (IMAGES / "photo_320x240.jpg").read_bytes()
    with image_server({"/p.jpg": photo}) as base, httpx.Client(follow_redirects=False) as client:
        with pytest.raises(imaging.DownloadError, match="HTTP 302"):
            imaging.download(f"{base}/moved", client=client)
        assert imaging.download(f"{base}/moved") == photo  # the default client follows


def test_download_invalid_url_is_a_download_error(captured):
    with pytest.raises(imaging.DownloadError, match="InvalidURL"):
        imaging.download("http://[::1")


def test_credentials_and_signatures_are_redacted_from_spans_and_errors(captured):
    with image_server({}) as base:
        host = base.removeprefix("http://")
        url = f"http://alice:s3cret@{host}/missing.jpg?X-Amz-Signature=abc123&size=large"
        with pytest.raises(imaging.DownloadError) as info:
            imaging.download(url)
    recorded = captured.one("download").attributes[semconv.URL_FULL]
    assert recorded == f"http://REDACTED:REDACTED@{host}/missing.jpg?X-Amz-Signature=REDACTED&size=large"
    for text in (recorded, str(info.value), captured.one("download").status.description):
        assert "s3cret" not in text and "abc123" not in text


def test_sixteen_bit_scaling_does_not_depend_on_content():
    dark = Image.new("I;16", (4, 4), 200)  # 200 / 65535: nearly black
    bright = Image.new("I;16", (4, 4), 60000)
    for image, expected in ((dark, 0), (bright, 60000 >> 8)):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        assert imaging.decode(buffer.getvalue()).getpixel((0, 0)) == (expected,) * 3


@pytest.mark.parametrize("data", [
    (IMAGES / "photo_1920x1080.jpg").read_bytes()[:300],  # cut inside the JPEG header
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\x03IHDR\x00\x00\x00",  # truncated IHDR chunk
])
def test_header_level_corruption_is_an_image_decode_error(data, captured):
    with pytest.raises(imaging.ImageDecodeError, match="corrupt"):
        imaging.decode(data)


def test_bit_flipped_inputs_either_decode_or_raise_image_decode_error():
    import random

    rng = random.Random(7)
    originals = [(IMAGES / n).read_bytes() for n in ("photo_320x240.jpg", "palette_transparent.png")]
    for i in range(300):
        data = bytearray(originals[i % 2])
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(min(len(data), 2048))] = rng.randrange(256)
        try:
            imaging.decode(bytes(data))
        except imaging.ImageDecodeError:
            pass
