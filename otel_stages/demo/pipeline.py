"""The demo's request path and run plan.

One request (:meth:`Pipeline.handle`) is::

    with request():                       # the request span, on the caller's thread
        download(url)                     # download span (real HTTP on 127.0.0.1)
        decode(bytes)                     # decode span (real Pillow decode, EXIF orientation;
                                          # JPEG draft decoding at reduced size with decode_draft)
        resize(image, (S, S))             # resize span; then to_tensor (float32 CHW, 0..1)
        worker.infer(tensor, prompt)      # queue + forward spans, recorded on the executor thread

The plan (:func:`run_plan`): the *fixed* run sends the same image with the same prompt
``fixed`` times, one after the other (the first is the process's cold request: the model session
is created inside its forward); then the *mixed* set sends ``mixed`` requests (thumbnails and
12 MP photos, and one truncated JPEG when ``mixed >= 2``) from ``concurrency`` threads at once,
so requests really queue and get batched. A failing request fails alone: its error is recorded on
its spans and in its :class:`Outcome`; every other request completes.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from PIL import Image

from otel_stages import imaging, request
from otel_stages.demo.images import DemoImage
from otel_stages.demo.model import tokenize
from otel_stages.demo.server import ImageServer
from otel_stages.demo.worker import THREAD_NAME_ATTR, InferenceWorker

FIXED_PATH = "/img/fixed.jpg"
MALFORMED_PATH = "/img/broken.jpg"
FIXED_PROMPT = "Describe this photo in one sentence."
MIXED_PROMPTS = (
    "What is in this picture?",
    "Is there a sun in the sky?",
    "Count the boxes.",
    "Caption this image for a blind reader.",
)
PHASE_ATTR = "demo.phase"  #: str, "fixed" or "mixed" (request span)
IMAGE_PATH_ATTR = "demo.image"  #: str, server path of the image (request span)


def to_tensor(image: Image.Image) -> np.ndarray:
    """RGB image -> float32 ``[3, H, W]`` array in 0..1 (channels first, as the model expects)."""
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32)  # [H, W, 3], 0..255
    tensor: np.ndarray = np.ascontiguousarray(pixels.transpose(2, 0, 1)) * np.float32(1 / 255)
    return tensor


@dataclass(frozen=True)
class Job:
    """One request to send: ``phase`` (``fixed`` / ``mixed``), image ``path`` and ``prompt``."""

    phase: str
    path: str
    prompt: str


@dataclass(frozen=True)
class Outcome:
    """What one request produced: ``embedding`` float32 ``[dim]`` on success, else ``error``
    (``"ImageDecodeError: ..."``). ``wall_ms`` is the caller-side time of the whole request."""

    job: Job
    wall_ms: float
    embedding: np.ndarray | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the request produced an embedding."""
        return self.error is None


class Pipeline:
    """download -> decode -> resize -> queue -> forward against ``server`` and ``worker``.

    ``image_size`` is the square model input in pixels; ``prompt_len`` the token count.
    ``decode_draft``: decode JPEGs at reduced size (Pillow draft mode, 1/2 to 1/8 scale, never
    below ``image_size``) before the resize, the knob ``otel-stages demo --decode-draft`` turns.
    Thread-safe: :meth:`handle` may run on many threads at once (httpx.Client is thread-safe).
    """

    def __init__(self, server: ImageServer, worker: InferenceWorker, *, image_size: int,
                 prompt_len: int, timeout_s: float = 30.0, decode_draft: bool = False) -> None:
        self.server = server
        self.worker = worker
        self.image_size = image_size
        self.prompt_len = prompt_len
        self.draft = (image_size, image_size) if decode_draft else None
        self.timeout_s = timeout_s
        self._client = httpx.Client(timeout=timeout_s)

    def handle(self, job: Job) -> Outcome:
        """Run one request inside its request span. Never raises for a bad image: an
        :class:`~otel_stages.imaging.ImageError` (or a model error) becomes ``Outcome.error``
        and is recorded on the spans (status ERROR) by the stages."""
        start = time.perf_counter()
        attrs: dict[str, Any] = {PHASE_ATTR: job.phase, IMAGE_PATH_ATTR: job.path,
                                 THREAD_NAME_ATTR: threading.current_thread().name}
        try:
            with request(**attrs):
                data = imaging.download(self.server.url(job.path), client=self._client,
                                        timeout_s=self.timeout_s)
                image = imaging.decode(data, draft=self.draft)
                small = imaging.resize(image, (self.image_size, self.image_size))
                tensor = to_tensor(small)
                embedding = self.worker.infer(tensor, tokenize(job.prompt, self.prompt_len),
                                              timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - one request fails alone; its spans already carry the error
            return Outcome(job, (time.perf_counter() - start) * 1e3, error=f"{type(exc).__name__}: {exc}")
        return Outcome(job, (time.perf_counter() - start) * 1e3, embedding=embedding)

    def close(self) -> None:
        """Close the HTTP client's connections."""
        self._client.close()


def fixed_jobs(count: int) -> list[Job]:
    """``count`` identical jobs: the fixed image with the fixed prompt."""
    return [Job("fixed", FIXED_PATH, FIXED_PROMPT) for _ in range(count)]


def mixed_jobs(count: int, images: dict[str, DemoImage], seed: int = 0) -> list[Job]:
    """``count`` jobs alternating thumbnails and 12 MP photos in a seeded shuffle.

    When ``count >= 2`` exactly one of them asks for the malformed image (in the middle).
    """
    thumbs = sorted(p for p, im in images.items() if im.kind == "thumbnail")
    photos = sorted(p for p, im in images.items() if im.kind == "photo")
    if not thumbs or not photos:
        raise ValueError("mixed_jobs: the catalogue needs at least one thumbnail and one photo")
    paths = []
    for i in range(count):  # even -> thumbnail, odd -> photo, cycling through each kind
        kind = thumbs if i % 2 == 0 else photos
        paths.append(kind[(i // 2) % len(kind)])
    random.Random(seed).shuffle(paths)
    if count >= 2:
        paths[count // 2] = MALFORMED_PATH
    return [Job("mixed", p, MIXED_PROMPTS[i % len(MIXED_PROMPTS)]) for i, p in enumerate(paths)]


def run_plan(pipeline: Pipeline, fixed: Sequence[Job], mixed: Sequence[Job], *, concurrency: int = 4,
             progress: Callable[[str], None] = lambda line: None) -> list[Outcome]:
    """Send ``fixed`` one at a time, then ``mixed`` from ``concurrency`` threads; outcomes in job
    order. ``progress`` gets one short line per phase and one per failed request."""
    outcomes: list[Outcome] = []
    start = time.perf_counter()
    for job in fixed:
        outcomes.append(pipeline.handle(job))
    done = outcomes[: len(fixed)]
    progress(f"fixed run: {len(done)} requests, same image and prompt, one at a time "
             f"({sum(o.ok for o in done)} ok) in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    if mixed:
        with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="demo-request") as pool:
            outcomes.extend(pool.map(pipeline.handle, mixed))
        done = outcomes[len(fixed):]
        kinds = (("thumb", "thumbnails"), ("photo", "12 MP photos"), ("broken", "malformed"))
        mix = ", ".join(f"{n} {label}" for key, label in kinds
                        if (n := sum(key in o.job.path for o in done)))
        progress(f"mixed set: {len(done)} requests ({mix}), "
                 f"{concurrency} at a time ({sum(o.ok for o in done)} ok) in "
                 f"{time.perf_counter() - start:.1f} s")
    for index, outcome in enumerate(outcomes, start=1):
        if not outcome.ok:
            progress(f"request {index} ({outcome.job.path}) failed on its own: {outcome.error}")
    return outcomes
