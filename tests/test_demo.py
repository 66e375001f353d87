"""The built-in demo: images, server, model, worker, and ``otel-stages demo`` end to end."""

from __future__ import annotations

import json
import re
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

import otel_stages as ots
from otel_stages import imaging, semconv
from otel_stages._runtime import RUNTIME
from otel_stages.analysis import load_paths
from otel_stages.cli import main
from otel_stages.demo.images import DemoImage, demo_images, jpeg_photo, photo, truncated_jpeg
from otel_stages.demo.model import Encoder, EncoderConfig, build_model, tokenize
from otel_stages.demo.pipeline import MALFORMED_PATH, mixed_jobs, to_tensor
from otel_stages.demo.server import ImageServer
from otel_stages.demo.worker import THREAD_NAME, THREAD_NAME_ATTR, InferenceWorker, WorkerClosed
from tests.otlp_receiver import http_receiver

SMALL = EncoderConfig(image_size=32, patch=16, dim=32, heads=2, depth=2, prompt_len=8)
ENV_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SDK_DISABLED",
            "OTEL_STAGES_ENABLED", "OTEL_STAGES_DATA_DIR", "OTEL_STAGES_EXPORTER_OTLP_ENDPOINT",
            "OTEL_STAGES_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT")


@pytest.fixture
def clean_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    saved = (RUNTIME.tracer, RUNTIME.enabled, RUNTIME.clock)
    yield monkeypatch
    RUNTIME.tracer, RUNTIME.enabled, RUNTIME.clock = saved


# -- images ---------------------------------------------------------------------------------------
def test_photo_is_deterministic_and_photo_like():
    a, b = jpeg_photo((160, 120), seed=7), jpeg_photo((160, 120), seed=7)
    assert a == b and a != jpeg_photo((160, 120), seed=8)
    pixels = np.asarray(photo((160, 120), seed=7), dtype=np.float32)
    assert pixels.shape == (120, 160, 3)
    assert pixels.std() > 10  # not a flat colour


def test_exif_orientation_and_truncation_behave_like_real_files():
    rotated = imaging.decode(jpeg_photo((64, 48), seed=1, orientation=6))
    assert rotated.size == (48, 64)  # displayed size: EXIF applied
    with pytest.raises(imaging.ImageDecodeError, match="truncated"):
        imaging.decode(truncated_jpeg(jpeg_photo((640, 480), seed=1)))


def test_catalogue_sizes_decode_as_declared():
    catalogue = demo_images(seed=3, thumbnails=1, photos=2)
    kinds = sorted(im.kind for im in catalogue.values())
    assert kinds == ["fixed", "malformed", "photo", "photo", "thumbnail"]
    for image in catalogue.values():
        if image.kind != "malformed":
            assert imaging.decode(image.data).size == (image.width, image.height), image.path
    assert catalogue["/img/photo-1.jpg"].width == 3000  # EXIF-rotated 4000x3000
    assert len(catalogue["/img/photo-0.jpg"].data) > 1_000_000  # a real 12 MP JPEG weight


# -- server ---------------------------------------------------------------------------------------
def test_server_serves_bytes_and_404_on_loopback_only():
    with ImageServer({"/img/a.jpg": b"\xff\xd8abc"}) as server:
        assert server.url("/img/a.jpg").startswith("http://127.0.0.1:")
        ok = httpx.get(server.url("/img/a.jpg"))
        assert ok.status_code == 200 and ok.content == b"\xff\xd8abc"
        assert ok.headers["content-type"] == "image/jpeg"
        assert httpx.head(server.url("/img/a.jpg")).headers["content-length"] == "5"
        missing = httpx.get(server.url("/img/nope.jpg"))
        assert missing.status_code == 404 and b"/img/nope.jpg" in missing.content
        with pytest.raises(imaging.DownloadError, match="HTTP 404"):
            imaging.download(server.url("/img/nope.jpg"))
    with pytest.raises(RuntimeError):
        _ = server.port  # stopped


# -- model ----------------------------------------------------------------------------------------
def _inputs(batch: int, seed: int = 0, cfg: EncoderConfig = SMALL) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    pixels = rng.random((batch, 3, cfg.image_size, cfg.image_size), dtype=np.float32)
    prompts = np.stack([tokenize(f"prompt {i}", cfg.prompt_len) for i in range(batch)])
    return pixels, prompts


def test_model_shapes_batch_and_determinism():
    import onnx

    onnx.checker.check_model(build_model(SMALL, seed=0))
    encoder = Encoder(SMALL, seed=0)
    assert not encoder.loaded  # lazy: the session is made by the first run (the cold start)
    pixels, prompts = _inputs(3)
    out = encoder.run(pixels, prompts)
    assert encoder.loaded and out.shape == (3, SMALL.dim) and out.dtype == np.float32
    # a batch gives the same rows as one-by-one runs
    for i in range(3):
        np.testing.assert_allclose(encoder.run(pixels[i:i + 1], prompts[i:i + 1])[0], out[i],
                                   rtol=1e-4, atol=1e-5)
    # same seed -> same weights -> same output; another seed -> different
    np.testing.assert_array_equal(Encoder(SMALL, seed=0).run(pixels, prompts), out)
    assert not np.allclose(Encoder(SMALL, seed=1).run(pixels, prompts), out)
    # different images and different prompts give different embeddings
    assert not np.allclose(out[0], out[1])
    same_image = encoder.run(np.stack([pixels[0], pixels[0]]), prompts[:2])
    assert not np.allclose(same_image[0], same_image[1])
    with pytest.raises(ValueError, match="pixels: expected"):
        encoder.run(pixels[:, :, :16], prompts)


def test_default_model_on_real_images():
    encoder = Encoder(seed=0)  # the demo's ViT-Tiny-sized default
    size = encoder.config.image_size
    a, b = (to_tensor(imaging.decode(jpeg_photo((320, 240), seed=s)).resize((size, size)))
            for s in (1, 2))
    assert a.shape == (3, size, size) and a.min() >= 0.0 and a.max() <= 1.0
    prompt = tokenize("Describe this photo.", encoder.config.prompt_len)
    out = encoder.run(np.stack([a, b]), np.stack([prompt, prompt]))
    assert out.shape == (2, encoder.config.dim) and np.isfinite(out).all()
    assert not np.allclose(out[0], out[1])


def test_tokenize_pads_and_truncates():
    assert tokenize("ab", 4).tolist() == [98, 99, 0, 0]
    assert tokenize("abcdef", 3).tolist() == [98, 99, 100]


# -- worker ---------------------------------------------------------------------------------------
class GatedModel:
    """Blocks in its first call until released, so later items pile up behind it."""

    def __init__(self, fail_on_call: int | None = None) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls: list[int] = []
        self.fail_on_call = fail_on_call

    def __call__(self, pixels: np.ndarray, prompts: np.ndarray) -> np.ndarray:
        self.calls.append(len(pixels))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(timeout=10), "test never released the model"
        if self.fail_on_call == len(self.calls):
            raise RuntimeError(f"out of memory in batch of {len(pixels)}")
        return pixels.reshape(len(pixels), -1).sum(axis=1, keepdims=True) + prompts[:, :1]


def _pile_up(worker: InferenceWorker, model: GatedModel, producers: int):
    """One request runs (blocked in the model) while ``producers`` threads each submit one more."""
    with ots.request(**{THREAD_NAME_ATTR: threading.current_thread().name}):
        first = worker.submit(np.zeros((3, 2, 2), np.float32), np.array([100]))
    assert model.entered.wait(timeout=10)
    submitted = threading.Barrier(producers + 1, timeout=10)

    def produce(i: int):
        with ots.request(**{THREAD_NAME_ATTR: threading.current_thread().name}):
            future = worker.submit(np.full((3, 2, 2), i, np.float32), np.array([i]))
            submitted.wait()
            return future.exception(timeout=10) or future.result()

    pool = ThreadPoolExecutor(max_workers=producers)
    results = [pool.submit(produce, i) for i in range(producers)]
    submitted.wait()  # every producer has queued its item while the model is busy
    model.release.set()
    return first, [r.result(timeout=10) for r in results], pool


def test_worker_batches_concurrent_producers_and_parents_spans(captured):
    model = GatedModel()
    with InferenceWorker(model, max_batch=4, max_wait_ms=50) as worker:
        first, results, pool = _pile_up(worker, model, producers=3)
        pool.shutdown()
    assert first.result() == [100.0]
    assert [float(r[0]) for r in results] == [0 * 12 + 0, 1 * 12 + 1, 2 * 12 + 2]
    assert model.calls == [1, 3] and worker.batch_sizes == [1, 3]
    requests = {s.context.span_id: s for s in captured.by_name("request")}
    forwards, queues = captured.by_name("forward"), captured.by_name("queue")
    assert len(requests) == len(forwards) == len(queues) == 4
    for span in forwards + queues:
        assert span.parent.span_id in requests, span.name
    assert {f.parent.span_id for f in forwards} == set(requests)  # one forward per request
    for forward in forwards:
        assert forward.attributes[THREAD_NAME_ATTR] == THREAD_NAME  # ran on the executor...
        assert requests[forward.parent.span_id].attributes[THREAD_NAME_ATTR] != THREAD_NAME
    assert sorted(f.attributes[semconv.BATCH_SIZE] for f in forwards) == [1, 3, 3, 3]
    # depths at enqueue: 0 for the first (queue empty), then 0, 1, 2 while the model was busy
    assert sorted(q.attributes[semconv.QUEUE_DEPTH] for q in queues) == [0, 0, 1, 2]


def test_worker_forward_error_reaches_every_future_of_the_batch(captured):
    model = GatedModel(fail_on_call=2)
    with InferenceWorker(model, max_batch=4, max_wait_ms=50) as worker:
        first, results, pool = _pile_up(worker, model, producers=3)
        pool.shutdown()
        later = worker.infer(np.ones((3, 2, 2), np.float32), np.array([1]))  # worker lives on
    assert first.result() == [100.0] and later.tolist() == [13.0]
    assert all(isinstance(r, RuntimeError) and "batch of 3" in str(r) for r in results)
    failed = [f for f in captured.by_name("forward") if not f.status.is_ok]
    assert len(failed) == 3 and all("out of memory" in f.status.description for f in failed)
    with pytest.raises(WorkerClosed):
        worker.submit(np.ones((3, 2, 2), np.float32), np.array([1]))


def test_worker_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_batch"):
        InferenceWorker(lambda p, q: p, max_batch=0)
    for wait in (-5.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite max_wait_ms >= 0"):
            InferenceWorker(lambda p, q: p, max_wait_ms=wait)


def test_worker_whose_loop_dies_fails_waiting_and_later_requests(captured):
    """A bug in the executor loop (here: collecting a batch raises) must not strand producers."""
    model = GatedModel()
    worker = InferenceWorker(model, max_batch=4, max_wait_ms=0)
    collect, calls = worker._collect, []

    def broken_collect(items):
        calls.append(len(items))
        if len(calls) == 2:
            raise OverflowError("timeout value is too large")
        return collect(items)

    worker._collect = broken_collect  # the loop looks it up per batch
    pixels, prompt = np.zeros((3, 2, 2), np.float32), np.array([1])
    first = worker.submit(pixels, prompt)
    assert model.entered.wait(timeout=10)
    in_hand, queued = worker.submit(pixels, prompt), worker.submit(pixels, prompt)
    model.release.set()
    assert first.result(timeout=10).tolist() == [1.0]
    for future in (in_hand, queued):  # the batch being collected and what waited behind it
        error = future.exception(timeout=10)
        assert isinstance(error, WorkerClosed) and "executor thread died" in str(error)
        assert isinstance(error.__cause__, OverflowError)
    with pytest.raises(WorkerClosed, match="executor thread died: OverflowError"):
        worker.submit(pixels, prompt)
    worker.close(timeout_s=5)  # the dead thread joins at once


@pytest.mark.parametrize("value", ["-5", "inf", "nan", "10001", "soon"])
def test_demo_rejects_bad_max_wait_up_front(value, tmp_path, clean_env, capsys):
    with pytest.raises(SystemExit) as info:  # a short plan: before the fix it ran (or stalled)
        main(["demo", "--max-wait-ms", value, "--requests", "2", "--mixed", "0",
              "--data-dir", str(tmp_path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--max-wait-ms" in err and repr(value) in err and "Traceback" not in err


def test_mixed_jobs_mix_sizes_with_one_malformed():
    catalogue = {p: DemoImage(p, b"", kind, 1, 1) for p, kind in [
        ("/img/fixed.jpg", "fixed"), ("/img/thumb-0.jpg", "thumbnail"),
        ("/img/thumb-1.jpg", "thumbnail"), ("/img/photo-0.jpg", "photo"),
        (MALFORMED_PATH, "malformed")]}
    jobs = mixed_jobs(10, catalogue, seed=5)
    paths = [j.path for j in jobs]
    assert paths == [j.path for j in mixed_jobs(10, catalogue, seed=5)]
    assert paths.count(MALFORMED_PATH) == 1
    assert any("thumb" in p for p in paths) and any("photo" in p for p in paths)
    assert mixed_jobs(1, catalogue)[0].path != MALFORMED_PATH


# -- end to end -----------------------------------------------------------------------------------
def _raw_spans(path: Path) -> list[dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [s for line in lines for rs in line["resourceSpans"] for ss in rs["scopeSpans"]
            for s in ss["spans"]]


@pytest.mark.slow
def test_demo_end_to_end(tmp_path, clean_env, capsys):
    fixed, mixed = 6, 4
    assert main(["demo", "--requests", str(fixed), "--mixed", str(mixed), "--data-dir",
                 str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)  # stdout is the JSON report alone
    traces = list(tmp_path.glob("traces-*.jsonl"))
    assert len(traces) == 1 and f"traces written to {traces[0]}" in err
    assert "failed on its own: ImageDecodeError" in err

    # The report counts every request sent (the failed one included).
    assert report["requests"] == fixed + mixed
    assert set(semconv.STANDARD_STAGES) <= set(report["stages"])
    cold = report["cold_start"]
    assert cold is not None and cold["total_ms"] > 0
    # the model session is created inside the first forward: the cold forward is the slow one
    assert cold["stages"]["forward"] > report["stages"]["forward"]["median_ms"]

    spans = load_paths(traces).spans
    by_id = {s.span_id: s for s in spans}
    requests = [s for s in spans if s.name == "request"]
    assert len(requests) == fixed + mixed
    assert sum(r.attributes[semconv.REQUEST_COLD_START] for r in requests) == 1
    # the demo turns the run-queue wait on (Linux): the decode spans carry it
    if Path("/proc/thread-self/schedstat").exists():
        assert any(semconv.THREAD_RUN_QUEUE_WAIT_MS in s.attributes for s in spans
                   if s.name == "decode")
    for span in spans:
        if span.name in ("queue", "forward"):
            assert by_id[span.parent_span_id].name == "request"
        if span.name == "forward":
            assert span.attributes[THREAD_NAME_ATTR] == THREAD_NAME
            assert by_id[span.parent_span_id].attributes[THREAD_NAME_ATTR] != THREAD_NAME
            assert span.end_ns > span.start_ns and span.attributes[semconv.BATCH_SIZE] >= 1

    # The malformed image fails its own request, with a precise message; the rest are intact.
    raw = {s["spanId"]: s for s in _raw_spans(traces[0])}
    failed = [s for s in raw.values() if s.get("status", {}).get("code") == 2 and s["name"] == "decode"]
    assert len(failed) == 1
    message = failed[0]["status"]["message"]
    assert message.startswith("ImageDecodeError: corrupt or truncated JPEG image") and "truncated" in message
    failed_request = by_id[failed[0]["parentSpanId"]]
    assert failed_request.error and failed_request.attributes["demo.image"] == MALFORMED_PATH
    kids: dict[str, set[str]] = {}
    for span in spans:
        if span.parent_span_id in by_id and by_id[span.parent_span_id].name == "request":
            kids.setdefault(span.parent_span_id, set()).add(span.name)
    assert kids[failed_request.span_id] == {"download", "decode"}
    intact = [r for r in requests if r.span_id != failed_request.span_id]
    assert all(kids[r.span_id] == set(semconv.STANDARD_STAGES) and not r.error for r in intact)

    # One batch span per model call, linking the requests it served; the report sums them up.
    batches = [s for s in spans if s.name == semconv.SPAN_BATCH]
    assert all(b.parent_span_id is None for b in batches)
    assert sorted(len(b.links) for b in batches) == sorted(b.attributes[semconv.BATCH_SIZE] for b in batches)
    assert {link for b in batches for link in b.links} == {(r.trace_id, r.span_id) for r in intact}
    summary = report["batches"]
    assert summary["batches"] == len(batches)
    assert sum(int(size) * n for size, n in summary["sizes"].items()) == len(intact)
    assert summary["unmatched_members"] == 0 and summary["wait_ms"]["max_ms"] >= 0
    assert summary["fill_ms"]["max_ms"] <= summary["wait_ms"]["max_ms"] + 1e-6


@pytest.mark.slow
def test_demo_text_report_and_disabled(tmp_path, clean_env, capsys):
    assert main(["demo", "--requests", "3", "--mixed", "0", "--data-dir", str(tmp_path)]) == 0
    out, _ = capsys.readouterr()
    assert "Verdict:" in out and "traces written to" in out
    assert "Batches:" in out and "3 batches, mean size 1.0" in out  # sequential: one per call
    clean_env.setenv("OTEL_SDK_DISABLED", "true")
    assert main(["demo", "--requests", "2", "--mixed", "0", "--data-dir", str(tmp_path)]) == 1
    assert "telemetry is disabled" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_exports_to_collector_and_reports_from_local_copy(tmp_path, clean_env, capsys):
    with http_receiver() as (endpoint, received):
        clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        assert main(["demo", "--requests", "3", "--mixed", "0", "--data-dir", str(tmp_path),
                     "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["requests"] == 3
    assert f"traces exported to OTLP http/protobuf {endpoint}" in err
    names = [span.name for req in received.traces
             for rs in req.resource_spans for ss in rs.scope_spans for span in ss.spans]
    assert names.count("request") == 3 and names.count("forward") == 3
    copies = list(tmp_path.glob("traces-*-demo-copy.jsonl"))
    assert len(copies) == 1 and len(_raw_spans(copies[0])) == len(names)


def test_to_tensor_layout():
    image = Image.new("RGB", (4, 2), (255, 0, 51))
    tensor = to_tensor(image)
    assert tensor.shape == (3, 2, 4) and tensor.dtype == np.float32
    np.testing.assert_allclose(tensor[:, 0, 0], [1.0, 0.0, 0.2], atol=1e-6)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_demo_with_dead_collector_warns_and_exits_1(tmp_path, clean_env, capsys):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    clean_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.2")  # seconds: stop retrying quickly
    assert main(["demo", "--requests", "2", "--mixed", "0", "--data-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "Verdict:" in out  # the local report is still made
    assert re.search(rf"demo: warning: [1-9]\d* span export batch(es)? to OTLP http/protobuf "
                     rf"{re.escape(endpoint)} failed \(is a collector listening\?\)", err), err
    assert "traces exported to" not in out + err
    assert "traces not (all) exported to" in out
