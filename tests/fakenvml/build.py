"""Compile ``libnvidia-ml.c`` (next to this file) into a folder usable as ``LD_LIBRARY_PATH``.

Used by the GPU tests' fixture and by ``benchmarks/gpu_sampler_overhead.py``. Needs ``gcc``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("libnvidia-ml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"  # the name pynvml dlopen()s


def build(out_dir: Path, *, no_memory_v2: bool = False) -> Path:
    """Build the fake library into ``out_dir`` (created); return ``out_dir``.

    ``no_memory_v2``: leave ``nvmlDeviceGetMemoryInfo_v2`` out, as in drivers older than R510.
    Raises ``FileNotFoundError`` without gcc, ``subprocess.CalledProcessError`` on a compile error.
    """
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise FileNotFoundError("gcc not found: the fake NVML library cannot be built")
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o",
               str(out_dir / LIBRARY_NAME), str(SOURCE), "-lpthread"]
    if no_memory_v2:
        command.insert(1, "-DFAKE_NO_MEMORY_V2")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, command, done.stdout, done.stderr)
    return out_dir
