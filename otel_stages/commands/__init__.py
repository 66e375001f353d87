"""One module per ``otel-stages`` subcommand: ``add_arguments(parser)`` and ``run(args) -> int``.

Argument types shared by the subcommands live here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number ``>= minimum``, else a usage error naming the value."""

    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {raw!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse
