"""Per-stage overhead of otel_stages, as ratios against a bare baseline measured in the same run.

Not a test: run ``python benchmarks/stage_overhead.py`` and read the JSON. Measures, per request of
five empty stages (the worst case: the stages themselves do nothing):

* ``bare``: the same loop with no instrumentation;
* ``disabled``: ``OTEL_STAGES_ENABLED=false`` (must be near-free);
* ``otel_raw``: the baseline: plain OpenTelemetry SDK ``start_as_current_span`` for the same six
  spans, same provider, ``BatchSpanProcessor`` with an exporter that drops spans;
* ``enabled_batch``: otel_stages on that same provider (cost on the request path);
* ``enabled_file``: the embedded default (OTLP/JSON file exporter) end to end.

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
from otel_stages import semconv
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

    # Interleave so drift in machine load hits both alike.
    raw_runs, ours_runs = [], []
    for _ in range(3):
        raw_runs.append(_per_request_us(raw))
        provider.force_flush()
        ours_runs.append(_per_request_us(_instrumented))
        provider.force_flush()
    results["otel_raw"] = statistics.median(raw_runs)
    results["enabled_batch"] = statistics.median(ours_runs)
    provider.shutdown()

    with tempfile.TemporaryDirectory() as folder:
        telemetry = ots.configure(data_dir=folder, set_global=False)
        results["enabled_file"] = _per_request_us(_instrumented)
        telemetry.shutdown()

    base = results["otel_raw"]
    print(json.dumps({
        "requests_per_run": REQUESTS,
        "stages_per_request": len(semconv.STANDARD_STAGES),
        "per_request_us": {k: round(v, 2) for k, v in results.items()},
        "ratio_vs_otel_raw": {k: round(v / base, 3) for k, v in results.items() if k != "bare"},
        "disabled_us_per_stage": round((results["disabled"] - results["bare"]) / 6, 3),
    }, indent=2))


if __name__ == "__main__":
    main()
