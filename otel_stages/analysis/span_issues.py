"""Problems met while building requests from spans (:mod:`otel_stages.analysis.requests`): stage
spans that stick out of their request, lie wholly outside it (clock skew between hosts), or
overlap each other; span ids shared by different spans. Each kind is counted with one example
and becomes one sentence of the report's ``problems``."""

from __future__ import annotations

from otel_stages.analysis.model import Span
from otel_stages.analysis.units import duration

#: Stage spans of one request may overlap by this much (ms) before it is a problem: clocks of two
#: threads (or Jaeger's microsecond times) can put one stage's start a hair before the last's end.
OVERLAP_TOLERANCE_MS = 0.05


class IdClashes:
    """Spans that share a trace and span id with a *different* span (another name, parent or
    times): exact copies (a collector retry, a file read twice) are not clashes."""

    def __init__(self) -> None:
        self.count = 0
        self.example = ""
        self.ids: set[tuple[str, str]] = set()  # (trace id, span id) that clash

    def add(self, kept: Span, other: Span) -> None:
        self.count += 1
        self.ids.add((other.trace_id, other.span_id))
        if not self.example:
            apart = abs(other.start_ns - kept.start_ns) / 1e6
            how = (f"starting {apart:.1f} ms apart" if apart else
                   "with other ends" if other.end_ns != kept.end_ns else "with other parents")
            self.example = (f"span {other.span_id} in trace {other.trace_id}: '{kept.name}' and"
                            f" '{other.name}' {how}")

    def problems(self) -> list[str]:
        if not self.count:
            return []
        n = self.count
        return [
            f"{n} span{'s' if n != 1 else ''} share{'s' if n == 1 else ''} a span id with a"
            f" different span (e.g. {self.example}): only the first of each id was kept, so"
            " requests that share an id are merged into one; the ids are not unique (a fixed or"
            " badly seeded id generator, spans copied between traces, hand-written ids, or one"
            " span exported twice with changed fields)"
        ]


def same_span(a: Span, b: Span) -> bool:
    """Whether two spans with one id are copies of each other (not a clash)."""
    return (a.name == b.name and a.start_ns == b.start_ns and a.end_ns == b.end_ns
            and a.parent_span_id == b.parent_span_id)


class StageIssues:
    """Counts of stages sticking out of their request and of overlapping stages, with one example."""

    def __init__(self) -> None:
        self.outside = 0
        self.outside_max_ms = 0.0
        self.outside_example = ""
        self.overlap = 0
        self.overlap_example = ""
        self.detached = 0  # stage spans with time that lie wholly outside their request span
        self.detached_requests = 0
        self.detached_example = ""

    def add_detached(self, other: StageIssues) -> None:
        """Take ``other``'s stage spans wholly outside their request (only those) into this one."""
        self.detached += other.detached
        self.detached_requests += other.detached_requests
        self.detached_example = self.detached_example or other.detached_example

    def problems(self) -> list[str]:
        out = []
        if self.detached:
            out.append(
                f"{self.detached} stage span{'s' if self.detached != 1 else ''} in"
                f" {self.detached_requests} request{'s' if self.detached_requests != 1 else ''} lie"
                f" entirely outside their request span (e.g. {self.detached_example}) and count"
                " 0 ms: a clock skew between hosts (the stage ran on a host whose clock is ahead of or"
                " behind the request's) is the likely cause; sync the hosts' clocks (NTP / chrony)"
                " or record the stage on the request's host"
            )
        if self.outside:
            out.append(
                f"stage spans reach outside their request span in {self.outside} request"
                f"{'s' if self.outside != 1 else ''} (up to {duration(self.outside_max_ms)} outside,"
                f" e.g. {self.outside_example}): only the part inside the request counts; work that"
                " outlives its request (fire-and-forget) is not request latency, and a stage"
                " recorded on another host reaches out by that host's clock skew"
            )
        if self.overlap:
            out.append(
                f"stage spans overlap in {self.overlap} request{'s' if self.overlap != 1 else ''}"
                f" (e.g. {self.overlap_example}): stages that run at the same time make the stage"
                " shares add up to more than the request"
            )
        return out
