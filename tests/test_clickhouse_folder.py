"""``otel-stages import FILE --clickhouse chdb:DIR`` where DIR is a folder of the user's own files
(not a chDB database): refused with the folder and what is in it named, and nothing written
there; a missing or empty folder, or an existing chDB database, stays fine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

try:
    import chdb  # noqa: F401
except ImportError:
    # CI installs the test extra, which holds chDB: there a missing chDB is a broken install
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        raise
    pytest.skip("needs chDB: the clickhouse extra (pip install -e '.[test]')", allow_module_level=True)

from otel_stages.analysis.clickhouse import connect, parse_url
from otel_stages.analysis.http_source import SourceError
from otel_stages.cli import main

GPU_BUSY = Path(__file__).parent / "data" / "traces" / "gpu_busy.otlp.jsonl"


def _import(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["import", str(GPU_BUSY), "--clickhouse", url])
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "DB::Exception" not in out.err
    return code, out.out, out.err


def test_a_folder_of_other_files_is_refused_and_left_alone(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "work"
    mine.mkdir()
    for name in ("notes.txt", "traces.jsonl"):
        (mine / name).write_text("mine\n")
    code, out, err = _import(f"chdb:{mine}", capsys)
    assert code == 1 and out == ""
    assert err.strip() == (
        f"otel-stages: error: chdb:{mine}: {mine} holds 2 entries (notes.txt, traces.jsonl) but no"
        " chDB database (no metadata/ folder), and import would write the database's data/,"
        " metadata/, store/ and tmp/ folders among them; give a new or empty folder, e.g."
        " chdb:./otel-stages-clickhouse")
    assert sorted(os.listdir(mine)) == ["notes.txt", "traces.jsonl"]


def test_many_entries_are_named_up_to_three(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}").mkdir()
    with pytest.raises(SourceError, match=r"holds 5 entries \(f0, f1, f2, \.\.\.\)"):
        with connect(parse_url(f"chdb:{tmp_path}")):
            pass


def test_a_new_an_empty_folder_and_a_database_stay_fine(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for url in (f"chdb:{tmp_path / 'new' / 'db'}", f"chdb:{empty}"):
        code, out, _ = _import(url, capsys)
        assert code == 0 and out.startswith("imported 180 spans")
        code, out, _ = _import(url, capsys)  # a second import: the folder is a database now
        assert code == 0 and out.startswith("imported 180 spans")
    assert (empty / "metadata").is_dir()
