"""Progress bars for long CLI work (reading large files or remote backends, benchmarks).

Shown only where a person watches: on standard error when it is a terminal that can move the
cursor (not ``TERM=dumb``), and never when the caller turns it off: commands pass
``enabled=show_progress(args.json)``, which is false for ``--json`` output and when standard output
is piped or redirected (scripts). The bar is ``rich``'s, drawn on stderr, and removed when the work
ends, so stdout (the report, the table) is never mixed with it. Colour follows rich's rules:
``NO_COLOR`` turns it off.

Usage::

    with progress("reading traces", total=len(files), enabled=show_progress(args.json)) as bar:
        for path in files:
            load(path)
            bar.advance()

``unit="bytes"`` counts bytes and shows them as ``12.3/45.6 MB``; any other unit is shown after
``done/total``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Protocol

from otel_stages.terminal import is_terminal


class Bar(Protocol):
    """What the body of :func:`progress` gets: ``advance`` by units of work, ``total`` changes."""

    def advance(self, units: float = 1.0) -> None:
        """Count ``units`` more units of work done."""

    def set_total(self, total: float | None) -> None:
        """Change the amount of work (``None``: unknown, the bar pulses)."""

    def describe(self, text: str) -> None:
        """Change the label (e.g. the file being read)."""


class _Silent:
    """The bar when none is shown: every call does nothing."""

    def advance(self, units: float = 1.0) -> None:
        pass

    def set_total(self, total: float | None) -> None:
        pass

    def describe(self, text: str) -> None:
        pass


class _RichBar:
    def __init__(self, bar: object, task: object) -> None:
        self._bar = bar
        self._task = task

    def advance(self, units: float = 1.0) -> None:
        self._bar.advance(self._task, units)  # type: ignore[attr-defined]

    def set_total(self, total: float | None) -> None:
        self._bar.update(self._task, total=total)  # type: ignore[attr-defined]

    def describe(self, text: str) -> None:
        self._bar.update(self._task, description=text)  # type: ignore[attr-defined]


def show_progress(json_output: bool) -> bool:
    """Whether a command should draw progress at all: not for ``--json`` output, and not when
    standard output is piped or redirected (a script reads it). :func:`progress` still checks that
    its own stream (stderr) is a terminal."""
    return not json_output and is_terminal(sys.stdout)


def _can_draw(stream: IO[str]) -> bool:
    """A terminal that can move the cursor (``TERM=dumb`` cannot: a bar would print line after
    line)."""
    return is_terminal(stream) and os.environ.get("TERM", "").strip().lower() != "dumb"


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
    ``"decodes"``; ``"bytes"`` shows kB / MB). Shown only when ``enabled`` and ``stream`` is a
    terminal that can move the cursor; otherwise the bar does nothing. Yields a :class:`Bar`."""
    stream = sys.stderr if stream is None else stream
    if not enabled or not _can_draw(stream):
        yield _Silent()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    counted: list[ProgressColumn] = (
        [DownloadColumn()] if unit == "bytes" else [MofNCompleteColumn(), TextColumn(unit)])
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        *counted,
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, console=Console(file=stream), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield _RichBar(bar, task)
