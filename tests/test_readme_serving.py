"""The README's "Serving" examples, run as written: the FastAPI handler, the batching worker (results
and errors back to the caller) and the gunicorn deployment (the command tests/test_gunicorn.py
runs, and the hooks of examples/gunicorn_conf.py)."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from opentelemetry.trace import StatusCode

from otel_stages import propagation, semconv
from tests.conftest import DATA
from tests.test_gunicorn import GUNICORN_ARGS

ROOT = Path(__file__).resolve().parents[1]


def _serving_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Serving\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


BLOCKS = _serving_blocks()
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
BASH = [code for lang, code in BLOCKS if lang == "bash"]


@pytest.fixture
def propagating():
    was_on = propagation.is_instrumented()
    propagation.instrument()  # what configure() does
    yield
    if not was_on:
        propagation.uninstrument()


def test_the_section_has_the_three_examples():
    assert len(PYTHON) == 3 and len(BASH) == 2
    assert "FastAPI()" in PYTHON[0] and "dequeue_batch" in PYTHON[1] and "post_fork" in PYTHON[2]


def test_fastapi_handler_example(captured, propagating):
    namespace: dict = {}
    exec(compile(PYTHON[0], "README.md:serving-fastapi", "exec"), namespace)
    photo = (DATA / "images" / "photo_320x240.jpg").read_bytes()
    try:
        with TestClient(namespace["app"]) as client:
            good = client.post("/describe", files={"image": ("p.jpg", photo)}, data={"prompt": "hi"})
            bad = client.post("/describe", files={"image": ("b.jpg", photo[:2000])}, data={"prompt": "x"})
    finally:
        namespace["worker"].close()
        namespace["pool"].shutdown()
    assert good.status_code == 200 and len(good.json()["embedding"]) == 64
    assert bad.status_code == 422 and bad.json()["detail"].startswith("ImageDecodeError: ")
    ok, failed = captured.by_name("request")
    assert {c.name for c in captured.children(ok)} == {"decode", "resize", "queue", "forward"}
    assert failed.status.status_code is StatusCode.ERROR
    assert {c.name for c in captured.children(failed)} == {"decode"}


def _worker_namespace() -> dict:
    namespace: dict = {}
    exec(compile(PYTHON[1], "README.md:serving-worker", "exec"), namespace)
    return namespace


def test_batching_worker_example_returns_results_and_links_batches(captured, propagating):
    ns = _worker_namespace()
    start = threading.Barrier(16)

    def call(i: int):
        start.wait(5)
        return ns["handle"](f"r-{i}", i)

    ns["thread"].start()
    with ThreadPoolExecutor(max_workers=16) as pool:
        assert list(pool.map(call, range(16))) == [2 * i for i in range(16)]
    ns["work"].put(None)
    ns["thread"].join(5)
    requests = {r.context.span_id: r for r in captured.by_name("request")}
    assert sorted(r.attributes[semconv.REQUEST_ID] for r in requests.values()) == sorted(
        f"r-{i}" for i in range(16))
    linked = [link.context.span_id for b in captured.by_name("batch") for link in b.links]
    assert sorted(linked) == sorted(requests)
    assert all(f.parent.span_id in requests for f in captured.by_name("forward"))


def test_batching_worker_example_gives_the_model_error_to_every_caller(captured):
    ns = _worker_namespace()

    def broken(items):
        raise MemoryError("CUDA out of memory")

    thread = threading.Thread(target=ns["executor"], args=(broken,))
    thread.start()
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(ns["handle"], f"r-{i}", i) for i in range(3)]
        for future in futures:
            with pytest.raises(MemoryError, match="CUDA out of memory"):
                future.result(timeout=5)
    ns["work"].put(None)
    thread.join(5)
    assert all(s.status.status_code is StatusCode.ERROR for s in captured.by_name("forward"))


def test_batching_worker_example_timeout_and_one_at_a_time(captured):
    ns = _worker_namespace()
    assert ns["handle"]("late", 1, timeout_s=0.01) is None  # no executor running
    late = captured.one("request")
    assert late.status.status_code is StatusCode.ERROR and late.attributes[semconv.ERROR_TYPE] == "TimeoutError"
    ns["work"].get_nowait()  # the stranded item
    thread = threading.Thread(target=ns["one_at_a_time"], args=(lambda xs: [x + 1 for x in xs],))
    thread.start()
    assert ns["handle"]("single", 41) == 42
    ns["work"].put(None)
    thread.join(5)
    (single,) = [r for r in captured.by_name("request") if r.attributes[semconv.REQUEST_ID] == "single"]
    assert {c.name for c in captured.children(single)} == {"queue", "forward"}


def test_gunicorn_example_is_what_the_gunicorn_test_runs():
    assert BASH[1].strip() == "gunicorn " + " ".join(GUNICORN_ARGS)
    conf = (ROOT / "examples" / "gunicorn_conf.py").read_text()

    def code_lines(source: str) -> list[str]:
        return [line.split("#")[0].strip() for line in source.splitlines()
                if line.split("#")[0].strip() and not line.strip().startswith(('"""', "#"))]

    conf_code = code_lines(conf)
    for line in code_lines(PYTHON[2]):
        assert line in conf_code, f"README hook line not in examples/gunicorn_conf.py: {line}"
