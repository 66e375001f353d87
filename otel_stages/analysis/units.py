"""Number formatting shared by the evidence sentences and the text report (pure, no rich).

- :func:`ms` -- a millisecond value for a table cell (unit in the header): 1 decimal from 1 ms
  up, more digits below so sub-millisecond stages never read ``0.0``.
- :func:`duration` -- a millisecond value with its unit for sentences: ``12.3 ms``, ``420 µs``.
- :func:`pct` -- a fraction as a percentage; tiny negatives (noise) read ``0%``, never ``-0%``/``-1%``.
- :func:`signed_ms` / :func:`signed_pct` -- changes with a sign, except when they round to zero.
"""

from __future__ import annotations

#: Negative fractions above this (e.g. a stage "explaining" -2 % of the variance) are noise and
#: shown as 0 %; a clearly negative value (a stage that moves against the total) keeps its sign.
NOISE_FRACTION = -0.05


def ms(value: float | None) -> str:
    """``123.4``, ``1.2``, ``0.42``, ``0.042``; ``-`` for ``None``."""
    if value is None:
        return "-"
    size = abs(value)
    if size == 0 or size >= 0.995:
        text = f"{value:.1f}"
    elif size >= 0.1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3f}"
    return "0.0" if float(text) == 0 else text


def duration(value_ms: float | None) -> str:
    """``12.3 ms`` from 1 ms up; ``420 µs`` / ``4.2 µs`` below; ``-`` for ``None``."""
    if value_ms is None:
        return "-"
    if value_ms == 0 or abs(value_ms) >= 1:
        return f"{ms(value_ms)} ms"
    us = value_ms * 1000
    return f"{us:.0f} µs" if abs(us) >= 10 else f"{us:.1f} µs"


def pct(fraction: float | None) -> str:
    """``42%``; ``0%`` for values that round to 0 or are noise-level negatives; ``-`` for ``None``."""
    if fraction is None:
        return "-"
    if abs(fraction) < 0.005 or NOISE_FRACTION < fraction < 0:
        return "0%"
    return f"{fraction:.0%}"


def signed_ms(value: float | None) -> str:
    """``+12.3`` / ``-0.42``; ``0.0`` (no sign) when it rounds to zero; ``-`` for ``None``."""
    if value is None:
        return "-"
    text = ms(value)
    return text if text == "0.0" or text.startswith("-") else "+" + text


def signed_pct(percent: float | None) -> str:
    """A change in percent (``-57.3`` -> ``-57%``); ``0%`` when it rounds to zero."""
    if percent is None:
        return "-"
    text = f"{percent:+.0f}%"
    return "0%" if text in ("+0%", "-0%") else text
