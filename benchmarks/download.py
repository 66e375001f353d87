"""What ``download`` spans measure: a per-call client vs the pooled default vs a pre-built client.

Not a test: run ``python benchmarks/download.py`` and read the JSON. A 640x480 JPEG is served by
the demo's keep-alive HTTP server on 127.0.0.1; each variant downloads it ``REQUESTS`` times per
round, rounds interleaved, and the medians of the ``download`` span durations (what the report
sees) and of the caller's wall time are compared:

* ``per_call_client``: a new ``httpx.Client`` for every call (what ``download(url)`` did before it
  pooled: the span included building the client and a new TCP connection);
* ``pooled_default``: ``download(url)`` (the process-wide pooled client);
* ``prebuilt_client``: a plain ``httpx.Client`` built once and passed in (the baseline).

Target: ``pooled_default`` span median within 1.5x of ``prebuilt_client`` (the span times the
transfer); ``per_call_client`` shows the distortion the pooling removes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import httpx

from otel_stages import imaging
from otel_stages.demo.images import jpeg_photo
from otel_stages.demo.server import ImageServer
from otel_stages.testing import capture_spans

REQUESTS = 20
ROUNDS = 5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two short rounds (tests)")
    args = parser.parse_args(argv)
    requests, rounds = (3, 2) if args.smoke else (REQUESTS, ROUNDS)
    image = jpeg_photo((640, 480), 1)
    with ImageServer({"/p.jpg": image}) as server, httpx.Client() as prebuilt:
        url = server.url("/p.jpg")

        def per_call() -> bytes:
            with httpx.Client() as client:
                return imaging.download(url, client=client)

        variants: dict[str, Callable[[], bytes]] = {
            "per_call_client": per_call,
            "pooled_default": lambda: imaging.download(url),
            "prebuilt_client": lambda: imaging.download(url, client=prebuilt),
        }
        for fn in variants.values():  # warm-up: first connection, pooled client built
            fn()
        span_ms: dict[str, list[float]] = {k: [] for k in variants}
        wall_ms: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(rounds):
            for name, fn in variants.items():
                with capture_spans() as captured:
                    for _ in range(requests):
                        t0 = time.perf_counter()
                        assert fn() == image
                        wall_ms[name].append((time.perf_counter() - t0) * 1e3)
                span_ms[name] += [(s.end_time - s.start_time) / 1e6 for s in captured.by_name("download")]
    median = {k: statistics.median(v) for k, v in span_ms.items()}
    base = median["prebuilt_client"]
    print(json.dumps({
        "image_bytes": len(image), "requests_per_variant": requests * rounds,
        "span_median_ms": {k: round(v, 3) for k, v in median.items()},
        "wall_median_ms": {k: round(statistics.median(v), 3) for k, v in wall_ms.items()},
        "span_ratio_vs_prebuilt": {k: round(v / base, 2) for k, v in median.items()},
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
