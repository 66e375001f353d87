"""The verdict: cause names, the stage -> cause map, and the :class:`Verdict` record.

The rules that pick the stage live in :mod:`otel_stages.analysis.decision` (one rule set for every
source). A stage's cause is its plain cause (download -> ``transfer``, decode/resize ->
``preprocess``, queue -> ``queue``, forward -> ``gpu_busy`` / ``gpu_starved`` / ``forward`` by
GPU evidence, a custom stage -> ``other``; a call whose own time swings -> ``call``) unless
confirmed mechanism evidence names a more specific one (:func:`cause_for`): later analyses add
causes such as ``cpu_contention``, ``gc_pause``, ``event_loop_blocked``, ``cpu_throttled`` and
``gpu_memory_pressure`` that way, with ``stage`` still the stage they hit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from otel_stages import semconv
from otel_stages.analysis.figures import Mechanism
from otel_stages.analysis.gpu import LEVEL_HIGH, LEVEL_LOW, GpuEvidence

CAUSE_TRANSFER = "transfer"
CAUSE_PREPROCESS = "preprocess"
CAUSE_QUEUE = "queue"
CAUSE_GPU_BUSY = "gpu_busy"
CAUSE_GPU_STARVED = "gpu_starved"
CAUSE_FORWARD = "forward"
CAUSE_COLD_START = "cold_start"
CAUSE_STABLE = "stable"
CAUSE_OTHER = "other"  #: a custom stage is the suspect; nothing more specific can be said
#: a call into other requests read in the report swings by its own time, outside those requests
#: (:func:`otel_stages.analysis.decision.own_time_calls`): the caller waits, not the callee
CAUSE_CALL = "call"

#: stage -> cause for the stages whose cause does not need more evidence
STAGE_CAUSES: dict[str, str] = {
    semconv.STAGE_DOWNLOAD: CAUSE_TRANSFER,
    semconv.STAGE_DECODE: CAUSE_PREPROCESS,
    semconv.STAGE_RESIZE: CAUSE_PREPROCESS,
    semconv.STAGE_PREPROCESS: CAUSE_PREPROCESS,
    semconv.STAGE_QUEUE: CAUSE_QUEUE,
}


@dataclass
class Verdict:
    """``cause`` (one of the CAUSE_* names, ``None`` when there is nothing to judge or no stage
    explains the swing), ``stage`` (the suspect stage or ``None``), human-readable ``evidence``
    (with numbers) and ``advice``, and ``tentative`` (fewer warm requests than a firm verdict
    needs, or so many requests failed that the timings are a biased sample; see
    :mod:`otel_stages.analysis.caveats`)."""

    cause: str | None
    stage: str | None
    evidence: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    tentative: bool = False

    def to_dict(self) -> dict[str, object]:
        """The CLI contract's ``verdict`` object."""
        return {
            "cause": self.cause,
            "stage": self.stage,
            "evidence": list(self.evidence),
            "advice": list(self.advice),
            "tentative": self.tentative,
        }


def plain_cause(stage: str, gpu: GpuEvidence) -> str:
    """The stage's cause without mechanism evidence (forward needs the GPU evidence)."""
    if stage == semconv.STAGE_FORWARD:
        if gpu.level == LEVEL_HIGH:
            return CAUSE_GPU_BUSY
        if gpu.level == LEVEL_LOW:
            return CAUSE_GPU_STARVED
        return CAUSE_FORWARD
    return STAGE_CAUSES.get(stage, CAUSE_OTHER)


def cause_for(
    stage: str, gpu: GpuEvidence, mechanisms: Sequence[Mechanism] = ()
) -> tuple[str, Mechanism | None]:
    """The cause for a suspect ``stage``: the first confirmed mechanism's cause, else
    :func:`plain_cause`. Returns the cause and the mechanism that named it (or ``None``)."""
    for mechanism in mechanisms:
        if mechanism.confirmed:
            return mechanism.cause, mechanism
    return plain_cause(stage, gpu), None
