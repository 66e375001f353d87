"""Read trace files, folders and standard input into one :class:`Recording`.

What a file holds is recognised from its content by :mod:`otel_stages.analysis.formats` (OTLP/JSON
lines or documents, Jaeger and Tempo JSON, gzip or zstd compressed); file names matter only when a
folder is searched (:data:`FOLDER_SUFFIXES`). Nothing raises for bad input: a missing path, an
empty folder or an unreadable file is a ``Recording.problems`` message and the rest still loads.

Files are streamed (:data:`~otel_stages.analysis.chunks.CHUNK_BYTES` at a time), so memory follows
what is kept, not the file size: pass a :class:`~otel_stages.analysis.selection.Selection` to keep
only the attributes the analysis reads (``otel-stages report`` does). Spans of one trace may be
spread over lines and files: the recording is grouped only after everything is read.

Progress: pass ``progress=`` any object with ``set_total(total)`` and ``advance(units)`` (the
:class:`otel_stages.progress.Bar` that :func:`otel_stages.progress.progress` yields fits as is).
:func:`load_paths` calls ``set_total`` once with the bytes on disk of every file it will read
(after folders are searched; ``None`` when a size is unknown) and ``advance`` with the bytes of
each chunk as it is read, so a bar moves with the reading, compressed files included.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Protocol

from otel_stages.analysis.chunks import read_stream
from otel_stages.analysis.compact import Compactor, paused_gc
from otel_stages.analysis.formats import read_chunks
from otel_stages.analysis.model import Recording
from otel_stages.analysis.selection import ALL, Selection

#: Data file endings picked up when a folder is given ...
DATA_SUFFIXES: tuple[str, ...] = (".jsonl", ".json", ".ndjson")
#: ... alone or followed by a compression ending; a bare ``.zst`` is what the Collector's file
#: exporter with native compression is usually pointed at.
COMPRESSED_SUFFIXES: tuple[str, ...] = (".gz", ".zst", ".zstd")
#: Every ending searched for in folders (a file named explicitly is read whatever its name).
FOLDER_SUFFIXES: tuple[str, ...] = (
    *DATA_SUFFIXES,
    *(d + c for d in DATA_SUFFIXES for c in COMPRESSED_SUFFIXES),
    ".zst",
    ".zstd",
)


class LoadProgress(Protocol):
    """Told how reading goes (see the module docstring); :class:`otel_stages.progress.Bar` fits."""

    def set_total(self, total: float | None) -> None:
        """Bytes to read in all (``None``: unknown)."""

    def advance(self, units: float = 1.0) -> None:
        """``units`` more bytes read."""


def load_paths(
    paths: Iterable[str | os.PathLike[str]],
    *,
    selection: Selection = ALL,
    progress: LoadProgress | None = None,
    on_file: Callable[[str, int], None] | None = None,
) -> Recording:
    """Load every given file, and every file under given folders (recursively) whose name ends in
    one of :data:`FOLDER_SUFFIXES`.

    Returns one :class:`Recording` holding all spans and points; problems name the file (as given
    or as found under the folder) and line. A file reached twice is read once. ``selection``:
    which span attributes to keep (default all); ``progress``: see the module docstring.
    ``on_file(path, size_bytes)`` is called just before each file is read, with its size on disk
    (0 when it cannot be stat'ed), for a progress bar's label.
    """
    out = Recording()
    files: list[Path] = []
    seen: set[str] = set()
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and p.name.endswith(FOLDER_SUFFIXES)
            )
            if not found:
                endings = ", ".join(f"*{s}" for s in (*DATA_SUFFIXES, *COMPRESSED_SUFFIXES))
                out.problems.append(f"{path}: no trace files ({endings}) in this folder; a file"
                                    " named otherwise is read when given by name")
        elif path.exists():
            found = [path]
        else:
            out.problems.append(f"{path}: no such file or folder")
            continue
        for file in found:
            key = os.path.realpath(file)
            if key not in seen:
                seen.add(key)
                files.append(file)
    if progress is not None:
        progress.set_total(_total_bytes(files))
    into = Compactor(selection, out)
    with paused_gc():
        for file in files:
            if on_file is not None:
                on_file(str(file), _size(file))
            _read_file(file, into, progress)
    return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def load_file(
    path: str | os.PathLike[str],
    *,
    selection: Selection = ALL,
    progress: LoadProgress | None = None,
) -> Recording:
    """Read one file in any format :mod:`~otel_stages.analysis.formats` recognises. Problems are
    ``"<path>:<line>: <what>"``; an unreadable file is one problem."""
    into = Compactor(selection)
    with paused_gc():
        _read_file(Path(path), into, progress)
    return into.out


def load_stream(
    stream: IO[bytes],
    name: str,
    *,
    selection: Selection = ALL,
    progress: LoadProgress | None = None,
) -> Recording:
    """Read a binary stream (standard input: ``sys.stdin.buffer``) to its end, chunk by chunk;
    ``name`` (``"<stdin>"``) prefixes problems. A read error is one problem; what came before it
    is kept."""
    into = Compactor(selection)
    with paused_gc():
        _read_chunks(stream, name, into, progress)
    return into.out


def load_bytes(data: bytes, name: str, *, selection: Selection = ALL) -> Recording:
    """Parse the contents of one file (or of stdin) named ``name`` in problem messages."""
    into = Compactor(selection)
    read_chunks([data], name, into)
    return into.out


def _total_bytes(files: list[Path]) -> int | None:
    total = 0
    for file in files:
        try:
            total += file.stat().st_size
        except OSError:
            return None
    return total


def _read_file(path: Path, into: Compactor, progress: LoadProgress | None) -> None:
    try:
        stream = path.open("rb")
    except OSError as exc:
        into.out.problems.append(f"{path}: cannot read ({exc.strerror or exc})")
        return
    with stream:
        _read_chunks(stream, str(path), into, progress)


def _read_chunks(stream: IO[bytes], name: str, into: Compactor, progress: LoadProgress | None) -> None:
    failed: list[OSError] = []
    read_chunks(read_stream(stream, failed, None if progress is None else progress.advance),
                name, into)
    if failed:
        exc = failed[0]
        into.out.problems.append(f"{name}: cannot read ({exc.strerror or exc}); read what came before")
