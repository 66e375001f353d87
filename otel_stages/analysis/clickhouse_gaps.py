"""What the file report reads that the ClickHouse SQL does not, found in the data: said in the
report's problems (lines starting :data:`~otel_stages.analysis.clickhouse_issues.NOT_CHECKED`)
and, because each can change which requests are compared with which, the verdict is then
tentative (:func:`gaps_caveat`). Pure: builds SQL and reads its answer row.

Checked, each by one cheap read (the exporter's bloom-filter index on the attribute keys skips
granules without the key):

- prompt and output token counts (``semconv.PROMPT_TOKENS_NAMES`` / ``OUTPUT_TOKENS_NAMES``, on
  any span): the file report's inputs include the prompt size, the SQL's only the image size and
  format (cohorts, requests set apart, the cold-start comparison);
- ``image.width`` on stage spans other than ``decode`` (standard or custom names): the file
  report takes a request's image size from any of its stage spans, the SQL from its decode spans
  (else a group span or the request span);
- GPU points from more than
  :data:`~otel_stages.analysis.clickhouse_queries.MAX_FOREIGN_GPU_PROCESSES` processes that ran
  no request: the file report lines every series up with the forwards by time, the SQL only that
  many (per host, every forward would meet every host's GPUs);
- ``batch`` spans (:data:`otel_stages.semconv.SPAN_BATCH`): the file report reads how long
  batches took to fill against how long requests waited (its Batches section), and a ``queue``
  verdict's advice follows it; the SQL does not, so only a ``queue`` verdict is hedged for them
  (:data:`BATCHES_UNREAD`);
- more than :data:`~otel_stages.analysis.naming.MAX_STAGE_NAMES` distinct span names under
  requests, some of them custom names without a path or an id: the file report then reads every
  custom name as per-request (counted under its ``stage`` attribute); the SQL only names holding
  a path or an id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.clickhouse_issues import NOT_CHECKED
from otel_stages.analysis.clickhouse_queries import MAX_FOREIGN_GPU_PROCESSES
from otel_stages.analysis.clickhouse_requests import custom_names_sql, sized_custom_sql
from otel_stages.analysis.clickhouse_sql import AggregateQuery, span_filter
from otel_stages.analysis.naming import MAX_STAGE_NAMES
from otel_stages.analysis.verdict import Verdict

_TOKENS = (*semconv.PROMPT_TOKENS_NAMES, *semconv.OUTPUT_TOKENS_NAMES)
_NOT_DECODE = [s for s in semconv.STANDARD_STAGES if s != semconv.STAGE_DECODE]


def _has_any(keys: tuple[str, ...] | list[str]) -> str:
    return " OR ".join(f"mapContains(SpanAttributes, '{k}')" for k in keys)


def gaps_sql(traces: str, query: AggregateQuery, *, custom: bool = True) -> str:
    """One row: ``token_spans`` (spans with a prompt or output token count),
    ``image_elsewhere`` (stage spans other than decode with ``image.width``),
    ``batch_spans``, ``custom_names`` / ``plain_names`` (distinct custom stage span names, and of
    those the ones not read as per-request here; after the request grouping). ``custom``: whether
    the request grouping read custom stage spans (none: their counts are 0, not read)."""
    base = span_filter(query, odd=False)
    not_decode = "(" + ", ".join(f"'{s}'" for s in _NOT_DECODE) + ")"
    sized = f"(SELECT n FROM ({sized_custom_sql()}))" if custom else "0"
    names = (f"(SELECT (distinct_names, plain_names) FROM ({custom_names_sql()}))" if custom
             else "(toUInt64(0), toUInt64(0))")
    return f"""SELECT
    (SELECT count() FROM {traces} WHERE ({_has_any(_TOKENS)}) AND {base}) AS token_spans,
    (SELECT count() FROM {traces} WHERE SpanName IN {not_decode}
        AND mapContains(SpanAttributes, '{semconv.IMAGE_WIDTH}') AND {base})
        + {sized} AS image_elsewhere,
    (SELECT count() FROM {traces} WHERE SpanName = '{semconv.SPAN_BATCH}' AND {base}) AS batch_spans,
    {names} AS names, names.1 AS custom_names, names.2 AS plain_names"""


def gap_lines(row: Mapping[str, Any], standard_names: int) -> list[str]:
    """The problem lines for :func:`gaps_sql`'s row (``standard_names``: standard stages seen)."""
    out = []
    tokens = int(row.get("token_spans") or 0)
    if tokens:
        out.append(
            f"{NOT_CHECKED}prompt and output token counts ({tokens} span{'s' if tokens != 1 else ''}"
            " carry gen_ai.usage.* tokens): inputs are told apart here by image size and format"
            " only, so requests of different prompt or output lengths are compared as one input"
            " (cohorts, requests set apart, the cold start); report the exported files (PATH) to"
            " split them")
    elsewhere = int(row.get("image_elsewhere") or 0)
    if elsewhere:
        out.append(
            f"{NOT_CHECKED}image sizes on stage spans other than decode ({elsewhere}"
            f" span{'s' if elsewhere != 1 else ''}): a request's image size is read here from its"
            " decode spans (else a group span or the request span), so a request whose size is recorded"
            " only on another stage counts as an unknown input; report the exported files (PATH)")
    batches = int(row.get("batch_spans") or 0)
    if batches:
        out.append(
            f"{NOT_CHECKED}{BATCHES_UNREAD} ({batches} span{'s' if batches != 1 else ''}): how long"
            " batches took to fill against how long requests waited is read from the files only,"
            " so a queue verdict's advice here cannot tell waiting for a batch to fill from waiting"
            " for a busy executor; report the exported files (PATH) for the Batches section")
    foreign = int(row.get("foreign_gpu_processes") or 0)
    if foreign > MAX_FOREIGN_GPU_PROCESSES:
        out.append(
            f"{NOT_CHECKED}GPU points from {foreign} processes that ran no request here and are on"
            " no request process's host (a GPU worker or metrics exporter per host, say): they are"
            f" lined up with the forwards only up to {MAX_FOREIGN_GPU_PROCESSES} such processes, so"
            " only each request process's own GPU points, and those of exporters on its own"
            " host.name, count here; report the exported files (PATH) of one host")
    names = int(row.get("custom_names") or 0) + standard_names
    if names > MAX_STAGE_NAMES and int(row.get("plain_names") or 0):  # else nothing differs
        out.append(
            f"{NOT_CHECKED}{names} distinct span names under requests (more than"
            f" {MAX_STAGE_NAMES}): the file report then reads every custom name as per-request data"
            " and counts the span under its 'stage' attribute; here only names holding a path or"
            " an id are, so the others stay stages of their own; report the exported files (PATH)")
    return out


#: what the batch spans' ``not checked`` line names (it hedges a ``queue`` verdict only)
BATCHES_UNREAD = "batch spans"


def queue_advised(verdict: Verdict) -> bool:
    """Whether ``verdict`` gives the queue advice the batch spans would choose: a ``queue`` verdict,
    or ``queue`` as the co-suspect of another (its advice lines start ``queue: ``)."""
    return verdict.cause == "queue" or any(a.startswith("queue: ") for a in verdict.advice)


def gaps_caveat(verdict: Verdict, unchecked: list[str]) -> None:
    """Tentative, with the reason first in the evidence, when the SQL left out something that
    could change the verdict (``unchecked``: the report's ``not checked`` lines; the batch spans'
    only where the queue advice is given, which they choose: :func:`queue_advised`)."""
    if not queue_advised(verdict):
        unchecked = [u for u in unchecked if not u.startswith(NOT_CHECKED + BATCHES_UNREAD)]
    if not unchecked:
        return
    verdict.tentative = True
    what = "; ".join(line[len(NOT_CHECKED):].split(" (")[0] for line in unchecked)
    verdict.evidence.insert(0, (
        f"the ClickHouse SQL does not read everything the file report does ({what}: see the"
        " problems), which could change this verdict, so it is tentative"))
