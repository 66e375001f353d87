"""Instructions per request of the ``benchmarks/overhead.py`` candidates, counted by callgrind.

Not a test, and not what the targets are judged on (that is ``overhead.py``'s request-thread CPU
time). On a shared machine CPU-time ratios move by several per cent from run to run; an
instruction count does not (the same count to within 0.2 % on a rerun), so it shows what a code
change did to the work itself. It does not see cache misses or branch mispredictions, which also
cost time: a candidate with 2 % more instructions and more distinct code can take 5 % more time.

``python benchmarks/overhead_instructions.py`` (Linux, ``valgrind`` installed, a CPython whose
symbols are present, as pyenv and distribution builds have: about 3 minutes) runs each candidate
in its own ``valgrind --tool=callgrind`` process. Only the timed loop is counted: it runs inside
``itertools.starmap`` and callgrind collects only while ``starmap_next`` is on the stack
(``--toggle-collect``); set-up, warm-up, exports and garbage collections between chunks are not
counted. The same candidate bodies, provider and settings as ``overhead.py`` (its ``_Bench``).
``--child NAME REQUESTS`` runs one candidate's loop without valgrind (what the parent starts under
it; the test suite runs it as a smoke test).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat, starmap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overhead  # the candidates, from the script beside this one

import otel_stages as ots
from otel_stages import signals
from otel_stages._runtime import RUNTIME
from otel_stages.signals import capture

#: Candidates counted by default, and how many requests each (the cheap ones need more to
#: rise above the loop's own instructions).
DEFAULT = {"bare": 4000, "disabled": 4000, "sdk_start_span": 400, "live_no_signals": 400,
           "sdk_start_span_signals": 400, "live": 400, "deferred": 400, "deferred_no_signals": 400}
RATIOS = {"live_no_signals_vs_sdk_start_span": ("live_no_signals", "sdk_start_span"),
          "live_vs_sdk_start_span_signals": ("live", "sdk_start_span_signals"),
          "deferred_vs_sdk_start_span": ("deferred", "sdk_start_span"),
          "deferred_no_signals_vs_sdk_start_span": ("deferred_no_signals", "sdk_start_span"),
          "disabled_vs_bare": ("disabled", "bare")}
CHUNK = 80  # requests between settles, as a round of overhead.py (under the batch size)


def child(name: str, requests: int) -> None:
    """One candidate's counted loop (under callgrind when started by :func:`main`)."""
    with tempfile.TemporaryDirectory() as folder:
        telemetry = ots.configure(data_dir=folder, gpu="off", set_global=False, span_mode="live",
                                  service_name="overhead-instructions")
        bench = overhead._Bench(telemetry)
        setup, body = bench.candidates[name]
        RUNTIME.enabled = setup.get("enabled", True)
        RUNTIME.deferred = bench.builder if setup.get("deferred") else None
        signals.enable(setup.get("signals", True))
        capture.enable_run_queue(setup.get("run_queue", False))
        gc.disable()  # collections run in _settle, outside the counted loop
        try:
            for _ in range(CHUNK):  # warm-up: CPython specialises the code on the first calls
                body()
            bench._settle()
            for _ in range(max(1, requests // CHUNK)):
                for _ in starmap(body, repeat((), CHUNK)):  # counted: see the module docstring
                    pass
                bench._settle()
        finally:
            gc.enable()
            RUNTIME.enabled, RUNTIME.deferred = True, None
            signals.enable(True)
            capture.enable_run_queue(False)
            telemetry.shutdown()
            bench.builder.shutdown(time.monotonic() + 5)


def count(name: str, requests: int) -> float:
    """Instructions per request of ``name`` (callgrind, one process)."""
    requests = max(1, requests // CHUNK) * CHUNK
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
           "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=starmap_next",
         "--callgrind-out-file=/dev/null", sys.executable, __file__, "--child", name, str(requests)],
        capture_output=True, text=True, env=env, check=False)
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{name}: callgrind failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    if int(found.group(1)) == 0:
        raise SystemExit("callgrind counted nothing: this CPython has no symbol for starmap_next")
    return int(found.group(1)) / requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("NAME", "REQUESTS"), help=argparse.SUPPRESS)
    parser.add_argument("--candidates", metavar="NAME,...", help="default: " + ",".join(DEFAULT))
    parser.add_argument("--jobs", type=int, default=2, help="callgrind processes at once (2)")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed")
    names = args.candidates.split(",") if args.candidates else list(DEFAULT)
    with ThreadPoolExecutor(args.jobs) as pool:
        counts = dict(zip(names, pool.map(lambda n: count(n, DEFAULT.get(n, 400)), names)))
    report: dict[str, Any] = {
        "instructions_per_request": {n: round(v) for n, v in counts.items()},
        "ratios": {k: round(counts[a] / counts[b], 4) for k, (a, b) in RATIOS.items()
                   if a in counts and b in counts},
        "python": sys.version.split()[0]}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
