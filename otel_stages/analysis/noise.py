"""The noise band of a run: how much the request total swings from ordinary jitter alone.

In a steady service every stage jitters by a similar *relative* amount (scheduler, caches, clock,
GIL hand-offs scale with the work), and the total, a sum of stages, swings relatively no more than
its stages do. A real problem concentrates in one or two stages. So the run's jitter is measured on
its stages: each stage's relative swing ``swing_ms / median_ms``, and the lower quartile of those
over the stages (robust to the one or two stages that really swing). Stages under
:data:`NOISE_STAGE_MIN_FRACTION` of the request are left out (sub-millisecond stages jitter by
timer resolution, not work). With fewer than :data:`NOISE_MIN_STAGES` such stages the jitter cannot
be measured and is not used.

The band (ms) is the largest of:

- :data:`MIN_SWING_MS` (absolute: below it nothing is material),
- ``SWING_MIN_FRACTION * median total`` (the least swing worth a verdict, 15 %), and
- ``jitter * median total`` with the jitter capped at :data:`NOISE_MAX_FRACTION` (a swing past
  that is worth a look however noisy the run).

The total *swings* when its ``p95 - p5`` is above the band, or one run lies
``SPIKE_MIN_FRACTION`` of the median away from it. Pure; works on aggregates only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from otel_stages.analysis.figures import StageFigures
from otel_stages.analysis.stats import percentile
from otel_stages.analysis.units import duration, pct, pct_beside

#: Swings (and spikes) under this many ms are never material: scheduler, timer and GIL hand-off
#: jitter reach about a millisecond on a busy host.
MIN_SWING_MS = 1.0
#: The least swing worth a verdict, as a fraction of the median request total (the request total
#: swings, or a stage is material, from here on): a steady service jitters well under 10 %.
SWING_MIN_FRACTION = 0.15
#: ... or one run this far from the median (as a fraction of the median total), either way: p95 - p5
#: deliberately ignores one freak run, but a single +50 % spike is what users see.
SPIKE_MIN_FRACTION = 0.5
#: The run's jitter is measured only on stages of at least this fraction of the median request.
NOISE_STAGE_MIN_FRACTION = 0.02
#: ... and only when at least this many stages qualify (a quartile of fewer says nothing).
NOISE_MIN_STAGES = 3
#: Which quantile (0..100) of the stages' relative swings is the run's jitter: the lower quartile,
#: so that one or two stages that really swing do not raise the band.
NOISE_QUANTILE = 25.0
#: The measured jitter counts up to this fraction of the median total: a swing beyond it is worth
#: a look however noisy every stage is.
NOISE_MAX_FRACTION = 0.25


@dataclass(frozen=True)
class NoiseBand:
    """``band_ms``: the total's swing that jitter alone explains. ``reference_ms``: the median
    request it was derived for. ``jitter``: the run's measured relative jitter (``None`` when not
    measurable), from ``stages`` stages. ``source``: which term set the band (``"floor"`` for
    MIN_SWING_MS, ``"fraction"`` for SWING_MIN_FRACTION, ``"jitter"``, ``"jitter_cap"``)."""

    band_ms: float
    reference_ms: float
    jitter: float | None
    stages: int
    source: str

    def describe(self) -> str:
        """One sentence: the band and where it comes from."""
        if self.jitter is None:
            measured = (f"this run's jitter could not be measured (fewer than {NOISE_MIN_STAGES}"
                        " stages large enough to measure it)")
        else:
            # beside the threshold the jitter was compared with, when the sentence names one
            limit = {"jitter_cap": NOISE_MAX_FRACTION, "fraction": SWING_MIN_FRACTION}.get(self.source)
            jitter = pct(self.jitter) if limit is None else pct_beside(self.jitter, limit)
            measured = (f"this run's stages jitter by {jitter} of their own medians"
                        f" (lower quartile of {self.stages} stages' p95 - p5 / median)")
        if self.source == "jitter":
            why = "set by that jitter"
        elif self.source == "jitter_cap":
            why = f"that jitter, capped at {pct(NOISE_MAX_FRACTION)} of the median"
        elif self.source == "fraction":
            why = f"the least swing worth a verdict, {pct(SWING_MIN_FRACTION)} of the median"
        else:
            why = f"the {duration(MIN_SWING_MS)} floor below which no swing is material"
        return (f"noise band {duration(self.band_ms)} ({pct(self.band_ms / self.reference_ms)} of the"
                f" median request {duration(self.reference_ms)}): {why}; {measured}"
                if self.reference_ms > 0 else f"noise band {duration(self.band_ms)}: {why}")


def run_jitter(stages: Iterable[StageFigures], reference_ms: float) -> tuple[float | None, int]:
    """The run's relative jitter (see the module docstring) and how many stages measured it."""
    rel = [s.swing_ms / s.median_ms for s in stages
           if s.median_ms > 0 and s.median_ms >= NOISE_STAGE_MIN_FRACTION * reference_ms]
    if len(rel) < NOISE_MIN_STAGES:
        return None, len(rel)
    return percentile(rel, NOISE_QUANTILE), len(rel)


def noise_band(stages: Iterable[StageFigures], reference_ms: float) -> NoiseBand:
    """The band for a run whose median request is ``reference_ms`` (module docstring)."""
    jitter, n = run_jitter(stages, reference_ms)
    terms = [
        (MIN_SWING_MS, "floor"),
        (SWING_MIN_FRACTION * reference_ms, "fraction"),
    ]
    if jitter is not None:
        capped = min(jitter, NOISE_MAX_FRACTION)
        terms.append((capped * reference_ms, "jitter" if capped == jitter else "jitter_cap"))
    band, source = max(terms, key=lambda t: t[0])
    return NoiseBand(band, reference_ms, jitter, n, source)
