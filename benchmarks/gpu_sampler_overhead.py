"""Benchmark (not a test): CPU cost of GPU telemetry as a share of one core, with the fake NVML.

Builds the stand-in ``libnvidia-ml.so.1`` (tests/fakenvml, needs gcc), re-runs itself with
``LD_LIBRARY_PATH`` pointing at it, then in one process measures process CPU time
(``time.process_time``: all threads) over a fixed wall-clock window for

- a baseline: ``configure(gpu="off")``, idle;
- ``configure(gpu="on", gpu_interval_s=I)`` for I in 0.2 s and 1 s, with 1 and 4 fake GPUs
  (driver ring every 1/6 s, as on recent GPUs), idle.

Cost = (CPU seconds - baseline CPU seconds) / wall seconds. The figure covers the sampler thread
(ring drain + instant readings through the real pynvml bindings), the export thread and the
OTLP/JSON encoding of every sample. The fake library's own calls cost less than a real
driver's ioctls, so on a GPU host add the per-call cost ``benchmarks/gpu_check.py`` prints.

Usage: ``python benchmarks/gpu_sampler_overhead.py [--window-s 10]``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _measure(window_s: float, **configure_kwargs: object) -> dict:
    import otel_stages as ots
    from otel_stages.gpu import session

    with tempfile.TemporaryDirectory() as folder:
        telemetry = ots.configure(data_dir=folder, set_global=False, metric_export_interval_s=10,
                                  **configure_kwargs)
        current = session.current() if configure_kwargs.get("gpu") != "off" else None
        if current is not None:
            current.sampler.wait_ready(10)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        time.sleep(window_s)  # the measurement window: the service is idle, only telemetry runs
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        stats = current.sampler.stats() if current is not None else None
        telemetry.shutdown()
    return {"cpu_s": cpu, "wall_s": wall, "stats": stats}


def child(window_s: float) -> None:
    sys.path.insert(0, str(ROOT))
    _measure(1.0, gpu="off")  # warm-up: imports, first-export code paths
    baseline = _measure(window_s, gpu="off")
    results = []
    for gpus in (1, 4):
        os.environ["FAKE_NVML_GPUS"] = str(gpus)  # read by the fake library at nvmlInit
        for interval_s in (0.2, 1.0):
            run = _measure(window_s, gpu="on", gpu_interval_s=interval_s)
            stats = run["stats"]
            results.append({
                "gpus": gpus, "interval_s": interval_s,
                "cpu_share_of_one_core": round((run["cpu_s"] - baseline["cpu_s"]) / run["wall_s"], 5),
                "passes": stats["passes"], "mean_pass_ms": stats["mean_pass_ms"],
                "mean_call_ms": stats["mean_call_ms"], "points": stats["points"],
            })
    print(json.dumps({
        "window_s": window_s,
        "baseline_cpu_share_of_one_core": round(baseline["cpu_s"] / baseline["wall_s"], 5),
        "results": results,
        "target": "under 0.01 (1 %) at 0.2 s",
    }, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window-s", type=float, default=10.0, help="wall seconds per measurement")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.window_s)
        return 0
    spec = importlib.util.spec_from_file_location("fakenvml_build", ROOT / "tests" / "fakenvml" / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    with tempfile.TemporaryDirectory() as lib_dir:
        build.build(Path(lib_dir))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAKE_NVML_"))}
        env.update({"LD_LIBRARY_PATH": lib_dir, "PYTHONPATH": str(ROOT)})
        return subprocess.run([sys.executable, __file__, "--child", "--window-s", str(args.window_s)],
                              env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
