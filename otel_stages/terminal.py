"""Terminal output for the text report and the CLI: is a stream a terminal, what its encoding can
hold, and tables fitted to a width.

:func:`fit_table` builds a ``rich`` table of string cells that fits ``width`` columns: numbers
and trace ids are never cut, stage names fold onto more lines, and when the table still does not
fit, its lowest-priority columns are left out (and named, :func:`left_out_note`).
"""

from __future__ import annotations

import codecs
import io
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, cast

from rich import box
from rich.console import Console, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

#: The stage-name column folds onto more lines below this many characters rather than cut.
NAME_MIN_WIDTH = 10
#: A fitted table's padding: 1 space at each outer edge, 3 between columns.
_EDGE, _GAP = 2, 3


@dataclass(frozen=True)
class Column:
    """A column of a fitted table: ``drop`` 0 = always shown, higher = dropped sooner when the
    terminal is narrow; ``fold``: the text may wrap onto more lines (stage names), otherwise the
    column is never narrower than its widest cell (numbers are never cut)."""

    header: str
    drop: int = 0
    justify: JustifyMethod = "right"
    fold: bool = False
    fold_header: bool = False  #: only the header may fold (a long stage name over numbers)


def fit_table(
    cols: Sequence[Column], rows: Sequence[Sequence[str]], width: int,
    styles: Sequence[str | None] = (),
) -> tuple[Table, list[str]]:
    """A table of ``rows`` with as many of ``cols`` as fit in ``width``; returns it and the
    headers of the columns left out (lowest priority first)."""

    def need(i: int) -> int:
        cells = max([0, *(len(row[i]) for row in rows)])
        if cols[i].fold_header:
            return max(cells, min(len(cols[i].header), NAME_MIN_WIDTH))
        w = max(len(cols[i].header), cells)
        return min(w, NAME_MIN_WIDTH) if cols[i].fold else w

    keep = list(range(len(cols)))
    dropped: list[str] = []
    while sum(need(i) for i in keep) + _GAP * (len(keep) - 1) + _EDGE > width:
        droppable = [i for i in keep if cols[i].drop > 0]
        if not droppable:
            break
        worst = max(droppable, key=lambda i: (cols[i].drop, i))
        keep.remove(worst)
        dropped.append(cols[worst].header)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for i in keep:
        c = cols[i]
        if c.fold or c.fold_header:
            table.add_column(c.header, justify=c.justify, overflow="fold", min_width=need(i))
        else:
            table.add_column(c.header, justify=c.justify, no_wrap=True, min_width=need(i))
    for n, row in enumerate(rows):
        table.add_row(*(row[i] for i in keep), style=styles[n] if n < len(styles) else None)
    return table, dropped


def left_out_note(dropped: list[str]) -> list[RenderableType]:
    """A dim line naming the columns :func:`fit_table` left out (nothing when none were)."""
    if not dropped:
        return []
    return [Text(f"(too narrow: {', '.join(dropped)} not shown; widen the terminal or set"
                 " COLUMNS, or use --json)", style="dim")]


def is_terminal(file: IO[str]) -> bool:
    """Whether ``file`` is an interactive terminal (``False`` for files, pipes, closed streams)."""
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


class TextBuffer(io.StringIO):
    """A text buffer that reports the final output's encoding, so rich draws ASCII table rules
    (its ``safe_box`` substitution) when that encoding has no box-drawing characters."""

    def __init__(self, encoding: str) -> None:
        super().__init__()
        self._target_encoding = encoding

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._target_encoding


#: What a character an encoding cannot hold is written as (the report's units and arrows);
#: anything else becomes ``?``.
_FALLBACKS = {"µ": "u", "×": "x", "→": "->", "←": "<-", "≥": ">=", "≤": "<=", "–": "-", "—": "-",
              "…": "...", "≈": "~", "−": "-", "±": "+/-", "·": "."}
#: The codec error handler that writes :data:`_FALLBACKS` (registered on import).
FALLBACK_ERRORS = "otel_stages.fallback"


def _fallback(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    text = error.object[error.start:error.end]
    return "".join(_FALLBACKS.get(ch, "?") for ch in text), error.end


codecs.register_error(FALLBACK_ERRORS, _fallback)


class ReplacingWriter(io.TextIOBase):
    """Writes to ``file`` with every character its encoding cannot hold replaced (``µs`` as
    ``us``, else ``?``: :data:`FALLBACK_ERRORS`): the report never dies with UnicodeEncodeError
    on a cp1252 / ASCII stdout."""

    def __init__(self, file: IO[str], encoding: str) -> None:
        super().__init__()
        self._file, self._encoding = file, encoding

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    def write(self, text: str) -> int:
        self._file.write(text.encode(self._encoding, FALLBACK_ERRORS).decode(self._encoding))
        return len(text)

    def flush(self) -> None:
        self._file.flush()

    def isatty(self) -> bool:
        return is_terminal(self._file)

    def fileno(self) -> int:
        return self._file.fileno()


def encoding_of(file: IO[str]) -> str:
    """``file``'s encoding (UTF-8 when it has none, e.g. a StringIO); unknown names count as ASCII."""
    name = getattr(file, "encoding", None) or "utf-8"
    try:
        return codecs.lookup(name).name
    except LookupError:
        return "ascii"


def env_columns() -> int | None:
    """``COLUMNS`` from the environment when it is a width of at least 40, else ``None`` (the
    variable shells set for their terminal; honoured for a file or a pipe too, so the hint of a
    table that had to leave columns out works everywhere)."""
    raw = os.environ.get("COLUMNS", "").strip()
    return int(raw) if raw.isdigit() and int(raw) >= 40 else None


@contextmanager
def text_console(file: IO[str], width: int, *, terminal_width: int | None = None) -> Iterator[Console]:
    """A ``rich`` console writing to ``file``. On a terminal: colours as rich decides (``NO_COLOR``,
    ``TERM=dumb`` turn them off) at ``terminal_width`` (default: the terminal's). Otherwise plain
    text at ``width`` columns, no escape codes, no trailing spaces, written when the block ends.
    Either way nothing raises ``UnicodeEncodeError``: table rules turn ASCII when ``file``'s
    encoding lacks box drawing, any other character it cannot hold becomes ``?``."""
    tty = is_terminal(file)
    out = ReplacingWriter(file, encoding_of(file))
    buffer = TextBuffer(out.encoding)
    console = Console(
        file=cast(IO[str], out) if tty else buffer,
        force_terminal=tty,
        no_color=True if not tty else None,
        width=terminal_width if tty else width,
        highlight=False,
        markup=False,  # names and messages are data, not markup
        emoji=False,
    )
    yield console
    if not tty:
        out.write("\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n")
