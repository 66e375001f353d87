"""Read trace files, folders and standard input into one :class:`Recording`.

What a file holds is recognised from its content by :mod:`otel_stages.analysis.formats` (OTLP/JSON
lines or documents, Jaeger and Tempo JSON, gzip or zstd compressed); file names matter only when a
folder is searched (:data:`FOLDER_SUFFIXES`). Nothing raises for bad input: a missing path, an
empty folder or an unreadable file is a ``Recording.problems`` message and the rest still loads.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from otel_stages.analysis.formats import decode
from otel_stages.analysis.model import Recording

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


def load_paths(paths: Iterable[str | os.PathLike[str]], *,
               on_file: Callable[[str, int], None] | None = None) -> Recording:
    """Load every given file, and every file under given folders (recursively) whose name ends in
    one of :data:`FOLDER_SUFFIXES`.

    Returns one :class:`Recording` holding all spans and points; problems name the file (as given
    or as found under the folder) and line. A file reached twice is read once. ``on_file(path,
    size_bytes)`` is called just before each file is read, with its size on disk (0 when it cannot
    be stat'ed), for progress bars.
    """
    out = Recording()
    seen: set[str] = set()
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and p.name.endswith(FOLDER_SUFFIXES)
            )
            if not found:
                endings = ", ".join(f"*{s}" for s in (*DATA_SUFFIXES, *COMPRESSED_SUFFIXES))
                out.problems.append(f"{path}: no trace files ({endings}) in this folder")
            files = found
        elif path.exists():
            files = [path]
        else:
            out.problems.append(f"{path}: no such file or folder")
            continue
        for file in files:
            key = os.path.realpath(file)
            if key not in seen:
                seen.add(key)
                if on_file is not None:
                    on_file(str(file), _size(file))
                out.extend(load_file(file))
    return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def load_file(path: str | os.PathLike[str]) -> Recording:
    """Read one file in any format :mod:`~otel_stages.analysis.formats` recognises. Problems are
    ``"<path>:<line>: <what>"``; an unreadable file is one problem."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return Recording(problems=[f"{path}: cannot read ({exc.strerror or exc})"])
    return load_bytes(data, str(path))


def load_bytes(data: bytes, name: str) -> Recording:
    """Parse the contents of one file (or of stdin) named ``name`` in problem messages."""
    return decode(data, name)
