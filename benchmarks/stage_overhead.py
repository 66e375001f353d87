"""Per-stage overhead of otel_stages, as ratios against a bare baseline measured in the same run.

Not a test: run ``python benchmarks/stage_overhead.py`` and read the JSON. Measures, per request of
five empty stages (the worst case: the stages themselves do nothing):

* ``bare``: the same loop with no instrumentation;
* ``disabled``: ``OTEL_STAGES_ENABLED=false`` (must be near-free);
* ``otel_raw``: the baseline: plain OpenTelemetry SDK ``start_as_current_span`` for the same six
  spans, same provider, ``BatchSpanProcessor`` with an exporter that drops spans;
* ``enabled_batch``: otel_stages on that same provider (cost on the request path);
* ``enabled_attrs``: the same with three typical attributes per stage (two ints, one short
  string: the attribute cleaning's fast path), against ``otel_raw_attrs`` (the SDK, same values);
* ``enabled_tracked``: ``enabled_batch`` plus the open-span tracking ``configure()`` installs
  (:class:`otel_stages.delivery.OpenSpans`: a dict insert and delete per span);
* ``enabled_file``: the embedded default (OTLP/JSON file exporter) end to end;
* ``enabled_no_signals``: ``enabled_batch`` with the per-stage signals off
  (``configure(signals=False)``): ``enabled_batch - enabled_no_signals`` is what thread CPU time,
  the GC and event-loop checks and their two attributes cost per request (6 spans);
  ``signals_capture_ns_per_stage`` times :func:`otel_stages.signals.on_start` +
  :func:`otel_stages.signals.finish_fields` alone (no span), the part a deferred span keeps.

Targets: ``enabled_batch / otel_raw`` <= 1.5 (otel_stages adds little over the SDK itself) and
``disabled`` under 1 us per stage.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import otel_stages as ots
from otel_stages import semconv, signals
from otel_stages._runtime import RUNTIME, scoped_tracer

REQUESTS = 300  # x6 spans stays under the default 2048-span batch queue
REPEATS = 3


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _instrumented() -> None:
    with ots.request():
        for name in semconv.STANDARD_STAGES:
            with ots.stage(name):
                pass


ATTRS = {"image.width": 640, "image.height": 480, "image.format": "JPEG"}


def _instrumented_attrs() -> None:
    with ots.request():
        for name in semconv.STANDARD_STAGES:
            with ots.stage(name, **ATTRS):
                pass


def _bare() -> None:
    for _ in semconv.STANDARD_STAGES:
        pass


def _per_request_us(fn: Callable[[], None]) -> float:
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(REQUESTS):
            fn()
        runs.append((time.perf_counter() - start) / REQUESTS * 1e6)
    return statistics.median(runs)


def main() -> None:
    results: dict[str, float] = {"bare": _per_request_us(_bare)}

    RUNTIME.enabled = False
    results["disabled"] = _per_request_us(_instrumented)

    RUNTIME.enabled = True
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Drop(), max_queue_size=1 << 18))
    tracer = RUNTIME.tracer = scoped_tracer(provider)

    def raw() -> None:
        with tracer.start_as_current_span(semconv.SPAN_REQUEST):
            for name in semconv.STANDARD_STAGES:
                with tracer.start_as_current_span(name):
                    pass

    def raw_attrs() -> None:
        with tracer.start_as_current_span(semconv.SPAN_REQUEST):
            for name in semconv.STANDARD_STAGES:
                with tracer.start_as_current_span(name, attributes=ATTRS):
                    pass

    from otel_stages.delivery import OpenSpans

    tracked = TracerProvider()
    tracked.add_span_processor(OpenSpans())
    tracked.add_span_processor(BatchSpanProcessor(_Drop(), max_queue_size=1 << 18))
    plain_tracer, tracked_tracer = tracer, scoped_tracer(tracked)

    def with_tracking() -> None:
        RUNTIME.tracer = tracked_tracer
        try:
            _instrumented()
        finally:
            RUNTIME.tracer = plain_tracer

    def no_signals() -> None:
        signals.enable(False)
        try:
            _instrumented()
        finally:
            signals.enable(True)

    # Interleave so drift in machine load hits every variant alike.
    runs: dict[str, list[float]] = {k: [] for k in ("otel_raw", "enabled_batch", "otel_raw_attrs",
                                                     "enabled_attrs", "enabled_tracked",
                                                     "enabled_no_signals")}
    variants = {"otel_raw": raw, "enabled_batch": _instrumented, "otel_raw_attrs": raw_attrs,
                "enabled_attrs": _instrumented_attrs, "enabled_tracked": with_tracking,
                "enabled_no_signals": no_signals}
    for _ in range(5):
        for key, fn in variants.items():
            runs[key].append(_per_request_us(fn))
            provider.force_flush()
            tracked.force_flush()
    for key, values in runs.items():
        results[key] = statistics.median(values)
    provider.shutdown()
    tracked.shutdown()

    with tempfile.TemporaryDirectory() as folder:
        telemetry = ots.configure(data_dir=folder, set_global=False)
        results["enabled_file"] = _per_request_us(_instrumented)
        telemetry.shutdown()

    capture_ns = _signals_capture_ns()
    base = results["otel_raw"]
    print(json.dumps({
        "requests_per_run": REQUESTS,
        "stages_per_request": len(semconv.STANDARD_STAGES),
        "per_request_us": {k: round(v, 2) for k, v in results.items()},
        "ratio_vs_otel_raw": {k: round(v / base, 3) for k, v in results.items() if k != "bare"},
        "attrs_ratio_vs_otel_raw_attrs": round(results["enabled_attrs"] / results["otel_raw_attrs"], 3),
        "tracking_us_per_span": round((results["enabled_tracked"] - results["enabled_batch"]) / 6, 3),
        "disabled_us_per_stage": round((results["disabled"] - results["bare"]) / 6, 3),
        "signals_us_per_span": round((results["enabled_batch"] - results["enabled_no_signals"]) / 6, 3),
        "signals_capture_ns_per_stage": round(capture_ns),
    }, indent=2))


def _signals_capture_ns(calls: int = 20_000) -> float:
    """on_start + finish_fields per stage, no span, off an event loop: median of interleaved
    rounds, minus the same loop doing nothing."""
    def capture() -> float:
        start = time.perf_counter_ns()
        for _ in range(calls):
            signals.finish_fields(signals.on_start(), 0, 1_000_000)
        return (time.perf_counter_ns() - start) / calls

    def empty() -> float:
        start = time.perf_counter_ns()
        for _ in range(calls):
            pass
        return (time.perf_counter_ns() - start) / calls

    rounds = [(capture(), empty()) for _ in range(7)]
    return statistics.median(c - e for c, e in rounds)


if __name__ == "__main__":
    main()
