"""An asyncio front end for the demo pipeline (``otel-stages demo --fault blocking-loop``).

Requests run as tasks on one event loop, the way an async web framework (FastAPI, aiohttp) serves
them: the image is fetched with ``httpx.AsyncClient`` inside an async ``download`` stage, then
decoded and resized, then handed to the same :class:`~otel_stages.demo.worker.InferenceWorker`
(``queue`` and ``forward`` run on its executor thread) and awaited.

``blocking=True`` is the fault: decode and resize run *on the event loop's thread*, so while one
request decodes a 12 MP photo no other request can make progress (its download's reads, its
awaited result), however idle the CPU. ``blocking=False`` is the fix: the same calls go through
``asyncio.to_thread``. The first request runs alone (it loads the model: the cold start), the rest
``concurrency`` at a time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from otel_stages import imaging, request, semconv, stage
from otel_stages.demo.model import tokenize
from otel_stages.demo.pipeline import IMAGE_PATH_ATTR, PHASE_ATTR, Job, Outcome, to_tensor
from otel_stages.demo.server import ImageServer
from otel_stages.demo.worker import THREAD_NAME_ATTR, InferenceWorker


class AsyncFrontEnd:
    """Serve :class:`~otel_stages.demo.pipeline.Job` s as asyncio tasks (module docstring).

    ``image_size``: square model input in pixels; ``prompt_len``: prompt tokens. Not thread-safe:
    one :meth:`run` at a time.
    """

    def __init__(self, server: ImageServer, worker: InferenceWorker, *, image_size: int,
                 prompt_len: int, blocking: bool = True, timeout_s: float = 60.0) -> None:
        self.server = server
        self.worker = worker
        self.image_size = image_size
        self.prompt_len = prompt_len
        self.blocking = blocking
        self.timeout_s = timeout_s

    async def _download(self, client: httpx.AsyncClient, url: str) -> bytes:
        async with stage(semconv.STAGE_DOWNLOAD, **{semconv.URL_FULL: url,
                                                    semconv.URL_SCHEME: "http"}) as span:
            response = await client.get(url)
            span.set_attribute(semconv.HTTP_RESPONSE_STATUS_CODE, response.status_code)
            if response.status_code != 200:
                raise imaging.DownloadError(f"HTTP {response.status_code} for {url}")
            span.set_attribute(semconv.IMAGE_SIZE, len(response.content))
            return response.content

    def _preprocess(self, data: bytes) -> Any:
        image = imaging.decode(data)
        return to_tensor(imaging.resize(image, (self.image_size, self.image_size)))

    async def handle(self, client: httpx.AsyncClient, job: Job) -> Outcome:
        """One request inside its request span; a bad image fails this request only."""
        start = time.perf_counter()
        attrs: dict[str, Any] = {PHASE_ATTR: job.phase, IMAGE_PATH_ATTR: job.path,
                 THREAD_NAME_ATTR: threading.current_thread().name}
        try:
            async with request(**attrs):
                data = await self._download(client, self.server.url(job.path))
                if self.blocking:
                    tensor = self._preprocess(data)  # the fault: CPU work on the loop's thread
                else:
                    tensor = await asyncio.to_thread(self._preprocess, data)
                future = self.worker.submit(tensor, tokenize(job.prompt, self.prompt_len))
                embedding = await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - one request fails alone; its spans carry the error
            return Outcome(job, (time.perf_counter() - start) * 1e3, error=f"{type(exc).__name__}: {exc}")
        return Outcome(job, (time.perf_counter() - start) * 1e3, embedding=embedding)

    async def _serve(self, jobs: Sequence[Job], concurrency: int) -> list[Outcome]:
        limits = httpx.Limits(max_connections=max(1, concurrency))
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as client:
            outcomes = [await self.handle(client, job) for job in jobs[:1]]  # the cold start, alone
            gate = asyncio.Semaphore(max(1, concurrency))

            async def one(job: Job) -> Outcome:
                async with gate:
                    return await self.handle(client, job)

            outcomes += await asyncio.gather(*(one(job) for job in jobs[1:]))
        return outcomes

    def run(self, jobs: Sequence[Job], *, concurrency: int = 6,
            progress: Callable[[str], None] = lambda line: None) -> list[Outcome]:
        """Serve ``jobs`` on a new event loop (first alone, then ``concurrency`` at a time);
        outcomes in job order."""
        start = time.perf_counter()
        outcomes = asyncio.run(self._serve(list(jobs), concurrency))
        where = "on the event loop (blocking it)" if self.blocking else "in worker threads"
        progress(f"asyncio front end: {len(outcomes)} requests, {concurrency} at a time, decode"
                 f" and resize {where} ({sum(o.ok for o in outcomes)} ok) in"
                 f" {time.perf_counter() - start:.1f} s")
        return outcomes
