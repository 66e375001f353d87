"""benchmarks/report_scale.py in its smoke mode: the library's own spans recorded through its file
exporter, replicated with new ids, read back by ``otel-stages report --json`` in a process of its
own next to the bare standard-library pass. No timing is asserted (BENCHMARKS.md has figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_report_scale_smoke_measures_report_and_bare_pass(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTEST_"))}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "report_scale.py"), "--smoke", "--json",
         "--data-dir", str(tmp_path)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    (row,) = result["sizes"].values()
    for run in ("bare", "report"):
        assert row[run]["wall_s"] > 0 and row[run]["cpu_s"] > 0 and row[run]["rss_mb"] > 0
    # the generated file: whole requests of the library's six spans, 512 spans per export line
    (data,) = tmp_path.glob("spans-*.otlp.jsonl")
    lines = data.read_bytes().splitlines()
    spans = [s for line in lines for rs in json.loads(line)["resourceSpans"]
             for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(lines) == -(-len(spans) // 512) and len(spans) == 1200
    names = {s["name"] for s in spans}
    assert names == {"request", "download", "decode", "resize", "queue", "forward"}
    decode = next(s for s in spans if s["name"] == "decode")
    assert {a["key"] for a in decode["attributes"]} >= {"image.width", "image.height", "image.size"}
    assert len({s["traceId"] for s in spans}) == 200
