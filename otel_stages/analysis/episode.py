"""Episodes: a swing whose slow requests all fall in one stretch of the run.

A tester's worker ran its forwards slow for the first minute of five (another job on its GPU,
a warm-up longer than :data:`~otel_stages.analysis.cohorts.WARMUP_MAX_REQUESTS` requests) and was
steady after; the report called the swing firmly and advised on what varies between calls, as if
every minute swung alike. The swing was real, but it was an episode, and a fix for steady-state
variability may not be needed.

The rule (pure; both reports feed it the same counts): the warm requests' start times, from the
first warm start to the last, are cut into :data:`EPISODE_BUCKETS` equal buckets; per bucket, how
many warm requests started and how many of them were *slow* (their total above the warm median
plus the verdict's noise band: the requests that make the swing). The window of
:data:`EPISODE_MAX_SPAN_SHARE` of the buckets that holds the most slow requests (the earliest on a
tie) is an episode when it holds at least :data:`EPISODE_MIN_SLOW_SHARE` of them, at most
:data:`EPISODE_MAX_REQUEST_SHARE` of all warm requests (else the requests themselves crowd there,
not the slow ones), there are at least :data:`EPISODE_MIN_SLOW` slow requests (fewer fall
together by chance), and the warm requests outside the window are steady: their total swings
(p95 - p5) within the noise band (:func:`steady_outside`; a load that rises over the run puts its
slow requests at the end too, but the requests before them are no steady run). Then the verdict
is tentative, the evidence says when (the first to the last bucket of the window that holds slow
requests), and the advice is to look at what ran then; unless the input mix or the processes
explain the swing (a large input sent only for a while, a slower replica alive only for a while):
their lines lead and the episode is not said.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from otel_stages.analysis.units import pct

#: Buckets the warm requests' start times are cut into.
EPISODE_BUCKETS = 100
#: The window: this share of the buckets (a quarter of the run's time).
EPISODE_MAX_SPAN_SHARE = 0.25
#: An episode holds at least this share of the slow requests ...
EPISODE_MIN_SLOW_SHARE = 0.8
#: ... and at most this share of all warm requests.
EPISODE_MAX_REQUEST_SHARE = 0.4
#: Fewer slow requests than this are never called an episode.
EPISODE_MIN_SLOW = 10

_WINDOW = round(EPISODE_BUCKETS * EPISODE_MAX_SPAN_SHARE)


@dataclass(frozen=True)
class Episode:
    """The stretch of the run that holds the slow warm requests: ``start_ns`` .. ``end_ns`` (Unix
    ns; the edges of the first and last bucket of the window that hold slow requests), ``slow_in`` of
    the ``slow`` requests (total above ``slow_min_ms``) and ``requests_in`` of the ``requests`` warm
    requests started in the window, buckets ``bucket_lo`` .. ``bucket_hi`` (excluded);
    ``first_ns`` / ``last_ns``: the first and last warm start; ``at_start``: it begins with the
    bucket of the run's window (the slow requests lie in its first quarter)."""

    start_ns: int
    end_ns: int
    slow_in: int
    slow: int
    requests_in: int
    requests: int
    slow_min_ms: float
    first_ns: int
    last_ns: int
    bucket_lo: int = 0
    bucket_hi: int = 0

    @property
    def at_start(self) -> bool:
        """The episode's window begins with the run's first warm requests."""
        return self.bucket_lo == 0

    def to_dict(self) -> dict[str, object]:
        """JSON form (the report's ``episode``)."""
        return {"start_unix_ns": self.start_ns, "end_unix_ns": self.end_ns, "slow_in": self.slow_in,
                "slow": self.slow, "requests_in": self.requests_in, "requests": self.requests,
                "slow_min_ms": round(self.slow_min_ms, 3), "at_start": self.at_start}


def bucket_of(start_ns: int, first_ns: int, last_ns: int) -> int:
    """The bucket (0 .. :data:`EPISODE_BUCKETS` - 1) of a warm request started at ``start_ns``,
    the warm starts running ``first_ns`` .. ``last_ns`` (integers, as the SQL computes it)."""
    return (start_ns - first_ns) * EPISODE_BUCKETS // (last_ns - first_ns + 1)


def bucket_counts(starts_ns: Sequence[int], totals_ms: Sequence[float], slow_min_ms: float
                  ) -> tuple[list[int], list[int], int, int]:
    """(requests per bucket, slow requests per bucket, first start, last start) of the warm
    requests (``starts_ns`` / ``totals_ms`` pairwise); empty lists without requests."""
    if not starts_ns:
        return [], [], 0, 0
    first, last = min(starts_ns), max(starts_ns)
    n = [0] * EPISODE_BUCKETS
    slow = [0] * EPISODE_BUCKETS
    for start, total in zip(starts_ns, totals_ms):
        b = bucket_of(start, first, last)
        n[b] += 1
        slow[b] += total > slow_min_ms
    return n, slow, first, last


def find_episode(n: Sequence[int], slow: Sequence[int], first_ns: int, last_ns: int,
                 slow_min_ms: float) -> Episode | None:
    """The episode of these bucket counts (module docstring), or ``None``."""
    slow_total, requests = sum(slow), sum(n)
    if slow_total < EPISODE_MIN_SLOW or len(n) != EPISODE_BUCKETS:
        return None
    best, at = -1, 0
    for b in range(EPISODE_BUCKETS - _WINDOW + 1):
        inside = sum(slow[b:b + _WINDOW])
        if inside > best:
            best, at = inside, b
    requests_in = sum(n[at:at + _WINDOW])
    if best < EPISODE_MIN_SLOW_SHARE * slow_total or requests_in > EPISODE_MAX_REQUEST_SHARE * requests:
        return None
    width = last_ns - first_ns + 1
    held = [b for b in range(at, at + _WINDOW) if slow[b]]
    return Episode(start_ns=first_ns + held[0] * width // EPISODE_BUCKETS,
                   end_ns=first_ns + (held[-1] + 1) * width // EPISODE_BUCKETS,
                   slow_in=best, slow=slow_total, requests_in=requests_in, requests=requests,
                   slow_min_ms=slow_min_ms, first_ns=first_ns, last_ns=last_ns,
                   bucket_lo=at, bucket_hi=at + _WINDOW)


def steady_outside(episode: Episode | None, outside_swing_ms: float | None, band_ms: float
                   ) -> Episode | None:
    """``episode`` when the warm requests outside its window swing (total p95 - p5,
    ``outside_swing_ms``) within ``band_ms`` (the verdict's noise band), else ``None``."""
    if episode is None or outside_swing_ms is None or outside_swing_ms > band_ms:
        return None
    return episode


def _clock(ns: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)


def episode_line(e: Episode) -> str:
    """The evidence line: how many slow requests fell when (UTC, and seconds into the run)."""
    start, end = _clock(e.start_ns), _clock(e.end_ns)
    run_s = (e.last_ns - e.first_ns) / 1e9
    return (f"the swing is an episode: {e.slow_in} of the {e.slow} slow warm requests (total above"
            f" {e.slow_min_ms:.1f} ms: the median plus the noise band) started between"
            f" {start:%Y-%m-%d %H:%M:%S} and {end:%H:%M:%S} UTC ({(e.start_ns - e.first_ns) / 1e9:.0f} s"
            f" .. {(e.end_ns - e.first_ns) / 1e9:.0f} s of the {run_s:.0f} s of warm requests), a"
            f" stretch of {pct(e.requests_in / e.requests)} of the warm requests or less; outside it"
            " the requests are steady (their total swings within the noise band), so the verdict is"
            " tentative: it may not hold for the rest of the run")


def episode_advice(e: Episode) -> str:
    """The advice line: look at what ran then (a warm-up, when it starts the run)."""
    first = ("it starts with the run: a warm-up longer than a few requests (lazy compilation or"
             " autotuning per input shape, caches filling): warm up with more requests, then check"
             " that later runs start steady; else " if e.at_start else "")
    return (f"{first}look at what ran on these hosts then (another job on the GPU, a deploy or"
            " model reload, throttling, a traffic burst) before changing the steady path, which"
            " ran steady outside it")

