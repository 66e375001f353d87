"""Why a stage was slow: signals recorded beside each stage span.

* :mod:`~otel_stages.signals.capture`: per stage, the thread's CPU time and the CPU/wall ratio,
  garbage-collector pauses that overlapped it, asyncio event-loop lag (the stage hot path calls
  :func:`on_start` and :func:`on_finish`);
* :mod:`~otel_stages.signals.gcwatch`: the ``gc.callbacks`` hook behind the GC figures;
* :mod:`~otel_stages.signals.loop`: the event-loop lag monitor;
* :mod:`~otel_stages.signals.runqueue`: the stage thread's run-queue wait (Linux schedstat),
  opt-in (``configure(run_queue=True)``);
* :mod:`~otel_stages.signals.cgroup`: the cgroup's CPU quota and throttled time (cgroup v2
  ``cpu.stat`` / ``cpu.max``, v1 where mounted), sampled on the span clock;
* :mod:`~otel_stages.signals.session` (SDK; only ``otel_stages.sdk`` imports it): exports the
  cgroup samples as metrics, each at the time it was read.

OpenTelemetry API only, except ``session``. ``configure(signals=False)`` turns all of it off.
"""

from otel_stages.signals.capture import enable, finish_fields, is_enabled, on_finish, on_start

__all__ = ["enable", "finish_fields", "is_enabled", "on_finish", "on_start"]
