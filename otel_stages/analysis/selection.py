"""Which span attributes a load keeps: every one, or only those the analysis reads.

A fleet's trace files carry many attributes the diagnosis never looks at (``url.full``,
``server.address``, ``http.response.status_code``, ``image.mode``, ``image.media_type``...):
at a million spans, keeping them costs hundreds of megabytes. ``otel-stages report`` therefore
loads with :func:`for_analysis` (plus the attributes a ``--stage-map`` reads), while the library's
loaders (:func:`otel_stages.analysis.load_paths`) keep everything by default (:data:`ALL`).

What a selection covers: span attributes and span-event attributes. Always kept in full: span
events themselves (name and time: stage maps and the analysis read them), span links, resource
attributes (one shared dict per process) and metric-point attributes (few points).

**Reading another attribute in the analysis** (a new mechanism module, say a CPU-time attribute
on stage spans or a field of a GC-pause event): add its ``semconv`` key to
:data:`ANALYSIS_ATTRIBUTES`, the one list of them. ``tests/test_selection.py`` fails when it is
missing: it runs the diagnosis, the text report and the HTML report's data over every recorded
case with attribute dicts that note each key looked up (any key read but not kept fails), checks
that the report made from a selective load equals the one from a full load, and checks the
sources for attribute reads of ``semconv`` keys (for code paths no case reaches).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from otel_stages import semconv

#: Span (and span-event) attribute keys the diagnosis reads; see the module docstring.
ANALYSIS_ATTRIBUTES: frozenset[str] = frozenset({
    # finding requests and naming stages (requests.py, naming.py)
    semconv.STAGE_NAME,
    semconv.REQUEST_SEQ,
    semconv.REQUEST_COLD_START,
    # why otel_stages' own sampler kept a request (sampled.py)
    semconv.SAMPLING_KEPT,
    # inputs and cohorts (requests.py, cohorts.py, evidence.py)
    semconv.IMAGE_WIDTH,
    semconv.IMAGE_HEIGHT,
    semconv.IMAGE_SIZE,
    semconv.IMAGE_FORMAT,
    *semconv.PROMPT_TOKENS_NAMES,
    *semconv.OUTPUT_TOKENS_NAMES,
    # queue and batches (evidence.py, batching.py)
    semconv.QUEUE_DEPTH,
    semconv.BATCH_SIZE,
    # per-forward GPU attribution (gpu.py; the memory figures for gpu_memory_pressure)
    semconv.GPU_UTILIZATION_MEAN,
    semconv.GPU_UTILIZATION_MAX,
    semconv.GPU_MEMORY_USAGE_MAX,
    semconv.GPU_BUSY_AT_START,
    semconv.GPU_SAMPLE_COUNT,
    semconv.GPU_DEVICE_TIME_MS,
    # preprocess facts (preprocessing.py: draft decoding, where decode/resize ran)
    semconv.IMAGE_DRAFT_SCALE,
    semconv.IMAGE_TARGET_WIDTH,
    semconv.IMAGE_TARGET_HEIGHT,
    semconv.THREAD_NAME,
    semconv.EVENT_LOOP_RUNNING,
    # per-stage signals for the mechanisms (stage_signals.py; GC_DURATION_MS is on the
    # cpython.gc.pause span events)
    semconv.THREAD_CPU_TIME_MS,
    semconv.THREAD_RUN_QUEUE_WAIT_MS,
    semconv.GC_PAUSE_MS,
    semconv.GC_DURATION_MS,
    semconv.EVENT_LOOP_LAG_MS,
    semconv.EVENT_LOOP_HELD_MS,
    # what the metric-point readers name (kept anyway on points; listed for the source check)
    semconv.HW_ID,
    semconv.HW_GPU_TASK,
    semconv.HW_MODEL,
    semconv.SYSTEM_LINUX_PRESSURE_STALL_TYPE,
    semconv.PRESSURE_SCOPE,
    # failures and spans the library ended itself (diagnosis.failure_kinds: error.type, else the
    # exception event's exception.type)
    semconv.ERROR_TYPE,
    semconv.EXCEPTION_TYPE,
    semconv.OTEL_STAGES_INTERRUPTED,
    semconv.STAGE_MAP_SOURCE,
})


@dataclass(frozen=True)
class Selection:
    """The span attributes a load keeps: ``attributes`` is the set of keys, or ``None`` for all."""

    attributes: frozenset[str] | None = None

    def keeps(self, key: str) -> bool:
        """Whether an attribute named ``key`` is kept."""
        return self.attributes is None or key in self.attributes

    def including(self, keys: Iterable[str]) -> Selection:
        """This selection plus ``keys`` (still :data:`ALL` when it was)."""
        if self.attributes is None:
            return self
        return Selection(self.attributes | frozenset(keys))


#: Keep every attribute (the loaders' default).
ALL = Selection()


def for_analysis(extra: Iterable[str] = ()) -> Selection:
    """Only what the diagnosis reads (:data:`ANALYSIS_ATTRIBUTES`), plus ``extra`` keys (for
    instance the attributes a stage map turns into stages)."""
    return Selection(ANALYSIS_ATTRIBUTES | frozenset(extra))
