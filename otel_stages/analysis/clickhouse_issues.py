"""Data problems in ClickHouse: what the file report finds while it screens spans and builds
requests (:mod:`otel_stages.analysis.screen`, :mod:`otel_stages.analysis.requests`,
:mod:`otel_stages.analysis.span_issues`), counted in SQL, with the same sentences.

- **Spans left out** (:func:`odd_spans_sql`): per reason of :mod:`otel_stages.analysis.screen`
  (a start before 2000-01-01, an end before the start, longer than a day; the exporter stores
  ``Duration`` as Go's ``uint64`` of ``end - start``, so an end before the start reads as a
  duration of 2^63 ns or more), a count and one example each. The table's partition key and
  duration index answer this without a full read.
- **Stage spans against their request** (:func:`issues_sql`): the per-request table holds, per
  request, its stage spans wholly outside the request span (``detached_spans``: clock skew between
  hosts), the most a stage span reaches outside it (``outside_ns``) and the stage time counted
  twice (``overlap_ns``, inside time minus the union), computed in the pass that computes the
  union-covered time (:mod:`otel_stages.analysis.clickhouse_requests`); here they are counted over
  the requests, with the tolerance of :data:`~otel_stages.analysis.span_issues.OVERLAP_TOLERANCE_MS`,
  and one example request each.
- **Span ids shared by different spans** (:func:`clash_statements`,
  :func:`clash_check_statements`, :func:`clashes_sql`): one pass over the ids alone keeps those
  held by more than one row (a count per id, 16 bytes a key; 10 M spans: 2.9 s CPU against 4.9 s
  for the min and max hash of every id's rows); only when there are such ids, a second pass over
  just those keeps the ones whose rows differ (name, start, duration or parent: a hash of them
  varies; per id its min and max hash); exact copies (a retried export, a file imported twice)
  are not clashes. Both spill to disk past :data:`CLASH_SPILL_BYTES` of state, so memory stays
  bounded (measured: spilling costs about 2.5x the CPU of the in-memory pass; passes over hash
  parts of the ids instead would read every span once per part). Only when some clash, a third
  read of just those ids counts, per id, the *different* spans beyond the first (the file report
  counts each later row that differs from the first it read; for an id held by two different
  spans, the usual case, both count 1).

Examples: the engine returns the spans of at most one example trace per problem
(:func:`example_spans_sql`: the exporter's bloom filter index on ``TraceId`` finds them), and
:func:`otel_stages.analysis.requests.group_spans` runs on those few spans, so each example is
the file report's own sentence part; the counts are the engine's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_stages import semconv
from otel_stages.analysis import screen
from otel_stages.analysis.caveats import BEFORE_PERCENTILE, OUTLIVED_PERCENTILE
from otel_stages.analysis.clickhouse_requests import BEFORE_WINDOW_S, NESTED_TABLE
from otel_stages.analysis.clickhouse_sql import (
    MIN_SPAN_START_NS,
    PROCESS_TABLE,
    REQUESTS_TABLE,
    AggregateQuery,
    query_params,
    requests,
    span_filter,
    utilization_reading,
)
from otel_stages.analysis.model import Span
from otel_stages.analysis.naming import WHY_PATTERN, problem_lines
from otel_stages.analysis.requests import Incomplete, group_spans, orphans_line, roots_line
from otel_stages.analysis.span_issues import OVERLAP_TOLERANCE_MS, IdClashes, StageIssues
from otel_stages.analysis.value_issues import UnreadValues

#: How each problem line starts that names a check the file report makes and the SQL does not.
NOT_CHECKED = "not checked in ClickHouse: "
#: The temporary table of span-id hashes held by different spans, and the one of span-id hashes
#: held by more than one row (the candidates: a clash needs two rows).
CLASH_TABLE = "otel_stages_clashes"
DUPLICATE_TABLE = "otel_stages_duplicate_ids"
#: The clash pass spills its aggregation to disk past this (bytes), not at the report's default
#: SPILL_BYTES: its state is flat (an id and two hashes), and spilling made it slower and larger
#: (10 M spans: 8.4 s CPU and 663 MB peak RSS spilling at 256 MB, 3.7 s and 570 MB in memory).
CLASH_SPILL_BYTES = 512 * 2**20
#: The tolerance of analysis.span_issues in ns (outside / overlap at most this are no problem).
TOLERANCE_NS = round(OVERLAP_TOLERANCE_MS * 1e6)
#: ``Duration`` values from this up are a negative ``end - start`` (Go's uint64 wrap-around).
_WRAPPED_NS = 2**63
_U64 = 2**64
#: Reason codes of :func:`odd_spans_sql`, in the order analysis.screen tests them.
REASONS = (screen.REASON_EARLY, screen.REASON_BACKWARDS, screen.REASON_LONG)
_HEX = "lower(hex(reinterpretAsFixedString(trace_key)))"


def odd_spans_sql(traces: str, query: AggregateQuery) -> str:
    """One row: spans left out (``n``), per reason (``n_1`` .. ``n_3``: :data:`REASONS` in
    order) the count and the earliest such span (``e_1`` .. ``e_3``: name, trace id, start ns,
    ``Duration``)."""
    reason = (f"multiIf(Timestamp < fromUnixTimestamp64Nano({MIN_SPAN_START_NS}), 1,"
              f" Duration >= {_WRAPPED_NS}, 2, 3)")
    parts = ", ".join(
        f"countIf(r = {i}) AS n_{i}, argMinIf((name, TraceId, start, Duration), (start, TraceId, SpanId),"
        f" r = {i}) AS e_{i}" for i in range(1, len(REASONS) + 1))
    return f"""SELECT count() AS n, {parts}
FROM (
    SELECT toString(SpanName) AS name, TraceId, SpanId, Duration,
        toInt64(toUnixTimestamp64Nano(Timestamp)) AS start, {reason} AS r
    FROM {traces} WHERE {span_filter(query, odd=True)}
)"""


def issues_sql() -> str:
    """One row over the per-request table: requests with stage spans wholly outside them and
    those spans, requests with a stage span reaching outside by more than the tolerance and the
    most, requests whose stage spans overlap by more than it, incomplete units (a parent that
    never arrived: ``n_orphan``; a stage span at the root of its trace: ``n_root``, as
    :class:`otel_stages.analysis.requests.Incomplete` counts them); an example trace id (hex)
    each; and the spans whose attribute values cannot be used
    (:class:`otel_stages.analysis.value_issues.UnreadValues`): ``n_gpu_unread`` forwards whose
    ``gpu.utilization.mean`` is no reading (``n_gpu_unread_warm``: of warm requests),
    ``n_cold_unread`` / ``n_seq_unread`` request spans
    (counted per process while the cold rule is worked out); ``n_started_before``: processes that
    ran before the window and mark no cold request (:func:`started_before_lines`)."""
    cond = {"detached": "detached_spans > 0", "outside": f"outside_ns > {TOLERANCE_NS}",
            "overlap": f"overlap_ns > {TOLERANCE_NS}", "orphan": "incomplete_groups > 0",
            "root": "by_trace AND incomplete_spans > 0"}
    for k in ("detached", "outside", "overlap"):  # of requests; the others are no request
        cond[k] = f"is_request AND {cond[k]}"
    first = "argMinIf(trace_key, (start_ns, trace_key), {})"
    unread = (f"arrayCount((u, c) -> u IS NOT NULL AND NOT {utilization_reading('u', 'c')},"
              " fwd_util, fwd_count)")
    examples = ", ".join(f"if(n_{k} > 0, {_HEX.replace('trace_key', first.format(c))}, '') AS trace_{k}"
                         for k, c in cond.items())
    return f"""SELECT countIf({cond["detached"]}) AS n_detached,
    sumIf(detached_spans, is_request) AS n_detached_spans,
    countIf({cond["outside"]}) AS n_outside,
    maxIf(outside_ns, {cond["outside"]}) AS outside_max_ns,
    (SELECT countIf(after_ns > {TOLERANCE_NS}) FROM {requests()} WHERE warm) AS n_outlived,
    (SELECT quantileExactInclusive({OUTLIVED_PERCENTILE / 100})(after_ns) FROM {requests()} WHERE warm)
        AS outlived_p95_ns,
    (SELECT countIf(before_ns > {TOLERANCE_NS}) FROM {requests()} WHERE warm) AS n_before,
    (SELECT quantileExactInclusive({BEFORE_PERCENTILE / 100})(before_ns) FROM {requests()} WHERE warm)
        AS before_p95_ns,
    countIf({cond["overlap"]}) AS n_overlap,
    sum(incomplete_groups) AS n_orphan, sumIf(incomplete_spans, by_trace) AS n_root,
    sumIf({unread}, is_request) AS n_gpu_unread,
    (SELECT sum({unread}) FROM {requests()} WHERE warm) AS n_gpu_unread_warm,
    sumIf(decode_bad_sizes, is_request) AS n_size_unread,
    (SELECT sum(unread_cold) FROM {PROCESS_TABLE}) AS n_cold_unread,
    (SELECT sum(unread_seq) FROM {PROCESS_TABLE}) AS n_seq_unread,
    (SELECT countIf(started_before) FROM {PROCESS_TABLE}) AS n_started_before,
    {examples}
FROM {REQUESTS_TABLE}"""


def clash_statements(traces: str, query: AggregateQuery) -> list[tuple[str, dict[str, Any]]]:
    """``(statement, params)``: (re)create :data:`CLASH_TABLE` (empty) and fill
    :data:`DUPLICATE_TABLE` with the hashes of the span ids held by more than one row: one
    aggregation over the ids alone (a count per id: the name, times and parent are read only by
    :func:`clash_check_statements`, for those ids, when there are any)."""
    insert = f"""INSERT INTO {DUPLICATE_TABLE}
SELECT id FROM (
    SELECT cityHash64(TraceId, SpanId) AS id, count() AS n
    FROM {traces} WHERE {span_filter(query, odd=False)}
    GROUP BY id HAVING n > 1
) SETTINGS max_bytes_before_external_group_by = {CLASH_SPILL_BYTES}"""
    return [
        (f"DROP TEMPORARY TABLE IF EXISTS {CLASH_TABLE}", {}),
        (f"CREATE TEMPORARY TABLE {CLASH_TABLE} (id UInt64) ENGINE = Memory", {}),
        (f"DROP TEMPORARY TABLE IF EXISTS {DUPLICATE_TABLE}", {}),
        (f"CREATE TEMPORARY TABLE {DUPLICATE_TABLE} (id UInt64) ENGINE = Memory", {}),
        (insert, query_params(query)),
    ]


def duplicate_count_sql() -> str:
    """One row: ``n``, the span ids held by more than one row (:func:`clash_statements`)."""
    return f"SELECT count() AS n FROM {DUPLICATE_TABLE}"


def clash_check_statements(traces: str, query: AggregateQuery) -> list[tuple[str, dict[str, Any]]]:
    """``(statement, params)`` filling :data:`CLASH_TABLE` with those of the ids in
    :data:`DUPLICATE_TABLE` whose rows differ (name, start, duration or parent: a hash of them
    varies; exact copies are no clash). Only needed when :func:`duplicate_count_sql` is not 0."""
    insert = f"""INSERT INTO {CLASH_TABLE}
SELECT id FROM (
    SELECT {_IDENT} AS id, min(h) AS lo, max(h) AS hi
    FROM (
        SELECT TraceId, SpanId, cityHash64(SpanName, Timestamp, Duration, ParentSpanId) AS h
        FROM {traces}
        WHERE {span_filter(query, odd=False)} AND {_IDENT} IN (SELECT id FROM {DUPLICATE_TABLE})
    )
    GROUP BY id HAVING lo != hi
) SETTINGS max_bytes_before_external_group_by = {CLASH_SPILL_BYTES}"""
    return [(insert, query_params(query))]


_IDENT = "cityHash64(TraceId, SpanId)"


def clash_count_sql() -> str:
    """One row: ``n``, the span ids found by :func:`clash_statements`."""
    return f"SELECT count() AS n FROM {CLASH_TABLE}"


def clashes_sql(traces: str, query: AggregateQuery) -> str:
    """One row: ``ids`` shared by different spans, ``spans`` the different spans beyond the first
    of each id (distinct name, start, duration and parent), and the earliest such id's trace."""
    return f"""SELECT count() AS ids, sum(v - 1) AS spans, argMin(TraceId, (first, TraceId)) AS trace_id
FROM (
    SELECT TraceId, SpanId, uniqExact(SpanName, Timestamp, Duration, ParentSpanId) AS v,
        min(Timestamp) AS first
    FROM {traces}
    WHERE {span_filter(query, odd=False)} AND cityHash64(TraceId, SpanId) IN (SELECT id FROM {CLASH_TABLE})
    GROUP BY TraceId, SpanId HAVING v > 1
)"""


def example_spans_sql(traces: str, query: AggregateQuery) -> str:
    """The spans of the example traces (param ``ids``: trace ids as written, and lower / upper
    case, joined by commas: :func:`example_trace_ids`), with the columns :func:`spans_of`
    reads."""
    return f"""SELECT TraceId AS trace_id, SpanId AS span_id, ParentSpanId AS parent_span_id,
    toString(SpanName) AS name, toInt64(toUnixTimestamp64Nano(Timestamp)) AS start_ns,
    Duration AS duration, StatusCode IN ('Error', 'STATUS_CODE_ERROR') AS error
FROM {traces}
WHERE TraceId IN (SELECT arrayJoin(splitByChar(',', {{ids:String}}))) AND {span_filter(query, odd=False)}
ORDER BY Timestamp, SpanId"""


def example_trace_ids(issues: Mapping[str, Any], clashes: Mapping[str, Any] | None) -> str:
    """The example traces to read (as written, lower and upper case; joined by commas), from the
    answers of :func:`issues_sql` and :func:`clashes_sql`; empty when there is no problem."""
    found = [str(issues.get(f"trace_{k}") or "")
             for k in ("detached", "outside", "overlap", "orphan", "root")]
    if clashes:
        found.append(str(clashes.get("trace_id") or ""))
    out: list[str] = []
    for trace in filter(None, found):
        for form in (trace, trace.lower(), trace.upper()):
            if form not in out and "," not in form:
                out.append(form)
    return ",".join(out)


def spans_of(rows: Sequence[Mapping[str, Any]]) -> list[Span]:
    """Rows of :func:`example_spans_sql` as :class:`~otel_stages.analysis.model.Span` (times and
    ids only: what the examples need)."""
    return [Span(trace_id=str(r["trace_id"]), span_id=str(r["span_id"]),
                 parent_span_id=str(r["parent_span_id"]) or None, name=str(r["name"]),
                 start_ns=int(r["start_ns"]),
                 end_ns=int(r["start_ns"]) + _signed(int(r["duration"])), error=bool(r["error"]))
            for r in rows]


def _signed(duration: int) -> int:
    return duration - _U64 if duration >= _WRAPPED_NS else duration


@dataclass(frozen=True)
class SpanIssues:
    """The counts behind the data problems (module docstring), as the file report counts them:
    ``left_out`` spans per reason of :mod:`otel_stages.analysis.screen`; ``detached_requests`` /
    ``detached_spans``: requests with stage spans wholly outside their request span, and those
    spans; ``outside_requests`` and ``outside_max_ms``: stage spans reaching outside their request;
    ``outlived_requests`` and ``outlived_p95_ms``: warm requests with a standard stage span ending
    after them and the p95 over the warm requests of the most one does
    (:attr:`~otel_stages.analysis.figures.Figures.outlived_requests`); ``before_requests`` and
    ``before_p95_ms``: the same for standard stage spans starting before them (a clock behind);
    ``overlap_requests``; ``clash_spans``: spans that share an id with a different span. ``problems``:
    the file report's sentences for them, with examples. ``unread``: attribute values present but
    unusable (:class:`~otel_stages.analysis.value_issues.UnreadValues`); ``unread_warm_forwards``:
    of those, the forwards of warm requests whose ``gpu.utilization.mean`` is no reading."""

    left_out: dict[str, int] = field(default_factory=dict)
    detached_requests: int = 0
    detached_spans: int = 0
    outside_requests: int = 0
    outside_max_ms: float = 0.0
    outlived_requests: int = 0
    outlived_p95_ms: float | None = None
    before_requests: int = 0
    before_p95_ms: float | None = None
    overlap_requests: int = 0
    clash_spans: int = 0
    problems: tuple[str, ...] = ()
    unread: UnreadValues = field(default_factory=UnreadValues)
    unread_warm_forwards: int = 0


def span_issues(odd: Mapping[str, Any], issues: Mapping[str, Any],
                clashes: Mapping[str, Any] | None, example_rows: Sequence[Mapping[str, Any]],
                names: Mapping[str, Any] | None = None) -> SpanIssues:
    """The :class:`SpanIssues` from the answers of :func:`odd_spans_sql`, :func:`issues_sql`,
    :func:`clashes_sql` (``None``: no clash found), :func:`example_spans_sql` and
    :func:`otel_stages.analysis.clickhouse_requests.names_sql`."""
    left_out: dict[str, int] = {}
    lines: list[str] = []
    for i, reason in enumerate(REASONS, start=1):
        n = int(odd.get(f"n_{i}") or 0)
        if n:
            left_out[reason] = n
            name, trace, start, duration = odd[f"e_{i}"]
            span = Span(trace_id=str(trace), span_id="", parent_span_id=None, name=str(name),
                        start_ns=int(start), end_ns=int(start) + _signed(int(duration)))
            lines.append(screen.problem_line(reason, n, screen.example(span, reason)))
    if names and (int(names.get("grouped") or 0) or int(names.get("dropped") or 0)):
        lines += problem_lines(WHY_PATTERN, str(names["example"]), int(names["grouped"]),
                               [str(n) for n in names["by_attribute"]], int(names["dropped"]))
    found = group_spans(spans_of(example_rows)) if example_rows else None
    clash = IdClashes()
    clash.count = int((clashes or {}).get("spans") or 0)
    if clash.count:
        clash.example = found.clashes.example if found and found.clashes.example else (
            f"trace {(clashes or {}).get('trace_id')}")
    stage = StageIssues()
    stage.detached = int(issues.get("n_detached_spans") or 0)
    stage.detached_requests = int(issues.get("n_detached") or 0)
    stage.outside = int(issues.get("n_outside") or 0)
    stage.outside_max_ms = int(issues.get("outside_max_ns") or 0) / 1e6
    stage.overlap = int(issues.get("n_overlap") or 0)
    for kind in ("detached", "outside", "overlap"):
        example = getattr(found.issues, f"{kind}_example") if found else ""
        setattr(stage, f"{kind}_example", example or f"trace {issues.get(f'trace_{kind}')}")
    incomplete = []
    for kind, line in (("orphan", orphans_line), ("root", roots_line)):
        n = int(issues.get(f"n_{kind}") or 0)
        if n:
            units = [u for u in (found.incomplete if found else ())
                     if (u.missing_parent_id is None) == (kind == "root")]
            unit = units[0] if units else Incomplete(str(issues.get(f"trace_{kind}")), None, ("?",), 0.0)
            incomplete.append(line(n, unit))
    unread = UnreadValues(cold_start=int(issues.get("n_cold_unread") or 0),
                          seq=int(issues.get("n_seq_unread") or 0),
                          gpu_utilization=int(issues.get("n_gpu_unread") or 0),
                          image_size=int(issues.get("n_size_unread") or 0))
    return SpanIssues(
        left_out=left_out, detached_requests=stage.detached_requests, detached_spans=stage.detached,
        outside_requests=stage.outside, outside_max_ms=stage.outside_max_ms,
        outlived_requests=int(issues.get("n_outlived") or 0),
        outlived_p95_ms=(float(issues["outlived_p95_ns"]) / 1e6
                         if int(issues.get("n_outlived") or 0) else None),
        before_requests=int(issues.get("n_before") or 0),
        before_p95_ms=(float(issues["before_p95_ns"]) / 1e6
                       if int(issues.get("n_before") or 0) else None),
        overlap_requests=stage.overlap, clash_spans=clash.count, unread=unread,
        unread_warm_forwards=int(issues.get("n_gpu_unread_warm") or 0),
        problems=(*lines, *clash.problems(), *incomplete, *stage.problems(), *unread.problems(),
                  *started_before_lines(int(issues.get("n_started_before") or 0))))


def started_before_lines(processes: int) -> list[str]:
    """The problem line for ``processes`` that ran before the window and mark no cold request
    (:data:`otel_stages.analysis.clickhouse_requests.BEFORE_WINDOW_S`)."""
    if not processes:
        return []
    many = processes != 1
    return [f"{processes} process{'es' if many else ''} without {semconv.REQUEST_COLD_START} or"
            f" {semconv.REQUEST_SEQ} ran in the {BEFORE_WINDOW_S // 60} min before the window:"
            f" {'they' if many else 'it'} started before it, so {'their' if many else 'its'} first"
            " request in the window is not taken as cold (without those attributes a process's"
            " earliest request is)"]


# --- what the SQL does not check ---------------------------------------------------------------


def groups_sql() -> str:
    """One row: ``n``, custom group spans nested under requests (after the request grouping)."""
    return f"SELECT count() AS n FROM {NESTED_TABLE}"


def not_checked(*, groups: int, signals: bool, grouped_preprocess: int = 0) -> list[str]:
    """Lines (each starting :data:`NOT_CHECKED`) for checks the file report makes that the SQL
    does not, where they could change the answer: signals on stage spans inside ``groups`` custom
    group spans (when stage spans carry ``signals``); the decode / resize facts of
    ``grouped_preprocess`` decode / resize spans inside custom group spans (counted only when the
    facts were read: a decode / resize verdict)."""
    out = []
    if grouped_preprocess:
        out.append(
            f"{NOT_CHECKED}decode / resize facts (several images, repeated decodes, draft decoding,"
            f" threads) of decode / resize spans inside custom group spans ({grouped_preprocess}"
            f" span{'s' if grouped_preprocess != 1 else ''}): the SQL reads those facts from the"
            " spans directly under the request only, so its size evidence and decode advice may"
            " miss them; report the exported files (PATH) to read them")
    if groups and signals:
        out.append(
            f"{NOT_CHECKED}mechanism signals (thread CPU time, GC, event-loop lag, throttling) on"
            f" stage spans inside custom group spans ({groups} group span{'s' if groups != 1 else ''}):"
            " those stages count their signals as not recorded here, so a mechanism among them"
            " goes unnamed; report the exported files (PATH) to read them")
    return out
