"""Photo-like test images made locally (no files, no downloads), JPEG-encoded with Pillow.

A "photo" here is a smooth sky-to-ground gradient with a few soft shapes (sun, hills, boxes),
upscaled from a small sketch so edges are soft, plus per-pixel sensor-like noise so the JPEG has
the size and decode cost of a real photo (a 4000x3000 one encodes to a few MB). Everything is
seeded: the same ``seed`` gives byte-identical JPEGs on the same Pillow / NumPy versions.

:func:`demo_images` returns the demo's whole catalogue: one fixed ~1024x768 photo, a few
160x120 thumbnails, a few 12 MP (4000x3000) photos (one with an EXIF "rotate 90" orientation, as
phones write them) and one malformed file (a truncated JPEG) for the error path.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

FIXED_SIZE = (1024, 768)  #: (width, height) pixels of the fixed-run image
THUMB_SIZE = (160, 120)  #: (width, height) pixels of a thumbnail
PHOTO_SIZE = (4000, 3000)  #: (width, height) pixels of a 12 MP photo

#: EXIF tag 0x0112 (Orientation); value 6 = "rotate 90 CW to display", as phones write it.
EXIF_ORIENTATION = 0x0112


@dataclass(frozen=True)
class DemoImage:
    """One servable image: ``path`` on the demo server (e.g. ``/img/fixed.jpg``), encoded
    ``data`` (bytes), ``kind`` (``fixed`` / ``thumbnail`` / ``photo`` / ``malformed``) and the
    ``width`` x ``height`` in pixels *as displayed* (after EXIF orientation; 0 when malformed)."""

    path: str
    data: bytes
    kind: str
    width: int
    height: int


def photo(size: tuple[int, int], seed: int, *, noise: float = 6.0) -> Image.Image:
    """A photo-like RGB image of ``size`` = ``(width, height)`` pixels.

    ``noise`` is the standard deviation of the added Gaussian noise in 8-bit levels (0 = none).
    Deterministic in ``seed``. Raises ``ValueError`` for a non-positive size.
    """
    width, height = size
    if width <= 0 or height <= 0:
        raise ValueError(f"photo: size must be positive, got {size!r}")
    rng = np.random.default_rng(seed)
    # Sketch at <= 512 px wide: gradients and shapes are cheap there and upscale smoothly.
    scale = max(1, -(-width // 512))
    sw, sh = max(1, width // scale), max(1, height // scale)
    sky_top, sky_bottom = rng.integers(40, 256, 3), rng.integers(40, 256, 3)
    ground = rng.integers(20, 200, 3)
    t = np.linspace(0.0, 1.0, sh, dtype=np.float32)[:, None, None]
    sky = (1 - t) * sky_top + t * sky_bottom
    sketch = np.broadcast_to(sky, (sh, sw, 3)).copy()
    xs = np.arange(sw, dtype=np.float32)
    horizon = sh * (0.55 + 0.1 * np.sin(xs / sw * rng.uniform(2, 7) + rng.uniform(0, 6.3)))
    below = np.arange(sh, dtype=np.float32)[:, None] > horizon[None, :]
    sketch[below] = ground * (0.7 + 0.3 * rng.random())
    img = Image.fromarray(sketch.clip(0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    r = int(sh * rng.uniform(0.05, 0.12))
    cx, cy = int(sw * rng.uniform(0.1, 0.9)), int(sh * rng.uniform(0.1, 0.35))
    draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=tuple(int(v) for v in rng.integers(200, 256, 3)))
    for _ in range(int(rng.integers(3, 7))):  # bounded: a handful of "objects"
        x0, y0 = int(rng.integers(0, sw)), int(rng.integers(sh // 2, sh))
        w, h = int(rng.integers(sw // 20 + 1, sw // 5 + 2)), int(rng.integers(sh // 20 + 1, sh // 4 + 2))
        draw.rectangle((x0, y0 - h, x0 + w, y0), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    img = img.filter(ImageFilter.GaussianBlur(radius=1.5))
    if (sw, sh) != (width, height):
        img = img.resize((width, height), Image.Resampling.BICUBIC)
    if noise > 0:
        grain = rng.standard_normal((height, width, 1), dtype=np.float32) * np.float32(noise)
        pixels = np.asarray(img, dtype=np.float32) + grain  # luminance grain, like a sensor
        img = Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "RGB")
    return img


def encode_jpeg(image: Image.Image, *, quality: int = 90, exif: Image.Exif | None = None) -> bytes:
    """Encode ``image`` as baseline JPEG bytes (4:2:0 subsampling, like cameras and phones)."""
    buffer = io.BytesIO()
    kwargs = {"exif": exif} if exif is not None else {}
    image.save(buffer, "JPEG", quality=quality, subsampling=2, **kwargs)
    return buffer.getvalue()


def jpeg_photo(size: tuple[int, int], seed: int, *, quality: int = 90,
               orientation: int | None = None) -> bytes:
    """:func:`photo` encoded as JPEG bytes; ``orientation`` (1..8) writes an EXIF Orientation tag.

    With ``orientation=6`` the stored pixels are ``size`` but a viewer (and
    :func:`otel_stages.imaging.decode`) shows them rotated: ``(height, width)``.
    """
    exif = None
    if orientation is not None:
        exif = Image.Exif()
        exif[EXIF_ORIENTATION] = orientation
    return encode_jpeg(photo(size, seed), quality=quality, exif=exif)


def truncated_jpeg(data: bytes, keep: float = 0.4) -> bytes:
    """The first ``keep`` fraction of a JPEG: a real-world broken upload (headers intact, scan cut)."""
    return data[: max(64, int(len(data) * keep))]


def demo_images(seed: int = 0, *, thumbnails: int = 3, photos: int = 2) -> dict[str, DemoImage]:
    """The demo catalogue keyed by server path (deterministic in ``seed``).

    ``/img/fixed.jpg`` (1024x768), ``/img/thumb-<i>.jpg`` (160x120) for ``i < thumbnails``,
    ``/img/photo-<i>.jpg`` (4000x3000; ``photo-1`` carries EXIF orientation 6 so it displays as
    3000x4000) for ``i < photos``, and ``/img/broken.jpg`` (a truncated JPEG, does not decode).
    """
    out: list[DemoImage] = [DemoImage("/img/fixed.jpg", jpeg_photo(FIXED_SIZE, seed), "fixed",
                                      *FIXED_SIZE)]
    for i in range(thumbnails):
        out.append(DemoImage(f"/img/thumb-{i}.jpg", jpeg_photo(THUMB_SIZE, seed + 100 + i),
                             "thumbnail", *THUMB_SIZE))
    for i in range(photos):
        rotated = i % 2 == 1
        data = jpeg_photo(PHOTO_SIZE, seed + 200 + i, quality=88, orientation=6 if rotated else None)
        w, h = PHOTO_SIZE
        out.append(DemoImage(f"/img/photo-{i}.jpg", data, "photo", *((h, w) if rotated else (w, h))))
    broken = truncated_jpeg(jpeg_photo((640, 480), seed + 300))
    out.append(DemoImage("/img/broken.jpg", broken, "malformed", 0, 0))
    return {image.path: image for image in out}
