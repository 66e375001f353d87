"""Episodes: a swing whose slow requests all fall in one stretch of the run.

A tester's worker ran its forwards slow for the first minute of five (another job on its GPU,
a warm-up longer than :data:`~otel_stages.analysis.cohorts.WARMUP_MAX_REQUESTS` requests) and was
steady after; the report called the swing firmly and advised on what varies between calls, as if
every minute swung alike. The swing was real, but it was an episode, and a fix for steady-state
variability may not be needed.

The rule (pure; both reports feed it the same counts): the warm requests' start times, from the
first warm start to the last, are cut into :data:`EPISODE_BUCKETS` equal buckets (an incident at
one time on every replica, a short-lived one too), and where that finds no episode, each
process's from its own first warm start to its last (:func:`buckets`: a stretch is then a part of
each process's run: replicas started at different times that each run slow for their first
minute meet in the first buckets, and a few requests recorded a day earlier by another instance
stretch no one's run); per bucket, how many warm requests started and how many
of them were *slow* (their total above the warm median plus the verdict's noise band: the
requests that make the swing). The window of :data:`EPISODE_MAX_SPAN_SHARE` of the buckets that
holds the most slow requests (the earliest on a tie) is a candidate when it holds at least
:data:`EPISODE_MIN_SLOW_SHARE` of them, at most :data:`EPISODE_MAX_REQUEST_SHARE` of all warm
requests (else the requests themselves crowd there, not the slow ones), the requests arrive less
than :data:`EPISODE_MAX_RATE_RATIO` times as fast where the slow ones are as outside the window
(else a load burst), and there are at least :data:`EPISODE_MIN_SLOW` slow requests (fewer fall
together by chance). It is an episode
(:func:`confirm`) when the warm requests outside the window are steady: their total swings (p95 -
p5) within the noise band (a load that rises over the run puts its slow requests at the end too,
but the requests before them are no steady run). Then the verdict is tentative, the evidence says
when (the first and last start of the slow requests in the window, which process when they are
all one's of several, the part of the run from their first to their last bucket, and whether it
runs to the end of the recording), and the advice is to look at what ran then; unless the input mix or the
processes explain the swing (a large input sent only for a while, a slower replica alive only for
a while): their lines lead and the episode is not said.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass, replace

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
#: Requests arriving this many times faster in the stretch that holds the slow ones (its first to
#: its last bucket with a slow request) than outside the window are a load burst, no episode:
#: the requests crowd there (a window a quarter of the run long dilutes a 10 s burst under
#: :data:`EPISODE_MAX_REQUEST_SHARE`).
EPISODE_MAX_RATE_RATIO = 2.0

_WINDOW = round(EPISODE_BUCKETS * EPISODE_MAX_SPAN_SHARE)


@dataclass(frozen=True)
class Episode:
    """The stretch of the runs that holds the slow warm requests: buckets ``bucket_lo`` ..
    ``bucket_hi`` (excluded) of each process's run, holding ``slow_in`` of the ``slow`` requests
    (total above ``slow_min_ms``) and ``requests_in`` of the ``requests`` warm requests.
    :func:`confirm` adds ``start_ns`` / ``end_ns`` (Unix ns: the first and last start of the slow
    requests in it) and ``process`` (the process they all ran in, when the warm requests ran in
    several; ``""`` else); ``0`` / ``""`` before."""

    slow_in: int
    slow: int
    requests_in: int
    requests: int
    slow_min_ms: float
    bucket_lo: int
    bucket_hi: int
    start_ns: int = 0
    end_ns: int = 0
    process: str = ""
    #: the first bucket of the window with a slow request, and the one after its last
    held_lo: int = 0
    held_hi: int = 0
    #: the buckets are each process's run's (else the whole recording's)
    per_process: bool = False

    @property
    def at_start(self) -> bool:
        """The slow requests start in the runs' first bucket."""
        return self.held_lo == 0

    @property
    def at_end(self) -> bool:
        """The slow requests reach the runs' last bucket (it may be going on still)."""
        return self.held_hi == EPISODE_BUCKETS

    def holds(self, bucket: int) -> bool:
        """Whether ``bucket`` lies in the window."""
        return self.bucket_lo <= bucket < self.bucket_hi

    def to_dict(self) -> dict[str, object]:
        """The report's ``episode`` object (JSON)."""
        return {"start_unix_ns": self.start_ns, "end_unix_ns": self.end_ns,
                "run_share": [self.held_lo / EPISODE_BUCKETS, self.held_hi / EPISODE_BUCKETS],
                "per_process": self.per_process,
                "process": self.process or None, "slow_in": self.slow_in, "slow": self.slow,
                "requests_in": self.requests_in, "requests": self.requests,
                "slow_min_ms": round(self.slow_min_ms, 3), "at_start": self.at_start}


def bucket_of(start_ns: int, first_ns: int, last_ns: int) -> int:
    """The bucket (0 .. :data:`EPISODE_BUCKETS` - 1) of a warm request started at ``start_ns``,
    its process's warm starts running ``first_ns`` .. ``last_ns`` (integers, as the SQL computes
    it)."""
    return (start_ns - first_ns) * EPISODE_BUCKETS // (last_ns - first_ns + 1)


def buckets(starts_ns: Sequence[int], processes: Sequence[str]) -> list[int]:
    """Each warm request's bucket (:func:`bucket_of`) in its own process's run (``processes``:
    each request's process, pairwise with ``starts_ns``)."""
    span: dict[str, tuple[int, int]] = {}
    for start, p in zip(starts_ns, processes):
        lo, hi = span.get(p, (start, start))
        span[p] = (min(lo, start), max(hi, start))
    return [bucket_of(start, *span[p]) for start, p in zip(starts_ns, processes)]


def bucket_counts(at: Sequence[int], totals_ms: Sequence[float], slow_min_ms: float
                  ) -> tuple[list[int], list[int]]:
    """(warm requests per bucket, slow ones per bucket), from each request's bucket ``at``
    (:func:`buckets`) and total."""
    n = [0] * EPISODE_BUCKETS
    slow = [0] * EPISODE_BUCKETS
    for b, total in zip(at, totals_ms):
        n[b] += 1
        slow[b] += total > slow_min_ms
    return n, slow


def find_episode(n: Sequence[int], slow: Sequence[int], slow_min_ms: float) -> Episode | None:
    """The candidate of these bucket counts (module docstring), or ``None``."""
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
    held = [b for b in range(at, at + _WINDOW) if slow[b]]
    rate_in = sum(n[held[0]:held[-1] + 1]) / (held[-1] + 1 - held[0])
    rate_out = (requests - requests_in) / (EPISODE_BUCKETS - _WINDOW)
    if rate_in >= EPISODE_MAX_RATE_RATIO * rate_out:
        return None
    return Episode(slow_in=best, slow=slow_total, requests_in=requests_in, requests=requests,
                   slow_min_ms=slow_min_ms, bucket_lo=at, bucket_hi=at + _WINDOW,
                   held_lo=held[0], held_hi=held[-1] + 1)


def confirm(candidate: Episode | None, outside_swing_ms: float | None, band_ms: float, *,
            start_ns: int, end_ns: int, process: str = "", per_process: bool = False
            ) -> Episode | None:
    """``candidate`` as an episode when the warm requests outside its window swing (total p95 -
    p5, ``outside_swing_ms``) within ``band_ms`` (the verdict's noise band), with the first and
    last start of its slow requests, the one ``process`` they ran in (``""``: several, or the
    warm requests ran in one) and whether the buckets were each process's (``per_process``);
    else ``None``."""
    if candidate is None or outside_swing_ms is None or outside_swing_ms > band_ms:
        return None
    return replace(candidate, start_ns=start_ns, end_ns=end_ns, process=process,
                   per_process=per_process)


def _clock(ns: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)


def episode_line(e: Episode) -> str:
    """The evidence line: how many slow requests fell when (UTC, which process, and where in
    their process's run)."""
    start, end = _clock(e.start_ns), _clock(e.end_ns)
    where = f", all in {e.process}" if e.process else ""
    run = (f"{'its' if e.process else 'their'} process's run" if e.per_process
           else "the recording's time")
    tail = (", and it runs to the end of the recording (it may be going on still)" if e.at_end
            else ": it may not hold for the rest of the run")
    return (f"the swing is an episode: {e.slow_in} of the {e.slow} slow warm requests (total above"
            f" {e.slow_min_ms:.1f} ms: the median plus the noise band) started between"
            f" {start:%Y-%m-%d %H:%M:%S} and {end:%Y-%m-%d %H:%M:%S} UTC{where}, within"
            f" {pct(e.held_lo / EPISODE_BUCKETS)} .. {pct(e.held_hi / EPISODE_BUCKETS)} of {run}, a"
            f" stretch of {pct(e.requests_in / e.requests)} of the warm requests or less; outside it"
            " the requests are steady (their total swings within the noise band), so the verdict is"
            f" tentative{tail}")


def episode_advice(e: Episode) -> str:
    """The advice line: look at what ran then (a warm-up, when it starts the runs)."""
    first = ("it starts with the run: a warm-up longer than a few requests (lazy compilation or"
             " autotuning per input shape, caches filling): warm up with more requests, then check"
             " that later runs start steady; else " if e.at_start else "")
    hosts = f"{e.process}'s host" if e.process else "these hosts"
    steady = ("; it runs to the end of the recording: record on to see whether it ends" if e.at_end
              else " before changing the steady path, which ran steady outside it")
    return (f"{first}look at what ran on {hosts} then (another job on the GPU, a deploy or"
            f" model reload, throttling, a traffic burst){steady}")
