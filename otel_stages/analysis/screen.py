"""Leave out spans whose times cannot be real, and say which and why. Pure, linear in the spans.

A span is left out when it

- starts before 2000-01-01 (:data:`EARLIEST_START_NS`): an unset clock, a monotonic reading
  exported as a Unix time, or a duration written where a timestamp belongs;
- lasts longer than a day (:data:`MAX_DURATION_NS`): no stage of an inference request does, and
  one such span would dominate every statistic it enters;
- ends before it starts.

Times are Unix-epoch nanoseconds, as every loader produces them (OTLP ``*UnixNano``, Jaeger and
Tempo converted). A left-out request span leaves its stage spans without a parent, so they are
then counted as incomplete rather than as a request (see :mod:`otel_stages.analysis.requests`).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from otel_stages.analysis.model import Span

#: 2000-01-01T00:00:00Z in Unix nanoseconds: nothing this tool reads was recorded earlier.
EARLIEST_START_NS = 946_684_800 * 10**9
#: One day in nanoseconds: the longest a span may last and still be a stage of a request.
MAX_DURATION_NS = 86_400 * 10**9

REASON_EARLY = "starts before 2000-01-01"
REASON_LONG = "lasts longer than a day"
REASON_BACKWARDS = "ends before it starts"


@dataclass
class _Tally:
    count: int = 0
    example: str = ""


@dataclass
class Screened:
    """``spans`` that passed; ``left_out`` maps a reason to how many spans it removed;
    ``problems`` are one sentence per reason with the first example."""

    spans: list[Span]
    left_out: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _utc(ns: int) -> str:
    seconds = ns / 1e9
    try:
        moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns"
    return f"{ns} ns = {moment.strftime('%Y-%m-%dT%H:%M:%SZ')}"


def _reason(span: Span) -> str | None:
    if span.start_ns < EARLIEST_START_NS:
        return REASON_EARLY
    if span.end_ns < span.start_ns:
        return REASON_BACKWARDS
    if span.end_ns - span.start_ns > MAX_DURATION_NS:
        return REASON_LONG
    return None


#: Unit mistakes recognised in an early start: (factor to ns, unit). A start that, times the
#: factor, falls between :data:`EARLIEST_START_NS` and a year from now was written in that unit
#: where OTLP wants nanoseconds.
#: (Not seconds: a duration in ns written as a timestamp has the same magnitude.)
_UNIT_MISTAKES = ((10**3, "microseconds"), (10**6, "milliseconds"))
_YEAR_NS = 366 * 86_400 * 10**9


def unit_mistake(start_ns: int, now_ns: int | None = None) -> tuple[int, str] | None:
    """``(factor, unit)`` when ``start_ns`` (a span start before 2000) reads as a time between
    2000 and a year from ``now_ns`` (default: the wall clock) once multiplied by ``factor``, i.e.
    it was most likely written in ``unit`` (``"microseconds"``, ``"milliseconds"``); ``None``
    otherwise."""
    latest = (time.time_ns() if now_ns is None else now_ns) + _YEAR_NS
    for factor, unit in _UNIT_MISTAKES:
        if EARLIEST_START_NS <= start_ns * factor <= latest:
            return factor, unit
    return None


def example(span: Span, reason: str) -> str:
    """The example text of ``span`` left out for ``reason`` (one of the ``REASON_*``)."""
    where = f"'{span.name}' in trace {span.trace_id}"
    if reason == REASON_EARLY:
        mistake = unit_mistake(span.start_ns)
        if mistake is not None:
            factor, unit = mistake
            return (f"{where} starts at {_utc(span.start_ns)}, or at"
                    f" {_utc(span.start_ns * factor).split(' = ')[-1]} read as {unit}")
        return f"{where} starts at {_utc(span.start_ns)}"
    if reason == REASON_BACKWARDS:
        return f"{where} ends {(span.start_ns - span.end_ns) / 1e6:.3f} ms before its start"
    return f"{where} lasts {(span.end_ns - span.start_ns) / 3.6e12:.1f} h"


def problem_line(reason: str, count: int, example_text: str) -> str:
    """The report's sentence for ``count`` spans left out for ``reason``, with ``example_text``
    (:func:`example`); also the ClickHouse report's, from its SQL counts."""
    if reason == REASON_EARLY:
        return (f"{count} span{'s' if count != 1 else ''} left out: {reason} (e.g. {example_text});"
                + (" the producer likely wrote another unit where OTLP wants nanoseconds"
                   if " read as " in example_text
                   else " an unset clock or a duration written as a timestamp"))
    return f"{count} span{'s' if count != 1 else ''} left out: {reason} (e.g. {example_text})"


def screen_spans(spans: Iterable[Span]) -> Screened:
    """Split ``spans`` into those with possible times and a count of the rest (see the module
    docstring). Never raises."""
    kept: list[Span] = []
    keep = kept.append
    tallies: dict[str, _Tally] = {}
    earliest, longest = EARLIEST_START_NS, MAX_DURATION_NS
    for span in spans:
        start, end = span.start_ns, span.end_ns
        if start >= earliest and start <= end and end - start <= longest:  # _reason(span) is None
            keep(span)
            continue
        reason = _reason(span)
        if reason is None:  # pragma: no cover - the test above is _reason's, inlined for speed
            keep(span)
            continue
        tally = tallies.setdefault(reason, _Tally())
        tally.count += 1
        if not tally.example:
            tally.example = example(span, reason)
    problems = [problem_line(reason, t.count, t.example) for reason, t in tallies.items()]
    return Screened(kept, {r: t.count for r, t in tallies.items()}, problems)
