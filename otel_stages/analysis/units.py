"""Number formatting shared by the evidence sentences and the text report (pure, no rich).

- :func:`ms` -- a millisecond value for a table cell (unit in the header): 1 decimal from 1 ms
  up, more digits below so sub-millisecond stages never read ``0.0``.
- :func:`duration` -- a millisecond value with its unit for sentences: ``12.3 ms``, ``420 µs``.
- :func:`pct` -- a fraction as a percentage; tiny negatives (noise) read ``0%``, never ``-0%``/``-1%``.
- :func:`signed_ms` / :func:`signed_pct` -- changes with a sign, except when they round to zero.
- :func:`times_beside` / :func:`pct_beside` -- a ratio / fraction printed in a sentence that
  compares it with a threshold: never rounded onto or across it (``1.999x`` or ``just under 2x``
  beside a 2x threshold, not ``2.00x``); :func:`round_beside` the same for a JSON number.
"""

from __future__ import annotations

#: Negative fractions above this (e.g. a stage "explaining" -2 % of the variance) are noise and
#: shown as 0 %; a clearly negative value (a stage that moves against the total) keeps its sign.
NOISE_FRACTION = -0.05
#: A figure printed beside a threshold gets up to this many more decimals to stay on its side of
#: it; closer still it is said in words (``just under 2x``): more digits would read as precision.
BESIDE_EXTRA_DIGITS = 2


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


def _beside(value: float, threshold: float, digits: int, scale: float) -> str:
    """``value * scale`` with ``digits`` decimals, or up to :data:`BESIDE_EXTRA_DIGITS` more: the
    fewest at which the printed figure lies on the same side of ``threshold * scale`` as the
    value (on it only when the value is); ``""`` when none do."""
    side = (value > threshold) - (value < threshold)
    limit = round(threshold * scale, 12)  # 0.7 * 100 is 70.00000000000001
    for d in range(digits, digits + BESIDE_EXTRA_DIGITS + 1):
        text = f"{value * scale:.{d}f}"
        shown = float(text)
        if (shown > limit) - (shown < limit) == side:
            return text
    return ""


def times_beside(ratio: float, threshold: float) -> str:
    """``ratio`` as ``12.3x`` in a sentence that compares it with ``threshold`` (a ratio too):
    more decimals near it (``2.01x``, ``1.999x``), never printed onto or across it; ``just under
    2x`` / ``just over 2x`` closer than that."""
    text = _beside(ratio, threshold, 1, 1.0)
    if text:
        return f"{text}x"
    return f"just {'under' if ratio < threshold else 'over'} {threshold:g}x"


def pct_beside(fraction: float, threshold: float) -> str:
    """``fraction`` as ``42%`` in a sentence that compares it with ``threshold`` (a fraction too):
    a decimal or two near it (``69.7%``), never printed onto or across it; ``just under 70%`` /
    ``just over 70%`` closer than that."""
    text = _beside(fraction, threshold, 0, 100.0)
    if text:
        return "0%" if float(text) == 0 else f"{text}%"
    return f"just {'under' if fraction < threshold else 'over'} {pct(threshold)}"


def round_beside(value: float | None, threshold: float, digits: int) -> float | None:
    """``value`` rounded to ``digits`` decimals, or up to :data:`BESIDE_EXTRA_DIGITS` more, so
    that it stays on its side of ``threshold`` (a JSON figure a reader compares with the
    threshold: a cold ratio of 1.9990 is 1.999, not 2.0); unrounded when none does; ``None``
    stays ``None``."""
    if value is None:
        return None
    text = _beside(value, threshold, digits, 1.0)
    return float(text) if text else value
