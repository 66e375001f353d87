"""The cgroup's CPU quota and throttled time (Linux), read from the cgroup filesystem, and the
sampler thread that also reads the CPU pressure (:mod:`otel_stages.signals.pressure`).

Where the numbers come from (kernel documentation):

* cgroup v2, ``Documentation/admin-guide/cgroup-v2.rst``: ``cpu.stat`` holds ``nr_periods``,
  ``nr_throttled`` and ``throttled_usec`` (besides ``usage_usec`` ...) when the cpu controller is
  enabled; ``cpu.max`` is ``"$MAX $PERIOD"`` with ``$MAX`` = ``max`` for no limit.
* cgroup v1, ``Documentation/scheduler/sched-bwc.rst``: ``cpu.cfs_quota_us`` (-1 = no limit),
  ``cpu.cfs_period_us``, and ``cpu.stat`` with ``nr_periods``, ``nr_throttled`` and
  ``throttled_time`` (ns).

Which cgroup: ``/proc/self/cgroup`` (``man 7 cgroups``: ``hierarchy-ID:controller-list:path``,
``0::path`` for v2) gives the process's cgroup path, ``/proc/self/mountinfo`` (``man 5 proc``:
field 4 the mount's root, field 5 the mount point, after ``-`` the file system type and super
options) where that hierarchy is mounted. A v1 ``cpu`` hierarchy wins over v2 (on a hybrid host
the v2 tree has no cpu controller); from the process's cgroup up to the mount point, the nearest
cgroup with a quota is read (a limit set on a parent, e.g. a Kubernetes pod, throttles the
children), else the process's own.

:class:`CgroupSampler` reads it every ``interval_s`` on a daemon thread and keeps the points on the
span clock, only where a value changes (plus the unchanged sample right before a change, so
straight-line interpolation between points is exact, and one point every
:data:`HEARTBEAT_S`). ``root`` (default ``/``) lets tests read a fake tree.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from otel_stages import semconv
from otel_stages._runtime import RUNTIME, guard

logger = logging.getLogger("otel_stages.signals")

#: Seconds between cgroup reads: fine enough to line throttling up with stages of ~100 ms (the
#: default CFS period is 100 ms), one small file read each.
DEFAULT_INTERVAL_S = 0.1
#: An unchanged value is still written this often (seconds), so a reader sees the series is alive.
HEARTBEAT_S = 10.0
#: Pending points kept when nobody exports them (oldest dropped first, counted).
MAX_PENDING = 100_000

_GUARD = guard("cgroup sampler")


@dataclass(frozen=True)
class CpuCgroup:
    """A cgroup folder to read: ``version`` 1 or 2, ``path`` the folder holding ``cpu.stat``."""

    version: int
    path: Path


@dataclass(frozen=True)
class CpuReading:
    """One read of a :class:`CpuCgroup`: enforcement ``periods``, ``throttled_periods`` (periods
    in which the quota ran out), ``throttled_ns`` (time throttled) and ``limit_cpus`` (quota /
    period; ``None`` without a quota). Counters are ``None`` when the file lacks them."""

    periods: int | None
    throttled_periods: int | None
    throttled_ns: int | None
    limit_cpus: float | None


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    if "\\" not in field:
        return field
    return field.encode("latin-1").decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")


def _mounts(root: Path) -> list[tuple[str, str, str, list[str]]]:
    """``(mount root, mount point, fstype, super options)`` of every line of mountinfo."""
    out: list[tuple[str, str, str, list[str]]] = []
    try:
        text = (root / "proc/self/mountinfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or len(fields) < sep + 4:
            continue
        out.append((_unescape(fields[3]), _unescape(fields[4]), fields[sep + 1],
                    fields[sep + 3].split(",")))
    return out


def _memberships(root: Path) -> tuple[str | None, str | None]:
    """The process's v1 ``cpu`` cgroup path and its v2 path (each ``None`` when absent)."""
    v1 = v2 = None
    try:
        text = (root / "proc/self/cgroup").read_text()
    except OSError:
        return None, None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v1, v2


def _folder(root: Path, mount_root: str, mount_point: str, path: str) -> Path:
    """The folder of cgroup ``path`` under a hierarchy mounted at ``mount_point`` whose root is
    ``mount_root`` (a container often sees only its own subtree mounted)."""
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root):]
    elif mount_root != "/":
        path = ""  # a namespaced view: the mount's root is the process's own cgroup
    return root / mount_point.lstrip("/") / path.lstrip("/")


def find(root: Path = Path("/")) -> CpuCgroup | None:
    """The cgroup whose CPU quota applies to this process (module docstring), or ``None`` when
    no cgroup CPU files can be read (not Linux, no cgroup mounted)."""
    v1_path, v2_path = _memberships(root)
    mounts = _mounts(root)
    for version, path, wanted in ((1, v1_path, "cgroup"), (2, v2_path, "cgroup2")):
        if path is None:
            continue
        for mount_root, mount_point, fstype, options in mounts:
            if fstype != wanted or (version == 1 and "cpu" not in options):
                continue
            folder = _folder(root, mount_root, mount_point, path)
            top = root / mount_point.lstrip("/")
            chosen = _nearest_with_quota(version, folder, top)
            if chosen is not None:
                return chosen
            if (folder / "cpu.stat").is_file() and (version == 1 or (folder / "cpu.max").is_file()):
                return CpuCgroup(version, folder)
    return None


def _nearest_with_quota(version: int, folder: Path, top: Path) -> CpuCgroup | None:
    current = folder
    while True:
        cgroup = CpuCgroup(version, current)
        if _limit(cgroup) is not None:
            return cgroup
        if current == top or top not in current.parents:
            return None
        current = current.parent


def _int_fields(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def _limit(cgroup: CpuCgroup) -> float | None:
    try:
        if cgroup.version == 2:
            quota, _, period = (cgroup.path / "cpu.max").read_text().strip().partition(" ")
            if quota == "max" or not quota.isdigit() or not period.strip().isdigit():
                return None
            return int(quota) / int(period) if int(period) > 0 else None
        quota_us = int((cgroup.path / "cpu.cfs_quota_us").read_text().strip())
        period_us = int((cgroup.path / "cpu.cfs_period_us").read_text().strip())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def read(cgroup: CpuCgroup) -> CpuReading | None:
    """Read ``cgroup`` now; ``None`` when its ``cpu.stat`` cannot be read."""
    try:
        stat = _int_fields((cgroup.path / "cpu.stat").read_text())
    except OSError:
        return None
    if cgroup.version == 2:
        usec = stat.get("throttled_usec")
        throttled = None if usec is None else usec * 1000
    else:
        throttled = stat.get("throttled_time")
    return CpuReading(stat.get("nr_periods"), stat.get("nr_throttled"), throttled, _limit(cgroup))


class _Thinned:
    """One series' points where the value changes (see the module docstring)."""

    __slots__ = ("_held", "_last")

    def __init__(self) -> None:
        self._last: tuple[int, float] | None = None
        self._held: tuple[int, float] | None = None

    def add(self, time_ns: int, value: float) -> list[tuple[int, float]]:
        last = self._last
        if last is not None and value == last[1] and time_ns - last[0] < HEARTBEAT_S * 1e9:
            self._held = (time_ns, value)
            return []
        out = [] if self._held is None else [self._held]
        out.append((time_ns, value))
        self._last, self._held = (time_ns, value), None
        return out

    def flush(self) -> list[tuple[int, float]]:
        """The sample held back, if any (at a flush: the series then reaches up to now)."""
        held, self._held = self._held, None
        if held is not None:
            self._last = held
        return [] if held is None else [held]


#: ``(metric name, time_ns, value)``
Point = tuple[str, int, float]


class CgroupSampler:
    """Reads ``cgroup`` (``None``: no cgroup CPU files) and the CPU pressure file ``pressure``
    (:mod:`otel_stages.signals.pressure`; ``None``: no PSI) every ``interval_s`` on a daemon
    thread; :meth:`drain` hands out the points (metric names ``semconv.CONTAINER_CPU_*`` and
    ``semconv.SYSTEM_CPU_PRESSURE_TOTAL`` in seconds, span-clock times) not yet taken.
    ``reader`` / ``pressure_reader`` are how a sample is taken (tests inject them). Thread-safe."""

    def __init__(self, cgroup: CpuCgroup | None, interval_s: float = DEFAULT_INTERVAL_S,
                 reader: Callable[[CpuCgroup], CpuReading | None] = read,
                 pressure: Path | None = None,
                 pressure_reader: Callable[[Path], int | None] | None = None) -> None:
        self.cgroup = cgroup
        self.pressure = pressure
        self.interval_s = interval_s
        self._reader = reader
        if pressure_reader is None:
            from otel_stages.signals.pressure import read_some_total_us  # it imports this module

            pressure_reader = read_some_total_us
        self._read_pressure = pressure_reader
        self._series: dict[str, _Thinned] = {}
        self._pending: list[Point] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.start_ns = RUNTIME.clock.now_ns()
        self.dropped = 0  #: points lost because nobody drained them (oldest first)

    def start(self) -> CgroupSampler:
        """Start the sampling thread (again, after ``fork()``); returns ``self``."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-stages-cgroup", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop and join the thread (idempotent)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        stop = self._stop
        while True:
            self.sample()
            if stop.wait(self.interval_s):
                return

    def sample(self, flush: bool = False) -> None:
        """Take one reading now and keep its points (``flush``: also the unchanged samples held
        back, so that the exported series reaches up to now)."""
        with _GUARD:
            values: dict[str, float | int | None] = {}
            if self.cgroup is not None:
                reading = self._reader(self.cgroup)
                if reading is not None:
                    values[semconv.CONTAINER_CPU_THROTTLED_TIME] = reading.throttled_ns
                    values[semconv.CONTAINER_CPU_PERIODS] = reading.periods
                    values[semconv.CONTAINER_CPU_THROTTLED_PERIODS] = reading.throttled_periods
                    values[semconv.CONTAINER_CPU_LIMIT] = reading.limit_cpus
            if self.pressure is not None:
                total_us = self._read_pressure(self.pressure)
                if total_us is not None:  # seconds, the proposed convention's unit
                    values[semconv.SYSTEM_CPU_PRESSURE_TOTAL] = total_us / 1e6
            if not values:
                return
            now = RUNTIME.clock.now_ns()
            with self._lock:
                for name, value in values.items():
                    if value is None:
                        continue
                    series = self._series.setdefault(name, _Thinned())
                    self._pending.extend((name, t, v) for t, v in series.add(now, float(value)))
                    if flush:
                        self._pending.extend((name, t, v) for t, v in series.flush())
                overflow = len(self._pending) - MAX_PENDING
                if overflow > 0:
                    del self._pending[:overflow]
                    self.dropped += overflow

    def drain(self) -> list[Point]:
        """Every point not yet taken, in time order per metric."""
        with self._lock:
            out, self._pending = self._pending, []
        return out
