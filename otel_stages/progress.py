"""Progress bars for long CLI work (reading large files or remote backends, benchmarks).

Shown only where a person watches: on standard error when it is a terminal, and never when the
caller turns it off (``--json`` output, scripts). Piped or redirected output gets no bar and no
escape codes. The bar is ``rich``'s, drawn on stderr, and removed when the work ends, so stdout
(the report, the table) is never mixed with it. Colour follows rich's rules: ``NO_COLOR`` and
``TERM=dumb`` turn it off.

Usage::

    with progress("reading traces", total=len(files), enabled=not args.json) as bar:
        for path in files:
            load(path)
            bar.advance()
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Protocol


class Bar(Protocol):
    """What the body of :func:`progress` gets: ``advance`` by units of work, ``total`` changes."""

    def advance(self, units: float = 1.0) -> None:
        """Count ``units`` more units of work done."""

    def set_total(self, total: float | None) -> None:
        """Change the amount of work (``None``: unknown, the bar pulses)."""


class _Silent:
    """The bar when none is shown: every call does nothing."""

    def advance(self, units: float = 1.0) -> None:
        pass

    def set_total(self, total: float | None) -> None:
        pass


class _RichBar:
    def __init__(self, bar: object, task: object) -> None:
        self._bar = bar
        self._task = task

    def advance(self, units: float = 1.0) -> None:
        self._bar.advance(self._task, units)  # type: ignore[attr-defined]

    def set_total(self, total: float | None) -> None:
        self._bar.update(self._task, total=total)  # type: ignore[attr-defined]


def is_terminal(stream: IO[str]) -> bool:
    """Whether ``stream`` is an interactive terminal (``False`` for files, pipes, closed streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextmanager
def progress(
    description: str,
    total: float | None,
    *,
    enabled: bool = True,
    unit: str = "",
    stream: IO[str] | None = None,
) -> Iterator[Bar]:
    """A transient progress bar on ``stream`` (default ``sys.stderr``) for ``total`` units of work
    (``None``: unknown), labelled ``description`` and, when given, the ``unit`` (``"files"``,
    ``"decodes"``). Shown only when ``enabled`` and ``stream`` is a terminal; otherwise the bar
    does nothing. Yields a :class:`Bar`."""
    stream = sys.stderr if stream is None else stream
    if not enabled or not is_terminal(stream):
        yield _Silent()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, console=Console(file=stream), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield _RichBar(bar, task)
