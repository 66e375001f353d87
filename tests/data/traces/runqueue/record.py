"""Record the run-queue wait cases of README.md with the library, ``configure(run_queue=True)``.

* ``idle``: decode is a fixed amount of real CPU work (Pillow decodes and resizes
  ``tests/data/images/photo_320x240.jpg`` several times, about 20 ms) plus ``time.sleep`` of
  0-80 ms, one request at a time, while two ``SCHED_IDLE`` busy loops run beside it (``chrt -i 0
  python -c 'while 1: pass'``, a low-priority batch job; killed at the end). The host's CPU
  pressure is high during every stage; the decode thread itself hardly waits for a core.
* ``hog``: decode is the same CPU work, two requests at a time, while twelve threads hash 8 MB
  buffers with hashlib (which releases the GIL) in bursts of 0.3-0.8 s: the decode threads wait
  in the run queue for a core, the slow runs get less than a tenth of one.

Usage: python record.py MODE DATA_DIR [REQUESTS]."""

from __future__ import annotations

import hashlib
import io
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

from PIL import Image

import otel_stages as ots

#: hashing threads in the ``hog`` mode: with the two decode threads, 7 runnable threads a core
HASHERS = 12
IMAGE = Path(__file__).resolve().parents[2] / "images" / "photo_320x240.jpg"


def cpu_work(raw: bytes) -> Image.Image:
    """About 20 ms of Pillow work on a free core (decode and resize, repeated)."""
    image = Image.open(io.BytesIO(raw))
    for _ in range(2):
        image = Image.open(io.BytesIO(raw))
        image.load()
        image = image.resize((640, 480)).resize((224, 224))
    return image


def main() -> None:
    mode, data = sys.argv[1], Path(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    rng = random.Random(13)
    raw = IMAGE.read_bytes()
    telemetry = ots.configure(service_name=f"runq-{mode}", data_dir=data, gpu="off",
                              run_queue=True)
    stop = threading.Event()
    hogging = threading.Event()
    background: list[subprocess.Popen[bytes]] = []
    if mode == "idle":
        background = [subprocess.Popen(["chrt", "-i", "0", sys.executable, "-c", "while 1: pass"])
                      for _ in range(2)]
    elif mode == "hog":
        def hasher() -> None:
            buf = os.urandom(8 << 20)
            while not stop.is_set():
                if hogging.is_set():
                    hashlib.sha256(buf).digest()
                else:
                    time.sleep(0.005)

        def burster() -> None:
            while not stop.is_set():
                hogging.set()
                time.sleep(rng.uniform(0.3, 0.8))
                hogging.clear()
                time.sleep(rng.uniform(0.3, 0.8))

        for target in (*[hasher] * HASHERS, burster):
            threading.Thread(target=target, daemon=True).start()
    sleeps = [rng.uniform(0.0, 0.08) for _ in range(n)]
    lock = threading.Lock()
    todo = list(range(n))

    def handle(i: int) -> None:
        with ots.request():
            with ots.stage("download"):
                body = raw
            with ots.stage("decode", **{"image.width": 320, "image.height": 240,
                                        "image.format": "JPEG"}):
                image = cpu_work(body)
                if mode == "idle":
                    time.sleep(sleeps[i])
            with ots.stage("forward"):
                image.convert("L").histogram()

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            handle(i)
            if mode == "idle":
                time.sleep(0.02)

    try:
        workers = [threading.Thread(target=worker) for _ in range(2 if mode == "hog" else 1)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        stop.set()
        for p in background:
            p.kill()
            p.wait()
    telemetry.shutdown()


if __name__ == "__main__":
    main()
