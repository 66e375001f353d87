"""Which clock NVML's sample timestamps use, and conversion onto the span clock.

``nvmlDeviceGetSamples`` documents its timestamps only as "CPU timestamp in microseconds".
Drivers have used the Unix epoch and also boot time / ``CLOCK_MONOTONIC``, so the domain is
detected at runtime: the newest sample is compared with "now" in each candidate clock and the
closest clock it is not in the future of wins. When none is plausible the domain is
``"relative"``: the newest sample is taken as "now" and the spacing between samples is kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from otel_stages.clock import Clock

UNIX = "unix"  #: microseconds since the Unix epoch (wall clock)
MONOTONIC = "monotonic"  #: CLOCK_MONOTONIC microseconds (equal to boot time when never suspended)
BOOTTIME = "boottime"  #: CLOCK_BOOTTIME microseconds (boot time including suspend)
RELATIVE = "relative"  #: unknown epoch: only the spacing between samples is trusted

#: A sample may be this far "in the future" of a clock (read order, clock granularity).
_FUTURE_SLACK_US = 2_000_000
#: Samples older than this in a candidate clock make that clock implausible (an idle GPU's ring
#: can stop updating for hours, so this is generous).
_MAX_AGE_US = 400 * 86_400 * 1_000_000


def _boottime_ns() -> int:
    try:
        return time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):  # not Linux: boot time is not distinguishable
        return time.monotonic_ns()


class Timebase:
    """Detects a timestamp's clock domain and converts raw microseconds to span-clock ns.

    ``clock`` is the span clock; ``wall_ns`` / ``monotonic_ns`` / ``boottime_ns`` are injectable
    for tests and must be the same sources ``clock`` was built from. Thread-safe (stateless).
    """

    def __init__(self, clock: Clock, wall_ns: Callable[[], int] = time.time_ns,
                 monotonic_ns: Callable[[], int] = time.monotonic_ns,
                 boottime_ns: Callable[[], int] = _boottime_ns) -> None:
        self.clock = clock
        self._now = {UNIX: wall_ns, MONOTONIC: monotonic_ns, BOOTTIME: boottime_ns}

    def detect(self, newest_us: int) -> str:
        """The domain of ``newest_us`` (the newest sample of a drain): the candidate clock in
        which it is youngest without lying in the future; :data:`RELATIVE` when none fits.
        Monotonic wins ties with boot time (they are equal unless the host was suspended)."""
        best: tuple[int, int, str] | None = None
        for rank, domain in enumerate((MONOTONIC, BOOTTIME, UNIX)):
            age_us = self._now[domain]() // 1000 - newest_us
            if -_FUTURE_SLACK_US <= age_us <= _MAX_AGE_US:
                key = (max(age_us, 0), rank, domain)
                best = key if best is None or key < best else best
        return RELATIVE if best is None else best[2]

    def offset_ns(self, domain: str, newest_us: int) -> int:
        """``span_ns = raw_us * 1000 + offset_ns(domain, newest_us)`` for one drain.

        Computed per drain so a stepped wall clock or a suspend is picked up; ``newest_us`` is
        used only for :data:`RELATIVE`.
        """
        now = self.clock.now_ns()
        if domain == UNIX:
            return now - self._now[UNIX]()
        if domain == MONOTONIC:
            return self.clock.from_monotonic_ns(0)
        if domain == BOOTTIME:
            boot_minus_mono = self._now[BOOTTIME]() - self._now[MONOTONIC]()
            return self.clock.from_monotonic_ns(0) - boot_minus_mono
        return now - newest_us * 1000
