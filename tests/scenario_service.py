"""A small image service recorded through the library, for the HTML report's browser test.

Everything real but the model: the SDK with its embedded OTLP/JSON file exporter
(``otel_stages.configure``), Pillow decode / resize through ``otel_stages.imaging`` on JPEG and PNG
bytes made here, a thread pool and an asyncio event loop (``thread.name`` and
``otel_stages.event_loop.running`` are recorded by imaging), untraced work between the stages
(unaccounted time). The forward stage is a sleep: this machine has no GPU and the test needs a
model that, like cuDNN autotuning or ``torch.compile`` with dynamic shapes, pays again on the first
request of a new input shape, so one PNG request is set apart as cold.

The recording has: a cold first request; 22 sequential 1600x1200 JPEG requests; 7 640x480 PNG
requests from a pool of 3 threads (the first one slow: set apart as a new input); 4 JPEG requests
handled on an asyncio event loop. Cohort keys carry the format (``1600x1200 JPEG``,
``640x480 PNG``); the PNG cohort's verdict is tentative (fewer than 20 requests).

Usage: ``python tests/scenario_service.py DATA_DIR`` (prints nothing; exit status 0).
"""

from __future__ import annotations

import asyncio
import io
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import otel_stages as ots
from otel_stages import imaging
from otel_stages.demo.images import photo

TARGET = (224, 224)
#: Stand-in model: seconds per forward, and the extra paid on the first call and on the first
#: call of each new input shape.
FORWARD_S, FIRST_CALL_S, NEW_SHAPE_S = 0.02, 0.6, 1.5  # extras far above any load-slowed request
UNTRACED_S = 0.004  # e.g. tokenization and response encoding outside any stage span


def encode(size: tuple[int, int], fmt: str, seed: int) -> bytes:
    out = io.BytesIO()
    photo(size, seed).save(out, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


class Model:
    """Sleeps like a model that compiles on its first call and on each new input shape."""

    def __init__(self) -> None:
        self.shapes: set[tuple[int, int]] = set()

    def forward(self, source: tuple[int, int]) -> None:
        extra = FIRST_CALL_S if not self.shapes else NEW_SHAPE_S if source not in self.shapes else 0.0
        self.shapes.add(source)
        with ots.stage("forward"):
            time.sleep(FORWARD_S + extra)


def handle(model: Model, data: bytes) -> None:
    with ots.request():
        image = imaging.decode(data)
        time.sleep(UNTRACED_S)
        imaging.resize(image, TARGET)
        model.forward(image.size)


async def handle_on_loop(model: Model, data: bytes) -> None:
    handle(model, data)  # decode / resize block the loop: what the report should point out


def main(data_dir: str) -> int:
    telemetry = ots.configure(service_name="scenario", data_dir=data_dir, gpu="off",
                              set_global=False)
    jpeg, png = encode((1600, 1200), "JPEG", 1), encode((640, 480), "PNG", 2)
    model = Model()
    for _ in range(23):
        handle(model, jpeg)
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="scenario-worker") as pool:
        handle(model, png)  # the new shape's first request, alone, so it is the one that pays
        list(pool.map(lambda _: handle(model, png), range(6)))

    async def on_loop() -> None:
        for _ in range(4):
            await handle_on_loop(model, jpeg)

    asyncio.run(on_loop())
    telemetry.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
