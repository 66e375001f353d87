"""Batches: how big they were and how long requests waited for one to fill (pure).

Reads the ``batch`` spans (:data:`otel_stages.semconv.SPAN_BATCH`, one per model call on a
batch, written by :meth:`otel_stages.Batch.stage`): ``batch.size`` and one span link per member
request. A member's wait is its ``queue`` span (a child of the linked request span: enqueue ->
the executor picked the batch up). A batch's *fill* is the time from when it could have started
to pickup: from its first member's enqueue, or from the end of the previous batch of the same
process when that came later (the executor was still busy, which is not waiting for a batch to
fill). The previous-batch correction needs one executor per process: when batches of one process
overlap in time, fill runs from the first enqueue and ``overlapping_executors`` says so. A batch
holding a cold or set-apart request (the start-up burst behind a cold batch waits seconds for
the model load, no fill timeout) gives no wait and no fill (``aside_batches`` counts them): the
advice on the queue reads the others. A failed member does not set its batch aside: timeouts
cluster in the batches that waited longest, whose waits are the swing.

:func:`summarize_batches` returns ``None`` when the recording has no ``batch`` span (data written
before batch spans existed, or a service that does not batch).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass

from otel_stages import semconv
from otel_stages.analysis.model import Span
from otel_stages.analysis.requests import process_key
from otel_stages.analysis.stats import percentile


def _ms_summary(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min_ms": round(min(values), 3), "median_ms": round(percentile(values, 50), 3),
            "p95_ms": round(percentile(values, 95), 3), "max_ms": round(max(values), 3)}


@dataclass(frozen=True)
class BatchSummary:
    """What the ``batch`` spans say. Times in ms.

    ``sizes``: batch size -> number of batches; ``wait_ms``: one value per member request found
    (its ``queue`` span); ``fill_ms``: one value per batch whose members' queue spans were found;
    ``call_ms``: ``batch`` span durations (the model call); ``unmatched_members``: links to
    requests whose ``queue`` span is not in the recording; ``aside_batches``: batches holding a
    cold or set-apart request, left out of ``wait_ms`` and ``fill_ms``.
    """

    batches: int
    sizes: dict[int, int]
    wait_ms: list[float]
    fill_ms: list[float]
    call_ms: list[float]
    unmatched_members: int
    overlapping_executors: bool
    aside_batches: int = 0

    @property
    def mean_size(self) -> float:
        """Items per batch, on average."""
        return sum(size * n for size, n in self.sizes.items()) / max(self.batches, 1)

    def to_dict(self) -> dict[str, object]:
        """``{"batches", "mean_size", "max_size", "sizes": {"4": 9, ...}, "wait_ms", "fill_ms",
        "call_ms"`` (each ``{"min_ms", "median_ms", "p95_ms", "max_ms"}`` or null),
        ``"unmatched_members", "overlapping_executors"}``."""
        return {
            "batches": self.batches,
            "mean_size": round(self.mean_size, 3),
            "max_size": max(self.sizes, default=0),
            "sizes": {str(size): n for size, n in sorted(self.sizes.items())},
            "wait_ms": _ms_summary(self.wait_ms),
            "fill_ms": _ms_summary(self.fill_ms),
            "call_ms": _ms_summary(self.call_ms),
            "unmatched_members": self.unmatched_members,
            "overlapping_executors": self.overlapping_executors,
            "aside_batches": self.aside_batches,
        }

    def describe(self) -> list[str]:
        """Short readable lines for the text report."""
        sizes = ", ".join(f"{n}x{size}" for size, n in sorted(self.sizes.items()))
        lines = [f"{self.batches} batches, mean size {self.mean_size:.1f}, "
                 f"largest {max(self.sizes, default=0)} (count x size: {sizes})"]
        wait, fill = _ms_summary(self.wait_ms), _ms_summary(self.fill_ms)
        if wait is not None:
            lines.append(f"requests waited {wait['median_ms']:.1f} ms median, {wait['p95_ms']:.1f} ms p95 "
                         "from enqueue to batch pickup")
        if fill is not None:
            busy = ("" if self.overlapping_executors else
                    " (after the executor was free)")
            lines.append(f"batches filled in {fill['median_ms']:.1f} ms median, {fill['p95_ms']:.1f} ms "
                         f"p95{busy}")
        if self.unmatched_members:
            lines.append(f"{self.unmatched_members} linked requests had no queue span in the input")
        if self.aside_batches:
            lines.append(f"{self.aside_batches} batches holding a cold or set-apart request"
                         " left out of the waits and fills")
        return lines


def _size(span: Span) -> int:
    value = span.attributes.get(semconv.BATCH_SIZE)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return max(len(span.links), 1)


def summarize_batches(spans: Iterable[Span], aside: Container[tuple[str, str]] = ()
                      ) -> BatchSummary | None:
    """Summarize the ``batch`` spans in ``spans`` (see the module docstring); ``None`` without any.
    ``aside``: the ``(trace_id, span_id)`` of the cold and set-apart request spans: a batch
    linking to one gives no wait and no fill. Linear, and it keeps only
    batch spans and the queue spans they link to (a span repeated with the same trace and span id
    counts once)."""
    spans = spans if isinstance(spans, Sequence) else list(spans)
    unique: dict[tuple[str, str], Span] = {}
    for span in spans:
        if span.name == semconv.SPAN_BATCH:
            unique.setdefault((span.trace_id, span.span_id), span)
    if not unique:
        return None
    batches = sorted(unique.values(), key=lambda s: (s.start_ns, s.span_id))
    linked = {link for batch in batches for link in batch.links}
    # (trace, parent span) -> {(trace, span): queue span}, for the requests a batch links to
    found_queues: dict[tuple[str, str], dict[tuple[str, str], Span]] = defaultdict(dict)
    for span in spans:
        if span.name == semconv.STAGE_QUEUE and span.parent_span_id is not None:
            key = (span.trace_id, span.parent_span_id)
            if key in linked:
                found_queues[key].setdefault((span.trace_id, span.span_id), span)
    queues = {key: list(by_id.values()) for key, by_id in found_queues.items()}

    # when did the executor become free for each batch: the previous batch's end, per process
    free_at: dict[tuple[str, str], int | None] = {}
    overlapping: set[str] = set()
    last_end: dict[str, int] = {}
    for batch in batches:
        process = process_key(batch.resource)
        end = last_end.get(process)
        if end is not None and end > batch.start_ns:
            overlapping.add(process)  # several executors: "previous batch" means nothing
        free_at[(batch.trace_id, batch.span_id)] = end
        last_end[process] = batch.end_ns if end is None else max(end, batch.end_ns)

    wait_ms: list[float] = []
    fill_ms: list[float] = []
    unmatched = left_aside = 0
    for batch in batches:
        if any(link in aside for link in batch.links):
            left_aside += 1
            continue
        members: list[Span] = []
        for link in dict.fromkeys(batch.links):
            # its queue span: the latest one under the request that ended by the batch's start
            found = [q for q in queues.get(link, []) if q.end_ns <= batch.start_ns]
            if found:
                members.append(max(found, key=lambda q: q.end_ns))
            else:
                unmatched += 1
        wait_ms.extend(q.duration_ms for q in members)
        if members:
            picked_ns = max(q.end_ns for q in members)
            start_ns = min(q.start_ns for q in members)
            free_ns = free_at[(batch.trace_id, batch.span_id)]
            if free_ns is not None and process_key(batch.resource) not in overlapping:
                start_ns = max(start_ns, min(free_ns, picked_ns))
            fill_ms.append((picked_ns - start_ns) / 1e6)
    return BatchSummary(
        batches=len(batches),
        sizes=dict(Counter(_size(b) for b in batches)),
        wait_ms=wait_ms,
        fill_ms=fill_ms,
        call_ms=[b.duration_ms for b in batches],
        unmatched_members=unmatched,
        aside_batches=left_aside,
        overlapping_executors=bool(overlapping),
    )
