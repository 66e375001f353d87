"""GPU telemetry against a stand-in ``libnvidia-ml.so.1`` (tests/fakenvml/libnvidia-ml.c) loaded
by the real ``nvidia-ml-py`` bindings, and against no library at all (the CI machine's case).

Each scenario runs in a fresh Python process (``LD_LIBRARY_PATH`` is read once at process start)
through ``tests/fakenvml/scenario.py``, which configures otel_stages, runs one request with a
``forward`` stage, flushes (no sleeps to wait for telemetry) and reports what was exported.
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_stages import semconv

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fakenvml"
SCENARIO = FAKE / "scenario.py"

_spec = importlib.util.spec_from_file_location("fakenvml_build", FAKE / "build.py")
assert _spec is not None and _spec.loader is not None
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)


def _system_has_nvml() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def _build(folder: Path, **options: bool) -> Path:
    try:
        return build.build(folder, **options)
    except FileNotFoundError as exc:  # no gcc: a skip locally, a failure in CI (CI=true)
        if os.environ.get("CI"):
            pytest.fail(f"{exc}; CI must provide gcc for the fake NVML tests")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("fakenvml"))


@pytest.fixture(scope="session")
def fake_lib_no_memory_v2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("fakenvml_old"), no_memory_v2=True)


@pytest.fixture
def run(tmp_path: Path):
    """``run(lib_dir, spec=..., **FAKE_NVML_env) -> dict`` (the scenario's JSON output)."""

    def _run(lib_dir: Path, spec: dict | None = None, **fake_env: str) -> dict:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OTEL_", "FAKE_NVML_", "CUDA_"))}
        env.update({"LD_LIBRARY_PATH": str(lib_dir), "PYTHONPATH": str(ROOT), **fake_env})
        full = {"data_dir": str(tmp_path / "data"), **(spec or {})}
        done = subprocess.run([sys.executable, str(SCENARIO), json.dumps(full)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    return _run


def _unavailable_lines(out: dict) -> list[str]:
    return [r["message"] for r in out["logs"] if "NVML unavailable" in r["message"]]


def _gpu_attrs(out: dict) -> dict:
    return {k: v for k, v in out["forward"]["attributes"].items() if k.startswith("gpu.")}


# --- no GPU data: the service runs on, one actionable line ------------------------------------

@pytest.mark.skipif(_system_has_nvml(), reason="this machine has a real libnvidia-ml.so.1")
def test_no_library_at_all_service_runs_on_with_one_log_line(run, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run(empty, {"forward_s": 0.05})
    assert out["configure_s"] < 2.0
    assert out["forward"] is not None and _gpu_attrs(out) == {}
    assert not any(name.startswith("hw.") for name in out["points"])
    lines = _unavailable_lines(out)
    assert len(lines) == 1
    assert "libnvidia-ml.so.1 not found" in lines[0] and "continuing without GPU data" in lines[0]
    assert out["stats"]["status"] == "unavailable"


@pytest.mark.skipif(_system_has_nvml(), reason="this machine has a real libnvidia-ml.so.1")
def test_gpu_on_without_library_fails_configure_naming_the_setting(run, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run(empty, {"configure": {"gpu": "on"}})
    assert "OTEL_STAGES_GPU" in out["configuration_error"]
    assert "libnvidia-ml.so.1 not found" in out["configuration_error"]
    assert _unavailable_lines(out) == []  # the error is the message, not a log line


@pytest.mark.parametrize(("scenario", "expected"), [
    ("init_error", "NVIDIA kernel driver is not loaded"),
    ("version_mismatch", "driver/library version mismatch"),
])
def test_init_failures_give_one_actionable_line(run, fake_lib: Path, scenario: str, expected: str) -> None:
    out = run(fake_lib, {"forward_s": 0.01}, FAKE_NVML_SCENARIO=scenario)
    lines = _unavailable_lines(out)
    assert len(lines) == 1 and expected in lines[0]
    assert out["forward"] is not None and _gpu_attrs(out) == {}
    assert "hw.gpu.utilization" not in out["points"]


def test_slow_init_does_not_block_configure_or_requests(run, fake_lib: Path) -> None:
    out = run(fake_lib, {"wait_ready": False, "forward_s": 0.0}, FAKE_NVML_INIT_DELAY_MS="1500")
    assert out["configure_s"] < 0.5
    assert out["request_s"] < 0.5
    # force_flush waited for init, then sampled: data arrives without any sleep in the test
    assert out["stats"]["status"] == "running" and out["stats"]["init_s"] >= 1.4
    assert out["points"][semconv.HW_GPU_MEMORY_USAGE]


def test_init_that_hangs_past_the_timeout_is_given_up(run, fake_lib: Path) -> None:
    out = run(fake_lib, {"init_timeout_s": 0.3}, FAKE_NVML_INIT_DELAY_MS="3000")
    assert out["open_ok"] is False and out["open_s"] < 1.5
    assert "did not return within" in out["stats"]["reason"]
    assert len(_unavailable_lines(out)) == 1


# --- readings -----------------------------------------------------------------------------------

def test_busy_idle_square_wave_mean_is_half_and_no_sample_lost(run, fake_lib: Path) -> None:
    # "1 s busy / 1 s idle" scaled 10x down: 100 ms busy / 100 ms idle, ring sample every 20 ms,
    # sampler every 0.2 s. Sampling the gauge at 0.2 s would alias to always-busy or always-idle.
    out = run(fake_lib, {"forward_s": 1.0, "configure": {"gpu_interval_s": 0.2}},
              FAKE_NVML_PERIOD_MS="100", FAKE_NVML_SAMPLE_US="20000")
    forward = out["forward"]
    points = sorted(out["points"][semconv.HW_GPU_UTILIZATION], key=lambda p: p["t"])
    inside = [p["v"] for p in points if forward["start_ns"] <= p["t"] <= forward["end_ns"]]
    assert len(inside) >= 45
    assert statistics.fmean(inside) == pytest.approx(0.5, abs=0.06)
    assert set(inside) == {0.0, 1.0}
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(points)]
    assert all(abs(g - 20_000_000) < 1_000_000 for g in gaps), "a ring sample was lost or merged"
    attrs = _gpu_attrs(out)
    assert attrs[semconv.GPU_UTILIZATION_MEAN] == pytest.approx(0.5, abs=0.06)
    assert attrs[semconv.GPU_UTILIZATION_MAX] == 1.0
    # every sample inside the forward, but the last one when the stage-end catch-up read was
    # skipped because the sampler thread held the device at that moment (gpu/attribution.py)
    assert len(inside) - 1 <= attrs[semconv.GPU_SAMPLE_COUNT] <= len(inside)
    assert out["stats"]["devices"][0]["sample_period_ms"] == pytest.approx(20.0)


def test_points_carry_units_and_hw_attributes(run, fake_lib: Path) -> None:
    out = run(fake_lib, {"forward_s": 0.0})
    p = out["points"]
    assert p[semconv.HW_POWER][0]["v"] == 250.0  # 250000 mW
    assert p[semconv.HW_TEMPERATURE][0]["v"] == 45.0
    assert p[semconv.HW_GPU_MEMORY_USAGE][0]["v"] == 30 * 1024**3  # v2 "used", reserved apart
    assert p[semconv.HW_GPU_MEMORY_LIMIT][0]["v"] == 80 * 1024**3
    assert p[semconv.HW_GPU_UTILIZATION][0]["v"] == pytest.approx(0.40)
    assert p[semconv.HW_POWER][0]["attrs"] == {
        semconv.HW_ID: "GPU-fa4e0000-0000-0000-0000-000000000000", semconv.HW_TYPE: "gpu",
        semconv.HW_VENDOR: "NVIDIA", semconv.HW_MODEL: "NVIDIA Fake H100"}
    assert "nvidia.gpu.sm.activity" not in p  # no GPM in the fake: no point, not 0


def test_mig_utilization_not_supported_emits_no_point(run, fake_lib: Path) -> None:
    out = run(fake_lib, {"forward_s": 0.05}, FAKE_NVML_SCENARIO="mig")
    assert semconv.HW_GPU_UTILIZATION not in out["points"]
    memory_ids = {p["attrs"][semconv.HW_ID] for p in out["points"][semconv.HW_GPU_MEMORY_USAGE]}
    mig = "MIG-fa4e0000-0000-0000-0000-000000001000"
    assert memory_ids == {"GPU-fa4e0000-0000-0000-0000-000000000000", mig}
    assert {p["attrs"][semconv.HW_ID] for p in out["points"][semconv.HW_POWER]} == {
        "GPU-fa4e0000-0000-0000-0000-000000000000"}
    # the MIG instance is the model's device; no utilization -> count 0, no mean, never 0.0
    attrs = _gpu_attrs(out)
    assert attrs[semconv.GPU_SAMPLE_COUNT] == 0 and semconv.GPU_UTILIZATION_MEAN not in attrs
    assert any("reports no utilization" in r["message"] for r in out["logs"])


def test_memory_v2_missing_falls_back_to_v1_with_a_note(run, fake_lib_no_memory_v2: Path) -> None:
    out = run(fake_lib_no_memory_v2, {"forward_s": 0.0})
    used = out["points"][semconv.HW_GPU_MEMORY_USAGE][0]["v"]
    assert used == 30 * 1024**3 + 512 * 1024**2  # v1 counts reserved memory as used
    notes = [r for r in out["logs"] if "nvmlDeviceGetMemoryInfo_v2 unavailable" in r["message"]]
    assert len(notes) == 1


def test_empty_ring_on_idle_gpu_gives_zero_utilization_points(run, fake_lib: Path) -> None:
    out = run(fake_lib, {"forward_s": 0.0}, FAKE_NVML_SCENARIO="empty_ring")
    values = [p["v"] for p in out["points"][semconv.HW_GPU_UTILIZATION]]
    assert values and set(values) == {0.0}
    assert out["stats"]["devices"][0]["utilization"] == "ring"
    assert not [r for r in out["logs"] if r["level"] in ("WARNING", "ERROR")]


def test_boot_time_sample_timestamps_land_on_the_span_clock(run, fake_lib: Path) -> None:
    out = run(fake_lib, {"forward_s": 0.3, "configure": {"gpu_interval_s": 0.2}},
              FAKE_NVML_SCENARIO="boot_clock", FAKE_NVML_SAMPLE_US="50000")
    assert out["stats"]["devices"][0]["clock_domain"] in ("boottime", "monotonic")
    first, last = out["window_ns"]
    times = [p["t"] for p in out["points"][semconv.HW_GPU_UTILIZATION]]
    assert len(times) >= 5
    assert all(first - 100_000_000 <= t <= last for t in times)  # -0.1 s: the newest backlog entry
    assert _gpu_attrs(out)[semconv.GPU_SAMPLE_COUNT] >= 4


def test_undecodable_device_name_is_replaced_not_fatal(run, fake_lib: Path) -> None:
    out = run(fake_lib, {"forward_s": 0.0}, FAKE_NVML_SCENARIO="bad_name")
    model = out["points"][semconv.HW_POWER][0]["attrs"][semconv.HW_MODEL]
    assert model == "NVIDIA Fake \ufffd\ufffd GPU"


def test_sampler_is_joined_before_nvml_shutdown(run, fake_lib: Path, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    run(fake_lib, {"forward_s": 0.3, "configure": {"gpu_interval_s": 0.05}}, FAKE_NVML_CALL_LOG=str(log))
    calls = [line.split()[0] for line in log.read_text().splitlines()]
    assert calls[0] == "nvmlInit" and calls[-1] == "nvmlShutdown"
    assert calls.count("nvmlShutdown") == 1 and calls.count("nvmlDeviceGetSamples") >= 3


def test_forked_child_reinitialises_and_samples(run, fake_lib: Path, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    out = run(fake_lib, {"fork": True, "forward_s": 0.4, "configure": {"gpu_interval_s": 0.1}},
              FAKE_NVML_CALL_LOG=str(log), FAKE_NVML_SAMPLE_US="50000")
    assert out["stats"]["status"] == "running", out["stats"]
    assert _gpu_attrs(out)[semconv.GPU_SAMPLE_COUNT] >= 4
    init_threads = {line.split()[1] for line in log.read_text().splitlines() if line.startswith("nvmlInit")}
    assert len(init_threads) == 2  # parent and child each ran nvmlInit
    # the child's GPU points carry the child's identity: the instance id its spans carry
    child_id = out["forward"]["instance"]
    assert child_id and child_id != out["parent_instance"]
    gpu_ids = {p["instance"] for p in out["points"][semconv.HW_GPU_UTILIZATION]}
    assert gpu_ids == {child_id}


# --- isolation: one GPU's failing or hung reading, through the real bindings -------------------

def _metrics_by_gpu(out: dict) -> dict[str, set[str]]:
    by_gpu: dict[str, set[str]] = {}
    for name, points in out["points"].items():
        for p in points:
            by_gpu.setdefault(p["attrs"][semconv.HW_ID], set()).add(name)
    return by_gpu


GPU_0, GPU_1 = "GPU-fa4e0000-0000-0000-0000-000000000000", "GPU-fa4e0000-0000-0000-0000-000000000001"
ALL_READINGS = {semconv.HW_GPU_UTILIZATION, semconv.HW_GPU_MEMORY_USAGE, semconv.HW_GPU_MEMORY_LIMIT,
                semconv.HW_POWER, semconv.HW_TEMPERATURE}


def test_one_gpus_failing_power_reading_stops_nothing_else(run, fake_lib: Path) -> None:
    out = run(fake_lib, {"forward_s": 0.4, "configure": {"gpu_interval_s": 0.1}},
              FAKE_NVML_GPUS="2", FAKE_NVML_POWER_FAIL_GPU="1")
    assert _metrics_by_gpu(out) == {GPU_0: ALL_READINGS, GPU_1: ALL_READINGS - {semconv.HW_POWER}}
    failed = [r["message"] for r in out["logs"] if "failed, will retry" in r["message"]]
    assert len(failed) == 1 and GPU_1 in failed[0] and "Unknown Error" in failed[0]


def test_one_gpus_hung_power_reading_is_abandoned_and_the_rest_go_on(run, fake_lib: Path, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    started = time.monotonic()
    out = run(fake_lib, {"forward_s": 1.0, "configure": {"gpu_interval_s": 0.1, "gpu_read_timeout_s": 0.3}},
              FAKE_NVML_GPUS="2", FAKE_NVML_POWER_HANG_GPU="1", FAKE_NVML_HANG_MS="30000",
              FAKE_NVML_CALL_LOG=str(log))
    assert time.monotonic() - started < 20  # the 30 s call was not waited for, not even at exit
    assert _metrics_by_gpu(out) == {GPU_0: ALL_READINGS, GPU_1: ALL_READINGS - {semconv.HW_POWER}}
    hung = [r["message"] for r in out["logs"] if "did not return within" in r["message"]]
    assert len(hung) == 1 and GPU_1 in hung[0] and "hw.power" in hung[0]
    assert [d["hung"] for d in out["stats"]["devices"]] == [[], [semconv.HW_POWER]]
    # GPU 0 kept its cadence: ~10 passes in the 1 s forward at 0.1 s, far more than one per 0.3 s
    assert out["stats"]["devices"][0]["passes"] >= 6
    calls = log.read_text().splitlines()
    assert sum(c.startswith("nvmlDeviceGetPowerUsage-hang") for c in calls) == 1  # not re-entered
    assert not any(c.startswith("nvmlShutdown") for c in calls)  # never under a stuck call


# --- the CLI live view --------------------------------------------------------------------------

def _cli(lib_dir: Path, *args: str, **fake_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVML_", "PYTEST_"))}
    env.update({"LD_LIBRARY_PATH": str(lib_dir), "PYTHONPATH": str(ROOT), **fake_env})
    code = ("import argparse, sys; from otel_stages.commands import gpu; p = argparse.ArgumentParser();"
            " gpu.add_arguments(p); sys.exit(gpu.run(p.parse_args(sys.argv[1:])))")
    return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_cli_once_json_shows_each_device(fake_lib: Path) -> None:
    done = _cli(fake_lib, "--once", "--json", FAKE_NVML_GPUS="2")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    rows = json.loads(line)["devices"]
    assert [r["uuid"][-1] for r in rows] == ["0", "1"]
    assert rows[0]["utilization"] == pytest.approx(0.4) and rows[0]["power_w"] == 250.0
    assert rows[0]["sample_period_ms"] == pytest.approx(166.667, abs=0.01)
    assert rows[0]["clock_domain"] == "unix"


def test_cli_count_refreshes_in_text(fake_lib: Path) -> None:
    done = _cli(fake_lib, "--count", "2", "--interval-s", "0.05")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("NVIDIA Fake H100") == 2 and "utilization" in done.stdout


@pytest.mark.skipif(_system_has_nvml(), reason="this machine has a real libnvidia-ml.so.1")
def test_cli_without_nvml_exits_1_with_the_reason(tmp_path: Path) -> None:
    done = _cli(tmp_path, "--once")
    assert done.returncode == 1
    assert "NVML unavailable: libnvidia-ml.so.1 not found" in done.stderr and done.stdout == ""


# --- memory pressure: the stand-in's memory_pressure scenario through the report -----------------

@pytest.mark.parametrize(("scenario", "cause"), [("memory_pressure", "gpu_memory_pressure"),
                                                 ("", "gpu_starved")])
def test_memory_pressure_lined_up_with_slow_forwards(run, fake_lib: Path, tmp_path: Path,
                                                     scenario: str, cause: str) -> None:
    """Forwards are slow in the pressure phases of the library's memory clock (memory at 93/99 %
    of its limit, jumping); with the scenario off memory stays flat and utilization low: the
    same slow forwards are then gpu_starved."""
    from otel_stages.analysis import diagnose, load_paths

    run(fake_lib, {"requests": 26, "forward_s": 0.05, "slow_forward_s": 0.2,
                   "pressure_period_ms": 600, "configure": {"gpu_interval_s": 0.05}},
        FAKE_NVML_SCENARIO=scenario, FAKE_NVML_MEMORY_PERIOD_MS="600", FAKE_NVML_UTIL="30")
    report = diagnose(load_paths(sorted((tmp_path / "data").glob("*.jsonl"))))
    assert (report.verdict.cause, report.verdict.stage) == (cause, "forward"), report.verdict.evidence
    memory = next(e for e in report.verdict.evidence if e.startswith("GPU memory during"))
    if scenario:
        assert "peak median 99%" in memory or "peak median 93%" in memory
        assert "lines up with the slow forwards" in memory
    else:
        assert "peak median 38% of 80 GiB" in memory  # 30 GiB used, flat
        assert "memory stays clear of its limit and steady" in memory
