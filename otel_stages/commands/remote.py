"""``otel-stages report`` from remote sources: Jaeger and Tempo (traces, then the same diagnosis
as files) and Prometheus (the fleet-wide report from span-metrics histograms), the ``--since``
window, and the stderr warnings every source shares. The command's arguments and its exit
statuses are in :mod:`otel_stages.commands.report`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import TYPE_CHECKING

from otel_stages.analysis import Recording
from otel_stages.analysis.http_source import SourceError
from otel_stages.analysis.jaeger import DEFAULT_LIMIT
from otel_stages.progress import show_progress

if TYPE_CHECKING:
    from otel_stages.analysis.aggregate import AggregateReport
    from otel_stages.analysis.prometheus import NamingOverrides

#: At most this many problems are echoed to stderr (all of them stay in the JSON).
MAX_STDERR_PROBLEMS = 20
#: How far back remote sources look when --since is not given.
DEFAULT_SINCE = "1h"

_NS_PER_UNIT = {
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
    "d": 86400 * 10**9,
    "w": 7 * 86400 * 10**9,
}
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")


def parse_since(raw: str) -> int:
    """``30m``, ``1h``, ``2d``, ``1h30m``, ``90s``, ``1w`` -> nanoseconds (> 0), Prometheus-style
    (integer counts, units ms/s/m/h/d/w). Raises ``argparse.ArgumentTypeError`` otherwise."""
    text = raw.strip().lower()
    parts = _DURATION_PART.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 30m, 1h, 2d or 1h30m, got {raw!r}"
        )
    ns = sum(int(n) * _NS_PER_UNIT[u] for n, u in parts)
    if ns <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration above 0, got {raw!r}")
    return ns


def warn(problems: list[str]) -> None:
    """Echo ``problems`` to stderr as warnings, at most :data:`MAX_STDERR_PROBLEMS` of them."""
    for problem in problems[:MAX_STDERR_PROBLEMS]:
        print(f"otel-stages: warning: {problem}", file=sys.stderr)
    if len(problems) > MAX_STDERR_PROBLEMS:
        print(
            f"otel-stages: warning: ... and {len(problems) - MAX_STDERR_PROBLEMS} more problems"
            " (all are listed under \"problems\" with --json)",
            file=sys.stderr,
        )


def _traceql_default(service: str | None) -> str:
    if not service:
        return "{}"
    quoted = service.replace("\\", "\\\\").replace('"', '\\"')
    return '{resource.service.name="' + quoted + '"}'


def load_remote(args: argparse.Namespace, now_ns: int) -> tuple[Recording, str]:
    """Spans from Jaeger or Tempo (plus GPU samples from Prometheus when given) and a phrase
    naming where they came from, with a progress bar per trace read on a terminal. Raises
    :class:`SourceError`."""
    from otel_stages.progress import progress

    since_ns = args.since or parse_since(DEFAULT_SINCE)
    start_ns, limit = now_ns - since_ns, args.limit or DEFAULT_LIMIT
    source = "Jaeger" if args.jaeger else "Tempo"
    with progress(f"reading traces from {source}", None, enabled=show_progress(args.json),
                  unit="traces") as bar:
        def on_trace(done: int, total: int) -> None:
            bar.set_total(total)
            bar.advance()

        if args.jaeger:
            from otel_stages.analysis.jaeger import fetch_jaeger

            recording = fetch_jaeger(args.jaeger, args.service, start_ns=start_ns, end_ns=now_ns,
                                     limit=limit, on_trace=on_trace)
            where = f"Jaeger at {args.jaeger} (service {args.service})"
        else:
            from otel_stages.analysis.tempo import fetch_tempo

            query = args.query if args.query is not None else _traceql_default(args.service)
            recording = fetch_tempo(args.tempo, query, start_ns=start_ns, end_ns=now_ns,
                                    limit=limit, on_trace=on_trace)
            where = f"Tempo at {args.tempo} (query {query})"
    if args.prometheus and recording.spans:
        from otel_stages.analysis.prometheus import fetch_gpu_samples

        recording.metrics.extend(
            fetch_gpu_samples(
                args.prometheus,
                service=args.service,
                start_ns=min(s.start_ns for s in recording.spans),
                end_ns=max(s.end_ns for s in recording.spans),
            )
        )
    return recording, f"{where}, last {_since_text(since_ns)}"


def _since_text(since_ns: int) -> str:
    from otel_stages.analysis.aggregate import format_window

    return format_window(max(1, since_ns // 10**9))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def aggregate_text(report: AggregateReport) -> str:
    """Plain text for ``report --prometheus``: stage table, verdict, evidence, advice."""
    who = f"service {report.service}" if report.service else "all services"
    lines = [
        f"otel-stages report from Prometheus span metrics ({who}, last"
        f" {_since_text(report.window_s * 10**9)}, about {report.requests} requests)",
        "",
        f"{'stage':<10}{'mean ms':>10}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}"
        f"{'share':>8}{'spans/s':>10}",
    ]
    for s in report.stages.values():
        lines.append(
            f"{s.name:<10}{_ms(s.mean_ms):>10}{_ms(s.p50_ms):>10}{_ms(s.p95_ms):>10}"
            f"{_ms(s.p99_ms):>10}{s.share:>8.0%}{s.rate_per_s:>10.2f}"
        )
    v = report.verdict
    lines += ["", f"verdict: {v.cause or 'none'}" + (f" ({v.stage})" if v.stage else "")
              + (" - tentative" if v.tentative else "")]
    lines += [f"  - {e}" for e in v.evidence]
    lines += ["advice:"] + [f"  - {a}" for a in v.advice]
    return "\n".join(lines) + "\n"


def run_prometheus(args: argparse.Namespace) -> int:
    from otel_stages.analysis.prometheus import fetch_prometheus_report

    try:
        report = fetch_prometheus_report(
            args.prometheus,
            service=args.service,
            since_ns=args.since or parse_since(DEFAULT_SINCE),
            now_ns=time.time_ns(),
            overrides=naming_overrides(args),
        )
    except SourceError as exc:
        print(f"otel-stages: error: {exc}", file=sys.stderr)
        return 1
    warn(report.problems)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        sys.stdout.write(aggregate_text(report))
    if not report.stages:
        print(
            f"otel-stages: error: no span metrics for the stages at {args.prometheus}"
            + (f" for service {args.service}" if args.service else ""),
            file=sys.stderr,
        )
        return 1
    return 0


def naming_overrides(args: argparse.Namespace) -> NamingOverrides:
    """The ``--metric``/label/unit options as :class:`NamingOverrides`."""
    from otel_stages.analysis.prometheus import NamingOverrides

    return NamingOverrides(
        metric=args.metric,
        span_label=args.span_label,
        service_label=args.service_label,
        unit=args.metric_unit,
    )
