"""The report: everything ``otel-stages report`` shows, and its JSON form.

:class:`Report` is built by :func:`otel_stages.analysis.diagnosis.diagnose`;
:meth:`Report.to_dict` is the ``otel-stages report --json`` contract (DESIGN.md section 3):
``requests``, ``counts``, ``total``, ``stages`` (with ``explains``), ``unaccounted``, ``overlap``
(time counted in two stages at once, :class:`~otel_stages.analysis.stage_overlap.Overlap`, or
null), ``cohorts`` (each verdict tentative on its own, fewer than 20 warm requests in it, or
whenever the report's ``verdict`` is: :func:`~otel_stages.analysis.figures.share_tentative`),
``input_mix_explains``, ``process_mix`` (:class:`~otel_stages.analysis.process_mix.ProcessMix`
or null), ``sampling`` (the ``request.seq`` coverage,
:meth:`~otel_stages.analysis.sampled.SeqCoverage.to_dict`, or null), ``cold_start``, ``runs``,
``problems``, ``verdict`` (with ``tentative``),
``comparison`` (:meth:`.comparison.Comparison.to_dict`); plus ``set_apart``, ``noise``, ``gpu``, ``slowest``,
``groups`` and ``signals`` (per stage: thread CPU time against waiting, GC, event-loop lag,
throttling; :mod:`otel_stages.analysis.mechanisms`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from otel_stages.analysis.batching import BatchSummary
from otel_stages.analysis.cohorts import CohortKeys, SetApart
from otel_stages.analysis.comparison import Comparison
from otel_stages.analysis.decision import COLD_START_MIN_RATIO
from otel_stages.analysis.episode import Episode
from otel_stages.analysis.figures import COLD_UNTRACED, CohortFigures, ColdFigures
from otel_stages.analysis.gpu import GpuEvidence
from otel_stages.analysis.noise import NoiseBand
from otel_stages.analysis.process_mix import ProcessMix
from otel_stages.analysis.requests import Request
from otel_stages.analysis.sampled import SeqCoverage
from otel_stages.analysis.signal_figures import StageSignals
from otel_stages.analysis.stage_overlap import Overlap
from otel_stages.analysis.stats import Distribution, StageStats, Unaccounted, order_stages
from otel_stages.analysis.units import round_beside
from otel_stages.analysis.verdict import Verdict

#: Default number of slowest warm requests listed.
DEFAULT_TOP = 5


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


@dataclass(frozen=True)
class SlowRequest:
    """One of the slowest warm requests: total and per-stage ms, time outside every stage span
    (``unaccounted_ms``), image pixels and bytes."""

    trace_id: str
    seq: int | None
    total_ms: float
    stages_ms: dict[str, float]
    image_width: int | None
    image_height: int | None
    image_bytes: int | None
    error: bool
    unaccounted_ms: float = 0.0

    @classmethod
    def of(cls, req: Request) -> SlowRequest:
        """Build from a :class:`Request`."""
        return cls(
            trace_id=req.trace_id,
            seq=req.seq,
            total_ms=req.total_ms,
            stages_ms={n: req.stages_ms[n] for n in order_stages(req.stages_ms)},
            image_width=req.image_width,
            image_height=req.image_height,
            image_bytes=req.image_bytes,
            error=req.error,
            unaccounted_ms=req.unaccounted_ms,
        )

    def to_dict(self) -> dict[str, object]:
        """JSON form for the report's ``slowest`` list."""
        return {
            "trace_id": self.trace_id,
            "seq": self.seq,
            "total_ms": round(self.total_ms, 3),
            "stages": {k: round(v, 3) for k, v in self.stages_ms.items()},
            "unaccounted_ms": round(self.unaccounted_ms, 3),
            "image_width": self.image_width,
            "image_height": self.image_height,
            "image_bytes": self.image_bytes,
            "error": self.error,
        }


@dataclass(frozen=True)
class RequestSets:
    """The requests behind a report's figures, for renderers that draw single requests (the HTML
    report); not part of the JSON. ``warm``: in the statistics; ``cold``: first request of each
    process; ``set_apart``: warm requests reported apart as cold (``Report.set_apart`` says why);
    ``failed``: ended with an error; ``keys``: this recording's cohort keys
    (:class:`~otel_stages.analysis.cohorts.CohortKeys`), so a renderer groups exactly as the report
    does."""

    warm: tuple[Request, ...]
    cold: tuple[Request, ...]
    set_apart: tuple[Request, ...]
    failed: tuple[Request, ...]
    keys: CohortKeys

    @property
    def all(self) -> tuple[Request, ...]:
        """Every request of the report, in start order."""
        return tuple(sorted((*self.warm, *self.cold, *self.set_apart, *self.failed),
                            key=lambda r: (r.start_ns, r.trace_id)))


@dataclass(frozen=True)
class Counts:
    """Requests read: ``warm`` (in the statistics), ``cold`` (first of a process, and warm ones
    set apart as cold), ``failed`` (ended with an error); ``warm + cold + failed`` is the report's
    ``requests``. ``incomplete``: stage spans that form no request (parent never arrived, or no
    request span above them). ``cold_failed``: the failed ones that were cold (the first of their
    process: a cold start can outlast the client's deadline; in the JSON as ``failures.cold``)."""

    warm: int
    cold: int
    failed: int
    incomplete: int
    cold_failed: int = 0

    def to_dict(self) -> dict[str, int]:
        """JSON form."""
        return {"warm": self.warm, "cold": self.cold, "failed": self.failed,
                "incomplete": self.incomplete}


@dataclass(frozen=True)
class Run:
    """One process read: ``service_name``, ``service_instance_id``, its first request start and
    last request end (Unix ns), how many ``requests`` (all kinds), whether it is in the
    statistics (``reported``: false when ``--last-run`` chose another), its ``host_name``
    (``host.name``, ``None`` when not set) and ``process_pid`` (``process.pid``, read only
    without an instance id, as the key). ``key`` is its
    :func:`~otel_stages.analysis.requests.process_key`."""

    key: str
    service_name: str | None
    service_instance_id: str | None
    first_unix_ns: int
    last_unix_ns: int
    requests: int
    reported: bool = True
    host_name: str | None = None
    process_pid: str | None = None

    def to_dict(self) -> dict[str, object]:
        """JSON form (DESIGN.md section 3 ``runs`` entry plus ``host_name`` and ``reported``)."""
        return {
            "service_name": self.service_name,
            "service_instance_id": self.service_instance_id,
            "host_name": self.host_name,
            "process_pid": self.process_pid,
            "first_unix_ns": self.first_unix_ns,
            "last_unix_ns": self.last_unix_ns,
            "requests": self.requests,
            "reported": self.reported,
        }


def cold_to_dict(cold: ColdFigures) -> dict[str, object]:
    """The CLI contract's ``cold_start`` object."""
    return {
        "total_ms": round(cold.total_ms, 3),
        "warm_median_total_ms": _r(cold.warm_median_total_ms),
        "comparable_median_total_ms": _r(cold.comparable_median_total_ms),
        "compared_with": cold.compared_with,
        "ratio": round_beside(cold.ratio, COLD_START_MIN_RATIO, 2),  # as the sentences print it
        "stages": {k: round(v, 3) for k, v in cold.stages_ms.items() if k != COLD_UNTRACED},
        "unaccounted_ms": _r(cold.stages_ms.get(COLD_UNTRACED)),
        "cohort": cold.cohort,
        "comparable_requests": cold.comparable_requests,
        "comparable_stages": {k: round(v, 3) for k, v in cold.comparable_stages_ms.items()
                              if k != COLD_UNTRACED},
        "comparable_unaccounted_ms": _r(cold.comparable_stages_ms.get(COLD_UNTRACED)),
        "count": cold.count,
        "left_out": cold.left_out,
        "without_penalty": cold.without_penalty,
        "failed": cold.failed,
    }


def cohort_to_dict(cohort: CohortFigures) -> dict[str, object]:
    """One entry of the CLI contract's ``cohorts`` list."""
    return {
        "key": cohort.key,
        "requests": cohort.requests,
        "median_total_ms": round(cohort.median_total_ms, 3),
        "p95_total_ms": round(cohort.p95_total_ms, 3),
        "verdict": None if cohort.verdict is None else cohort.verdict.to_dict(),
    }


def noise_to_dict(noise: NoiseBand | None, total: Distribution | None) -> dict[str, object] | None:
    """The report's ``noise`` object: the band, what set it, and the total's swing against it."""
    if noise is None:
        return None
    return {
        "band_ms": round(noise.band_ms, 3),
        "jitter": _r(noise.jitter, 4),
        "stages_measured": noise.stages,
        "source": noise.source,
        "total_swing_ms": None if total is None else round(total.swing_ms, 3),
        "description": noise.describe(),
    }


@dataclass
class Report:
    """Everything ``otel-stages report`` shows. See :meth:`to_dict` for the JSON shape.

    ``stages`` (standard stages in pipeline order, then custom) and ``total`` describe the warm
    requests. ``groups`` maps each custom stage that holds other stage spans (``preprocess``
    around ``decode``/``resize``) to those stages' names: a group is not a row of ``stages``.
    ``total_samples`` / ``stage_samples`` (warm ms values) and ``cohort_counts`` (warm requests per
    input cohort, ``"unknown"`` for none) feed before/after comparisons.
    """

    requests: int
    counts: Counts
    stages: dict[str, StageStats]
    total: Distribution | None
    unaccounted: Unaccounted | None
    cold_start: ColdFigures | None
    verdict: Verdict
    gpu: GpuEvidence
    cohorts: list[CohortFigures] = field(default_factory=list)
    input_mix_explains: float | None = None
    process_mix: ProcessMix | None = None
    set_apart: list[SetApart] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    noise: NoiseBand | None = None
    slowest: list[SlowRequest] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    comparison: Comparison | None = None
    groups: dict[str, list[str]] = field(default_factory=dict)
    total_samples: list[float] = field(default_factory=list)
    stage_samples: dict[str, list[float]] = field(default_factory=dict)
    cohort_counts: dict[str, int] = field(default_factory=dict)
    batches: BatchSummary | None = None  #: batch sizes and fill waits (analysis.batching)
    #: the requests behind the figures (not in the JSON); ``baseline_sets`` the baseline's
    request_sets: RequestSets | None = None
    baseline_sets: RequestSets | None = None
    #: per stage: thread CPU vs waiting, GC, event-loop lag, throttling (analysis.mechanisms)
    signals: dict[str, StageSignals] = field(default_factory=dict)
    #: time counted in two stages at once (analysis.stage_overlap); ``None`` when none
    overlap: Overlap | None = None
    #: the failed requests' figures (:func:`otel_stages.analysis.failures.failures_to_dict`)
    failures: dict[str, object] | None = None
    #: how much of each process's request.seq range was read (analysis.sampled)
    sampling: SeqCoverage | None = None
    #: the stretch of the run that holds the slow warm requests (analysis.episode); ``None``: none
    episode: Episode | None = None

    @property
    def warm_requests(self) -> int:
        """Warm requests in the statistics."""
        return self.counts.warm

    @property
    def failed_requests(self) -> int:
        """Requests that ended with an error."""
        return self.counts.failed

    def to_dict(self) -> dict[str, object]:
        """The ``--json`` object (module docstring), ms values rounded to microseconds."""
        return {
            "requests": self.requests,
            "counts": self.counts.to_dict(),
            "total": None if self.total is None else self.total.to_dict(),
            "stages": {name: s.to_dict() for name, s in self.stages.items()},
            "unaccounted": None if self.unaccounted is None else self.unaccounted.to_dict(),
            "overlap": None if self.overlap is None else self.overlap.to_dict(),
            "cohorts": [cohort_to_dict(c) for c in self.cohorts],
            "cohorts_total": len(self.cohorts),  # all listed here; from ClickHouse the largest 20
            "input_mix_explains": _r(self.input_mix_explains, 4),
            "process_mix": None if self.process_mix is None else self.process_mix.to_dict(),
            "sampling": None if self.sampling is None else self.sampling.to_dict(),
            "cold_start": None if self.cold_start is None else cold_to_dict(self.cold_start),
            "set_apart": [a.to_dict() for a in self.set_apart],
            "failures": self.failures,
            "episode": None if self.episode is None else self.episode.to_dict(),
            "runs": [r.to_dict() for r in self.runs],
            "problems": list(self.problems),
            "verdict": self.verdict.to_dict(),
            "noise": noise_to_dict(self.noise, self.total),
            "gpu": self.gpu.to_dict(),
            "slowest": [s.to_dict() for s in self.slowest],
            "groups": {name: list(kids) for name, kids in self.groups.items()},
            "comparison": None if self.comparison is None else self.comparison.to_dict(),
            "batches": None if self.batches is None else self.batches.to_dict(),
            "signals": {name: s.to_dict() for name, s in self.signals.items()},
        }
