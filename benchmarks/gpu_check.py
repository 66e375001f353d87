"""Device check (issue 3, item 8): does the report call busy and starved GPUs right on real hardware?

On a machine with an NVIDIA GPU and PyTorch with CUDA, runs three loads through otel_stages
(``forward`` stage = :func:`otel_stages.gpu.cuda_stage`, NVML sampling at ``--interval-s``),
each into its own folder, then runs the report on each folder, twice: as recorded, and with the
``gpu.*`` forward attributes stripped so the verdict rests on exported ``hw.gpu.utilization``
samples alone.

- ``busy``: back-to-back large fp16 matmuls (expected ``gpu_busy``);
- ``starved``: one small matmul, then a host sleep, repeated (expected ``gpu_starved``);
- ``launch_bound``: thousands of one-element kernels back to back (no expectation: the honest
  call may be starved, busy or "medium"; the output shows what NVML and the report made of it).

Forward work varies 0.6x / 1x / 1.4x across requests so the forward stage swings (a stage that
does not swing gives ``stable``). Prints one JSON object: NVML init time, driver sample period,
sample clock domain, per-call cost, the NVML UUID the CUDA device mapped to, and per load the
verdict, GPU evidence and host vs device forward time. Runs in about a minute; exits 2 with a
JSON error when PyTorch, CUDA or NVML is missing.

Usage: ``python benchmarks/gpu_check.py [--requests 24] [--forward-s 0.5] [--interval-s 0.2]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEADLINE_S = 240.0  # stay well under the 5-minute budget whatever the GPU


def fail(message: str) -> None:
    print(json.dumps({"ok": False, "error": message}, indent=2))
    sys.exit(2)


def make_loads(torch: Any) -> dict[str, Any]:
    big_a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    big_b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    big_c = torch.empty_like(big_a)
    small = torch.randn(256, 256, device="cuda")
    tiny = torch.zeros(1, device="cuda")

    def busy(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(8):
                torch.mm(big_a, big_b, out=big_c)
            torch.cuda.synchronize()

    def starved(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            torch.mm(small, small)
            torch.cuda.synchronize()
            time.sleep(0.02)  # the host is busy elsewhere (data loading, locks): the GPU waits

    def launch_bound(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(500):
                tiny.add_(1.0)
            torch.cuda.synchronize()

    return {"busy": busy, "starved": starved, "launch_bound": launch_bound}


EXPECTED = {"busy": "gpu_busy", "starved": "gpu_starved", "launch_bound": None}


def strip_gpu_attributes(src: Path, dst: Path) -> None:
    """Copy ``src``'s OTLP/JSON files to ``dst`` with every ``gpu.*`` span attribute removed."""
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.glob("metrics-*.jsonl"):
        shutil.copy(path, dst / path.name)
    for path in src.glob("traces-*.jsonl"):
        lines = []
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            for rs in doc.get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for span in ss.get("spans", []):
                        span["attributes"] = [a for a in span.get("attributes", [])
                                              if not a["key"].startswith("gpu.")]
            lines.append(json.dumps(doc))
        (dst / path.name).write_text("\n".join(lines) + "\n")


def forward_times(folder: Path) -> dict[str, Any]:
    """Median host (span) and device (``gpu.device_time_ms``) time of the warm forwards."""
    host, device = [], []
    for path in folder.glob("traces-*.jsonl"):
        for line in path.read_text().splitlines():
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for span in ss.get("spans", []):
                        if span["name"] != "forward":
                            continue
                        host.append((int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e6)
                        for a in span.get("attributes", []):
                            if a["key"] == "gpu.device_time_ms":
                                device.append(float(a["value"]["doubleValue"]))
    return {"forwards": len(host),
            "host_median_ms": round(statistics.median(host), 3) if host else None,
            "device_median_ms": round(statistics.median(device), 3) if device else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24, help="requests per load (first is cold)")
    parser.add_argument("--forward-s", type=float, default=0.5, help="median forward duration")
    parser.add_argument("--interval-s", type=float, default=0.2, help="GPU sampler interval")
    parser.add_argument("--keep", type=Path, default=None, help="copy the recorded files here")
    args = parser.parse_args()
    started = time.perf_counter()
    try:
        import torch
    except ImportError as exc:
        fail(f"PyTorch is not installed ({exc}): install a CUDA build of torch to run this check")
    if not torch.cuda.is_available():
        fail("PyTorch sees no CUDA device (CPU-only build, no driver, or CUDA_VISIBLE_DEVICES empty)")

    import otel_stages as ots
    from otel_stages.analysis import diagnose, load_paths
    from otel_stages.config import ConfigurationError
    from otel_stages.gpu import cuda, session, set_model_device

    torch.cuda.set_device(0)
    set_model_device(0)  # CUDA ordinal 0 -> its NVML UUID through PyTorch
    loads = make_loads(torch)
    for load in loads.values():
        load(0.2)  # warm-up outside telemetry: cuBLAS handles, kernel selection
    out: dict[str, Any] = {"ok": True, "device": torch.cuda.get_device_name(0),
                           "torch": torch.__version__, "cuda_uuid": cuda.torch_device_uuid(0),
                           "settings": vars(args) | {"keep": str(args.keep) if args.keep else None},
                           "loads": {}}
    workdir = Path(tempfile.mkdtemp(prefix="otel-stages-gpu-check-"))
    for name, load in loads.items():
        if time.perf_counter() - started > DEADLINE_S:
            out["loads"][name] = {"skipped": "time budget used up"}
            continue
        folder = workdir / name
        t0 = time.perf_counter()
        try:
            telemetry = ots.configure(data_dir=folder, set_global=False, gpu="on",
                                      gpu_interval_s=args.interval_s, metric_export_interval_s=5,
                                      service_name=f"gpu-check-{name}")
        except ConfigurationError as exc:
            fail(str(exc))
        configure_s = time.perf_counter() - t0
        current = session.current()
        for i in range(args.requests):
            with ots.request():
                with ots.stage("decode"):
                    sum(range(20_000))  # a small CPU stage so requests have more than one stage
                with cuda.cuda_stage("forward"):
                    load(args.forward_s * (0.6, 1.0, 1.4)[i % 3])
        cuda.flush(30)
        telemetry.force_flush()
        stats = current.sampler.stats()
        model_uuid = current.attribution.model_device()
        telemetry.shutdown()
        stripped = workdir / f"{name}-samples-only"
        strip_gpu_attributes(folder, stripped)
        full = diagnose(load_paths([folder])).to_dict()
        samples_only = diagnose(load_paths([stripped])).to_dict()
        device = next((d for d in stats["devices"] if d["uuid"] == model_uuid), None)
        out["loads"][name] = {
            "expected": EXPECTED[name],
            "verdict": full["verdict"]["cause"], "verdict_stage": full["verdict"]["stage"],
            "gpu": full.get("gpu"), "evidence": full["verdict"].get("evidence"),
            "verdict_from_samples_only": samples_only["verdict"]["cause"],
            "gpu_from_samples_only": samples_only.get("gpu"),
            "forward": forward_times(folder),
            "nvml": {"configure_s": round(configure_s, 4), "init_s": stats["init_s"],
                     "model_device": model_uuid,
                     "sample_period_ms": device and device["sample_period_ms"],
                     "clock_domain": device and device["clock_domain"],
                     "utilization_source": device and device["utilization"],
                     "unsupported": device and device["unsupported"],
                     "mean_call_ms": stats["mean_call_ms"], "mean_pass_ms": stats["mean_pass_ms"],
                     "points": stats["points"], "points_dropped": stats["points_dropped"]},
        }
    if args.keep is not None:
        shutil.copytree(workdir, args.keep, dirs_exist_ok=True)
    shutil.rmtree(workdir, ignore_errors=True)
    out["elapsed_s"] = round(time.perf_counter() - started, 1)
    out["all_expected"] = all(v.get("verdict") == v.get("expected") and
                              v.get("verdict_from_samples_only") == v.get("expected")
                              for v in out["loads"].values() if v.get("expected"))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
