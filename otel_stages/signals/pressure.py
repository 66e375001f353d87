"""CPU pressure stall information (Linux PSI): how long tasks waited for a core.

Kernel ``Documentation/accounting/psi.rst``: ``/proc/pressure/cpu`` (host-wide, kernel 4.20+,
``CONFIG_PSI``) and, in cgroup v2, ``cpu.pressure`` in every cgroup folder (the cgroup's own
tasks) hold::

    some avg10=0.00 avg60=0.00 avg300=0.00 total=0
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

``some`` is the share of time in which at least one task was runnable but waiting for a core
(``full`` for CPU: all non-idle tasks, zero at the host level); ``total=`` is that time in µs,
cumulative. Only ``some total`` is read: it is exact where the averages are smoothed.

Which file (:func:`find`): the process's own cgroup v2 folder's ``cpu.pressure`` when it can be
read (in a container that is the container's cgroup: the tasks that compete for its cores),
else ``/proc/pressure/cpu``. Neither (no PSI: kernel older than 4.20, booted with ``psi=0``,
pressure switched off in the cgroup, not Linux) -> ``None``, said once at debug level; the
sampler then records no pressure and nothing else changes. ``root`` (default ``/``) lets tests
read a fake tree. :func:`scope_of` says which of the two a path is (the points carry it as
``otel_stages.pressure.scope``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from otel_stages import semconv
from otel_stages.signals import cgroup

logger = logging.getLogger("otel_stages.signals")

#: ``/proc/pressure/cpu`` relative to the root: the host's CPU pressure.
PROC_PRESSURE_CPU = "proc/pressure/cpu"
#: The file in a cgroup v2 folder.
CGROUP_PRESSURE_FILE = "cpu.pressure"

_said_absent = False


def parse_some_total_us(text: str) -> int | None:
    """The ``total=`` of the ``some`` line (µs) of a PSI file's ``text``; ``None`` when there is
    no such line or its total is not a non-negative integer."""
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind != "some":
            continue
        for field in rest.split():
            key, sep, value = field.partition("=")
            if key == "total" and sep and value.isdigit():
                return int(value)
        return None
    return None


def read_some_total_us(path: Path) -> int | None:
    """:func:`parse_some_total_us` of the file at ``path`` now; ``None`` when it cannot be read
    (gone, ``EOPNOTSUPP`` with pressure switched off) or has no valid ``some`` line."""
    try:
        text = path.read_text()
    except (OSError, ValueError):
        return None
    return parse_some_total_us(text)


def _own_cgroup_file(root: Path) -> Path | None:
    """The ``cpu.pressure`` of the process's cgroup v2 folder (``0::path`` in
    ``/proc/self/cgroup`` under a ``cgroup2`` mount), when it reads as a PSI file."""
    _, v2_path = cgroup._memberships(root)
    if v2_path is None:
        return None
    for mount_root, mount_point, fstype, _ in cgroup._mounts(root):
        if fstype != "cgroup2":
            continue
        path = cgroup._folder(root, mount_root, mount_point, v2_path) / CGROUP_PRESSURE_FILE
        if read_some_total_us(path) is not None:
            return path
    return None


def scope_of(path: Path, root: Path = Path("/")) -> str:
    """``semconv.PRESSURE_SCOPE_CGROUP`` for a ``cpu.pressure`` in a non-root cgroup (its folder
    has ``cgroup.type``, which kernel ``Documentation/admin-guide/cgroup-v2.rst`` says exists
    only on non-root cgroups: inside a cgroup namespace ``/`` may well be the container's own),
    else ``semconv.PRESSURE_SCOPE_HOST``: ``/proc/pressure/cpu`` under ``root`` and the root
    cgroup's file count every task of the host, so they only bound one thread's wait from
    above."""
    if path != root / PROC_PRESSURE_CPU and (path.parent / "cgroup.type").exists():
        return semconv.PRESSURE_SCOPE_CGROUP
    return semconv.PRESSURE_SCOPE_HOST


def find(root: Path = Path("/")) -> Path | None:
    """The CPU pressure file to sample (module docstring), or ``None`` without one (said once
    per process at debug level)."""
    global _said_absent
    own = _own_cgroup_file(root)
    if own is not None:
        return own
    host = root / PROC_PRESSURE_CPU
    if read_some_total_us(host) is not None:
        return host
    if not _said_absent:
        _said_absent = True
        logger.debug("no CPU pressure stall information (PSI) to read under %s: not recorded"
                     " (kernel older than 4.20, psi=0, or not Linux)", root)
    return None
