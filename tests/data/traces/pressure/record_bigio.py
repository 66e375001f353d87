"""Record the ``bigio`` service (README.md): decode is a fixed amount of real CPU work (Pillow
decodes and resizes a 1920x1080 JPEG) plus a blocking wait of 0-250 ms (a read from a pipe whose
writer sleeps that long first: a slow disk or socket), one request at a time, signals and the
cgroup / CPU pressure sampler on. Usage: python record_bigio.py DATA_DIR [REQUESTS]."""

from __future__ import annotations

import io
import os
import random
import sys
import threading
import time
from pathlib import Path

from PIL import Image

import otel_stages as ots

IMAGE = Path(__file__).resolve().parents[2] / "images" / "photo_1920x1080.jpg"


def slow_read(delay_s: float) -> bytes:
    """Block in os.read until a writer thread, after ``delay_s``, writes (a slow device)."""
    r, w = os.pipe()

    def writer() -> None:
        time.sleep(delay_s)
        os.write(w, b"x" * 64)
        os.close(w)

    threading.Thread(target=writer, daemon=True).start()
    try:
        return os.read(r, 64)
    finally:
        os.close(r)


def main() -> None:
    data = Path(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    rng = random.Random(13)
    raw = IMAGE.read_bytes()
    telemetry = ots.configure(service_name="bigio", data_dir=data, gpu="off")
    for _ in range(n):
        with ots.request():
            with ots.stage("download"):
                body = io.BytesIO(raw)
            # the input's size and format, as otel_stages.imaging.decode records them
            with ots.stage("decode", **{"image.width": 1920, "image.height": 1080,
                                        "image.format": "JPEG"}):
                image = Image.open(body)
                image.load()
                image = image.resize((960, 540))
                slow_read(rng.uniform(0.0, 0.25))
            with ots.stage("forward"):
                image.convert("L").histogram()
        time.sleep(0.05)
    telemetry.shutdown()


if __name__ == "__main__":
    main()
