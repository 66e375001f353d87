"""``otel-stages demo``: run a traced image + prompt inference pipeline locally, then report on it.

Everything is real and local: photo-like JPEGs made with Pillow, an HTTP server on 127.0.0.1, an
ONNX Runtime CPU model built with random weights, a queue with one batching executor thread.
Spans go where :func:`otel_stages.configure` sends them: OTLP/JSON files under the data folder by
default, or an OTLP collector when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (then a local copy of
this run's spans is also written, so the report can be made here). The report reads only the
files this run wrote. Progress goes to stderr; the report (text or ``--json``) to stdout.

``--fault cpu-hog|gc-storm|blocking-loop`` injects one fault for real
(:mod:`otel_stages.demo.faults`) so that the report can be seen to name its mechanism
(``cpu_contention``, ``gc_pause``, ``event_loop_blocked``); with a fault the mixed set is off
unless ``--mixed`` is given, so the fault is the only thing that varies.

Exit status: 0 when the run was reported and its spans were delivered; 1 when telemetry is off,
a setting is bad, or span batches could not be exported (e.g. no collector listening at
``OTEL_EXPORTER_OTLP_ENDPOINT``): the report is still printed, from the local copy, but the
spans did not reach their destination, which a script running the demo needs to notice.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from otel_stages import mark_cold_start
from otel_stages.commands import int_at_least
from otel_stages.demo.faults import BLOCKING_LOOP, CPU_HOG, FAULTS, GC_STORM

if TYPE_CHECKING:
    from otel_stages.demo.images import DemoImage
    from otel_stages.demo.model import EncoderConfig
    from otel_stages.demo.pipeline import Outcome
    from otel_stages.demo.server import ImageServer
    from otel_stages.demo.worker import InferenceWorker

DEFAULT_FIXED = 24
DEFAULT_MIXED = 24
MAX_WAIT_MS_LIMIT = 10_000.0  #: a longer batching wait is no demo of batching, just a stall
SERVICE_NAME = "otel-stages-demo"


def _milliseconds(maximum: float):  # type: ignore[no-untyped-def]
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of milliseconds, got {raw!r}") from None
        if not math.isfinite(value) or not 0 <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be a number from 0 to {maximum:g}, got {raw!r}")
        return value
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the demo's options on its subparser."""
    parser.epilog = ("Images: a 1024x768 fixed photo, 160x120 thumbnails and 4000x3000 (12 MP)"
                     " photos, resized to the model's 224x224 pixel input. The report it prints"
                     " gives times in milliseconds (see otel-stages report --help for every unit).")
    parser.add_argument("--requests", type=int_at_least(2), default=DEFAULT_FIXED, metavar="N",
                        help=f"fixed-run requests: same image, same prompt, sequential "
                             f"(default {DEFAULT_FIXED}; 20+ for a sound diagnosis)")
    parser.add_argument("--mixed", type=int_at_least(0), default=None, metavar="N",
                        help=f"mixed-set requests: thumbnails and 12 MP photos sent concurrently, one "
                             f"of them a truncated JPEG when N >= 2 (default {DEFAULT_MIXED}; 0 "
                             "with --fault)")
    parser.add_argument("--concurrency", type=int_at_least(1), default=6, metavar="N",
                        help="requests at a time in the mixed set, and in the asyncio front end of "
                             "--fault blocking-loop (default 6); 1 sends one request at a time")
    parser.add_argument("--fault", choices=FAULTS, default=None,
                        help="inject one fault for real: cpu-hog (busy threads competing for the "
                             "cores), gc-storm (reference cycles over a large heap: long garbage "
                             "collections), blocking-loop (an asyncio front end that decodes on "
                             "its event loop, 12 MP photos)")
    parser.add_argument("--threads", type=int_at_least(1), default=1, metavar="N",
                        help="ONNX Runtime intra-op threads (default 1)")
    parser.add_argument("--max-batch", type=int_at_least(1), default=4, metavar="N",
                        help="most requests per forward call (default 4)")
    parser.add_argument("--max-wait-ms", type=_milliseconds(MAX_WAIT_MS_LIMIT), default=5.0,
                        metavar="MS",
                        help="how long the executor waits to fill a batch after its first item, "
                             f"0 to {MAX_WAIT_MS_LIMIT:g} (default 5)")
    parser.add_argument("--data-dir", metavar="PATH", default=None,
                        help="folder for the OTLP/JSON files (default: OTEL_STAGES_DATA_DIR or "
                             "./otel-stages-data)")
    parser.add_argument("--decode-draft", action="store_true",
                        help="decode JPEGs at reduced size (Pillow draft mode) before the resize: "
                             "one real change to compare with --baseline")
    parser.add_argument("--seed", type=int, default=0, help="seed for images and weights (default 0)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def _progress(line: str) -> None:
    print(f"demo: {line}", file=sys.stderr, flush=True)


def _local_copy(telemetry, folder: Path) -> Path:  # type: ignore[no-untyped-def]
    """Exporting over OTLP: also write this run's spans to a local OTLP/JSON file for the report."""
    path = folder / f"traces-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-demo-copy.jsonl"
    telemetry.add_span_file(path)
    return path


def _fault(name: str | None, seed: int) -> AbstractContextManager[object]:
    """The context manager that keeps fault ``name`` going (a no-op without one)."""
    from otel_stages.demo.faults import CpuHog, GcStorm

    if name == CPU_HOG:
        hog = CpuHog(seed=seed)
        _progress(f"fault cpu-hog: {hog.threads} busy threads (SHA-256, GIL released), busy "
                  f"{hog.busy_s * 1000:.0f} ms / idle {hog.idle_s * 1000:.0f} ms in turn, jittered")
        return hog
    if name == GC_STORM:
        storm = GcStorm()
        _progress(f"fault gc-storm: {storm.live_objects} long-lived objects, a thread making a "
                  f"{storm.ring_size}-list reference cycle every {storm.every_s * 1000:.0f} ms")
        return storm
    return nullcontext()


def _blocking_loop(args: argparse.Namespace, server: ImageServer, worker: InferenceWorker,
                   config: EncoderConfig, images: dict[str, DemoImage]) -> list[Outcome]:
    """``--fault blocking-loop``: the asyncio front end, decoding 12 MP photos on its loop."""
    from otel_stages.demo.asyncfront import AsyncFrontEnd
    from otel_stages.demo.pipeline import FIXED_PROMPT, Job

    photos = sorted(p for p, im in images.items() if im.kind == "photo")
    jobs = [Job("fixed", photos[i % len(photos)], FIXED_PROMPT) for i in range(args.requests)]
    _progress(f"fault blocking-loop: an asyncio front end decodes and resizes {len(jobs)} 12 MP "
              f"photos on its event loop, {args.concurrency} requests at a time")
    front = AsyncFrontEnd(server, worker, image_size=config.image_size,
                          prompt_len=config.prompt_len, blocking=True)
    return front.run(jobs, concurrency=args.concurrency, progress=_progress)


def run(args: argparse.Namespace) -> int:
    """Run the plan and print the report; 0 on success, 1 when telemetry is off, a setting is
    bad or span batches could not be exported (the report is printed all the same)."""
    from otel_stages.analysis import diagnose, load_paths
    from otel_stages.config import ConfigurationError
    from otel_stages.demo.images import demo_images
    from otel_stages.demo.model import Encoder, EncoderConfig
    from otel_stages.demo.pipeline import Pipeline, fixed_jobs, mixed_jobs, run_plan
    from otel_stages.demo.server import ImageServer
    from otel_stages.demo.worker import InferenceWorker
    from otel_stages.render import render
    from otel_stages.sdk import configure

    mixed = args.mixed if args.mixed is not None else (0 if args.fault else DEFAULT_MIXED)

    started = time.perf_counter()
    try:
        # Not installed as the OpenTelemetry globals: the demo's spans all go through otel_stages,
        # and an embedding process (e.g. a test run) keeps its own global providers. Run-queue
        # wait on (the demo exists to show the diagnosis) unless OTEL_STAGES_RUN_QUEUE says.
        run_queue = None if os.environ.get("OTEL_STAGES_RUN_QUEUE", "").strip() else True
        telemetry = configure(service_name=SERVICE_NAME, data_dir=args.data_dir, set_global=False,
                              run_queue=run_queue)
    except ConfigurationError as exc:
        print(f"otel-stages demo: {exc}", file=sys.stderr)
        return 1
    if telemetry.tracer_provider is None:
        print("otel-stages demo: telemetry is disabled (OTEL_SDK_DISABLED=true or "
              "OTEL_STAGES_ENABLED=false): there would be nothing to report", file=sys.stderr)
        return 1
    try:
        trace_path = telemetry.trace_path or _local_copy(telemetry, telemetry.settings.data_path)
        images = demo_images(args.seed)
        _progress(f"made {len(images)} images in {time.perf_counter() - started:.1f} s "
                  "(1024x768 fixed, 160x120 thumbnails, 4000x3000 photos, 1 truncated JPEG)")
        config = EncoderConfig()
        encoder = Encoder(config, seed=args.seed, threads=args.threads)
        mark_cold_start()  # a fresh model: the next request is the cold one
        with ImageServer({p: im.data for p, im in images.items()}) as server, \
                InferenceWorker(encoder.run, max_batch=args.max_batch,
                                max_wait_ms=args.max_wait_ms) as worker:
            _progress(f"image server on http://127.0.0.1:{server.port}; model: ViT-like encoder "
                      f"({config.depth} blocks, dim {config.dim}) on ONNX Runtime CPU, "
                      f"{args.threads} thread(s), loaded on the first forward")
            pipeline = Pipeline(server, worker, image_size=config.image_size,
                                prompt_len=config.prompt_len, decode_draft=args.decode_draft)
            if args.decode_draft:
                _progress(f"decode: JPEG draft mode, decoded at 1/2..1/8 scale, never below "
                          f"{config.image_size}x{config.image_size}")
            try:
                if args.fault == BLOCKING_LOOP:
                    outcomes = _blocking_loop(args, server, worker, config, images)
                else:
                    with _fault(args.fault, args.seed):
                        outcomes = run_plan(pipeline, fixed_jobs(args.requests),
                                            mixed_jobs(mixed, images, args.seed),
                                            concurrency=args.concurrency, progress=_progress)
            finally:
                pipeline.close()
        batched = [n for n in worker.batch_sizes if n > 1]
        _progress(f"{len(outcomes)} requests sent, {sum(o.ok for o in outcomes)} ok; "
                  f"{len(worker.batch_sizes)} forward calls, {len(batched)} of them batched "
                  f"(largest {max(worker.batch_sizes, default=0)})")
        if not telemetry.force_flush():
            _progress("warning: telemetry flush timed out; the report may miss spans")
        failures = telemetry.export_failures
        if failures:
            hint = ("is a collector listening?" if telemetry.settings.endpoint is not None else
                    "is the data folder writable?")
            _progress(f"warning: {failures} span export batch{'es' if failures != 1 else ''} to "
                      f"{telemetry.destination} failed ({hint})")
        report = diagnose(load_paths([p for p in (trace_path, telemetry.metrics_path)
                                      if p is not None and p.exists()]))
        if args.json:
            print(json.dumps(report.to_dict(), indent=2))
        else:
            render(report)
        if failures:
            where = (f"traces not (all) exported to {telemetry.destination}; "
                     f"this report was made from {trace_path}")
        elif telemetry.trace_path is not None:
            where = f"traces written to {trace_path}"
        else:
            where = f"traces exported to {telemetry.destination}; local copy for this report: {trace_path}"
        print(where, file=sys.stderr if args.json else sys.stdout)
        _progress(f"done in {time.perf_counter() - started:.1f} s")
        return 1 if failures else 0
    finally:
        telemetry.shutdown()
