"""Cost of otel_stages on the request path, every candidate in one process, as per-round ratios.

Not a test: run ``python benchmarks/overhead.py`` and read the JSON (``--smoke`` for a quick
functional run: the test suite does that, with no timed assertion). One request is a ``request``
span with five stages inside (``download``, ``decode``, ``resize``, ``queue``, ``forward``), all
empty: the worst case, where the instrumentation is all there is. Candidates:

* ``bare_pairs``: two ``time.monotonic_ns()`` per span, nothing kept;
* ``bare``: the three-timestamps method done by hand: two ``time.monotonic_ns()`` per span, kept
  with the stage name in a per-request list (the baseline of the ``disabled`` target);
* ``bare_cpu``: ``bare`` plus one ``time.thread_time_ns()`` pair per span;
* ``disabled``: otel_stages with telemetry off;
* ``sdk_start_span``: the OpenTelemetry SDK by hand, ``tracer.start_span`` + ``context.attach`` /
  ``detach`` + ``end`` per span (the baseline of the ``live`` and ``deferred`` targets), with the
  request span's two attributes (``request.seq``, ``request.cold_start``) so it makes the same
  spans as otel_stages;
* ``sdk_start_as_current_span``: the same with ``tracer.start_as_current_span``;
* ``live``, ``deferred``: otel_stages in each span mode, per-stage signals at their default (on:
  thread CPU time, GC and event-loop checks, :mod:`otel_stages.signals`);
* ``live_no_signals``, ``deferred_no_signals``: the same with ``configure(signals=False)``;
* ``live_run_queue``, ``deferred_run_queue``: the same with ``configure(run_queue=True)`` (opt-in:
  the stage thread's run-queue wait, two ``/proc/thread-self/schedstat`` reads per span,
  :mod:`otel_stages.signals.runqueue`); against ``live`` / ``deferred`` it is what turning it
  on costs;
* ``sdk_start_span_signals``: ``sdk_start_span`` plus the same signal calls by hand
  (``signals.on_start`` after each start time, ``signals.on_finish`` before each end): the
  like-for-like baseline of ``live`` with signals on;
* ``sdk_start_span_attrs``, ``live_attrs``, ``deferred_attrs``: three typical attributes per stage
  (two ints, one short string).

Fairness: every SDK-based candidate uses the same tracer of the same provider, the one the default
``configure()`` builds (open-span tracking, ``BatchSpanProcessor``, the embedded OTLP/JSON file
exporter); deferred mode's builder uses that tracer too. Each round runs every candidate once,
in a rotated order, after a garbage collection and with the batch queue and the builder emptied
(untimed); a round is short enough (``--requests`` x 6 spans < the batch size) that neither the
exporter nor the builder runs inside it, so the figures are the request thread's own cost (the
builder's later work is reported apart as ``builder_us_per_span``). Warm-up rounds are discarded.
Ratios are taken per round, then the median over rounds, for the request thread's CPU time
(``time.thread_time_ns``: what the targets use) and for wall time. On a shared machine wall time
also counts the moments other processes held the core; CPU time is the work itself.

Targets (issue 11): ``deferred / sdk_start_span <= 0.25``, ``live / sdk_start_span <= 1.05``,
``disabled / bare <= 1.5``; each reported with signals on (the default) and off
(``targets`` and ``targets_no_signals``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

import otel_stages as ots
from otel_stages import semconv, signals
from otel_stages._runtime import RUNTIME
from otel_stages.builder import SpanBuilder
from otel_stages.signals import capture

STAGES = semconv.STANDARD_STAGES
SPANS_PER_REQUEST = 1 + len(STAGES)
ATTRS = {semconv.IMAGE_WIDTH: 640, semconv.IMAGE_HEIGHT: 480, semconv.IMAGE_FORMAT: "JPEG"}
TARGETS = {"deferred_vs_sdk_start_span": 0.25, "live_vs_sdk_start_span": 1.05, "disabled_vs_bare": 1.5}
#: the same targets with signals off
TARGETS_NO_SIGNALS = {"deferred_no_signals_vs_sdk_start_span": 0.25,
                      "live_no_signals_vs_sdk_start_span": 1.05}

mono = time.monotonic_ns
thread_ns = time.thread_time_ns


def _bare_pairs() -> None:
    t0 = mono()
    for _ in STAGES:
        s0 = mono()
        s1 = mono()
    t1 = mono()
    del t0, t1, s0, s1


def _bare() -> None:
    stamps = []
    t0 = mono()
    for name in STAGES:
        s0 = mono()
        stamps.append((name, s0, mono()))
    stamps.append(("request", t0, mono()))


def _bare_cpu() -> None:
    stamps = []
    t0, c0 = mono(), thread_ns()
    for name in STAGES:
        s0, sc0 = mono(), thread_ns()
        sc1 = thread_ns()
        stamps.append((name, s0, mono(), sc0, sc1))
    c1 = thread_ns()
    stamps.append(("request", t0, mono(), c0, c1))


def _otel_stages() -> None:
    with ots.request():
        for name in STAGES:
            with ots.stage(name):
                pass


def _otel_stages_attrs() -> None:
    with ots.request():
        for name in STAGES:
            with ots.stage(name, **ATTRS):
                pass


def _sdk_candidates(tracer: trace.Tracer) -> dict[str, Callable[[], None]]:
    attach, detach, current = otel_context.attach, otel_context.detach, trace.set_span_in_context
    seq = iter(range(2, 1 << 62))

    def request_attributes() -> dict[str, Any]:
        return {semconv.REQUEST_SEQ: next(seq), semconv.REQUEST_COLD_START: False}

    def start_span() -> None:
        req = tracer.start_span(semconv.SPAN_REQUEST, attributes=request_attributes())
        req_token = attach(current(req))
        for name in STAGES:
            span = tracer.start_span(name)
            token = attach(current(span))
            detach(token)
            span.end()
        detach(req_token)
        req.end()

    def start_span_attrs() -> None:
        req = tracer.start_span(semconv.SPAN_REQUEST, attributes=request_attributes())
        req_token = attach(current(req))
        for name in STAGES:
            span = tracer.start_span(name, attributes=ATTRS)
            token = attach(current(span))
            detach(token)
            span.end()
        detach(req_token)
        req.end()

    on_start, on_finish, now = signals.on_start, signals.on_finish, time.time_ns

    def start_span_signals() -> None:
        start_ns = now()
        state = on_start()
        req = tracer.start_span(semconv.SPAN_REQUEST, attributes=request_attributes(),
                                start_time=start_ns)
        req_token = attach(current(req))
        for name in STAGES:
            span_start_ns = now()
            span_state = on_start()
            span = tracer.start_span(name, start_time=span_start_ns)
            token = attach(current(span))
            detach(token)
            end_ns = now()
            on_finish(span, span_state, span_start_ns, end_ns)
            span.end(end_ns)
        detach(req_token)
        end_ns = now()
        on_finish(req, state, start_ns, end_ns)
        req.end(end_ns)

    def start_as_current_span() -> None:
        with tracer.start_as_current_span(semconv.SPAN_REQUEST, attributes=request_attributes()):
            for name in STAGES:
                with tracer.start_as_current_span(name):
                    pass

    return {"sdk_start_span": start_span, "sdk_start_as_current_span": start_as_current_span,
            "sdk_start_span_attrs": start_span_attrs, "sdk_start_span_signals": start_span_signals}


class _Bench:
    """The candidates, each a (setup, body) pair run on one provider (module docstring)."""

    def __init__(self, telemetry: Any) -> None:
        self.telemetry = telemetry
        self.tracer = telemetry._tracer
        # Its thread never wakes on its own here (a round stays under its wake-up count): every
        # record is built in _settle, untimed and measured, never beside a timed round.
        self.builder = SpanBuilder(self.tracer, drops=telemetry._drops, interval_s=3600.0)
        sdk = _sdk_candidates(self.tracer)
        self.candidates: dict[str, tuple[dict[str, Any], Callable[[], None]]] = {
            "bare_pairs": ({"enabled": False}, _bare_pairs),
            "bare": ({"enabled": False}, _bare),
            "bare_cpu": ({"enabled": False}, _bare_cpu),
            "disabled": ({"enabled": False}, _otel_stages),
            "sdk_start_span": ({}, sdk["sdk_start_span"]),
            "sdk_start_as_current_span": ({}, sdk["sdk_start_as_current_span"]),
            "live": ({}, _otel_stages),
            "deferred": ({"deferred": True}, _otel_stages),
            "live_no_signals": ({"signals": False}, _otel_stages),
            "deferred_no_signals": ({"deferred": True, "signals": False}, _otel_stages),
            "live_run_queue": ({"run_queue": True}, _otel_stages),
            "deferred_run_queue": ({"deferred": True, "run_queue": True}, _otel_stages),
            "sdk_start_span_signals": ({}, sdk["sdk_start_span_signals"]),
            "sdk_start_span_attrs": ({}, sdk["sdk_start_span_attrs"]),
            "live_attrs": ({}, _otel_stages_attrs),
            "deferred_attrs": ({"deferred": True}, _otel_stages_attrs),
        }
        assert tuple(self.candidates) == CANDIDATES
        self.builder_s = 0.0  # builder CPU spent building deferred rounds (untimed part)
        self.built = 0

    def _settle(self) -> None:
        """Untimed: build what deferred rounds left, export what is queued, collect garbage."""
        started = time.thread_time()
        before = self.builder.built
        self.builder.flush()
        self.builder_s += time.thread_time() - started
        self.built += self.builder.built - before
        self.telemetry.tracer_provider.force_flush()
        gc.collect()

    def run(self, name: str, requests: int) -> tuple[float, float]:
        """One timed round of ``name``: (wall µs, request-thread CPU µs) per request."""
        setup, body = self.candidates[name]
        self._settle()
        RUNTIME.enabled = setup.get("enabled", True)
        RUNTIME.deferred = self.builder if setup.get("deferred") else None
        signals.enable(setup.get("signals", True))
        capture.enable_run_queue(setup.get("run_queue", False))
        try:
            wall0, cpu0 = time.perf_counter_ns(), time.thread_time_ns()
            for _ in range(requests):
                body()
            wall1, cpu1 = time.perf_counter_ns(), time.thread_time_ns()
        finally:
            RUNTIME.enabled, RUNTIME.deferred = True, None
            signals.enable(True)
            capture.enable_run_queue(False)
        return (wall1 - wall0) / requests / 1e3, (cpu1 - cpu0) / requests / 1e3


#: Every candidate's name, in the order a round starts from (rotated each round).
CANDIDATES = ("bare_pairs", "bare", "bare_cpu", "disabled", "sdk_start_span", "sdk_start_as_current_span",
              "live", "deferred", "live_no_signals", "deferred_no_signals", "live_run_queue",
              "deferred_run_queue", "sdk_start_span_signals", "sdk_start_span_attrs", "live_attrs",
              "deferred_attrs")

RATIOS = {  # name: (candidate, baseline)
    "deferred_vs_sdk_start_span": ("deferred", "sdk_start_span"),
    "live_vs_sdk_start_span": ("live", "sdk_start_span"),
    "disabled_vs_bare": ("disabled", "bare"),
    "disabled_vs_bare_pairs": ("disabled", "bare_pairs"),
    "sdk_start_as_current_span_vs_sdk_start_span": ("sdk_start_as_current_span", "sdk_start_span"),
    "live_vs_sdk_start_as_current_span": ("live", "sdk_start_as_current_span"),
    "deferred_no_signals_vs_sdk_start_span": ("deferred_no_signals", "sdk_start_span"),
    "live_no_signals_vs_sdk_start_span": ("live_no_signals", "sdk_start_span"),
    "live_vs_sdk_start_span_signals": ("live", "sdk_start_span_signals"),
    "sdk_start_span_signals_vs_sdk_start_span": ("sdk_start_span_signals", "sdk_start_span"),
    "live_vs_live_no_signals": ("live", "live_no_signals"),
    "deferred_vs_deferred_no_signals": ("deferred", "deferred_no_signals"),
    "live_run_queue_vs_live": ("live_run_queue", "live"),
    "deferred_run_queue_vs_deferred": ("deferred_run_queue", "deferred"),
    "bare_cpu_vs_bare": ("bare_cpu", "bare"),
    "live_attrs_vs_sdk_start_span_attrs": ("live_attrs", "sdk_start_span_attrs"),
    "deferred_attrs_vs_sdk_start_span_attrs": ("deferred_attrs", "sdk_start_span_attrs"),
}


def measure(rounds: int, warmup: int, requests: int, folder: Path,
            only: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the report (module docstring). ``only``: run just these
    candidates (a quicker look while iterating; ratios and targets whose two sides did not run
    are left out)."""
    load_before = os.getloadavg()
    telemetry = ots.configure(data_dir=folder, gpu="off", set_global=False, span_mode="live",
                              service_name="overhead-benchmark")
    signals_default = signals.is_enabled()  # configure()'s default: on
    bench = _Bench(telemetry)
    names = list(bench.candidates) if only is None else only
    pairs = {k: v for k, v in RATIOS.items() if set(v) <= set(names)}
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {k: [] for k in pairs}
    wall_ratios: dict[str, list[float]] = {k: [] for k in pairs}
    started = time.monotonic()
    try:
        for index in range(warmup + rounds):
            shift = index % len(names)
            order = names[shift:] + names[:shift]  # rotated: no candidate always runs first
            wall_round: dict[str, float] = {}
            cpu_round: dict[str, float] = {}
            for name in order:
                wall_round[name], cpu_round[name] = bench.run(name, requests)
            if index >= warmup:
                for name in names:
                    walls[name].append(wall_round[name])
                    cpus[name].append(cpu_round[name])
                for key, (num, den) in pairs.items():
                    ratios[key].append(cpu_round[num] / cpu_round[den])
                    wall_ratios[key].append(wall_round[num] / wall_round[den])
        bench._settle()
    finally:
        ok = telemetry.shutdown()
        bench.builder.shutdown(time.monotonic() + 5)
    deferred_requests = (rounds + warmup) * requests * sum(
        bool(bench.candidates[n][0].get("deferred")) for n in names)
    median = statistics.median
    cpu_us = {n: round(median(v), 3) for n, v in cpus.items()}

    def per_span(num: str, den: str | None = None) -> float | None:
        if num not in cpu_us or (den is not None and den not in cpu_us):
            return None  # not run (--candidates)
        return round((cpu_us[num] - (cpu_us[den] if den else 0.0)) / SPANS_PER_REQUEST, 3)

    report: dict[str, Any] = {
        "requests_per_round": requests, "rounds": rounds, "warmup_rounds": warmup,
        "spans_per_request": SPANS_PER_REQUEST,
        "thread_cpu_us_per_request": cpu_us,
        "wall_us_per_request": {n: round(median(v), 3) for n, v in walls.items()},
        "ratios": {k: round(median(v), 4) for k, v in ratios.items()},
        "ratio_quartiles": {k: [round(q, 3) for q in statistics.quantiles(v, n=4)] if len(v) > 1 else v
                            for k, v in ratios.items()},
        "wall_ratios": {k: round(median(v), 4) for k, v in wall_ratios.items()},
        "cpu_us_per_span": {
            "disabled_over_bare": per_span("disabled", "bare"),
            "live_over_sdk_start_span": per_span("live", "sdk_start_span"),
            "sdk_start_span": per_span("sdk_start_span"),
            "deferred": per_span("deferred"),
            "signals_live": per_span("live", "live_no_signals"),
            "signals_deferred": per_span("deferred", "deferred_no_signals"),
            "signals_sdk_by_hand": per_span("sdk_start_span_signals", "sdk_start_span"),
            "run_queue_live": per_span("live_run_queue", "live"),
            "run_queue_deferred": per_span("deferred_run_queue", "deferred"),
            "thread_time_pair_bare": per_span("bare_cpu", "bare"),
        },
        "builder_us_per_span": round(bench.builder_s * 1e6 / max(1, bench.built), 2),
        "deferred_spans_built": bench.built,
        "deferred_spans_expected": deferred_requests * SPANS_PER_REQUEST,
        "signals_default": signals_default,
        "spans_dropped": telemetry.dropped_spans,
        "shutdown_ok": ok,
        "duration_s": round(time.monotonic() - started, 1),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                    "platform": platform.platform(), "processor": platform.processor() or None,
                    "load_avg_before": [round(x, 2) for x in load_before],
                    "load_avg_after": [round(x, 2) for x in os.getloadavg()]},
    }
    report["targets"] = {k: {"ratio": report["ratios"][k], "at_most": t, "met": report["ratios"][k] <= t}
                         for k, t in TARGETS.items() if k in pairs}
    report["targets_no_signals"] = {
        k: {"ratio": report["ratios"][k], "at_most": t, "met": report["ratios"][k] <= t}
        for k, t in TARGETS_NO_SIGNALS.items() if k in pairs}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=41, help="timed rounds (default 41)")
    parser.add_argument("--warmup", type=int, default=5, help="rounds discarded first (default 5)")
    parser.add_argument("--requests", type=int, default=80,
                        help="requests per candidate per round (default 80; x6 spans stays under "
                             "the batch processor's 512-span batch)")
    parser.add_argument("--smoke", action="store_true", help="2 rounds of 5 requests, no warm-up")
    parser.add_argument("--candidates", metavar="NAME,...",
                        help="run only these candidates, comma-separated (e.g. "
                             "live_no_signals,sdk_start_span); the full run is what BENCHMARKS.md "
                             "reports")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.warmup, args.requests = 2, 0, 5
    only = None
    if args.candidates:
        only = [n.strip() for n in args.candidates.split(",") if n.strip()]
        unknown = sorted(set(only) - set(CANDIDATES))
        if unknown:
            parser.error(f"--candidates: unknown {', '.join(unknown)} (known: {', '.join(CANDIDATES)})")
    with tempfile.TemporaryDirectory() as folder:
        report = measure(args.rounds, args.warmup, args.requests, Path(folder), only)
        report["spans_written"] = sum(
            len(scope["spans"]) for path in Path(folder).glob("traces-*.jsonl")
            for line in path.read_bytes().splitlines()
            for resource in json.loads(line)["resourceSpans"] for scope in resource["scopeSpans"])
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
