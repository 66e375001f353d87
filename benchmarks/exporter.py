"""The embedded span file under load, and what encoding a span costs, against the official exporter.

Not a test: run ``python benchmarks/exporter.py`` and read the JSON (``--smoke``: a short functional
run, used by the test suite with no timed assertion). Two parts, both in one process:

* ``encode``: CPU time per span of ``export()`` on the same 512-span batches (a request and its
  five stages with the attributes otel_stages sets), the official
  ``opentelemetry-exporter-otlp-json-file`` ``FileSpanExporter`` against
  :class:`otel_stages.json_lines.JsonLinesSpanExporter`, interleaved rounds, median of per-round
  ratios; plus the serialisation step alone (``json.dumps`` / orjson / msgspec when installed) on
  the same request dict, which is how the serialiser was chosen.
* ``load``: the default ``configure()`` (its batch processor settings, open-span tracking, drop
  counting) with 8 threads sending 1000 requests/s in total, each request six spans whose five
  stages sleep about 1 ms; once with the embedded exporter, once with the official one swapped in
  (nothing else changed), alternating. Reports requests sent, spans expected / written / counted as
  dropped, and the export thread's CPU per span (``time.thread_time_ns`` around each
  ``export()``).

* ``busy``: beyond the target, the same with stages that do not sleep (8 threads making spans as
  fast as they can for a few seconds): the export thread gets about a ninth of the GIL, so spans
  are dropped; every one is counted (``spans_written + spans_dropped == spans_expected``).

Each part runs with the per-stage signals at their default (on: two more attributes per span,
:mod:`otel_stages.signals`) and off (``configure(signals=False)``), load runs alternating
(``--signals on|off|both``, default both; ``encode`` / ``encode_no_signals``, each load run says
``signals``).

Targets (issue 11): with the default ``configure()`` no span lost at that load; the exporter's
CPU per span at most half the official exporter's (``targets``: signals on, the default;
``targets_no_signals``: off).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.json.file import FileSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import otel_stages as ots
from otel_stages import json_lines, sdk, semconv
from otel_stages.testing import capture_spans

TARGET_CPU_RATIO = 0.5


def _one_request() -> None:
    with ots.request():
        with ots.stage(semconv.STAGE_DOWNLOAD, **{semconv.URL_FULL: "https://images.example.com/cat.jpg",
                                                  semconv.URL_SCHEME: "https"}) as span:
            span.set_attribute(semconv.IMAGE_SIZE, 86_763)
        with ots.stage(semconv.STAGE_DECODE, **{semconv.IMAGE_SIZE: 86_763}) as span:
            span.set_attributes({semconv.IMAGE_FORMAT: "JPEG", semconv.IMAGE_MODE: "RGB",
                                 semconv.IMAGE_WIDTH: 640, semconv.IMAGE_HEIGHT: 480})
        with ots.stage(semconv.STAGE_RESIZE, **{semconv.IMAGE_TARGET_WIDTH: 224,
                                                semconv.IMAGE_TARGET_HEIGHT: 224}):
            pass
        with ots.stage(semconv.STAGE_QUEUE, **{semconv.QUEUE_DEPTH: 3}):
            pass
        with ots.stage(semconv.STAGE_FORWARD, **{semconv.BATCH_SIZE: 4}) as span:
            span.set_attributes({semconv.GPU_UTILIZATION_MEAN: 0.8731, semconv.GPU_UTILIZATION_MAX: 0.97,
                                 semconv.GPU_SAMPLE_COUNT: 3})


def _batch(size: int = 512, signals: bool = True) -> list[ReadableSpan]:
    with capture_spans(signals_on=signals) as captured:
        while len(captured.exporter.get_finished_spans()) < size:
            _one_request()
        return captured.spans[:size]


def _cpu_per_span(exporter: SpanExporter, batch: Sequence[ReadableSpan], repeat: int) -> float:
    gc.collect()
    started = time.thread_time_ns()
    for _ in range(repeat):
        exporter.export(batch)
    return (time.thread_time_ns() - started) / repeat / len(batch) / 1e3


def encode(rounds: int, repeat: int, folder: Path, signals: bool = True) -> dict[str, Any]:
    """Part one (module docstring): µs of CPU per span, and the ratio per round."""
    batch = _batch(signals=signals)
    folder.mkdir(parents=True, exist_ok=True)
    ours = json_lines.JsonLinesSpanExporter(folder / "ours.jsonl")
    official = FileSpanExporter(folder / "official.jsonl")
    ours_us, official_us, ratios = [], [], []
    for index in range(rounds + 1):
        order = [(ours, ours_us), (official, official_us)]
        if index % 2:
            order.reverse()
        measured = {}
        for exporter, _ in order:
            measured[id(exporter)] = _cpu_per_span(exporter, batch, repeat)
        if index:  # the first round warms up
            ours_us.append(measured[id(ours)])
            official_us.append(measured[id(official)])
            ratios.append(measured[id(ours)] / measured[id(official)])
    ours.shutdown()
    official.shutdown()
    identical = (folder / "ours.jsonl").read_bytes() == (folder / "official.jsonl").read_bytes()
    request = json_lines.encode_spans(batch)
    serialisers: dict[str, Any] = {"json.dumps": lambda d: json.dumps(d, separators=(",", ":"))}
    import orjson

    serialisers["orjson"] = lambda d: orjson.dumps(d, default=json_lines._orjson_default)
    try:
        import msgspec

        # the same float format as json.dumps (as orjson.Fragment does for orjson)
        encoder = msgspec.json.Encoder(enc_hook=lambda v: msgspec.Raw(float.__repr__(v).encode()))
        serialisers["msgspec"] = encoder.encode
    except ImportError:
        pass
    serialise_us: dict[str, list[float]] = {k: [] for k in serialisers}
    for _ in range(rounds):
        for name, fn in serialisers.items():
            started = time.thread_time_ns()
            for _ in range(repeat):
                fn(request)
            serialise_us[name].append((time.thread_time_ns() - started) / repeat / len(batch) / 1e3)
    return {
        "signals": signals, "batch_spans": len(batch), "rounds": rounds, "exports_per_round": repeat,
        "official_cpu_us_per_span": round(statistics.median(official_us), 2),
        "ours_cpu_us_per_span": round(statistics.median(ours_us), 2),
        "ratio": round(statistics.median(ratios), 3),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "same_bytes": identical,
        "serialise_only_cpu_us_per_span": {k: round(statistics.median(v), 3)
                                           for k, v in serialise_us.items()},
    }


class _Timed(SpanExporter):
    """Measures the CPU time the export thread spends in ``inner.export``."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.cpu_ns = 0
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        started = time.thread_time_ns()
        try:
            return self.inner.export(spans)
        finally:
            self.cpu_ns += time.thread_time_ns() - started
            self.spans += len(spans)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


@contextlib.contextmanager
def _official_file_exporter() -> Iterator[None]:
    """configure() with the official span file exporter in place of the embedded one."""
    saved = sdk.JsonLinesSpanExporter
    sdk.JsonLinesSpanExporter = FileSpanExporter  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        sdk.JsonLinesSpanExporter = saved  # type: ignore[misc]


def _stage_sleep() -> None:
    time.sleep(0.001)


def _paced_request() -> None:
    with ots.request():
        for name in semconv.STANDARD_STAGES:
            with ots.stage(name, **{semconv.IMAGE_WIDTH: 640}):
                _stage_sleep()


def _busy_request() -> None:
    with ots.request():
        for name in semconv.STANDARD_STAGES:
            with ots.stage(name, **{semconv.IMAGE_WIDTH: 640}):
                pass


def load(exporter: str, threads: int, rate: float, duration_s: float, folder: Path,
         busy: bool = False, signals: bool = True) -> dict[str, Any]:
    """Part two (module docstring) for ``exporter`` ``"ours"`` or ``"official"``; ``busy``: part
    three (no pacing, no sleeping); ``signals``: the ``configure()`` setting."""
    context = _official_file_exporter() if exporter == "official" else contextlib.nullcontext()
    with context:
        telemetry = ots.configure(data_dir=folder / exporter, gpu="off", set_global=False,
                                  service_name=f"load-{exporter}", signals=signals)
    timed = _Timed(telemetry._span_exporter.inner)  # type: ignore[union-attr]
    telemetry._span_exporter.inner = timed  # type: ignore[union-attr]
    sent = [0] * threads
    late = [0] * threads
    interval_s = threads / rate
    stop_at = time.monotonic() + duration_s
    cpu0 = time.process_time()

    def worker(index: int) -> None:
        next_at = time.monotonic() + index * interval_s / threads  # spread the threads out
        while True:
            now = time.monotonic()
            if now >= stop_at:
                return
            if busy:
                _busy_request()
                sent[index] += 1
                continue
            if next_at > now:
                time.sleep(next_at - now)
            elif now - next_at > interval_s:
                late[index] += 1
            _paced_request()
            sent[index] += 1
            next_at += interval_s

    workers = [threading.Thread(target=worker, args=(i,), name=f"load-{i}") for i in range(threads)]
    started = time.monotonic()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    elapsed = time.monotonic() - started
    process_cpu_s = time.process_time() - cpu0
    ok = telemetry.shutdown()
    written = 0
    assert telemetry.trace_path is not None
    for line in telemetry.trace_path.read_bytes().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                written += len(scope["spans"])
    requests = sum(sent)
    return {
        "exporter": exporter, "signals": signals, "threads": threads, "target_requests_per_s": rate,
        "requests": requests, "requests_per_s": round(requests / elapsed, 1),
        "requests_behind_schedule": sum(late),
        "spans_expected": requests * (1 + len(semconv.STANDARD_STAGES)),
        "spans_written": written, "spans_dropped": telemetry.dropped_spans, "drops": telemetry.drops["spans"],
        "export_cpu_us_per_span": round(timed.cpu_ns / max(1, timed.spans) / 1e3, 2),
        "process_cpu_s_per_s": round(process_cpu_s / elapsed, 3),
        "shutdown_ok": ok,
    }


def _targets(runs: dict[str, list[dict[str, Any]]], encoded: dict[str, Any]) -> dict[str, Any]:
    ours_runs = runs["ours"]
    cpu_ratio = (statistics.median(r["export_cpu_us_per_span"] for r in ours_runs)
                 / statistics.median(r["export_cpu_us_per_span"] for r in runs["official"]))
    return {
        "no_spans_lost_default_configure": {
            "met": all(r["spans_written"] == r["spans_expected"] and r["spans_dropped"] == 0
                       for r in ours_runs)},
        "export_cpu_vs_official_under_load": {"ratio": round(cpu_ratio, 3), "at_most": TARGET_CPU_RATIO,
                                              "met": cpu_ratio <= TARGET_CPU_RATIO},
        "encode_cpu_vs_official": {"ratio": encoded["ratio"], "at_most": TARGET_CPU_RATIO,
                                   "met": encoded["ratio"] <= TARGET_CPU_RATIO},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds, for the test suite")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per load run (default 10)")
    parser.add_argument("--load-rounds", type=int, default=2,
                        help="load runs per exporter and signals setting (default 2)")
    parser.add_argument("--signals", choices=("on", "off", "both"), default="both",
                        help="per-stage signals setting(s) to measure (default both; configure() "
                             "has them on)")
    args = parser.parse_args(argv)
    rounds, repeat, duration, load_rounds, threads, rate = 15, 3, args.duration, args.load_rounds, 8, 1000.0
    if args.smoke:
        rounds, repeat, duration, load_rounds, threads, rate = 2, 1, 1.0, 1, 2, 100.0
    settings = {"on": [True], "off": [False], "both": [True, False]}[args.signals]
    load_before = os.getloadavg()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        for signals in settings:
            key = "encode" if signals else "encode_no_signals"
            report[key] = encode(rounds, repeat, folder / key, signals=signals)
        runs: dict[bool, dict[str, list[dict[str, Any]]]] = {
            signals: {"ours": [], "official": []} for signals in settings}
        for index in range(load_rounds):  # alternating exporters and settings
            order = ["ours", "official"] if index % 2 == 0 else ["official", "ours"]
            for exporter in order:
                for signals in (settings if index % 2 == 0 else settings[::-1]):
                    runs[signals][exporter].append(load(
                        exporter, threads, rate, duration, folder / f"run{index}-{signals}",
                        signals=signals))
        report["load"] = {exporter: [run for signals in settings for run in runs[signals][exporter]]
                          for exporter in ("ours", "official")}
        report["busy"] = {exporter: load(exporter, threads, rate, min(duration, 3.0), folder / "busy",
                                         busy=True, signals=settings[0])
                          for exporter in ("ours", "official")}
    if True in runs:
        report["targets"] = _targets(runs[True], report["encode"])
    if False in runs:
        report["targets_no_signals"] = _targets(runs[False], report["encode_no_signals"])
    report["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                         "platform": platform.platform(),
                         "load_avg_before": [round(x, 2) for x in load_before],
                         "load_avg_after": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
