"""A sampled recording read as if every request were in it (tester A F5: otel-stages' own sampler
at ``OTEL_STAGES_SAMPLE_RATIO=0.1`` keeps every request of 1 s or more, the failed and the cold
ones whole, and a tenth of the rest; the report said "request total median 1114 ms" of a service
whose median request took 170 ms, and a 15x cold start read as 2.2x).

Two readings tell a sampled recording:

- gaps in ``request.seq`` (1-based per process; numbers from one counter the processes share,
  :data:`SHARED_SEQ_MAX_SHARE`, are read over all of them together): per process, requests in start
  order, a run of numbers restarts where the number drops by :data:`SEQ_RESTART_MIN_DROP` or more
  (a restart that kept ``service.instance.id``); each run counts the numbers from its lowest to its
  highest seen (a recording window that starts or ends mid-process counts only inside), and the
  distinct numbers seen. At :data:`SAMPLED_MIN_MISSING_FRACTION` of those numbers missing, and at
  least :data:`SAMPLED_MIN_MISSING_REQUESTS`, the recording is read as sampled;
- the sampler's own word: ``otel_stages.sampling.kept`` on the request spans it exported
  (:mod:`otel_stages.sampling`), counted by value (``ratio``: kept at the head, an unbiased
  sample; ``slow`` / ``error`` / ``cold``: kept for what they turned out to be). Where at least
  :data:`UNBIASED_MIN_REQUESTS` warm requests were kept by the ratio (or a sampled caller), their
  median total is given beside the one over every warm request read.

:func:`otel_stages.analysis.caveats.sampled_caveat` makes the verdict tentative, says first how
many requests were kept of how many ran and why the figures lean toward the slow ones, and leads
the advice with how to get unbiased figures. Pure; the ClickHouse report passes the same counts from SQL
(:func:`otel_stages.analysis.clickhouse_queries.seq_coverage_sql`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from otel_stages import semconv
from otel_stages.analysis.requests import Request, process_keys
from otel_stages.analysis.stats import percentile
from otel_stages.analysis.units import duration, pct

#: At this share of the ``request.seq`` numbers missing inside the seen range or more the
#: recording is read as sampled: a ratio sampler at 0.5 or below leaves half of them out, a
#: collector's tail sampling most; spans an export queue dropped now and then, or requests still
#: running at the end, leave a few percent.
SAMPLED_MIN_MISSING_FRACTION = 0.2
#: ... and at least this many numbers missing: two of ten lost is two lost requests, not sampling.
SAMPLED_MIN_MISSING_REQUESTS = 5
#: In a process's requests in start order, ``request.seq`` dropping by this much or more starts a
#: new run (a restart that kept ``service.instance.id`` numbers from 1 again); smaller drops are
#: concurrent requests that took their numbers in another order than their start times.
SEQ_RESTART_MIN_DROP = 16
#: ``request.seq`` values seen in more than one process: under this share of the distinct values,
#: with the values owned (lowest process key per value) by two processes or more, the numbers come
#: from one counter the processes share (a gateway or a load generator numbering requests across
#: replicas) when, read together, they leave no gaps (:data:`SAMPLED_MIN_MISSING_FRACTION`):
#: each process then sees every n-th number, which is no sampling, and the gaps are read over all
#: processes together. Per-process counters (otel-stages' own) all start at 1.
SHARED_SEQ_MAX_SHARE = 0.1
#: The warm requests the sampler kept by the ratio alone get a median of their own from this many
#: on (as ``decision.MIN_WARM_RUNS``: the median of fewer is one or two runs).
UNBIASED_MIN_REQUESTS = 5
#: ``otel_stages.sampling.kept`` values decided before the request ran (an unbiased sample).
HEAD_KEPT = (semconv.KEPT_RATIO, semconv.KEPT_PARENT)


@dataclass(frozen=True)
class SeqCoverage:
    """How much of each process's ``request.seq`` range the recording holds (module docstring).

    ``kept``: distinct numbers seen, summed over every process's runs; ``numbered``: the numbers
    from each run's lowest to its highest seen, summed (requests that ran in that range).
    ``kept_by``: request spans per ``otel_stages.sampling.kept`` value (the sampler's own word;
    empty when none says). ``unbiased_warm``: warm requests kept at the head (:data:`HEAD_KEPT`),
    ``unbiased_median_ms`` their median total (ms; ``None`` when there are none)."""

    kept: int = 0
    numbered: int = 0
    kept_by: Mapping[str, int] = field(default_factory=dict)
    unbiased_warm: int = 0
    unbiased_median_ms: float | None = None

    @property
    def missing(self) -> int:
        """Numbers in the ranges that no request read carries."""
        return max(self.numbered - self.kept, 0)

    def to_dict(self) -> dict[str, object]:
        """The ``sampling`` JSON object: ``kept``, ``numbered``, ``missing``, ``sampled``
        (:func:`is_sampled`); where sampled, ``kept_by`` (value -> requests),
        ``unbiased_warm`` and ``unbiased_median_ms`` (else ``{}``, 0, ``null``: the ClickHouse
        report reads the attribute only then)."""
        sampled = is_sampled(self)
        median = self.unbiased_median_ms if sampled else None
        return {"kept": self.kept, "numbered": self.numbered, "missing": self.missing,
                "sampled": sampled, "kept_by": dict(sorted(self.kept_by.items())) if sampled else {},
                "unbiased_warm": self.unbiased_warm if sampled else 0,
                "unbiased_median_ms": None if median is None else round(median, 3)}


def seq_runs(rows: Iterable[tuple[str, int, str, int]]) -> tuple[int, int]:
    """``(kept, numbered)`` of ``rows`` ``(process, start_ns, trace_id, seq)`` (module docstring;
    rows in any order, ``seq`` above 0)."""
    rows = list(rows)
    one = shared_counter(rows)
    by_process: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    for proc, start_ns, trace_id, seq in rows:
        by_process["" if one else proc].append((start_ns, trace_id, seq))
    kept = numbered = 0
    for found in by_process.values():
        found.sort()
        run: set[int] = set()
        previous = None
        for _, _, seq in found:
            if previous is not None and previous - seq >= SEQ_RESTART_MIN_DROP:
                kept, numbered = kept + len(run), numbered + max(run) - min(run) + 1
                run = set()
            run.add(seq)
            previous = seq
        if run:
            kept, numbered = kept + len(run), numbered + max(run) - min(run) + 1
    return kept, numbered


def shared_counter(rows: Sequence[tuple[str, int, str, int]]) -> bool:
    """Whether the ``request.seq`` numbers of ``rows`` (as :func:`seq_runs`) come from one counter
    the processes share (:data:`SHARED_SEQ_MAX_SHARE`)."""
    procs: dict[int, set[str]] = defaultdict(set)
    for proc, _, _, seq in rows:
        procs[seq].add(proc)
    if not procs:
        return False
    owners = {min(found) for found in procs.values()}
    shared = sum(1 for found in procs.values() if len(found) > 1)
    # read together they leave no gaps that would read as sampled (processes with counters of
    # their own whose ranges merely differ, 30..60 and 1..10, leave them)
    together = len(procs) >= (1 - SAMPLED_MIN_MISSING_FRACTION) * (max(procs) - min(procs) + 1)
    return len(owners) >= 2 and shared < SHARED_SEQ_MAX_SHARE * len(procs) and together


def seq_coverage(requests: Sequence[Request], warm: Sequence[Request] = ()) -> SeqCoverage:
    """:class:`SeqCoverage` of every request read (``requests``: warm, cold, failed); the
    unbiased median over those of ``warm`` kept at the head."""
    keys = process_keys(requests)
    kept, numbered = seq_runs((key, r.start_ns, r.trace_id, r.seq)
                              for r, key in zip(requests, keys) if r.seq is not None)
    why = Counter(str(r.attributes[semconv.SAMPLING_KEPT]) for r in requests
                  if semconv.SAMPLING_KEPT in r.attributes)
    head = [r.total_ms for r in warm if r.attributes.get(semconv.SAMPLING_KEPT) in HEAD_KEPT]
    return SeqCoverage(kept, numbered, dict(why), len(head),
                       percentile(head, 50) if head else None)


def is_sampled(coverage: SeqCoverage | None) -> bool:
    """At least :data:`SAMPLED_MIN_MISSING_REQUESTS` and :data:`SAMPLED_MIN_MISSING_FRACTION` of
    the numbered requests missing."""
    if coverage is None or coverage.numbered <= 0:
        return False
    missing = coverage.missing
    return (missing >= SAMPLED_MIN_MISSING_REQUESTS
            and missing >= SAMPLED_MIN_MISSING_FRACTION * coverage.numbered)


def sampled_line(coverage: SeqCoverage, warm_median_ms: float | None = None) -> str:
    """The evidence sentence when :func:`is_sampled`; ``warm_median_ms``: the median total over
    every warm request read (beside the unbiased one)."""
    line = (f"the recording is sampled: {coverage.kept} of the {coverage.numbered} requests"
            f" numbered by request.seq were kept ({pct(coverage.missing / coverage.numbered)}"
            " missing); a sampler that keeps the slow, failed and cold requests whole and only a"
            " share of the rest (otel-stages' own below OTEL_STAGES_SAMPLE_RATIO=1, a collector's"
            " tail sampling) makes the slow ones a larger part of what was kept than of what ran,"
            " so the medians, shares and the cold-start ratio here lean toward the slow requests;"
            " the verdict is tentative")
    by = coverage.kept_by
    if by:
        ratio = by.get(semconv.KEPT_RATIO, 0) + by.get(semconv.KEPT_PARENT, 0)
        late = {k: n for k, n in sorted(by.items())
                if k not in (semconv.KEPT_RATIO, semconv.KEPT_PARENT)}
        named = ", ".join(f"{k} {n}" for k, n in late.items()) or "none"
        line += (f"; the sampler says ({semconv.SAMPLING_KEPT}): {ratio} kept at the head by the"
                 f" ratio (an unbiased sample of what ran), the others for what they turned out to"
                 f" be ({named})")
        median = coverage.unbiased_median_ms
        if coverage.unbiased_warm >= UNBIASED_MIN_REQUESTS and median is not None:
            over = f", against {duration(warm_median_ms)} over every warm request read" if (
                warm_median_ms is not None) else ""
            line += (f"; the {coverage.unbiased_warm} warm requests kept by the ratio have a median"
                     f" total of {duration(median)}{over}")
    return line

