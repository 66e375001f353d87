"""benchmarks/soak.py in its smoke mode: the demo pipeline against a loopback collector that goes
down and comes back; every span is delivered or counted, nothing is lost while it is up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_soak_smoke_accounts_for_every_span():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTEST_"))}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--smoke"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    report = json.loads(done.stdout)
    assert done.returncode == 0, (report["verdict"], done.stderr[-2000:])
    spans = report["spans"]
    assert spans["sent"] == spans["received"] + spans["dropped"] and spans["dropped"] > 0
    assert report["phases"]["before_down"]["dropped"] == 0
    assert report["phases"]["before_down"]["received"] > 0  # the collector really was up first
    assert report["dropped_after_collector_back"] == 0 or report["phases"]["settled"]["dropped"] == spans["dropped"]
    assert report["shutdown_ok"] is True
