"""Why the suspect stage is slow: the mechanism rules, on per-request signals.

For every stage, :func:`stage_signals` splits the stage's time over the warm requests into the
parts the signals measure (:mod:`otel_stages.analysis.stage_signals`) and asks, for each, how much
of the stage's variance it explains: ``cov(part, stage) / var(stage)``, the measure the stage
table uses for stages against the total. The parts are ``wait`` (``wall - thread CPU``) and
``cpu`` (these two add up to the stage, so their shares add up to 1), GC time, event-loop lag and
cgroup throttled time. The result feeds :class:`~otel_stages.analysis.figures.StageEvidence`
(``mechanisms``, in order of precedence; :func:`~otel_stages.analysis.verdict.cause_for` takes
the first confirmed one) and the report's ``signals`` section. CPU pressure (PSI) is a part too,
read only by the ``cpu_contention`` rule (item 5).

A mechanism is confirmed when its part is known for at least :data:`MIN_SIGNAL_REQUESTS` warm
requests and :data:`MIN_SIGNAL_COVERAGE` of those the stage ran in, explains at least
:data:`MECHANISM_MIN_EXPLAINS` of the stage's variance (it drives the swing more than everything
else together), and its median in the slowest quarter of runs is above the faster half's (a few
outlying runs do not make a mechanism), plus, per cause:

1. ``gpu_memory_pressure`` (``forward`` only): :mod:`otel_stages.analysis.gpu_memory`.
2. ``cpu_throttled``: throttled time explains the swing (the cgroup's CPU quota ran out while the
   slow runs were going on).
3. ``gc_pause``: GC time explains the swing.
4. ``event_loop_blocked``: event-loop lag explains the swing; the evidence names the stages that
   held the loop (``otel_stages.event_loop.held_ms``). Also for the stage that held the loop itself
   when its slow runs were blocked there, off the CPU (:func:`_blocking_call`: time.sleep or
   synchronous I/O on the loop's thread).
5. ``cpu_contention``: :mod:`otel_stages.analysis.contention` (thread CPU time, CPU pressure
   with its scope, the run-queue wait where recorded).

Throttling, GC pauses and a blocked loop all show as waiting too, hence the order. Evidence lines
compare the slowest quarter of the stage's runs (``>= p75``) with the faster half (``<= median``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from otel_stages import semconv
from otel_stages.analysis import contention as contention_rules
from otel_stages.analysis import signal_rules as rules
from otel_stages.analysis.contention import (
    CAUSE_CPU_CONTENTION as CAUSE_CPU_CONTENTION,
)
from otel_stages.analysis.contention import (
    CONTENTION_MAX_UTILIZATION_RATIO as CONTENTION_MAX_UTILIZATION_RATIO,
)
from otel_stages.analysis.contention import (
    CONTENTION_MIN_PRESSURE_OF_WAIT as CONTENTION_MIN_PRESSURE_OF_WAIT,
)
from otel_stages.analysis.contention import (
    CONTENTION_MIN_SLOW_UTILIZATION as CONTENTION_MIN_SLOW_UTILIZATION,
)
from otel_stages.analysis.contention import (
    CPU_WORK_MIN_UTILIZATION as CPU_WORK_MIN_UTILIZATION,
)
from otel_stages.analysis.contention import (
    MOSTLY_WAITING_UTILIZATION as MOSTLY_WAITING_UTILIZATION,
)
from otel_stages.analysis.contention import contention
from otel_stages.analysis.figures import Mechanism, StageEvidence
from otel_stages.analysis.gpu import GpuEvidence
from otel_stages.analysis.gpu_memory import memory_evidence, memory_mechanism
from otel_stages.analysis.model import MetricPoint
from otel_stages.analysis.requests import Request
from otel_stages.analysis.signal_figures import (
    Held,
    StageSignals,
    figures_of,
    held_by_stage,
)
from otel_stages.analysis.signal_rules import (
    MECHANISM_MIN_EXPLAINS as MECHANISM_MIN_EXPLAINS,
)
from otel_stages.analysis.signal_rules import (
    MIN_SIGNAL_COVERAGE as MIN_SIGNAL_COVERAGE,
)
from otel_stages.analysis.signal_rules import (
    MIN_SIGNAL_REQUESTS as MIN_SIGNAL_REQUESTS,
)
from otel_stages.analysis.signal_rules import (
    drives,
    known,
    share_words,
    slowest_utilization,
    split_line,
)
from otel_stages.analysis.stage_signals import (
    PressureSeries,
    SignalTable,
    ThrottleSeries,
    signal_table,
)
from otel_stages.analysis.units import duration, pct

CAUSE_CPU_THROTTLED = "cpu_throttled"
CAUSE_GC_PAUSE = "gc_pause"
CAUSE_EVENT_LOOP_BLOCKED = "event_loop_blocked"


def _throttled(sig: StageSignals) -> Mechanism | None:
    part = sig.throttled
    if part is None or part.max_ms <= 0:  # never throttled during the stage: nothing to say
        return None
    quota = f" (quota {sig.limit_cpus:g} CPUs)" if sig.limit_cpus else ""
    line = split_line(sig.stage, part, sig, f"cgroup CPU throttling{quota}")
    if not drives(part, sig.requests):
        return Mechanism(CAUSE_CPU_THROTTLED, False, (line,))
    return Mechanism(CAUSE_CPU_THROTTLED, True, (
        f"{line}: the container's CPU quota ran out while the slow {sig.stage} runs were going on",
    ), (
        "raise the CPU limit (Kubernetes resources.limits.cpu, docker --cpus) or drop the limit and"
        " keep the request; throttling stops every thread of the container until the next period",
        "or use fewer threads in parallel: each one burns quota (torch.set_num_threads,"
        " OMP_NUM_THREADS, ONNX Runtime intra_op_num_threads, thread pools) - size them to the"
        " quota, not to the host's cores",
    ))


def _gc(sig: StageSignals) -> Mechanism | None:
    part = sig.gc
    if part is None or part.max_ms <= 0:
        return None
    line = split_line(sig.stage, part, sig, "garbage-collector time")
    if not drives(part, sig.requests):
        return Mechanism(CAUSE_GC_PAUSE, False, (line,))
    return Mechanism(CAUSE_GC_PAUSE, True, (
        f"{line}: CPython's collector (it holds the GIL: every Python thread stops) ran during the"
        f" slow {sig.stage} runs",
    ), (
        "call gc.freeze() once the model, caches and other long-lived objects are loaded: later"
        " full collections no longer walk them",
        "raise the collection thresholds (gc.set_threshold) or collect between requests, and"
        " break reference cycles in per-request code (weakref for back-pointers, no closures"
        " holding their frames) so that objects die by reference counting",
    ))


#: With no stage span named as the loop's holder, event-loop lag is not confirmed as a blocked
#: loop when CPU pressure covered at least this part of the slow runs' lag: a loop thread that
#: waits for a core (a CPU-starved host) lags as a blocked one does, and a waiting thread keeps the
#: pressure on (1:1), so half leaves the same room for 100 ms samples as the contention rule.
LOOP_STARVED_MIN_PRESSURE_OF_LAG = 0.5


def _loop_may_be_starved(sig: StageSignals) -> str | None:
    """Why the lag may be the loop thread's wait for a core, when no stage held the loop: the
    CPU pressure (any scope: here it can only cast doubt) covered at least
    :data:`LOOP_STARVED_MIN_PRESSURE_OF_LAG` of the slow runs' median lag; ``None`` otherwise or
    without pressure."""
    lag, pressure = sig.lag, sig.pressure
    if (lag is None or pressure is None or not known(pressure, sig.requests)
            or lag.slow_median_ms is None or pressure.slow_median_ms is None
            or lag.slow_median_ms <= 0
            or pressure.slow_median_ms < LOOP_STARVED_MIN_PRESSURE_OF_LAG * lag.slow_median_ms):
        return None
    return (f"the CPU was under pressure (Linux PSI some) for {duration(pressure.slow_median_ms)}"
            f" of the slow runs' {duration(lag.slow_median_ms)} lag (medians)")


def _loop(sig: StageSignals, held: Mapping[str, Held]) -> Mechanism | None:
    part = sig.lag
    if part is None or part.max_ms <= 0:
        return None
    line = split_line(sig.stage, part, sig, "asyncio event-loop lag")
    if not drives(part, sig.requests):
        return Mechanism(CAUSE_EVENT_LOOP_BLOCKED, False, (line,))
    lines = [f"{line}: the event loop was busy with other work while {sig.stage} waited on it"]
    if held:
        parts = []
        for name, h in sorted(held.items(), key=lambda kv: -kv[1].sum_ms)[:3]:
            parts.append(f"{name} {h.count} time{'s' if h.count != 1 else ''}"
                         f" (median {duration(h.median_ms)}, max {duration(h.max_ms)})")
        lines.append("held the event loop (ran on its thread without letting it run anything"
                     " else): " + "; ".join(parts))
        culprit = max(held, key=lambda k: held[k].sum_ms)
        move = f"move {culprit} off the event loop"
    else:
        lines.append("no stage span held the loop long enough to be named: the blocking work"
                     " runs outside the stage spans, or in pieces shorter than the shortest hold"
                     " the recording names (25 ms: otel_stages.signals.loop.HOLD_MIN_NS)")
        move = "find the CPU-bound or blocking call on the event loop and move it off"
        starved = _loop_may_be_starved(sig)
        if starved is not None:  # a loop thread waiting for a core lags the same way
            return Mechanism(CAUSE_EVENT_LOOP_BLOCKED, False, (
                f"{line}; {lines[1]}; but {starved}: the loop's thread may have been waiting for a"
                " core rather than blocked (a CPU-starved loop lags the same way), so a blocked"
                " loop is not confirmed",
            ), (
                "check whether the loop's thread got a core during the slow runs: fewer busy"
                " threads and processes on the service's CPUs (its own pools included), or more"
                " CPUs; then, if the lag stays, " + move.replace("find", "look for", 1),
                "asyncio's debug mode (PYTHONASYNCIODEBUG=1) logs every callback that runs longer"
                " than loop.slow_callback_duration, with the code that ran",
            ))
    return Mechanism(CAUSE_EVENT_LOOP_BLOCKED, True, tuple(lines), (
        f"{move}: await asyncio.to_thread(...) or loop.run_in_executor(pool, ...) (a process pool"
        " for pure-Python work), so the loop only awaits",
        "asyncio's debug mode (PYTHONASYNCIODEBUG=1) logs every callback that runs longer than"
        " loop.slow_callback_duration, with the code that ran",
    ))


def _blocking_call(sig: StageSignals, held: Mapping[str, Held]) -> Mechanism | None:
    """``event_loop_blocked`` by the stage itself: its spans held the event loop at least
    :data:`MIN_SIGNAL_REQUESTS` times, its waiting drives its swing (the slowdown explains
    :data:`MECHANISM_MIN_EXPLAINS`) and its slow runs were off the CPU (below
    :data:`CONTENTION_MIN_SLOW_UTILIZATION`): a blocking call on the loop's thread."""
    own = held.get(sig.stage)
    slowest, slowdown = slowest_utilization(sig), sig.slowdown_explains
    if (own is None or own.count < rules.MIN_SIGNAL_REQUESTS or slowest is None or slowdown is None
            or slowdown < rules.MECHANISM_MIN_EXPLAINS
            or slowest[0] >= contention_rules.CONTENTION_MIN_SLOW_UTILIZATION):
        return None
    util, runs = slowest
    return Mechanism(CAUSE_EVENT_LOOP_BLOCKED, True, (
        f"{sig.stage} held the event loop {own.count} time{'s' if own.count != 1 else ''} (median"
        f" {duration(own.median_ms)}, max {duration(own.max_ms)}) while its {runs} were on a"
        f" core only {pct(util)} of their time: a blocking call (time.sleep, synchronous I/O,"
        f" a lock) ran on the loop's thread, and every other request on that loop waited with it;"
        f" the slowdown (wall / CPU time) explains {share_words(slowdown)} of the variance of"
        f" log({sig.stage} ms)",
    ), (
        f"replace the blocking call in {sig.stage} with its asyncio form (await asyncio.sleep, an"
        " async client, asyncio locks), or run it with await asyncio.to_thread(...), so the loop"
        " keeps serving other requests while it waits",
        "asyncio's debug mode (PYTHONASYNCIODEBUG=1) logs every callback that runs longer than"
        " loop.slow_callback_duration, with the code that ran",
    ))


def _summary(sig: StageSignals) -> tuple[str, ...]:
    """One sentence per recorded part, for a stage with no confirmed mechanism."""
    lines = [m.evidence[0] for m in sig.mechanisms if m.evidence]
    if sig.cpu is None and sig.requests:
        lines.append(f"no thread CPU time on {sig.stage} spans (signals off, or another producer):"
                     " whether it computed or waited is unknown")
    elif sig.cpu is not None and sig.cpu.requests < rules.MIN_SIGNAL_REQUESTS:
        lines.append(f"thread CPU time on only {sig.cpu.requests} {sig.stage} spans: too few to"
                     " tell computing from waiting")
    return tuple(lines)


def stage_signals(warm: Sequence[Request], stages: Sequence[str], metrics: Sequence[MetricPoint],
                  gpu: GpuEvidence, *, table: SignalTable | None = None,
                  processes: Collection[str] | None = None, band_ms: float = 0.0,
                  model_gpus: Mapping[str, frozenset[str]] | None = None) -> dict[str, StageSignals]:
    """Signals per stage over the ``warm`` requests (module docstring); stages without any
    recorded signal are left out. ``table``: the requests' :func:`signal_table
    <otel_stages.analysis.stage_signals.signal_table>` when the caller has it already (it must
    be the table of exactly ``warm``, e.g. a :meth:`SignalTable.subset
    <otel_stages.analysis.stage_signals.SignalTable.subset>` of a larger one). ``processes``: the
    process keys of every request read, for the GPU memory
    (:func:`~otel_stages.analysis.gpu_memory.memory_evidence`). ``band_ms``: the run's noise band,
    which sets the slow forwards of the memory rule (:mod:`otel_stages.analysis.gpu_memory`; 0:
    every forward above the median). ``model_gpus``: process key -> the model's GPU, whose memory
    the memory rule reads (:func:`otel_stages.analysis.gpu.model_gpus` over the whole window;
    ``None``: chosen over ``warm``). Never raises for odd input."""
    throttle = ThrottleSeries(metrics)
    if table is None:
        table = signal_table(warm, stages, throttle, PressureSeries(metrics))
    scope = table.pressure_scope
    held = held_by_stage(table.holders())
    limit = max(throttle.limits.values()) if throttle.limits else None
    out: dict[str, StageSignals] = {}
    for stage in stages:
        found_columns = table.stages.get(stage)
        if found_columns is None or not len(found_columns):
            continue
        sig = figures_of(stage, found_columns, limit)
        if sig.pressure is not None:
            sig = replace(sig, pressure_scope=scope)
        forward = stage == semconv.STAGE_FORWARD
        judged = judge(sig, held, memory_mechanism(memory_evidence(
            warm, metrics, processes, band_ms=band_ms, model_gpus=model_gpus))
                       if forward else None, gpu if forward else None)
        if judged is not None:
            out[stage] = judged
    return out


def judge(sig: StageSignals, held: Mapping[str, Held], memory: Mechanism | None = None,
          gpu: GpuEvidence | None = None) -> StageSignals | None:
    """The mechanism rules on one stage's signals: ``sig`` (its parts filled, no mechanisms yet)
    with its mechanisms in order of precedence and its summary lines; ``held`` the stages that held
    the event loop, ``memory`` the forward's ``gpu_memory_pressure`` mechanism (``None`` for other
    stages or without memory data), ``gpu`` the forward's GPU utilization evidence (``None`` for
    other stages: a busy GPU during the slow forwards refutes ``cpu_contention``,
    :mod:`otel_stages.analysis.contention`). ``None`` when nothing was recorded (no mechanism, no
    CPU time). Every source's signals go through here: the file report's and ClickHouse's
    aggregates."""
    found = [memory, _throttled(sig), _gc(sig), _loop(sig, held), _blocking_call(sig, held),
             contention(sig, gpu)]
    mechanisms = tuple(m for m in found if m is not None)
    if not mechanisms and sig.cpu is None:
        return None
    holder = max(held, key=lambda k: held[k].sum_ms) if held else None
    sig = replace(sig, mechanisms=mechanisms, loop_holder=holder)
    return replace(sig, lines=() if sig.confirmed else _summary(sig))


def with_mechanisms(evidence: Mapping[str, StageEvidence],
                    signals: Mapping[str, StageSignals]) -> dict[str, StageEvidence]:
    """``evidence`` with each stage's mechanisms and signal sentences added."""
    out = dict(evidence)
    for stage, sig in signals.items():
        base = out.get(stage, StageEvidence())
        also = [m for m in sig.mechanisms if m.confirmed][1:]
        extra = tuple(f"also {m.cause}: {m.evidence[0]}" for m in also if m.evidence)
        lag = sig.lag.median_ms if sig.lag is not None and sig.lag.median_ms > 0 else None
        # the holder is named where this stage lagged, or a blocked loop is confirmed on it (its
        # median lag can be 0 when only the slow runs waited)
        blocked = any(m.confirmed and m.cause == CAUSE_EVENT_LOOP_BLOCKED for m in sig.mechanisms)
        out[stage] = replace(base, lines=(*base.lines, *sig.lines, *extra), mechanisms=sig.mechanisms,
                             lag_median_ms=lag,
                             loop_holder=sig.loop_holder if lag or blocked else None)
    return out
