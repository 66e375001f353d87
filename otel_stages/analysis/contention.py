"""``cpu_contention``: whether a stage's slow runs waited for a core (item 5 of
:mod:`otel_stages.analysis.mechanisms`, whose shared tests it uses:
:mod:`otel_stages.analysis.signal_rules`). Pure.

The rule, on :class:`~otel_stages.analysis.signal_figures.StageSignals`:

5. ``cpu_contention``: the *slowdown* ``wall / CPU time`` explains the swing: its share of the
   variance of ``log(stage ms)`` (``log wall = log cpu + log slowdown``, so the two shares add up to
   1) is at least :data:`MECHANISM_MIN_EXPLAINS`. A host short of CPU throughout slows every run
   by the same factor: then the waiting grows with the work, and the swing follows the work (e.g.
   image size), not the contention. And the stage must be CPU work: its upper quartile of CPU/wall
   at least :data:`CPU_WORK_MIN_UTILIZATION`. A stage that spends most of even its best runs off
   the CPU (a download, a GPU forward that blocks on the device, a lock) waits for something thread
   CPU time cannot tell from a core. The slow runs must have waited: their CPU/wall median at most
   :data:`CONTENTION_MAX_UTILIZATION_RATIO` of the fast runs' (not a few outliers), and at least
   :data:`CONTENTION_MIN_SLOW_UTILIZATION` (less is a thread blocked on a lock, I/O or a sleep,
   not one waiting for a core). And, where the CPU pressure part (Linux PSI ``some`` stall time
   during the stage, :mod:`otel_stages.signals.pressure`) is known for enough runs (the same
   :data:`MIN_SIGNAL_REQUESTS` and :data:`MIN_SIGNAL_COVERAGE`), the cores must have been
   contended while the slow runs waited: slowest-quarter median pressure at least
   :data:`CONTENTION_MIN_PRESSURE_OF_WAIT` of the slowest quarter's median waiting. A thread
   waiting in the run queue keeps its cgroup's ``some`` state on, so a wait for a core shows in
   the pressure at least 1:1; less means the slow runs waited on I/O, a lock, a sleep or the GIL
   (a Python thread waiting for the GIL sleeps, it is not runnable). Pressure counts every task
   of the cgroup (else the host) that waited, so it bounds this thread's own wait from above: it
   refutes a core wait when low and shows the cores were busy when high. Without pressure (other
   producers, old files, no PSI) the rule rests on thread CPU time alone and says so.

   Which tasks the pressure counts matters (``otel_stages.pressure.scope`` on the points,
   :attr:`StageSignals.pressure_scope`): the service's own cgroup (``cgroup``) may confirm; the
   host's ``/proc/pressure/cpu`` (``host``, and points without the attribute: older files,
   other producers) grows with any stage's length on a busy host (a low-priority batch job
   beside a service that sleeps keeps it on), so it may only refute: high host pressure leaves
   the verdict unconfirmed, and says to record the run-queue wait. Likewise a slow run below
   :data:`CONTENTION_MIN_SLOW_UTILIZATION` is called blocked only when the pressure did not
   cover its waiting (else it cannot be told: a thread 10+ deep in a run queue looks the same).

   **Run-queue wait decides where it is known** (``otel_stages.thread.run_queue_wait_ms``:
   Linux schedstat ``run_delay`` of the stage's own thread, opt-in at the producer), for at
   least :data:`MIN_SIGNAL_REQUESTS` runs and :data:`MIN_SIGNAL_COVERAGE` of them, once the
   slowdown explains the swing (above): confirmed when the run-queue part drives the swing (the
   same test as every part: explains at least :data:`MECHANISM_MIN_EXPLAINS`, slow median above
   the fast one), refuted when the rest of the waiting (``wall - CPU - run queue``: blocked on
   I/O, a lock, a sleep, the GIL) drives it, and unconfirmed when neither does. It is the
   thread's own, exact wait for a core, so neither the CPU/wall guards nor the pressure
   override it.

   **A busy GPU refutes it for ``forward``** (after the run-queue wait, before the other guards):
   when the GPU evidence's level is high (:data:`~otel_stages.analysis.gpu.GPU_BUSY_MIN_UTILIZATION`,
   judged on the slow forwards where enough of them are sampled,
   :mod:`otel_stages.analysis.gpu`), a forward thread off the CPU was waiting on the device, not
   for a core: the cause stays ``gpu_busy``.
"""

from __future__ import annotations

from otel_stages import semconv
from otel_stages.analysis import signal_rules as rules
from otel_stages.analysis.figures import Mechanism
from otel_stages.analysis.gpu import GPU_BUSY_MIN_UTILIZATION, LEVEL_HIGH, GpuEvidence
from otel_stages.analysis.signal_figures import StageSignals
from otel_stages.analysis.signal_rules import (
    drives,
    known,
    share_words,
    slowest_utilization,
    split_line,
)
from otel_stages.analysis.units import duration, pct, pct_beside

CAUSE_CPU_CONTENTION = "cpu_contention"

#: CPU work gets at least this share of a core in its best runs (upper quartile of CPU/wall) even on
#: a host oversubscribed 4x (decode, resize, a CPU model measure 0.9+ alone on a core); a download
#: from a remote store or a GPU forward that blocks on the device stays well below it.
CPU_WORK_MIN_UTILIZATION = 0.25
#: Below this CPU/wall in its slowest quarter a stage waited most of its time: the evidence says
#: how long its slow runs would take on a core of their own (a sentence, not a verdict).
MOSTLY_WAITING_UTILIZATION = 0.5
#: A thread that waits for a core still gets about (cores / runnable threads) of one: below this
#: share of a core in its slow runs (10+ busy threads per core) the thread was blocked, on a lock,
#: I/O or a sleep, not waiting for a core; thread CPU time cannot tell which.
CONTENTION_MIN_SLOW_UTILIZATION = 0.1
#: The slow runs must have been on the CPU for at most this part of the fast runs' share (CPU/wall
#: medians): above it the slow runs computed about as steadily as the fast ones, and the slowdown
#: that explains the variance comes from a few outliers, not from runs that waited.
CONTENTION_MAX_UTILIZATION_RATIO = 0.75
#: Where CPU pressure is recorded, the slow runs' median pressure (ms of PSI ``some`` stall during
#: the stage) must be at least this part of their median waiting (wall - CPU) for the waiting to
#: be for a core. A thread in the run queue keeps ``some`` on for its whole wait (1:1 at least);
#: half leaves room for the counter's 100 ms samples interpolated across the stage's window (a
#: stall near a window's edge is partly counted outside it) and for waiting that is GC or
#: throttling beside a core wait. Below half, most of the waiting had no task waiting for a core.
CONTENTION_MIN_PRESSURE_OF_WAIT = 0.5


_FIND_WAIT = ("a wall-clock profile of them (py-spy dump, or py-spy record --idle) shows the"
              " socket, lock or sleep they block in; py-spy record --gil shows whether they wait"
              " for the GIL (a Python thread waiting for the GIL sleeps: it counts as blocked,"
              " not as run-queue wait)")
_TURN_ON_RUN_QUEUE = ("record each stage thread's run-queue wait: configure(run_queue=True) or"
                      " OTEL_STAGES_RUN_QUEUE=true (Linux; two reads, a few us, a stage) tells a wait"
                      " for a core from one on I/O, a lock or a sleep")
_GIVE_A_CORE = (
    "give {stage} a core: fewer busy threads and processes on the same CPUs (cap request"
    " concurrency and thread pools at the cores available; ONNX Runtime / PyTorch / OpenMP thread"
    " counts add up), or more CPUs for the service",
    "in Python, CPU-bound threads also wait for the GIL: run CPU-heavy preprocessing in a process"
    " pool, or in libraries that release the GIL",
)


def _run_queue_check(sig: StageSignals, line: str, slowdown: float) -> Mechanism | None:
    """``cpu_contention`` decided by the run-queue wait (module docstring, item 5); ``None`` when
    it is not known for enough runs."""
    runq, blocked = sig.runq, sig.blocked
    if runq is None or blocked is None or not known(runq, sig.requests):
        return None
    runq_line = split_line(sig.stage, runq, sig, "run-queue wait (Linux schedstat run_delay: the"
                       " stage's thread runnable, waiting for a core)")
    blocked_line = split_line(sig.stage, blocked, sig, "blocked time (wall - CPU - run-queue wait)")
    head = (f"{line}; the slowdown (wall / CPU time) explains {share_words(slowdown)} of the variance"
            f" of log({sig.stage} ms); {runq_line}")
    if drives(runq, sig.requests):
        return Mechanism(CAUSE_CPU_CONTENTION, True, (
            f"{head}: {sig.stage} is CPU work that spent its slow runs waiting in the run queue"
            f" for a core (the thread's own wait, measured), not doing more work; {blocked_line}",
        ), tuple(a.format(stage=sig.stage) for a in _GIVE_A_CORE))
    if drives(blocked, sig.requests):
        return Mechanism(CAUSE_CPU_CONTENTION, False, (
            f"{head}; but {blocked_line}: the slow {sig.stage} runs were blocked, off the CPU and"
            " not waiting for one: on I/O, a lock, a sleep or the GIL, not on a core",
        ), (f"find what the slow {sig.stage} runs wait on: {_FIND_WAIT}",))
    return Mechanism(CAUSE_CPU_CONTENTION, False, (
        f"{head}; {blocked_line}: neither the wait for a core nor the blocked time drives the"
        f" swing alone (each below {pct(rules.MECHANISM_MIN_EXPLAINS)}): the slow {sig.stage} runs"
        " waited on both",
    ), (f"find what the slow {sig.stage} runs wait on besides a core: {_FIND_WAIT}",
        *(a.format(stage=sig.stage) for a in _GIVE_A_CORE[:1])))


def _pressure_covers(sig: StageSignals) -> bool:
    """The CPU pressure is known for enough runs and covered at least
    :data:`CONTENTION_MIN_PRESSURE_OF_WAIT` of the slow runs' median waiting."""
    share = sig.pressure_of_wait
    return (known(sig.pressure, sig.requests) and share is not None
            and share >= CONTENTION_MIN_PRESSURE_OF_WAIT)


def _device_busy(sig: StageSignals, line: str, gpu: GpuEvidence | None) -> Mechanism | None:
    """``cpu_contention`` refuted for a forward whose GPU was busy during the slow forwards (or,
    when those could not be judged apart, during the forwards): module docstring, item 5."""
    if gpu is None or gpu.level != LEVEL_HIGH:
        return None
    return Mechanism(CAUSE_CPU_CONTENTION, False, (
        f"{line}; but the GPU was busy, {gpu.judged_words()}, at or above the"
        f" {pct(GPU_BUSY_MIN_UTILIZATION)} busy threshold: the {sig.stage} thread was off the CPU"
        " waiting on the device (a forward blocks while its kernels run), not waiting for a"
        " core",))


def contention(sig: StageSignals, gpu: GpuEvidence | None = None) -> Mechanism | None:
    """The ``cpu_contention`` mechanism for one stage's signals (module docstring); ``gpu``: the
    forward's GPU evidence (``None`` for other stages). ``None`` without thread CPU time."""
    wait = sig.wait
    if wait is None or sig.cpu is None:
        return None
    line = (f"thread CPU time: in the slowest quarter of {sig.stage} runs (>= "
            f"{duration(sig.slow_min_ms)}) the thread ran {pct(sig.slow_cpu_utilization)} of the"
            f" time ({duration(sig.cpu.slow_median_ms)} CPU, {duration(wait.slow_median_ms)}"
            f" waiting, medians), in the faster half {pct(sig.fast_cpu_utilization)}; waiting is"
            f" {pct(wait.explains)} of {sig.stage}'s variance, CPU work {pct(sig.cpu.explains)}")
    slowdown = sig.slowdown_explains
    enough = (wait.requests >= rules.MIN_SIGNAL_REQUESTS
              and wait.requests >= rules.MIN_SIGNAL_COVERAGE * sig.requests)
    if not enough or slowdown is None or slowdown < rules.MECHANISM_MIN_EXPLAINS:
        why = ("" if not enough or slowdown is None else
               f"; the slowdown (wall / CPU time) explains only {pct(slowdown)} of the variance of"
               f" log({sig.stage} ms), the amount of CPU work {pct(1 - slowdown)}: the waiting grows"
               " with the work, the swing follows the work")
        slow_util = sig.slow_cpu_utilization
        if (why and slow_util is not None and slow_util < MOSTLY_WAITING_UTILIZATION
                and sig.cpu.slow_median_ms is not None):
            why += (f"; still, the slow runs waited most of their time: on a core of their own they"
                    f" would take about {duration(sig.cpu.slow_median_ms)} of CPU work instead of"
                    f" {duration(sig.cpu.slow_median_ms + (wait.slow_median_ms or 0.0))}")
        return Mechanism(CAUSE_CPU_CONTENTION, False, (line + why,))
    decided = _run_queue_check(sig, line, slowdown)
    if decided is not None:
        return decided
    device = _device_busy(sig, line, gpu)
    if device is not None:
        return device
    busy = sig.busy_utilization
    if busy is None or busy < CPU_WORK_MIN_UTILIZATION:
        return Mechanism(CAUSE_CPU_CONTENTION, False, (
            f"{line}; but even its best runs spend most of their time off the CPU (upper quartile"
            f" {pct_beside(busy, CPU_WORK_MIN_UTILIZATION) if busy is not None else pct(busy)}"
            f" on a core, below {pct(CPU_WORK_MIN_UTILIZATION)}): {sig.stage} waits"
            " for I/O, a lock or a device, which thread CPU time cannot tell from waiting for a"
            " core",))
    slow_util, fast_util = sig.slow_cpu_utilization, sig.fast_cpu_utilization
    if slow_util is None or fast_util is None or slow_util > CONTENTION_MAX_UTILIZATION_RATIO * fast_util:
        return Mechanism(CAUSE_CPU_CONTENTION, False, (
            f"{line}; but the typical slow run was on the CPU nearly as much of its time as the"
            f" fast ones (more than {pct(CONTENTION_MAX_UTILIZATION_RATIO)} of their share): the"
            " slowdown that explains the variance comes from a few outlying runs, not from runs"
            " that waited",))
    slowest = slowest_utilization(sig)
    if slowest is not None and slowest[0] < CONTENTION_MIN_SLOW_UTILIZATION:
        util, runs = slowest
        if _pressure_covers(sig):
            assert (sig.pressure is not None and sig.wait is not None
                    and sig.pressure_of_wait is not None)  # _pressure_covers
            return Mechanism(CAUSE_CPU_CONTENTION, False, (
                f"{line}; the {runs} were on a core only"
                f" {pct_beside(util, CONTENTION_MIN_SLOW_UTILIZATION)} of their time, yet the CPU"
                f" pressure ({_scope_words(sig)}) covered"
                f" {pct_beside(sig.pressure_of_wait, CONTENTION_MIN_PRESSURE_OF_WAIT)} of their"
                f" waiting ({duration(sig.pressure.slow_median_ms)} of"
                f" {duration(sig.wait.slow_median_ms)}, medians): whether they were blocked (on a"
                " lock, I/O, a sleep) or 10+ deep in a run queue cannot be told from thread CPU"
                " time and pressure",), (
                _TURN_ON_RUN_QUEUE,
                f"or find what the slow {sig.stage} runs wait on: {_FIND_WAIT}",))
        return Mechanism(CAUSE_CPU_CONTENTION, False, (
            f"{line}; but the {runs} were on a core only"
            f" {pct_beside(util, CONTENTION_MIN_SLOW_UTILIZATION)} of their time: waiting for a"
            f" core would leave a thread more (below {pct(CONTENTION_MIN_SLOW_UTILIZATION)} takes"
            f" 10+ busy threads per core, or 10+ busy Python threads sharing the GIL), so the"
            f" slow {sig.stage} runs were most likely blocked: on a lock, I/O, a device or a sleep"
            " (thread CPU time cannot tell which)",), (
            f"find what the slow {sig.stage} runs wait on: a wall-clock profile of them (py-spy"
            " dump or py-spy record --idle) shows the lock, socket or sleep they block in",))
    return _pressure_check(sig, line, slowdown)


def _pressure_check(sig: StageSignals, line: str, slowdown: float) -> Mechanism:
    """``cpu_contention`` for a stage whose thread CPU time says it waited: confirmed when the CPU
    pressure shows the cores were busy during the slow runs' waiting (at least
    :data:`CONTENTION_MIN_PRESSURE_OF_WAIT` of it), refuted when it was recorded and stayed
    lower, and on thread CPU time alone, hedged, when it was not recorded for enough runs."""
    wait, pressure = sig.wait, sig.pressure
    wait_ms = None if wait is None else wait.slow_median_ms
    if (pressure is None or pressure.slow_median_ms is None or wait_ms is None
            or pressure.requests < rules.MIN_SIGNAL_REQUESTS
            or pressure.requests < rules.MIN_SIGNAL_COVERAGE * sig.requests):
        missing = ("CPU pressure (Linux PSI) was not recorded" if pressure is None else
                   f"CPU pressure (Linux PSI) was recorded for only {pressure.requests} of"
                   f" {sig.requests} runs, too few to tell")
        return _on_cpu_time_alone(sig, line, slowdown, missing)
    stalled = pressure.slow_median_ms
    share = sig.pressure_of_wait
    assert share is not None  # both medians known (checked above)
    figure = (f"CPU pressure (Linux PSI some: {_scope_words(sig)} waited for a core) in the"
              f" slowest quarter: {duration(stalled)} of their"
              f" {duration(wait_ms)} waiting (medians,"
              f" {pct_beside(share, CONTENTION_MIN_PRESSURE_OF_WAIT)}), vs"
              f" {duration(pressure.fast_median_ms)} in the faster half")
    if share < CONTENTION_MIN_PRESSURE_OF_WAIT:
        return Mechanism(CAUSE_CPU_CONTENTION, False, (
            f"{line}; but {figure}: the cores were contended for only"
            f" {pct_beside(share, CONTENTION_MIN_PRESSURE_OF_WAIT)} of the slow"
            f" runs' waiting (below {pct(CONTENTION_MIN_PRESSURE_OF_WAIT)}; a thread waiting for"
            f" a core keeps the pressure on all the while), so the slow {sig.stage} runs waited"
            " on something else: I/O, a lock, a sleep, or the GIL (Python threads waiting for the"
            " GIL sleep and do not show as CPU pressure)",), (
            f"find what the slow {sig.stage} runs wait on: a wall-clock profile of them (py-spy"
            " dump or py-spy record --idle) shows the socket, lock or sleep they block in; py-spy"
            " record --gil shows whether they wait for the GIL",))
    if sig.pressure_scope != semconv.PRESSURE_SCOPE_CGROUP:
        return Mechanism(CAUSE_CPU_CONTENTION, False, (
            f"{line}: the slowdown (wall / CPU time) explains {share_words(slowdown)} of the variance"
            f" of log({sig.stage} ms), and {figure}: waiting drives the swing, but whether for a"
            " core cannot be told: the host's CPU pressure counts every task on the host (a"
            " low-priority batch job keeps it on while this thread sleeps), so it bounds this"
            " thread's wait from above and cannot confirm it",), (
            _TURN_ON_RUN_QUEUE,
            f"or find what the slow {sig.stage} runs wait on: {_FIND_WAIT}",))
    return Mechanism(CAUSE_CPU_CONTENTION, True, (
        f"{line}: the slowdown (wall / CPU time) explains {share_words(slowdown)} of the variance of"
        f" log({sig.stage} ms); {figure}: the cores were busy while the slow runs waited (the"
        " pressure counts every waiting task, so it bounds this thread's own wait from above):"
        f" {sig.stage} is CPU work that spent its slow runs waiting for a core, not doing more"
        " work",
    ), (
        f"give {sig.stage} a core: fewer busy threads and processes on the same CPUs (cap"
        " request concurrency and thread pools at the cores available; ONNX Runtime / PyTorch"
        " / OpenMP thread counts add up), or more CPUs for the service",
        "in Python, CPU-bound threads also wait for the GIL: run CPU-heavy preprocessing in a"
        " process pool, or in libraries that release the GIL",
    ))


def _scope_words(sig: StageSignals) -> str:
    """Whose tasks the pressure counts, in words."""
    if sig.pressure_scope == semconv.PRESSURE_SCOPE_CGROUP:
        return "a task of the service's cgroup"
    return "a task anywhere on the host"


def _on_cpu_time_alone(sig: StageSignals, line: str, slowdown: float, missing: str) -> Mechanism:
    """``cpu_contention`` confirmed from thread CPU time without CPU pressure: hedged."""
    return Mechanism(CAUSE_CPU_CONTENTION, True, (
        f"{line}: the slowdown (wall / CPU time) explains {share_words(slowdown)} of the variance of"
        f" log({sig.stage} ms): {sig.stage} is CPU work that spent its slow runs waiting for a"
        f" core (or the GIL), not doing more work; {missing}, so this rests on thread CPU time"
        " alone, which cannot rule out a wait on I/O, a lock or a device behind a fixed amount"
        " of CPU work (see the advice)",
    ), (
        f"give {sig.stage} a core: fewer busy threads and processes on the same CPUs (cap"
        " request concurrency and thread pools at the cores available; ONNX Runtime / PyTorch"
        " / OpenMP thread counts add up), or more CPUs for the service; first check that the"
        " cores were busy during the slow runs (load average, the service's own pools, other"
        f" processes): if they were idle, {sig.stage} waited on I/O, a lock or a device instead"
        " (time what it calls)",
        "in Python, CPU-bound threads also wait for the GIL: run CPU-heavy preprocessing in a"
        " process pool, or in libraries that release the GIL",
    ))
