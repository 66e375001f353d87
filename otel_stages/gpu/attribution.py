"""Per-forward GPU attribution: a stage-end hook that summarises the samples inside each
``forward`` span's window and sets ``gpu.*`` attributes on it (``semconv.GPU_*``).

The window is ``[start_ns, end_ns]`` on the span clock. A utilization sample at time ``t``
covers the driver's sample period ending at ``t``, so a sample counts when ``t`` lies inside the
window (the same rule the report applies to exported points). Before summarising, the model
GPU's ring is drained once (one NVML call on the request thread, skipped when the sampler holds
the device) so the window is complete up to the driver's latest sample.

Which GPU runs the model: :func:`set_model_device` > the current PyTorch CUDA device (when
PyTorch has initialised CUDA) > ``CUDA_VISIBLE_DEVICES`` naming one UUID > the only GPU (MIG
instances replace their parent). Several GPUs and no hint: no attribution (logged once).
"""

from __future__ import annotations

import logging
import os
import statistics
from typing import Any

from otel_stages import semconv
from otel_stages.gpu import cuda
from otel_stages.gpu.backend import Device
from otel_stages.gpu.sampler import RUNNING, Sampler

logger = logging.getLogger("otel_stages.gpu")

#: The GPU counts as "already busy" when the last sample before the forward is at least this.
BUSY_AT_START_MIN_UTILIZATION = 0.5
#: ... and that sample is at most this old (older says nothing about the start).
BUSY_AT_START_MAX_AGE_NS = 2_000_000_000

_model_device: Any = None


def set_model_device(device: Any) -> None:
    """Tell otel_stages which GPU runs the model: an NVML UUID (``"GPU-..."`` / ``"MIG-..."``, a
    prefix is enough), a CUDA ordinal (``int``, mapped through PyTorch) or a ``torch.device``.
    ``None`` goes back to automatic. NVML does not follow ``CUDA_VISIBLE_DEVICES``, so with
    several GPUs this is how forwards get the right one."""
    global _model_device
    if device is not None and hasattr(device, "type") and hasattr(device, "index"):  # torch.device
        device = (device.index or 0) if device.type == "cuda" else None
    _model_device = device


def match_uuid(text: str, devices: list[Device]) -> Device | None:
    """The device ``text`` names: a full or prefix NVML UUID, or a bare UUID as CUDA/PyTorch
    print it (without the ``GPU-`` / ``MIG-`` prefix)."""
    want = text.strip().lower()
    if not want:
        return None
    for device in devices:
        uuid = device.uuid.lower()
        if uuid == want or (want[:4] in ("gpu-", "mig-") and uuid.startswith(want)) or uuid.endswith(want):
            return device
    return None


class Attribution:
    """The hook: ``attribution(span, name, start_ns, end_ns)`` (see :data:`StageEndHook`).

    ``catch_up=False`` never calls NVML on the request thread (the window then holds what the
    sampler has drained so far, which lags by up to one interval).
    """

    def __init__(self, sampler: Sampler, catch_up: bool = True) -> None:
        self.sampler = sampler
        self.catch_up = catch_up
        self._last: tuple[tuple[str, int, int], dict[str, Any]] | None = None
        self._warned = False

    def __call__(self, span: Any, name: str, start_ns: int, end_ns: int) -> None:
        if name != semconv.STAGE_FORWARD or self.sampler.status != RUNNING:
            return
        uuid = self.model_device()
        if uuid is None:
            return
        key = (uuid, start_ns, end_ns)
        last = self._last
        if last is not None and last[0] == key:  # Batch.stage: one window, one span per request
            attributes = last[1]
        else:
            if self.catch_up:
                self.sampler.refresh_utilization(uuid)
            attributes = self.summarize(uuid, start_ns, end_ns)
            self._last = (key, attributes)
        span.set_attributes(attributes)

    def summarize(self, uuid: str, start_ns: int, end_ns: int) -> dict[str, Any]:
        """``gpu.*`` attributes for one window: mean/max utilization (0..1) and max memory used
        (bytes) of the samples inside, whether the GPU was busy just before, and the sample
        count. Keys without data are left out; the count is always there (0 = no evidence)."""
        store = self.sampler.store
        utilization = store.window(uuid, semconv.HW_GPU_UTILIZATION, start_ns, end_ns)
        out: dict[str, Any] = {semconv.GPU_SAMPLE_COUNT: len(utilization)}
        if utilization:
            values = [p.value for p in utilization]
            out[semconv.GPU_UTILIZATION_MEAN] = round(statistics.fmean(values), 4)
            out[semconv.GPU_UTILIZATION_MAX] = round(max(values), 4)
        before = store.last_at_or_before(uuid, semconv.HW_GPU_UTILIZATION, start_ns)
        if before is not None and start_ns - before.time_ns <= BUSY_AT_START_MAX_AGE_NS:
            out[semconv.GPU_BUSY_AT_START] = before.value >= BUSY_AT_START_MIN_UTILIZATION
        memory = store.window(uuid, semconv.HW_GPU_MEMORY_USAGE, start_ns, end_ns)
        if memory:
            out[semconv.GPU_MEMORY_USAGE_MAX] = int(max(p.value for p in memory))
        return out

    def model_device(self) -> str | None:
        """UUID of the GPU the model runs on (see the module docstring), or ``None``."""
        devices = self.sampler.devices
        hint = _model_device
        if isinstance(hint, int):
            hint = cuda.torch_device_uuid(hint)
        elif hint is None:
            hint = cuda.torch_current_uuid()
        if hint is None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
            if len(visible) == 1 and visible[0].strip()[:4].lower() in ("gpu-", "mig-"):
                hint = visible[0]
        if hint is not None:
            found = match_uuid(str(hint), devices)
            if found is not None:
                return found.uuid
        parents = {d.parent_uuid for d in devices if d.is_mig}
        leaves = [d for d in devices if d.uuid not in parents]
        if len(leaves) == 1:
            return leaves[0].uuid
        if not self._warned:
            self._warned = True
            logger.info("%d GPUs and no hint which one runs the model: forward spans get no gpu.* "
                        "attributes (call otel_stages.gpu.set_model_device(...))", len(leaves))
        return None
