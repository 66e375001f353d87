"""What :func:`otel_stages.analysis.stage_map.apply_stage_map` did (:class:`MapSummary`): requests
mapped and left out, the map's problems, each stage's time per label value, and the advice a
server's user can follow for a verdict on a mapped stage. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from otel_stages.analysis.stage_map_file import StageMap
from otel_stages.analysis.stage_map_labels import LabelStats, label_lines, labels_to_dict
from otel_stages.analysis.verdict import CAUSE_CALL, Verdict

#: Advice text that assumes the user's own Python pipeline instrumented with this library (its
#: stage() spans, otel_stages.imaging, attributes it records): no help for a stage timed from a
#: server's telemetry, so :meth:`MapSummary.advise` drops lines holding one of these (only the
#: first, ``stage()``, for a verdict on time outside the mapped stages).
_IN_PROCESS_ADVICE: tuple[str, ...] = (
    "stage()", "otel_stages.", "imaging.decode", "decode span", "(not span metrics)",
    "queue.depth")


@dataclass
class MapSummary:
    """What :func:`apply_stage_map` did: requests mapped (and by which variant), request spans
    left as they were, and the problems to show."""

    name: str
    mapped: int = 0
    unmapped: int = 0
    problems: list[str] = field(default_factory=list)
    #: requests mapped per variant name (every variant, 0 where unused); reported for a map with
    #: more than one variant
    by_variant: dict[str, int] = field(default_factory=dict)
    variants: int = 1
    #: for a map with a ``label``: stage -> label value -> its time over the warm requests
    #: (:func:`label_stats <otel_stages.analysis.stage_map_labels.label_stats>`)
    labels: dict[str, dict[str, LabelStats]] = field(default_factory=dict)
    label: str | None = None  #: the map's ``label`` attribute
    stage_map: StageMap | None = None  #: the map applied

    def label_lines(self) -> list[str]:
        """The text report's lines of each stage's time per label value (:func:`label_lines
        <otel_stages.analysis.stage_map_labels.label_lines>`)."""
        return label_lines(self.name, self.label, self.labels)

    def advise(self, verdict: Verdict) -> None:
        """Advice a server's user can follow: drop the lines that assume the user's own
        instrumented pipeline (:data:`_IN_PROCESS_ADVICE`: ``stage()`` spans, the library's
        imaging helpers; code the user does not own) and, for a verdict on a mapped stage, put
        the map's advice for it first (after a tentative verdict's caveat): the entry's
        ``advice``, else (when a line was dropped) where its time comes from and where to look
        next. A ``call`` verdict keeps its advice: it is about the calling code's client (a
        connection pool, reading the response), which whoever maps its spans runs (a tester's map
        of a gateway's POST replaced the pool-wait advice its evidence gave). Changes ``verdict``
        in place."""
        if self.stage_map is None:
            return
        stage = verdict.stage
        mapped = stage is not None and stage in self.stage_map.stage_order()
        markers = (() if verdict.cause == CAUSE_CALL else
                   _IN_PROCESS_ADVICE if mapped else _IN_PROCESS_ADVICE[:1])
        removed = [i for i, a in enumerate(verdict.advice) if any(m in a for m in markers)]
        kept = [a for i, a in enumerate(verdict.advice) if i not in removed]
        line = self.stage_map.advice_for(stage) if stage is not None and mapped else ""
        if not line and removed:
            line = (f"{stage} is timed from the server's own telemetry by stage map {self.name}"
                    f" ({'; '.join(self.stage_map.sources_of(stage))}); it cannot be split"
                    " further here: look at the server's own metrics and logs for that step"
                    if stage is not None and mapped else
                    f"the stages come from the server's own telemetry (stage map {self.name}):"
                    " the time between them is work the server does not time; look at its"
                    " metrics and logs")
        if line:  # first, after a tentative verdict's caveat
            kept.insert(1 if verdict.tentative and kept else 0, line)
        verdict.advice = kept

    def to_dict(self) -> dict[str, object]:
        """JSON form: ``{"name", "requests_mapped", "requests_unmapped"}``, plus ``"variants"``
        (``{variant name: requests mapped}``, every variant) for a map with more than one, and
        ``"labels"`` for a map with a ``label`` (:func:`labels_to_dict
        <otel_stages.analysis.stage_map_checks.labels_to_dict>`: each stage's time per label
        value over the warm requests, e.g. per Triton model, with median, swing and part of the
        total's variance)."""
        out: dict[str, object] = {
            "name": self.name, "requests_mapped": self.mapped, "requests_unmapped": self.unmapped}
        if self.variants > 1:
            out["variants"] = dict(self.by_variant)
        if self.labels:
            out["labels"] = labels_to_dict(self.labels)
        return out
