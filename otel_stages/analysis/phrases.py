"""Sentences the verdicts share (:mod:`otel_stages.analysis.decision`): a stage's or the total's
spread, its centre, the request total, and the total against the run's noise band. Pure text from
:class:`~otel_stages.analysis.figures.Figures`; no rule lives here."""

from __future__ import annotations

from otel_stages.analysis.figures import Figures, StageFigures, TotalFigures
from otel_stages.analysis.noise import SPIKE_MIN_FRACTION, NoiseBand
from otel_stages.analysis.units import duration, pct


def spread_text(s: StageFigures | TotalFigures) -> str:
    """`` (p5 .. -> p95 .., min .., max ..)`` for a stage or the total; ``""`` when unknown."""
    d = duration
    if s.p5_ms is not None and s.p95_ms is not None:
        if abs((s.p95_ms - s.p5_ms) - s.swing_ms) <= 1e-6 * max(1.0, s.swing_ms):
            inner = f"p5 {d(s.p5_ms)} -> p95 {d(s.p95_ms)}"
        else:  # histograms: the rules use the spread the bucket edges prove
            inner = (f"p5 {d(s.p5_ms)} -> p95 {d(s.p95_ms)} as interpolated; the histogram buckets"
                     f" prove at least {d(s.swing_ms)}")
    else:
        inner = ""
    if s.min_ms is not None and s.max_ms is not None:
        inner += f"{', ' if inner else ''}min {d(s.min_ms)}, max {d(s.max_ms)}"
    return f" ({inner})" if inner else ""


def centre(s: StageFigures) -> str:
    """``12.3 ms median``, plus the mean when it differs (shares follow the mean)."""
    text = f"{duration(s.median_ms)} median"
    if s.mean_ms is not None and abs(s.mean_ms - s.median_ms) > 0.25 * max(s.median_ms, 1e-9):
        text += f", {duration(s.mean_ms)} mean"
    return text


def total_text(fig: Figures) -> str:
    """``median 120 ms, p95 130 ms, 29 warm requests``."""
    t = fig.total
    if t is None:
        return f"{fig.warm_requests} warm requests"
    p95 = f", p95 {duration(t.p95_ms)}" if t.p95_ms is not None else ""
    return f"median {duration(t.median_ms)}{p95}, {t.count} warm requests"


def band_line(fig: Figures, band: NoiseBand, beyond: bool) -> str:
    """The request total's swing (or spike) ``beyond`` / within the run's noise ``band``."""
    t = fig.total
    assert t is not None
    if beyond and t.swing_ms <= band.band_ms and t.spike_ms is not None:
        return (f"request total spikes: its farthest run lies {duration(t.spike_ms)} from the median"
                f" {duration(t.median_ms)} (at least {pct(SPIKE_MIN_FRACTION)} of it), while its"
                f" p95 - p5 of {duration(t.swing_ms)} stays within this run's {band.describe()}")
    where = "beyond" if beyond else "within"
    return (f"request total swings {duration(t.swing_ms)}{spread_text(t)}, {where} this run's"
            f" {band.describe()}")
