"""Connections to ClickHouse: parse a ``--clickhouse`` URL and open it as an :class:`Engine`
(the statements of :mod:`otel_stages.analysis.clickhouse` run on it).

URL forms (:func:`parse_url`):

- ``http://[user[:password]@]host[:8123][/database]`` or ``https://...`` (port 8443): a server,
  through clickhouse-connect (HTTP interface). The password may instead come from the environment
  variable ``CLICKHOUSE_PASSWORD`` (and the user from ``CLICKHOUSE_USER``), as for
  ``clickhouse-client``; a password in the URL is never printed.
- ``chdb:PATH``: chDB, ClickHouse's engine in this process, with its data in the folder PATH
  (``~`` expanded; created when missing, except by a reader: :func:`connect`'s ``reading``). One
  PATH per process at a time (a chDB limit): open, use, close; one process at a time on a PATH
  (another one's open database is :data:`IN_USE`).

Every failure (missing package, unreachable server, a folder in use, SQL error) is a
:class:`SourceError` naming the URL (without its password) and what is wrong. Needs the
``clickhouse`` extra: ``pip install 'otel-stages[clickhouse]'``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from otel_stages.analysis import clickhouse_schema as schema
from otel_stages.analysis import clickhouse_sql as sql
from otel_stages.analysis.http_source import SourceError

#: Environment variables read for server credentials (the names clickhouse-client uses).
ENV_USER = "CLICKHOUSE_USER"
ENV_PASSWORD = "CLICKHOUSE_PASSWORD"
#: Seconds to wait for a server to accept the connection.
CONNECT_TIMEOUT_S = 10
_EXTRA_HINT = "install the clickhouse extra: pip install 'otel-stages[clickhouse]'"


@dataclass(frozen=True)
class Target:
    """A parsed ``--clickhouse`` URL. ``kind`` is ``"chdb"`` (``path`` set) or ``"http"``."""

    kind: str
    display: str
    path: str = ""
    host: str = ""
    port: int = 0
    secure: bool = False
    username: str = "default"
    password: str = ""
    database: str = "default"


def parse_url(url: str, environ: Mapping[str, str] | None = None) -> Target:
    """Parse a ``--clickhouse`` URL (see the module docstring). Raises ``ValueError`` with the
    accepted forms when ``url`` is none of them."""
    env = os.environ if environ is None else environ
    if url.startswith("chdb:"):
        path = url[len("chdb:"):]
        if not path:
            raise ValueError("chdb: needs a folder, e.g. chdb:./otel-stages-clickhouse")
        return Target(kind="chdb", display=url, path=os.path.expanduser(path))
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"unsupported ClickHouse URL {url!r}: use http(s)://user@host:8123/database for a"
            " server or chdb:PATH for an embedded database in PATH")
    database = parts.path.strip("/") or "default"
    schema.quote_ident(database)
    secure = parts.scheme == "https"
    shown = f"{parts.scheme}://" + (f"{parts.username}@" if parts.username else "") + (
        f"{parts.hostname}" + (f":{parts.port}" if parts.port else "") + f"/{database}")
    return Target(
        kind="http",
        display=shown,
        host=parts.hostname,
        port=parts.port or (8443 if secure else 8123),
        secure=secure,
        username=unquote(parts.username) if parts.username else env.get(ENV_USER, "default"),
        password=unquote(parts.password) if parts.password else env.get(ENV_PASSWORD, ""),
        database=database,
    )


class Engine(Protocol):
    """What the report needs from a ClickHouse connection. Not thread-safe; one user at a time.

    ``rows`` returns the result as one dict per row (``JSONEachRow``); ``execute`` runs a
    statement without a result; ``insert`` streams ``JSONEachRow`` lines into a table. Every
    method raises the backend's own exception; :func:`connect` turns them into
    :class:`SourceError`.
    """

    def rows(self, query: str, params: Mapping[str, Any] | None = None,
             settings: Mapping[str, Any] | None = None) -> list[dict[str, Any]]: ...

    def execute(self, query: str, params: Mapping[str, Any] | None = None,
                settings: Mapping[str, Any] | None = None) -> None: ...

    def insert(self, table: str, lines: Iterable[bytes]) -> None: ...


def _decode_rows(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


#: Output settings both backends run with: 64-bit integers as JSON numbers, not strings.
_OUTPUT = {"output_format_json_quote_64bit_integers": 0}


#: Settings the embedded engine (its version pinned by the ``clickhouse`` extra) runs with, beside
#: each statement's: the analyzer pass that adds implied comparisons to AND chains (``a < b AND
#: b < c`` gives ``a < c``) took a tenth of the report's planning time on small data and found no
#: index to use on temporary tables (a server keeps its own default: older ones lack the setting).
_CHDB_SESSION = {"optimize_and_compare_chain": 0}


#: What the engine writes when another process has the chDB folder open (its ``status`` file
#: is locked: ClickHouse's ``StatusFile``), and what the user is told instead.
_LOCKED = "Cannot lock file"
IN_USE = ("{display} is in use by another process (an import or report running on it); wait for it"
          " or use a server")


class _InUse(Exception):
    """Another process holds the chDB folder."""


@contextmanager
def _engine_stderr(into: list[str]) -> Iterator[None]:
    """Hold back what the embedded engine writes straight to file descriptor 2 while it starts
    (on a locked folder it prints its own exception text before Python sees any), and hand it to
    ``into``. Written back to stderr unless the caller clears ``into``."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (embedded interpreters): nothing to hold back
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            into.append(held.read().decode("utf-8", "replace"))


class _ChdbEngine:
    """chDB in this process (``chdb.connect(PATH)``); settings are applied with ``SET``."""

    def __init__(self, path: str) -> None:
        import chdb

        Path(path).mkdir(parents=True, exist_ok=True)
        said: list[str] = []
        try:
            with _engine_stderr(said):
                self._conn = chdb.connect(path)
        except Exception as exc:
            if _LOCKED in "".join(said) + str(exc):
                raise _InUse from None
            raise
        finally:
            if said and said[0].strip() and _LOCKED not in said[0]:
                sys.stderr.write(said[0])
        self._applied: dict[str, Any] = {}
        self._purge = True
        for key, value in _CHDB_SESSION.items():
            self._conn.query(f"SET {key} = {sql.setting_literal(value)}")

    def _settings(self, settings: Mapping[str, Any] | None) -> None:
        for key, value in {**_OUTPUT, **(settings or {})}.items():
            if self._applied.get(key, object()) != value:
                self._conn.query(f"SET {key} = {sql.setting_literal(value)}")
                self._applied[key] = value

    def rows(self, query: str, params: Mapping[str, Any] | None = None,
             settings: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        self._settings(settings)
        result = self._conn.query(query, "JSONEachRow", params=dict(params or {}))
        self._release()
        return _decode_rows(result.bytes())

    def execute(self, query: str, params: Mapping[str, Any] | None = None,
                settings: Mapping[str, Any] | None = None) -> None:
        self._settings(settings)
        self._conn.query(query, "CSV", params=dict(params or {}))
        self._release()

    def _release(self) -> None:
        """Hand the memory a statement freed back to the system. The engine shares this
        process, and its allocator (jemalloc) otherwise keeps freed pages: at 10 M spans the
        report's peak RSS went from 845 MB with this to 995-1136 MB without (same statements,
        each under the engine's ``max_memory_usage``); it costs ~0.3 ms a statement. Skipped
        for good if this chDB build refuses the command."""
        if self._purge:
            try:
                self._conn.query("SYSTEM JEMALLOC PURGE")
            except Exception:  # noqa: BLE001 - a build without jemalloc: keep its memory
                self._purge = False

    def insert(self, table: str, lines: Iterable[bytes]) -> None:
        body = b"".join(lines)
        if body:
            self._conn.query(f"INSERT INTO {table} FORMAT JSONEachRow\n" + body.decode("utf-8"))

    def close(self) -> None:
        self._conn.close()


#: Loggers that log each retry of a refused connection as a WARNING (with the same error the
#: :class:`SourceError` then names): quiet while connecting.
_RETRY_LOGGERS = ("urllib3.connectionpool", "clickhouse_connect")


@contextmanager
def _quiet_retries() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _RETRY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


class _ServerEngine:
    """A ClickHouse server through clickhouse-connect (HTTP). Temporary tables need the session
    clickhouse-connect opens per client by default."""

    def __init__(self, target: Target) -> None:
        import clickhouse_connect

        with _quiet_retries():
            self._client = clickhouse_connect.get_client(
                host=target.host, port=target.port, username=target.username,
                password=target.password, database=target.database, secure=target.secure,
                connect_timeout=CONNECT_TIMEOUT_S, settings=dict(_OUTPUT),
            )

    def rows(self, query: str, params: Mapping[str, Any] | None = None,
             settings: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        data = self._client.raw_query(query, parameters=dict(params or {}),
                                      settings=dict(settings or {}), fmt="JSONEachRow")
        return _decode_rows(data)

    def execute(self, query: str, params: Mapping[str, Any] | None = None,
                settings: Mapping[str, Any] | None = None) -> None:
        self._client.command(query, parameters=dict(params or {}) or None,
                             settings=dict(settings or {}))

    def insert(self, table: str, lines: Iterable[bytes]) -> None:
        body = b"".join(lines)
        if body:
            self._client.raw_insert(table, insert_block=body, fmt="JSONEachRow")

    def close(self) -> None:
        self._client.close()


def no_table(url: str, name: str) -> str:
    """The message for a report on ``url`` (a target's display) without the traces table
    ``name``."""
    if url.startswith("chdb:"):
        named = "" if name == schema.DEFAULT_TRACES_TABLE else f" --traces-table {name}"
        how = f"run `otel-stages import FILE... --clickhouse {url}{named}` first"
    else:
        how = ("is the Collector's clickhouse exporter writing to this database? name its table"
               " with --traces-table, or load files with `otel-stages import FILE... --clickhouse"
               " URL`")
    return f"{url}: no {name} table here ({how})"


#: At most this many entries of a folder that is not a chDB database are named.
_NAMED_ENTRIES = 3


def _chdb_folder_problem(target: Target, reading: str | None) -> str | None:
    """Why the chDB folder of ``target`` cannot be opened (``reading``: see :func:`connect`)."""
    path = Path(target.path)
    if path.exists() and not path.is_dir():
        return (f"{target.display}: {target.path} is a file, not a folder (chDB keeps a database in"
                " a folder: give a folder's path, e.g. chdb:./otel-stages-clickhouse)")
    # a database folder has metadata/ (what chDB writes first); a reader creates nothing
    if (path / "metadata").is_dir():
        return None
    if reading is not None:
        return no_table(target.display, reading)
    # an importer creates the database in a missing or empty folder only: chDB would write its
    # data/, metadata/, store/ and tmp/ among the user's own files
    others = sorted(os.listdir(path)) if path.is_dir() else []
    if others:
        named = ", ".join(others[:_NAMED_ENTRIES]) + (", ..." if len(others) > _NAMED_ENTRIES else "")
        return (f"{target.display}: {target.path} holds {len(others)}"
                f" entr{'ies' if len(others) != 1 else 'y'} ({named}) but no chDB database (no"
                " metadata/ folder), and import would write the database's data/, metadata/,"
                " store/ and tmp/ folders among them; give a new or empty folder, e.g."
                " chdb:./otel-stages-clickhouse")
    return None


@contextmanager
def connect(target: Target, *, reading: str | None = None) -> Iterator[Engine]:
    """Open ``target``, yield an :class:`Engine`, close it. Any failure inside (connecting, a
    query) is re-raised as :class:`SourceError` naming ``target.display``: a chDB ``PATH`` that
    is a file, or that another process has open (:data:`IN_USE`), is said so.

    ``reading``: the traces table a reader needs (as the user named it). With it a chDB folder is
    never created: a missing one, or one without a database, is the error :func:`no_table`.
    Without it (``import``) the folder is created when missing, and a folder holding other files
    but no database is refused (chDB would write its folders among them)."""
    if target.kind == "chdb":
        problem = _chdb_folder_problem(target, reading)
        if problem is not None:
            raise SourceError(problem)
    try:
        engine: _ChdbEngine | _ServerEngine = (
            _ChdbEngine(target.path) if target.kind == "chdb" else _ServerEngine(target))
    except _InUse:
        raise SourceError(IN_USE.format(display=target.display)) from None
    except ImportError as exc:
        package = "chdb-core" if target.kind == "chdb" else "clickhouse-connect"
        raise SourceError(f"{target.display}: {package} is not installed ({exc}); {_EXTRA_HINT}"
                          ) from None
    except Exception as exc:  # noqa: BLE001 - each backend raises its own types
        raise SourceError(f"{target.display}: cannot connect ({_first_line(exc)})") from None
    try:
        yield engine
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise SourceError(f"{target.display}: {_first_line(exc)}") from None
    finally:
        engine.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]
