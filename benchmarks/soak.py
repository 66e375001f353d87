"""Soak: the demo pipeline at its top rate against a loopback OTLP/HTTP collector that goes down
and comes back. Not a test: run ``python benchmarks/soak.py`` (about 3 minutes) and read the JSON.

What runs: the demo's image server, batching executor and ONNX encoder (``otel_stages.demo``),
``--threads`` request threads sending requests back to back (no think time), telemetry exported
over real OTLP/HTTP to a receiver on 127.0.0.1 that is up for the first third of the run, down
(port closed: connection refused) for the middle third and up again, on the same port, for the
last third. Every second it samples the process RSS and thread count.

What it checks (``"verdict"`` in the output, exit status 1 when one fails):

* ``accounted``: every span that ended was either received or counted as dropped
  (``sent == received + Telemetry.dropped_spans``), after a final flush;
* ``none_lost_while_up``: nothing was dropped before the collector went down, and nothing more
  once it was back and the backlog had drained (drops happen only around the outage);
* ``drops_counted_while_down``: the outage did cost spans, and they were counted;
* ``rss_flat`` / ``threads_flat``: the last third's peak RSS is within ``RSS_GROWTH_LIMIT`` of the
  first third's peak (after warm-up), and its peak thread count at most one above the first
  third's (``thread_census`` names them).

``--smoke`` runs a few seconds with a tiny model for the test suite (same checks).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

import otel_stages as ots
from otel_stages.demo.images import demo_images
from otel_stages.demo.model import Encoder, EncoderConfig
from otel_stages.demo.pipeline import FIXED_PROMPT, Job, Pipeline
from otel_stages.demo.server import ImageServer
from otel_stages.demo.worker import InferenceWorker

RSS_GROWTH_LIMIT = 0.10  #: last third's peak RSS may exceed the first third's by at most 10 %


class Collector:
    """OTLP/HTTP receiver on a fixed 127.0.0.1 port that can be stopped and started again."""

    def __init__(self) -> None:
        self.port = 0
        self.spans = 0
        self.points = 0
        self._server: http.server.ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    count = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
                    with collector._lock:
                        collector.spans += count
                    reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                else:
                    metrics = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                    with collector._lock:
                        collector.points += sum(
                            len(getattr(m, m.WhichOneof("data")).data_points)
                            for rm in metrics.resource_metrics for sm in rm.scope_metrics
                            for m in sm.metrics)
                    reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                         name="soak-collector", daemon=True).start()
        self._server = server

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class EndedSpans(SpanProcessor):
    """Counts spans that ended (what was sent, in the accounting)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            self.count += 1


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux: peak RSS is the best available
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(duration_s: float, threads: int, config: EncoderConfig, interval_s: float = 1.0,
        progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    collector = Collector()
    collector.start()
    images = demo_images(0, thumbnails=3, photos=0)
    paths = [p for p, im in images.items() if im.kind in ("fixed", "thumbnail")]
    encoder = Encoder(config, seed=0, threads=1)
    samples: list[dict[str, float]] = []
    phases: dict[str, dict[str, int]] = {}
    census: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as folder:
        telemetry = ots.configure(service_name="soak", endpoint=f"http://127.0.0.1:{collector.port}",
                                  data_dir=folder, gpu="off", set_global=False,
                                  metric_export_interval_s=max(1.0, duration_s / 30))
        ended = EndedSpans()
        assert telemetry.tracer_provider is not None
        telemetry.tracer_provider.add_span_processor(ended)
        requests = [0]
        failures = [0]
        stop = threading.Event()
        with ImageServer({p: im.data for p, im in images.items()}) as server, \
                InferenceWorker(encoder.run, max_batch=4, max_wait_ms=2.0) as worker:
            pipeline = Pipeline(server, worker, image_size=config.image_size, prompt_len=config.prompt_len)

            def client(index: int) -> None:
                i = index
                while not stop.is_set():
                    outcome = pipeline.handle(Job("soak", paths[i % len(paths)], FIXED_PROMPT))
                    requests[0] += 1
                    failures[0] += not outcome.ok
                    i += 1

            workers = [threading.Thread(target=client, args=(i,), name=f"soak-client-{i}", daemon=True)
                       for i in range(threads)]
            baseline_threads = threading.active_count()
            for w in workers:
                w.start()
            started = time.monotonic()
            third = duration_s / 3

            def snapshot(phase: str) -> None:
                phases[phase] = {"sent": ended.count, "received": collector.spans,
                                 "dropped": telemetry.dropped_spans, "requests": requests[0]}

            while (elapsed := time.monotonic() - started) < duration_s:
                if collector._server is not None and third <= elapsed < 2 * third:
                    snapshot("before_down")
                    collector.stop()
                    progress(f"{elapsed:.0f} s: collector down")
                elif collector._server is None and elapsed >= 2 * third:
                    snapshot("before_up")
                    collector.start()
                    progress(f"{elapsed:.0f} s: collector up again")
                elif "settled" not in phases and elapsed >= 2.5 * third:
                    snapshot("settled")  # the backlog from the outage has had time to drain
                samples.append({"t_s": round(elapsed, 1), "rss_mb": round(_rss_mb(), 1),
                                "threads": threading.active_count()})
                if "threads_first" not in census and elapsed >= third * 0.5:
                    census["threads_first"] = _thread_census()
                time.sleep(interval_s)  # the sampling cadence of this benchmark
            census["threads_last"] = _thread_census()
            stop.set()
            for w in workers:
                w.join(60)
            pipeline.close()
        telemetry.force_flush(30_000)
        snapshot("end")
        drops = telemetry.drops
        ok = telemetry.shutdown(timeout_millis=10_000)
    collector.stop()
    report = _summarise(samples, phases, drops, requests[0], failures[0], duration_s, threads,
                        baseline_threads, ok)
    report["metric_points"] = {"received": collector.points, "dropped": sum(drops["points"].values())}
    report["thread_census"] = census
    return report


def _thread_census() -> dict[str, int]:
    """Live threads by name, numbers stripped (``Thread-12 (process_request_thread)`` and
    ``Thread-13 (...)`` count as one kind)."""
    out: dict[str, int] = {}
    for thread in threading.enumerate():
        kind = "".join(c for c in thread.name if not c.isdigit())
        out[kind] = out.get(kind, 0) + 1
    return dict(sorted(out.items()))


def _summarise(samples: list[dict[str, float]], phases: dict[str, dict[str, int]],
               drops: dict[str, dict[str, int]], requests: int, failures: int, duration_s: float,
               threads: int, baseline_threads: int, shutdown_ok: bool) -> dict[str, Any]:
    third = duration_s / 3
    warm = [s for s in samples if third * 0.25 <= s["t_s"] < third]
    warm_threads = max((s["threads"] for s in warm), default=baseline_threads + threads)
    last = [s for s in samples if s["t_s"] >= 2 * third]
    first_peak = max((s["rss_mb"] for s in warm), default=samples[0]["rss_mb"] if samples else 0.0)
    last_peak = max((s["rss_mb"] for s in last), default=first_peak)
    end = phases["end"]
    before_down = phases.get("before_down", end)
    before_up = phases.get("before_up", end)
    settled = phases.get("settled", end)
    dropped_after_outage = end["dropped"] - before_up["dropped"]
    verdict = {
        "accounted": end["sent"] == end["received"] + end["dropped"],
        "none_lost_while_up": before_down["dropped"] == 0 and end["dropped"] == settled["dropped"],
        "drops_counted_while_down": before_up["dropped"] + dropped_after_outage > 0,
        "rss_flat": last_peak <= first_peak * (1 + RSS_GROWTH_LIMIT),
        # one more is tolerated: a collector handler thread for the connection made after restart
        "threads_flat": bool(last) and max(s["threads"] for s in last) <= warm_threads + 1,
    }
    return {
        "duration_s": duration_s, "client_threads": threads, "requests": requests,
        "requests_per_s": round(requests / duration_s, 1), "failed_requests": failures,
        "spans": end, "phases": phases, "drops": drops,
        "dropped_after_collector_back": dropped_after_outage,
        "rss_mb": {"first_third_peak": first_peak, "last_third_peak": last_peak,
                   "min": min(s["rss_mb"] for s in samples), "max": max(s["rss_mb"] for s in samples)},
        "threads": {"baseline": baseline_threads, "min": min(s["threads"] for s in samples),
                    "max": max(s["threads"] for s in samples), "last": samples[-1]["threads"]},
        "shutdown_ok": shutdown_ok, "verdict": verdict, "ok": all(verdict.values()),
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=180.0)
    parser.add_argument("--threads", type=int, default=4, help="request threads (default 4)")
    parser.add_argument("--smoke", action="store_true", help="a few seconds, tiny model (tests)")
    args = parser.parse_args(argv)
    if args.smoke:
        # Seconds, not minutes: export often, a small queue, give up on a dead collector fast,
        # so the outage fills the queue and fails batches within the run.
        os.environ.update({"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_BSP_MAX_QUEUE_SIZE": "256",
                           "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"})
        config = EncoderConfig(image_size=32, patch=16, dim=24, heads=2, depth=1, prompt_len=4)
        report = run(6.0, 2, config, interval_s=0.25)
    else:
        report = run(args.duration_s, args.threads, EncoderConfig(),
                     progress=lambda line: print(f"soak: {line}", file=sys.stderr, flush=True))
    print(json.dumps(report if args.smoke else {k: v for k, v in report.items() if k != "samples"},
                     indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
