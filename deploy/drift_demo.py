"""See the StageDurationDrift alert fire on the local stack, without waiting a week.

The alert compares a stage's recent p95 with the same hour yesterday and with the last 7 days, so
a fresh Prometheus has nothing to compare with. This script:

``history``  prints a week of normal span-metrics history (OpenMetrics text) for a synthetic
             service, ending two hours ago, for ``promtool tsdb create-blocks-from openmetrics``;
``traffic``  sends live request/stage spans over OTLP to the collector, with one stage slowed
             down (decode x6 by default). The collector turns them into span metrics; the alert
             fires 30-50 minutes later (``for: 30m`` after the first evaluation of the 15-minute
             7-day baseline group).

Walkthrough: deploy/README.md ("A firing drift alert"). Both use the same stage durations, so the
only difference between history and live traffic is the slowed stage.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from otel_stages import semconv

SERVICE = "drift-demo"
#: Mean duration per stage (ms); each request draws uniformly from [0.5, 1.5] x mean.
STAGE_MEAN_MS = {
    semconv.STAGE_DOWNLOAD: 12.0,
    semconv.STAGE_DECODE: 25.0,
    semconv.STAGE_RESIZE: 6.0,
    semconv.STAGE_QUEUE: 8.0,
    semconv.STAGE_FORWARD: 60.0,
}
#: Bucket bounds (ms) of the span_metrics connector in the bundled collector config.
BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000)
METRIC = "traces_span_metrics_duration_milliseconds"


def _uniform_cdf(x: float, mean: float) -> float:
    """P(duration <= x) for a duration uniform on [0.5 mean, 1.5 mean]."""
    lo, hi = 0.5 * mean, 1.5 * mean
    return min(1.0, max(0.0, (x - lo) / (hi - lo)))


def history_lines(
    *, end_s: int, days: float = 8.0, step_s: int = 300, rate_per_s: float = 2.0
) -> Iterator[str]:
    """OpenMetrics text: cumulative span-metrics histograms, one sample per ``step_s``."""
    steps = int(days * 86400 // step_s)
    start_s = end_s - steps * step_s
    per_step = rate_per_s * step_s
    labels = (
        f'service_name="{SERVICE}",span_kind="SPAN_KIND_INTERNAL",status_code="STATUS_CODE_UNSET"'
    )
    yield f"# TYPE {METRIC} histogram"
    yield f"# UNIT {METRIC} milliseconds"
    for stage, mean in STAGE_MEAN_MS.items():
        for i in range(steps + 1):
            ts, n = start_s + i * step_s, per_step * i
            for le in BUCKETS_MS:
                count = round(n * _uniform_cdf(le, mean))
                yield f'{METRIC}_bucket{{{labels},span_name="{stage}",le="{le}"}} {count} {ts}'
            yield f'{METRIC}_bucket{{{labels},span_name="{stage}",le="+Inf"}} {round(n)} {ts}'
            yield f'{METRIC}_count{{{labels},span_name="{stage}"}} {round(n)} {ts}'
            yield f'{METRIC}_sum{{{labels},span_name="{stage}"}} {n * mean:.1f} {ts}'
    yield "# EOF"


def write_history(out: TextIO, *, days: float, end_s: int | None = None) -> None:
    end = int(time.time()) - 2 * 3600 if end_s is None else end_s
    for line in history_lines(end_s=end, days=days):
        out.write(line + "\n")


def request_durations_ms(
    slow_stage: str, factor: float, rng: random.Random
) -> dict[str, float]:
    """One request's stage durations: uniform on [0.5, 1.5] x mean, ``slow_stage`` x ``factor``."""
    return {
        stage: rng.uniform(0.5, 1.5) * mean * (factor if stage == slow_stage else 1.0)
        for stage, mean in STAGE_MEAN_MS.items()
    }


def emit_request(tracer: Any, durations_ms: dict[str, float], seq: int, end_ns: int) -> None:
    """Record one request span with its stage spans back to back, ending at ``end_ns``."""
    from opentelemetry import trace

    t = end_ns - int(sum(durations_ms.values()) * 1e6)
    request = tracer.start_span(semconv.SPAN_REQUEST, start_time=t, attributes={
        semconv.REQUEST_SEQ: seq, semconv.REQUEST_COLD_START: False})
    ctx = trace.set_span_in_context(request)
    for stage, ms in durations_ms.items():
        span = tracer.start_span(stage, context=ctx, start_time=t)
        t += int(ms * 1e6)
        span.end(end_time=t)
    request.end(end_time=t)


def send_traffic(
    endpoint: str, slow_stage: str, factor: float, rate: float, minutes: float
) -> None:
    """Emit requests at ``rate``/s for ``minutes`` (0 = until interrupted) over OTLP/gRPC."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({semconv.SERVICE_NAME: SERVICE}))
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer(semconv.SCOPE_NAME)
    rng = random.Random()
    stop_at = time.monotonic() + minutes * 60 if minutes > 0 else float("inf")
    print(f"{rate} requests/s to {endpoint}, {slow_stage} x{factor}; Ctrl-C stops", file=sys.stderr)
    seq = 0
    try:
        while time.monotonic() < stop_at:
            seq += 1
            emit_request(tracer, request_durations_ms(slow_stage, factor, rng), seq, time.time_ns())
            time.sleep(1.0 / rate)
    except KeyboardInterrupt:
        pass
    finally:
        provider.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    hist = sub.add_parser("history", help="print a week of normal history (OpenMetrics)")
    hist.add_argument("--days", type=float, default=8.0)
    traffic = sub.add_parser("traffic", help="send live spans with one stage slowed down")
    traffic.add_argument("--endpoint", default="localhost:4317", help="collector OTLP/gRPC")
    traffic.add_argument("--slow-stage", default=semconv.STAGE_DECODE, choices=list(STAGE_MEAN_MS))
    traffic.add_argument("--factor", type=float, default=6.0, help="slow-down of that stage")
    traffic.add_argument("--rate", type=float, default=2.0, help="requests per second")
    traffic.add_argument("--minutes", type=float, default=0.0, help="0 = until Ctrl-C")
    args = parser.parse_args(argv)
    if args.command == "history":
        write_history(sys.stdout, days=args.days)
    else:
        send_traffic(args.endpoint, args.slow_stage, args.factor, args.rate, args.minutes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
