"""A ready image + prompt service on FastAPI, traced per stage with otel_stages.

    uvicorn examples.fastapi_app:app                       # from the repository root
    gunicorn -c examples/gunicorn_conf.py examples.fastapi_app:app   # 3 workers, --preload

Endpoints:

* ``POST /v1/describe`` with JSON ``{"image_url": "https://...", "prompt": "..."}``;
* ``POST /v1/describe/upload``: multipart form, file field ``image`` and text field ``prompt``;
* ``GET /healthz``.

Both answer 200 with ``{"embedding": [...], "dim", "image": {"width", "height"}, "prompt",
"trace_id"}`` and 4xx with ``{"detail": "..."}`` naming what was wrong: 422 for an image that
cannot be fetched or decoded (``DownloadError: GET ...: HTTP 404 Not Found``,
``ImageDecodeError: ...``) or a malformed body, 413 for an upload over the size cap. A model
failure is a 500 with its message, a model that does not answer in time a 503.

Each request is one ``request`` span with ``download`` / ``decode`` / ``resize`` run in a thread
pool (context kept by :mod:`otel_stages.propagation`) and ``queue`` / ``forward`` on the demo's
batching executor (:class:`otel_stages.demo.worker.InferenceWorker`, one ``batch`` span per model
call). With OpenTelemetry's FastAPI instrumentation on (the default) the request span is a child
of its HTTP server span; without it the request span stands alone, under the caller's
``traceparent`` when one is sent.

Per process: telemetry (:func:`setup_telemetry`, i.e. ``otel_stages.configure()``), the
preprocessing pool, the model and its executor thread are made in the process that serves, never
before ``fork()``: under ``gunicorn --preload`` the master imports this module (nothing here starts
a thread), and each worker configures telemetry in gunicorn's ``post_fork`` hook
(``examples/gunicorn_conf.py``), so it gets its own ``service.instance.id``, its ``request.seq``
from 1 and its own cold start (the model session is created on its first forward). Under plain
uvicorn the app's lifespan does the same once.

Environment: ``OTEL_STAGES_*`` / ``OTEL_*`` as for ``configure()``; ``EXAMPLE_MODEL=small`` for a
small, fast encoder (tests), default the ViT-Tiny-sized demo encoder. The service fetches any
http(s) URL it is given: put it behind an allow-list of image hosts before exposing it.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract
from pydantic import BaseModel

import otel_stages as ots
from otel_stages import imaging, propagation
from otel_stages.demo.model import Encoder, EncoderConfig, tokenize
from otel_stages.demo.pipeline import to_tensor
from otel_stages.demo.worker import InferenceWorker, ModelFn, WorkerClosed

SERVICE_NAME = "describe-api"
SMALL_MODEL = EncoderConfig(image_size=64, patch=16, dim=64, heads=2, depth=2, prompt_len=16)
MAX_UPLOAD_BYTES = imaging.DEFAULT_MAX_BYTES
TIMEOUT_S = 30.0


class DescribeRequest(BaseModel):
    """JSON body of ``POST /v1/describe``."""

    image_url: str
    prompt: str


def model_config() -> EncoderConfig:
    """The encoder size: ``EXAMPLE_MODEL=small`` for tests, else the demo default."""
    return SMALL_MODEL if os.environ.get("EXAMPLE_MODEL", "").strip() == "small" else EncoderConfig()


class Service:
    """One process's serving state: HTTP client, preprocessing pool, model behind the batcher.

    ``model(pixels [B, 3, S, S], prompt_ids [B, T]) -> [B, dim]``; default the demo encoder for
    ``config``. Thread-safe; :meth:`close` stops the pool and the executor thread.
    """

    def __init__(self, model: ModelFn | None = None, *, config: EncoderConfig | None = None,
                 max_batch: int = 8, max_wait_ms: float = 5.0, threads: int = 4,
                 timeout_s: float = TIMEOUT_S) -> None:
        self.config = config or model_config()
        self.timeout_s = timeout_s
        self.http = httpx.Client(timeout=timeout_s, follow_redirects=True)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="preprocess")
        run = model or Encoder(self.config).run  # the session is made on the first forward
        self.worker = InferenceWorker(run, max_batch=max_batch, max_wait_ms=max_wait_ms)

    def _preprocess(self, data: bytes) -> tuple[np.ndarray, dict[str, int]]:
        image = imaging.decode(data)  # decode span
        size = self.config.image_size
        small = imaging.resize(image, (size, size))  # resize span
        return to_tensor(small), {"width": image.width, "height": image.height}

    async def describe(self, prompt: str, *, url: str | None = None,
                       data: bytes | None = None) -> dict[str, Any]:
        """Run one request (download when ``url`` is given) inside its request span.

        Raises :class:`otel_stages.imaging.ImageError` for a bad URL or image, ``TimeoutError``
        when the model does not answer within ``timeout_s``, and what the model raised.
        """
        loop = asyncio.get_running_loop()
        async with ots.request() as span:
            if url is not None:
                fetch = functools.partial(imaging.download, url, client=self.http,
                                          timeout_s=self.timeout_s)
                data = await loop.run_in_executor(self.pool, fetch)  # download span, pooled
            assert data is not None
            tensor, size = await loop.run_in_executor(self.pool, self._preprocess, data)
            future = self.worker.submit(tensor, tokenize(prompt, self.config.prompt_len))
            embedding = await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
            trace_id = format(span.get_span_context().trace_id, "032x")
        return {"embedding": [round(float(x), 6) for x in embedding], "dim": int(embedding.shape[0]),
                "image": size, "prompt": prompt, "trace_id": trace_id}

    def close(self) -> None:
        """Finish queued work and stop the executor thread, the pool and the HTTP client."""
        self.worker.close()
        self.pool.shutdown(wait=True)
        self.http.close()


# -- telemetry, once per process ----------------------------------------------------------------

_configured_pid: int | None = None
_telemetry: Any = None


def setup_telemetry() -> None:
    """``otel_stages.configure()`` once in this process (gunicorn ``post_fork``, else the
    lifespan). Safe to call again: a second call in the same process does nothing."""
    global _configured_pid, _telemetry
    if _configured_pid == os.getpid():
        return
    _telemetry = ots.configure(service_name=os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME)
    _configured_pid = os.getpid()


def shutdown_telemetry() -> None:
    """Flush and stop this process's telemetry (the lifespan's shutdown; gunicorn ``worker_exit``).
    Idempotent."""
    global _configured_pid
    if _telemetry is not None and _configured_pid == os.getpid():
        _telemetry.shutdown()
        _configured_pid = None


# -- the app ----------------------------------------------------------------------------------------

def _bad_input(exc: Exception) -> HTTPException:
    return HTTPException(status_code=422, detail=f"{type(exc).__name__}: {exc}")


async def _answer(service: Service, http_request: Request, prompt: str, *, url: str | None = None,
                  data: bytes | None = None) -> dict[str, Any]:
    # No HTTP server span (instrumentation off): the request continues the caller's trace.
    own = not trace.get_current_span().get_span_context().is_valid
    token = otel_context.attach(extract(http_request.headers)) if own else None
    try:
        return await service.describe(prompt, url=url, data=data)
    except imaging.ImageError as exc:
        raise _bad_input(exc) from None
    except (TimeoutError, asyncio.TimeoutError, WorkerClosed) as exc:  # distinct before 3.11
        detail = f"model unavailable: {type(exc).__name__}: {exc}"
        raise HTTPException(status_code=503, detail=detail) from None
    except Exception as exc:  # noqa: BLE001 - a model failure: a clear 500, recorded on the spans
        detail = f"inference failed: {type(exc).__name__}: {exc}"
        raise HTTPException(status_code=500, detail=detail) from None
    finally:
        if token is not None:
            otel_context.detach(token)


def create_app(*, service_factory: Any = Service, instrument_http: bool = True,
               tracer_provider: Any = None, configure_telemetry: bool = True) -> FastAPI:
    """The FastAPI app. ``service_factory()`` makes the per-process :class:`Service` at startup.

    ``instrument_http``: wrap the app in OpenTelemetry's FastAPI instrumentation (HTTP server
    spans; ``tracer_provider`` or the global one). ``configure_telemetry``: call
    :func:`setup_telemetry` at startup; pass ``False`` when the process sets up its own SDK
    (thread-pool propagation is then turned on here, see :mod:`otel_stages.propagation`).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if configure_telemetry:
            setup_telemetry()
        else:
            propagation.instrument()
        app.state.service = service_factory()
        try:
            yield
        finally:
            app.state.service.close()
            if configure_telemetry:
                # uvicorn re-raises SIGTERM/SIGINT once it has shut down, so the process ends by
                # the signal and atexit handlers (the SDK's final flush) never run: flush here.
                shutdown_telemetry()

    app = FastAPI(title="describe", lifespan=lifespan)

    @app.post("/v1/describe")
    async def describe(body: DescribeRequest, request: Request) -> dict[str, Any]:
        if not body.image_url.startswith(("http://", "https://")):
            raise HTTPException(status_code=422, detail=f"image_url must be an http(s) URL, got "
                                                        f"{body.image_url[:80]!r}")
        return await _answer(request.app.state.service, request, body.prompt, url=body.image_url)

    @app.post("/v1/describe/upload")
    async def describe_upload(request: Request, image: UploadFile = File(...),  # noqa: B008
                              prompt: str = Form(...)) -> dict[str, Any]:
        data = await image.read(MAX_UPLOAD_BYTES + 1)
        if len(data) > MAX_UPLOAD_BYTES:
            raise HTTPException(status_code=413, detail=f"image larger than {MAX_UPLOAD_BYTES} bytes")
        return await _answer(request.app.state.service, request, prompt, data=data)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    if instrument_http:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(app, tracer_provider=tracer_provider,
                                           excluded_urls="healthz", exclude_spans=["receive", "send"])
    return app


app = create_app()
