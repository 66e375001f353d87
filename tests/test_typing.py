"""The package's types reach users: ``py.typed`` ships, and returning from inside otel_stages
blocks type-checks (a context manager whose ``__exit__`` may swallow exceptions would make mypy
report "Missing return statement" in the user's code)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

USER_CODE = '''\
import otel_stages as ots


def decode(x: int) -> int:
    with ots.stage("decode"):
        return x


def handle() -> str:
    with ots.request(request_id="r-1"):
        return "a"


def worker(token: ots.QueueToken) -> int:
    with ots.dequeue(token):
        return 1


async def forward() -> int:
    async with ots.stage("forward"):
        return 2


@ots.stage("resize")
def resize(size: int) -> int:
    return size * 2


reveal_type(resize)
'''


def test_py_typed_ships_in_the_package() -> None:
    import otel_stages

    assert (Path(otel_stages.__file__).parent / "py.typed").is_file()


def test_user_code_returning_inside_blocks_type_checks(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    user = tmp_path / "user_service.py"
    user.write_text(USER_CODE)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(user)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # the decorator keeps the function's own signature
    assert 'Revealed type is "def (size: int) -> int"' in done.stdout
