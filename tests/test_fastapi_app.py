"""examples/fastapi_app.py under FastAPI's test client, with OpenTelemetry's FastAPI
instrumentation on and off: real images over HTTP on 127.0.0.1, real Pillow, the real demo encoder
(small config) behind the batching executor."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from examples.fastapi_app import SMALL_MODEL, Service, create_app
from otel_stages import propagation, semconv
from otel_stages.demo.server import ImageServer
from tests.conftest import DATA

PHOTO = (DATA / "images" / "photo_320x240.jpg").read_bytes()
TRUNCATED = (DATA / "images" / "truncated.jpg").read_bytes()
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
STAGES = {"download", "decode", "resize", "queue", "forward"}


@pytest.fixture(scope="module")
def images():
    with ImageServer({"/photo.jpg": PHOTO, "/broken.jpg": TRUNCATED}) as server:
        yield server


@pytest.fixture
def propagating():
    was_on = propagation.is_instrumented()
    yield
    if not was_on:
        propagation.uninstrument()


def _client(captured, instrument_http: bool, model=None):
    app = create_app(
        service_factory=lambda: Service(model, config=SMALL_MODEL, max_wait_ms=10, threads=4),
        instrument_http=instrument_http, tracer_provider=captured.provider,
        configure_telemetry=False)
    return TestClient(app)


def _children(captured, parent) -> dict[str, list]:
    out: dict[str, list] = {}
    for span in captured.children(parent):
        out.setdefault(span.name, []).append(span)
    return out


def test_describe_with_instrumentation_nests_request_under_the_http_span(captured, images, propagating):
    with _client(captured, instrument_http=True) as client:
        reply = client.post("/v1/describe", json={"image_url": images.url("/photo.jpg"),
                                                  "prompt": "What is in this picture?"},
                            headers={"traceparent": TRACEPARENT})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["dim"] == SMALL_MODEL.dim == len(body["embedding"])
    assert body["image"] == {"width": 320, "height": 240} and body["trace_id"] == TRACE_ID
    (server,) = [s for s in captured.spans if s.kind is SpanKind.SERVER]
    assert server.parent.span_id == int(PARENT_ID, 16) and server.parent.is_remote  # traceparent
    request = captured.one("request")
    assert request.parent.span_id == server.context.span_id
    kids = _children(captured, request)
    assert set(kids) == STAGES and all(len(v) == 1 for v in kids.values())
    batch = captured.one(semconv.SPAN_BATCH)
    assert batch.parent is None and [link.context.span_id for link in batch.links] == [request.context.span_id]


def test_describe_without_instrumentation_stands_alone_or_continues_traceparent(captured, images,
                                                                                 propagating):
    with _client(captured, instrument_http=False) as client:
        assert client.post("/v1/describe", json={"image_url": images.url("/photo.jpg"),
                                                 "prompt": "hi"}).status_code == 200
        assert client.post("/v1/describe", json={"image_url": images.url("/photo.jpg"), "prompt": "hi"},
                           headers={"traceparent": TRACEPARENT}).status_code == 200
    assert not [s for s in captured.spans if s.kind is SpanKind.SERVER]
    alone, continued = captured.by_name("request")
    assert alone.parent is None
    assert continued.parent.span_id == int(PARENT_ID, 16)
    assert format(continued.context.trace_id, "032x") == TRACE_ID
    for request in (alone, continued):
        assert set(_children(captured, request)) == STAGES


def test_upload_variant_has_no_download_stage(captured, propagating):
    with _client(captured, instrument_http=True) as client:
        reply = client.post("/v1/describe/upload", files={"image": ("photo.jpg", PHOTO, "image/jpeg")},
                            data={"prompt": "Count the boxes."})
    assert reply.status_code == 200, reply.text
    assert reply.json()["image"] == {"width": 320, "height": 240}
    assert set(_children(captured, captured.one("request"))) == STAGES - {"download"}


def test_bad_inputs_get_a_clear_4xx_and_other_requests_are_unaffected(captured, images, propagating):
    with _client(captured, instrument_http=True) as client:
        broken = client.post("/v1/describe", json={"image_url": images.url("/broken.jpg"), "prompt": "x"})
        missing = client.post("/v1/describe", json={"image_url": images.url("/nope.jpg"), "prompt": "x"})
        not_url = client.post("/v1/describe", json={"image_url": "file:///etc/passwd", "prompt": "x"})
        no_prompt = client.post("/v1/describe", json={"image_url": images.url("/photo.jpg")})
        upload = client.post("/v1/describe/upload", files={"image": ("a.jpg", b"", "image/jpeg")},
                             data={"prompt": "x"})
        fine = client.post("/v1/describe", json={"image_url": images.url("/photo.jpg"), "prompt": "x"})
    assert broken.status_code == 422 and broken.json()["detail"].startswith(
        "ImageDecodeError: corrupt or truncated JPEG image")
    assert missing.status_code == 422 and missing.json()["detail"].startswith("DownloadError: GET ")
    assert "HTTP 404" in missing.json()["detail"]
    assert not_url.status_code == 422 and "must be an http(s) URL" in not_url.json()["detail"]
    assert no_prompt.status_code == 422 and "prompt" in no_prompt.text
    assert upload.status_code == 422 and "ImageDecodeError: empty input" in upload.json()["detail"]
    assert fine.status_code == 200
    failed = [r for r in captured.by_name("request") if r.status.status_code is StatusCode.ERROR]
    assert len(failed) == 3 and len(captured.by_name("request")) == 4


def test_model_failure_is_a_500_with_its_message_on_every_request_of_the_batch(captured, propagating):
    def broken(pixels, prompt_ids):
        raise MemoryError("CUDA out of memory")

    with _client(captured, instrument_http=False, model=broken) as client:
        reply = client.post("/v1/describe/upload", files={"image": ("p.jpg", PHOTO, "image/jpeg")},
                            data={"prompt": "x"})
    assert reply.status_code == 500
    assert reply.json()["detail"] == "inference failed: MemoryError: CUDA out of memory"
    assert captured.one("forward").status.status_code is StatusCode.ERROR
    assert captured.one(semconv.SPAN_BATCH).status.status_code is StatusCode.ERROR


def test_concurrent_http_requests_each_keep_their_stages_and_batches_link_members(captured, images,
                                                                                    propagating):
    n = 16
    with _client(captured, instrument_http=True) as client:
        def post(i: int) -> int:
            return client.post("/v1/describe", json={"image_url": images.url("/photo.jpg"),
                                                     "prompt": f"p{i}"}).status_code

        with ThreadPoolExecutor(max_workers=n) as pool:
            assert list(pool.map(post, range(n))) == [200] * n
    requests = captured.by_name("request")
    assert len(requests) == n
    for request in requests:
        kids = _children(captured, request)
        assert set(kids) == STAGES and all(len(v) == 1 for v in kids.values())
    linked = [link.context.span_id for b in captured.by_name(semconv.SPAN_BATCH) for link in b.links]
    assert sorted(linked) == sorted(r.context.span_id for r in requests)
    assert not trace.get_current_span().get_span_context().is_valid
