"""A real gunicorn, 3 preloaded uvicorn workers on 127.0.0.1 serving examples/fastapi_app.py: spans
and GPU samples (the stand-in NVML library under the real bindings) arrive from every worker, each
with its own service.instance.id, request.seq from 1 and one cold start, and the report says so."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from otel_stages import semconv
from otel_stages.analysis import load_paths
from otel_stages.analysis.requests import find_requests
from otel_stages.cli import main
from otel_stages.demo.server import ImageServer
from tests.conftest import DATA
from tests.test_gpu_fakelib import fake_lib  # noqa: F401 - the session fixture

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 3
DEADLINE_S = 60.0  # bounded: the whole exchange gives up after this
WAVE = 12
#: The README's gunicorn command (tests/test_readme_serving.py checks they are the same).
GUNICORN_ARGS = ["-c", "examples/gunicorn_conf.py", "-w", str(WORKERS), "--preload", "-k",
                 "uvicorn.workers.UvicornWorker", "examples.fastapi_app:app"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _workers_with_spans(folder: Path) -> set[str]:
    """pids (from the file names) whose span file already holds exported spans."""
    return {p.name.split("-")[2] for p in folder.glob("traces-*.jsonl") if p.stat().st_size > 0}


@pytest.mark.slow
def test_gunicorn_three_preloaded_workers_each_report_their_own_cold_start(tmp_path, fake_lib,  # noqa: F811
                                                                           capsys):
    data_dir = tmp_path / "telemetry"
    port = _free_port()
    env = {**os.environ, "OTEL_STAGES_DATA_DIR": str(data_dir), "EXAMPLE_MODEL": "small",
           "OTEL_SERVICE_NAME": "describe-test", "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_STAGES_METRIC_EXPORT_INTERVAL_S": "0.2", "OTEL_STAGES_GPU_INTERVAL_S": "0.1",
           "LD_LIBRARY_PATH": str(fake_lib), "PYTHONPATH": str(ROOT)}
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_STAGES_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED",
                "OTEL_STAGES_ENABLED", "OTEL_STAGES_GPU", "OTEL_TRACES_SAMPLER", "PYTEST_CURRENT_TEST"):
        env.pop(var, None)
    command = [sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{port}", *GUNICORN_ARGS]
    photo = (DATA / "images" / "photo_320x240.jpg").read_bytes()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    sent = 0
    try:
        with ImageServer({"/photo.jpg": photo}) as images:
            deadline = time.monotonic() + DEADLINE_S
            while True:  # up: bounded wait for the workers to listen
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "gunicorn did not come up"
                time.sleep(0.1)

            def post(i: int) -> int:  # a new connection each: the workers share the accepts
                reply = httpx.post(f"{base}/v1/describe", timeout=30, headers={"connection": "close"},
                                   json={"image_url": images.url("/photo.jpg"), "prompt": f"p{i}"})
                assert reply.status_code == 200, reply.text
                return i

            with ThreadPoolExecutor(max_workers=WAVE) as pool:
                while len(_workers_with_spans(data_dir)) < WORKERS:  # until every worker served
                    assert time.monotonic() < deadline, "requests never reached every worker"
                    sent += len(list(pool.map(post, range(sent, sent + WAVE))))
    finally:
        server.send_signal(signal.SIGTERM)  # graceful: workers flush in worker_exit
        try:
            output, _ = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            output, _ = server.communicate()
    assert server.returncode == 0, output
    assert "configure() ran before fork()" not in output  # nothing configured in the master

    recording = load_paths(sorted(data_dir.glob("*.jsonl")))
    assert recording.problems == []
    requests = find_requests(recording.spans)
    assert len(requests) == sent
    by_worker = defaultdict(list)
    for req in requests:
        by_worker[req.resource[semconv.SERVICE_INSTANCE_ID]].append(req)
    assert len(by_worker) == WORKERS  # each worker its own service.instance.id
    for reqs in by_worker.values():
        assert sorted(r.seq for r in reqs) == list(range(1, len(reqs) + 1))  # seq from 1
        assert [r.seq for r in reqs if r.cold] == [1]  # one cold start each
    gpu_workers = {p.resource.get(semconv.SERVICE_INSTANCE_ID) for p in recording.metrics
                   if p.name == semconv.HW_GPU_UTILIZATION}
    assert gpu_workers == set(by_worker)  # GPU samples from every worker

    assert main(["report", str(data_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] == sent and report["cold_start"] is not None
    # one cold request per worker; on a loaded machine one may take no longer than the warm
    # requests of its input (then counted apart: without_penalty), so the text's figure varies
    cold = report["cold_start"]
    assert cold["count"] + cold["without_penalty"] == WORKERS
    assert report["batches"]["batches"] >= 1 and report["batches"]["unmatched_members"] == 0
    assert main(["report", str(data_dir)]) == 0
    text = capsys.readouterr().out
    assert f"{WORKERS} cold" in text  # one per worker
    assert (f"{cold['count']} of the {WORKERS} cold requests" if cold["without_penalty"]
            else f"{WORKERS} first requests (median)") in text


@pytest.mark.slow
def test_uvicorn_from_the_repository_root_serves_and_flushes_on_sigterm(tmp_path):
    """``uvicorn examples.fastapi_app:app`` as documented. uvicorn re-raises SIGTERM after its
    shutdown (atexit never runs), so the spans must be flushed by the app's lifespan."""
    data_dir = tmp_path / "telemetry"
    port = _free_port()
    env = {**os.environ, "OTEL_STAGES_DATA_DIR": str(data_dir), "EXAMPLE_MODEL": "small",
           "OTEL_STAGES_GPU": "off"}
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_STAGES_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED",
                "OTEL_STAGES_ENABLED", "OTEL_TRACES_SAMPLER", "PYTEST_CURRENT_TEST"):
        env.pop(var, None)
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "examples.fastapi_app:app", "--port", str(port)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    photo = (DATA / "images" / "photo_320x240.jpg").read_bytes()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "uvicorn did not come up"
            time.sleep(0.1)
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/describe/upload", timeout=30,
                           files={"image": ("p.jpg", photo, "image/jpeg")}, data={"prompt": "hi"})
        assert reply.status_code == 200, reply.text
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            output, _ = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            output, _ = server.communicate()
    assert "Application shutdown complete" in output
    spans = load_paths(sorted(data_dir.glob("traces-*.jsonl"))).spans
    (request,) = [s for s in spans if s.name == "request"]
    assert format(int(reply.json()["trace_id"], 16), "032x") == request.trace_id
    assert {s.name for s in spans if s.parent_span_id == request.span_id} == {
        "decode", "resize", "queue", "forward"}
