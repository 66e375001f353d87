"""cgroup CPU quota and throttled time from fake cgroup file trees laid out as the kernel writes
them (cgroup v2 ``cpu.stat`` / ``cpu.max``, v1 ``cpu.stat`` / ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``, ``/proc/self/cgroup``, ``/proc/self/mountinfo``), the sampler's points,
their export as metrics on the span clock, and the report calling ``cpu_throttled``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import otel_stages as ots
from otel_stages import semconv
from otel_stages.analysis import diagnose, load_paths
from otel_stages.clock import Clock
from otel_stages.signals import cgroup, session

# /proc/self/mountinfo lines as a container runtime leaves them (man 5 proc).
MOUNT_V2 = "35 28 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n"
MOUNT_V1_CPU = ("32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup "
                "rw,cpu,cpuacct\n")
MOUNT_TMPFS = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
V2_STAT = ("usage_usec 8049312\nuser_usec 6105377\nsystem_usec 1943935\nnr_periods 1204\n"
           "nr_throttled 311\nthrottled_usec 45230811\nnr_bursts 0\nburst_usec 0\n")
V1_STAT = "nr_periods 880\nnr_throttled 97\nthrottled_time 12503918412\n"


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def v2_tree(root: Path, *, quota: str = "150000 100000", where: str = "ctr") -> Path:
    """A pod cgroup with a container cgroup in it; the quota on ``where`` (``ctr`` or ``pod``)."""
    base = "/sys/fs/cgroup/kubepods.slice/pod1"
    files = {
        "/proc/self/cgroup": "0::/kubepods.slice/pod1/ctr\n",
        "/proc/self/mountinfo": MOUNT_V2,
        f"{base}/cpu.max": quota if where == "pod" else "max 100000\n",
        f"{base}/cpu.stat": V2_STAT,
        f"{base}/ctr/cpu.max": quota if where == "ctr" else "max 100000\n",
        f"{base}/ctr/cpu.stat": V2_STAT,
    }
    return _write(root, files)


def test_v2_container_with_a_quota(tmp_path):
    found = cgroup.find(v2_tree(tmp_path))
    assert found == cgroup.CpuCgroup(2, tmp_path / "sys/fs/cgroup/kubepods.slice/pod1/ctr")
    reading = cgroup.read(found)
    assert reading == cgroup.CpuReading(periods=1204, throttled_periods=311,
                                        throttled_ns=45_230_811_000, limit_cpus=1.5)


def test_v2_quota_on_the_parent_is_the_one_read(tmp_path):
    found = cgroup.find(v2_tree(tmp_path, where="pod"))
    assert found is not None and found.path.name == "pod1"
    assert cgroup.read(found).limit_cpus == 1.5


def test_v2_without_any_quota_reads_its_own_cgroup(tmp_path):
    found = cgroup.find(v2_tree(tmp_path, quota="max 100000\n"))
    assert found is not None and found.path.name == "ctr"
    assert cgroup.read(found).limit_cpus is None


def test_v1_cpu_hierarchy_wins_on_a_hybrid_host(tmp_path):
    _write(tmp_path, {
        "/proc/self/cgroup": "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
        "/proc/self/mountinfo": MOUNT_TMPFS + MOUNT_V1_CPU + MOUNT_V2.replace("/sys/fs/cgroup ",
                                                                              "/sys/fs/cgroup/unified "),
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.stat": V1_STAT,
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "/sys/fs/cgroup/unified/cpu.stat": V2_STAT,
    })
    found = cgroup.find(tmp_path)
    assert found == cgroup.CpuCgroup(1, tmp_path / "sys/fs/cgroup/cpu,cpuacct/docker/abc")
    assert cgroup.read(found) == cgroup.CpuReading(880, 97, 12_503_918_412, 0.5)


def test_v1_namespaced_mount_root_and_no_quota(tmp_path):
    # Inside the container the hierarchy's root is the container's own cgroup.
    _write(tmp_path, {
        "/proc/self/cgroup": "3:cpu,cpuacct:/docker/abc\n",
        "/proc/self/mountinfo": MOUNT_V1_CPU.replace(" / /sys", " /docker/abc /sys"),
        "/sys/fs/cgroup/cpu,cpuacct/cpu.stat": V1_STAT,
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    found = cgroup.find(tmp_path)
    assert found == cgroup.CpuCgroup(1, tmp_path / "sys/fs/cgroup/cpu,cpuacct")
    assert cgroup.read(found).limit_cpus is None


def test_no_cgroup_files(tmp_path):
    assert cgroup.find(tmp_path) is None
    _write(tmp_path, {"/proc/self/cgroup": "0::/\n", "/proc/self/mountinfo": MOUNT_V2})
    assert cgroup.find(tmp_path) is None  # mounted, but no cpu.stat to read
    assert cgroup.read(cgroup.CpuCgroup(2, tmp_path / "missing")) is None


def test_mount_points_with_escaped_spaces(tmp_path):
    _write(tmp_path, {
        "/proc/self/cgroup": "0::/a\n",
        "/proc/self/mountinfo": MOUNT_V2.replace("/sys/fs/cgroup ", "/sys/fs/my\\040cgroup "),
        "/sys/fs/my cgroup/a/cpu.stat": V2_STAT, "/sys/fs/my cgroup/a/cpu.max": "200000 100000",
    })
    found = cgroup.find(tmp_path)
    assert found is not None and cgroup.read(found).limit_cpus == 2.0


# --- sampler --------------------------------------------------------------------------------------


def _clock(now_ns: Callable[[], int]) -> Clock:
    """A span clock reading ``now_ns()`` (offset 0; Clock has slots, so it is replaced whole)."""
    clock = Clock(monotonic_ns=lambda: 0, wall_ns=lambda: 0)
    clock.monotonic_ns = now_ns
    return clock


def test_sampler_keeps_points_only_where_values_change(gc_off, monkeypatch):
    readings = iter([cgroup.CpuReading(10, 0, 0, 1.0)] * 3 + [cgroup.CpuReading(13, 1, 5_000_000, 1.0)])
    clock = iter(range(1_000, 10_000, 1_000))
    monkeypatch.setattr(cgroup.RUNTIME, "clock", _clock(lambda: next(clock)))
    sampler = cgroup.CgroupSampler(cgroup.CpuCgroup(2, Path("/x")), reader=lambda _c: next(readings))
    for _ in range(4):
        sampler.sample()
    throttled = [(t, v) for name, t, v in sampler.drain() if name == semconv.CONTAINER_CPU_THROTTLED_TIME]
    # first point, the unchanged one right before the change (so interpolation stays exact), the change
    assert throttled == [(2_000, 0.0), (4_000, 0.0), (5_000, 5_000_000.0)]
    assert sampler.drain() == []


def test_sampler_heartbeat_and_flush(gc_off, monkeypatch):
    beat = int(cgroup.HEARTBEAT_S * 1e9)
    sampler = cgroup.CgroupSampler(cgroup.CpuCgroup(2, Path("/x")),
                                   reader=lambda _c: cgroup.CpuReading(None, None, 7, None))
    times = iter([0, beat // 2, beat - 1, beat + 5, beat + 6])
    monkeypatch.setattr(cgroup.RUNTIME, "clock", _clock(lambda: next(times)))
    sampler.sample()
    sampler.sample()  # unchanged, within the heartbeat: held back
    sampler.sample()  # held back, replacing the previous one
    assert [t for _, t, _ in sampler.drain()] == [0]
    sampler.sample()  # unchanged, but past the heartbeat: written (after the held one)
    assert [t for _, t, _ in sampler.drain()] == [beat - 1, beat + 5]
    sampler.sample(flush=True)  # a flush writes the held-back sample: the series reaches now
    assert [t for _, t, _ in sampler.drain()] == [beat + 6]


# --- end to end: configure() on a fake tree, throttled slow stages, the report ----------------------


class FakeKernel:
    """Bumps throttled_usec in a fake v2 cpu.stat, as the kernel does while a quota is used up."""

    def __init__(self, stat: Path) -> None:
        self.stat = stat
        self.throttled_usec = 0
        self.lock = threading.Lock()

    def throttle(self, usec: int) -> None:
        with self.lock:
            self.throttled_usec += usec
            self.stat.write_text(V2_STAT.replace("throttled_usec 45230811", f"throttled_usec {self.throttled_usec}"))


def _metrics(folder: Path) -> list[dict]:
    out = []
    for path in folder.glob("metrics-*.jsonl"):
        for line in path.read_text().splitlines():
            for rm in json.loads(line)["resourceMetrics"]:
                for sm in rm["scopeMetrics"]:
                    out.extend(sm["metrics"])
    return out


def test_throttled_slow_stages_give_cpu_throttled(tmp_path, monkeypatch):
    tree = v2_tree(tmp_path / "root")
    kernel = FakeKernel(tree / "sys/fs/cgroup/kubepods.slice/pod1/ctr/cpu.stat")
    kernel.throttle(0)
    monkeypatch.setattr(session, "CGROUP_ROOT", tree)
    data = tmp_path / "data"
    telemetry = ots.configure(data_dir=data, gpu="off", set_global=False, service_name="throttled")
    try:
        reader = session._current
        assert reader is not None and reader.sampler.cgroup.version == 2
        for i in range(25):
            slow = i % 3 == 1
            with ots.request():
                with ots.stage("decode"):
                    reader.sampler.sample()
                    time.sleep(0.005)
                    if slow:  # the quota ran out: the whole container stood still 40 ms
                        kernel.throttle(40_000)
                        time.sleep(0.04)
                    reader.sampler.sample()
                with ots.stage("forward"):
                    time.sleep(0.005)
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    metrics = {m["name"]: m for m in _metrics(data)}
    throttled = metrics[semconv.CONTAINER_CPU_THROTTLED_TIME]
    assert throttled["unit"] == "ns" and throttled["sum"]["isMonotonic"] is True
    assert throttled["sum"]["aggregationTemporality"] == 2  # cumulative
    assert metrics[semconv.CONTAINER_CPU_LIMIT]["gauge"]["dataPoints"][0]["asDouble"] == 1.5
    values = [int(p["asInt"]) for p in throttled["sum"]["dataPoints"]]
    assert values == sorted(values) and values[-1] == 8 * 40_000_000

    report = diagnose(load_paths(sorted(data.glob("*.jsonl"))))
    verdict = report.verdict
    assert (verdict.cause, verdict.stage) == ("cpu_throttled", "decode"), verdict.evidence
    assert any("quota 1.5 CPUs" in line for line in verdict.evidence)
    assert any("CPU limit" in line for line in verdict.advice)
    signals = report.signals["decode"]
    assert signals.throttled is not None and signals.throttled.slow_median_ms == pytest.approx(40, abs=3)
    assert signals.throttled.fast_median_ms == pytest.approx(0, abs=1)
