"""Which GPU points a request's forwards are lined up with: those of the request's own process,
and those of processes that ran no request (a DCGM exporter, a GPU worker). Pure.

GPU series are keyed by process (:func:`~otel_stages.analysis.requests.process_key`:
service and ``service.instance.id``, else service and ``host.name``), then ``hw.id``, never by
``hw.id`` alone: ``hw.id`` is "an identifier for the hardware component, unique within the
monitored host" (OpenTelemetry hardware semantic conventions, ``hw.gpu.*``:
https://opentelemetry.io/docs/specs/semconv/hardware/gpu/). Producers differ: otel-stages' own
NVML sampler writes the NVML UUID (``GPU-…`` / ``MIG-…``, unique everywhere;
:func:`otel_stages.gpu.metrics.device_attributes`), OpenLIT's GPU collector writes the UUID when
NVML gives one and else DCGM's device id (``opentelemetry-gpu-collector``, its DCGM export:
``hwID := s.DeviceID`` unless ``info.UUID`` is known), and others write an index such as ``"0"``.
So two hosts can each have a ``GPU-0`` / ``0``: merging them would line host A's forwards up
with host B's GPU. The ClickHouse SQL keys its GPU tables the same way
(:func:`otel_stages.analysis.clickhouse_queries.gpu_owners_statements`).

A forward span recorded by a process that ran no request (a model server recording ``queue`` and
``forward`` under a gateway's request span) belongs to that process, which then owns its GPU
points like a request process, whenever some GPU point comes from a process without requests
(:func:`forward_owners`); else to its request's process. Other points of a process that ran no
request go to every request process (the file report and the SQL alike), but where the
sender's ``host.name`` is that of some request processes, to those only
(one DCGM exporter per node: node b's GPU "0" is not node a's), and where the request processes
name hosts and none is the sender's, only to those that name none. On the request process's own
host, or with an NVML UUID for ``hw.id`` (:data:`NVML_UUID`, unique everywhere), they join its
series of that ``hw.id`` (the node's exporter and the model's own sampler naming the same GPU);
an id such as ``0`` sent from elsewhere or from an unknown host (no ``host.name`` on one side) is
a series of its own per sender (:func:`series_hw`: the ``hw.id`` and the sender), so two
exporters' GPU ``0`` are two GPUs, of which the rules pick the one whose utilization rises during
the forwards, never a mix of both.

Utilization units: a point declared ``%`` is scaled when read
(:data:`otel_stages.analysis.otlp_json.PERCENT_UNIT`) and never guessed. The others are guessed
per sending process and unit, over all those points of every ``hw.id`` (:func:`sender_divisors`):
a producer writes one unit for one metric, so a DCGM exporter whose GPU 1 reads 93 writes percent,
and its GPU 0's 0 and 1 are 0 % and 1 %; and a unit fixed partway through a recording (undeclared,
then ``%`` or ``1``) leaves the points of each unit to their own reading. A sender's points of one
unit with a value above :data:`PERCENT_GUESS` are percent, divided by 100 (a ratio never exceeds 1,
even one declared ``1``). A sender's undeclared points (OTLP ``unit`` empty:
:data:`UNDECLARED_UNIT`) that are all whole numbers not above :data:`PERCENT_GUESS`, at least one
of them 1 (0 and 1), are *ambiguous* (:func:`is_ambiguous`): a ratio of an idle or saturated GPU,
or integer percent of a near-idle one (NVIDIA dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL``, 0..100 with
no unit through the Collector's prometheus receiver, renamed ``hw.gpu.utilization``). Read as a
ratio an idle GPU would be called busy, so they are left out of the utilization evidence and the
charts, and the report says so (:func:`ambiguous_unit_lines`). Only zeros are not ambiguous (an
idle GPU under either reading: read as 0). A declared ``1`` is never ambiguous (otel-stages' own
sampler declares it and reads exactly 0.0 / 1.0 on an idle / saturated GPU); a source without units
(``MetricPoint.unit`` ``None``: PromQL) keeps the percent guess and is never ambiguous either.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from otel_stages import semconv
from otel_stages.analysis.model import AttributeValue, MetricPoint
from otel_stages.analysis.otlp_json import PERCENT_UNIT
from otel_stages.analysis.requests import Request, process_key, process_keys

#: A sender's utilization points of one unit (not ``%``: :func:`is_guessed`) with a value above
#: this are percent (0..100) without dividing by 100 or declaring ``%`` (a ratio never
#: exceeds 1; a point declared ``%`` is scaled when read,
#: :data:`otel_stages.analysis.otlp_json.PERCENT_UNIT`). One value for the verdict
#: (:mod:`otel_stages.analysis.gpu`) and the charts (``gpu_series``). An undeclared sender of
#: whole numbers not above it, some 1, is neither: :func:`is_ambiguous`.
PERCENT_GUESS = 1.0
#: ``MetricPoint.unit`` (and the exporter's ``MetricUnit``) of a metric whose producer declared no
#: unit: a sender's utilization may be ambiguous (module docstring, :func:`is_ambiguous`).
UNDECLARED_UNIT = ""
#: What :func:`sender_divisors` keys its answer by: the sending process and the points' unit.
SenderUnit = tuple[str, str | None]

#: The GPU gauges whose ``hw.id`` is checked for being reported by several request processes.
GPU_METRICS = (semconv.HW_GPU_UTILIZATION, semconv.HW_GPU_MEMORY_USAGE, semconv.HW_GPU_MEMORY_LIMIT)
#: At most this many ``hw.id`` values, and processes per value, are named in the problem line.
MAX_NAMED = 5

#: ``(request process, series hw)``: one GPU series as the forwards of that process see it; the
#: second part is the ``hw.id``, with the sender for points from another host (:func:`series_hw`).
SeriesKey = tuple[str, str]
#: An NVML UUID (``nvmlDeviceGetUUID``: ``GPU-`` and a UUID; a MIG instance ``MIG-`` and a UUID,
#: or ``MIG-GPU-<uuid>/<gi>/<ci>`` on older drivers): the same GPU whoever reports it.
NVML_UUID = (r"^(MIG-)?GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}(/[0-9]+/[0-9]+)?$"
             r"|^MIG-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_NVML_UUID = re.compile(NVML_UUID)
#: Joins a ``hw.id`` and its sender in a series key (a control character no ``hw.id`` holds).
SENDER_SEPARATOR = "\x1e"


def series_hw(hw_id: str, sender: str | None = None) -> str:
    """The second part of a :data:`SeriesKey`: ``hw_id``, or with ``sender`` (a process key) the
    series of that sender's GPU ``hw_id`` apart from the request process's own, unless ``hw_id`` is
    an NVML UUID (:data:`NVML_UUID`: the same GPU whoever reports it)."""
    if sender is None or _NVML_UUID.match(hw_id):
        return hw_id
    return f"{hw_id}{SENDER_SEPARATOR}{sender}"


def hw_of(series: str) -> str:
    """The ``hw.id`` of a series' second part (:func:`series_hw`), for display."""
    return series.split(SENDER_SEPARATOR, 1)[0]


def point_processes(points: Iterable[MetricPoint]) -> list[str]:
    """The :func:`~otel_stages.analysis.requests.process_key` of each point, in order (computed
    once per distinct resource dict: loaders share one per process)."""
    known: dict[int, str] = {}
    out = []
    for p in points:
        key = known.get(id(p.resource))
        if key is None:
            key = known[id(p.resource)] = process_key(p.resource)
        out.append(key)
    return out


def is_ambiguous(values: Iterable[float], undeclared: bool, guess: float = PERCENT_GUESS) -> bool:
    """Whether one sender's guessed utilization points (their ``values`` as read, every ``hw.id``;
    ``undeclared``: every one's unit is :data:`UNDECLARED_UNIT`) cannot be told ratio from percent:
    undeclared, every value a whole number not above ``guess`` and at least one above 0 (module
    docstring). One fractional value makes them a ratio, one value above the guess percent; only
    zeros are idle under either reading."""
    above_zero = False
    for v in values:
        if v > guess or not float(v).is_integer():
            return False
        above_zero = above_zero or v > 0
    return undeclared and above_zero


def is_model_utilization(point: MetricPoint) -> bool:
    """Whether ``point`` is an ``hw.gpu.utilization`` reading of the GPU's compute engine, the one
    a model runs on: without ``hw.gpu.task`` or with ``general``. The hardware conventions split
    utilization by engine (``decoder`` / ``encoder`` / ``general``:
    https://opentelemetry.io/docs/specs/semconv/hardware/gpu/), and the video engines idle while
    the model saturates the GPU: averaged with them, a 95 % GPU read 32 %."""
    return (point.name == semconv.HW_GPU_UTILIZATION
            and point.attributes.get(semconv.HW_GPU_TASK) in (None, "", semconv.HW_GPU_TASK_GENERAL))


def is_guessed(unit: str | None) -> bool:
    """Whether a utilization point's unit leaves percent to the guess: every unit but ``%``
    (:data:`~otel_stages.analysis.otlp_json.PERCENT_UNIT`, scaled when read)."""
    return unit != PERCENT_UNIT


def sender_divisors(points: Sequence[MetricPoint], guess: float = PERCENT_GUESS
                    ) -> dict[SenderUnit, float | None]:
    """``(sending process, unit)`` -> what that sender's ``hw.gpu.utilization`` points of that
    unit (every ``hw.id``; :func:`is_guessed` units only) are divided by: 100 where one exceeds
    ``guess`` (percent), 1 otherwise, ``None`` where they are undeclared and :func:`is_ambiguous`
    (left out). One producer writes one unit for a metric, so the guess is made per sender, not
    per GPU, and per unit, so a unit fixed partway is not guessed from the points before
    (module docstring). The sender is its :func:`~otel_stages.analysis.requests.process_key`."""
    chosen = [p for p in points if is_model_utilization(p)]
    return _divisors(chosen, point_processes(chosen), guess)


def _divisors(chosen: Sequence[MetricPoint], procs: Sequence[str], guess: float
              ) -> dict[SenderUnit, float | None]:
    """:func:`sender_divisors` of utilization points ``chosen`` sent by ``procs``."""
    values: dict[SenderUnit, list[float]] = defaultdict(list)
    for p, proc in zip(chosen, procs):
        if is_guessed(p.unit):
            values[proc, p.unit].append(p.value)
    return {key: None if is_ambiguous(vs, key[1] == UNDECLARED_UNIT, guess)
            else 100.0 if max(vs) > guess else 1.0
            for key, vs in values.items()}


def ambiguous_series(points: Sequence[MetricPoint]) -> list[SeriesKey]:
    """The ``hw.gpu.utilization`` series, as ``(sending process, hw.id)`` sorted, whose undeclared
    points are left out (:func:`owned_series`): every ``hw.id`` with undeclared points of a sender
    whose undeclared points :func:`sender_divisors` finds ambiguous (the sender is its
    :func:`~otel_stages.analysis.requests.process_key`, whether or not it ran requests)."""
    chosen = [p for p in points if is_model_utilization(p)]
    procs = point_processes(chosen)
    divisors = _divisors(chosen, procs, PERCENT_GUESS)
    return sorted({(proc, str(p.attributes.get(semconv.HW_ID, "")))
                   for p, proc in zip(chosen, procs)
                   if p.unit == UNDECLARED_UNIT and divisors[proc, p.unit] is None})


def ambiguous_unit_lines(series: Sequence[SeriesKey]) -> list[str]:
    """The problem line for :func:`ambiguous_series`'s answer (none when empty), naming the first
    as the example; the same text from the file report and the ClickHouse report."""
    if not series:
        return []
    proc, hw_id = series[0]
    senders = len({s for s, _ in series})
    return [
        f"hw.gpu.utilization without a declared unit reads only whole numbers not above"
        f" {PERCENT_GUESS:g}, some 1, in all the undeclared points of {senders} sending"
        f" process{'es' if senders > 1 else ''} ({len(series)} series, e.g."
        f" {proc or '(no service)'} hw.id {hw_id or '(none)'}): a ratio (an idle or saturated"
        " GPU) and integer percent (a near-idle GPU, as dcgm-exporter's DCGM_FI_DEV_GPU_UTIL)"
        " cannot be told apart (one producer writes one unit, so each sender is judged on all"
        " its GPUs), so they are left out of the GPU evidence. Declare the unit: '1' for a"
        " ratio, '%' for percent (e.g. the Collector's transform processor: set(metric.unit, \"%\") where"
        " metric.name == \"hw.gpu.utilization\")"]


def owned_series(points: Sequence[MetricPoint], name: str, request_processes: Collection[str],
                 scale: float | None = None, hosts: Mapping[str, str] | None = None
                 ) -> dict[SeriesKey, list[tuple[int, float]]]:
    """The ``name`` points as ``(time_ns, value)`` lists in time order, per :data:`SeriesKey`: a
    request process's own points, plus the points of processes that ran no request (not in
    ``request_processes``): those of a sender whose ``host.name`` is the host of some request
    processes (``hosts``: request process -> its ``host.name``, :func:`request_hosts`) go to those
    processes only (a per-node GPU exporter describes its node's GPUs), joining their series of
    the same ``hw.id``; a sender on a host none of them names, to those that name no host; the
    others to every request process; those two kinds as a series per sender (:func:`series_hw`).
    ``scale``: guess the unit (utilization; pass :data:`PERCENT_GUESS`): a sender's points of one
    unit (not ``%``, scaled when read: :func:`is_guessed`) with one above it are divided by 100
    (percent), its ambiguous undeclared points left out (:func:`sender_divisors`, per sender and
    unit over every ``hw.id``)."""
    return {key: [(t, v) for t, v, _ in samples]
            for key, samples in owned_points(points, name, request_processes, scale, hosts).items()}


def request_hosts(resources: Iterable[dict[str, AttributeValue]]) -> dict[str, str]:
    """Process key -> ``host.name`` (when set) of the given request resources, for
    :func:`owned_series`."""
    out: dict[str, str] = {}
    for resource in resources:
        host = resource.get(semconv.HOST_NAME)
        if isinstance(host, str) and host:
            out.setdefault(process_key(resource), host)
    return out


@dataclass(frozen=True)
class ForwardOwners:
    """Whose GPU each forward span ran on (:func:`forward_owners`). ``windows``: ``(process key,
    start_ns, end_ns)`` per forward span, in the requests' order; ``owners``: the processes that
    own GPU series (every request process and the processes that recorded forwards without
    running a request); ``hosts``: process key -> ``host.name`` of those that name one
    (:func:`request_hosts`), for :func:`owned_series`."""

    windows: list[tuple[str, int, int]]
    owners: frozenset[str]
    hosts: dict[str, str]


def unowned_gpu_senders(points: Sequence[MetricPoint], processes: Collection[str]) -> bool:
    """Whether some GPU point (:data:`GPU_METRICS`; utilization of the compute engine only,
    :func:`is_model_utilization`) was sent by a process not in ``processes`` (the request
    processes): only then can a forward recorded by a process that ran no request have GPU points
    of its own or of an exporter on its host. The ClickHouse SQL asks the same before it reads the
    forward spans' own processes
    (:func:`otel_stages.analysis.clickhouse_queries.forward_owners_statements`)."""
    known: dict[int, bool] = {}
    for p in points:
        if p.name not in GPU_METRICS or (p.name == semconv.HW_GPU_UTILIZATION
                                         and not is_model_utilization(p)):
            continue
        outside = known.get(id(p.resource))
        if outside is None:
            outside = known[id(p.resource)] = process_key(p.resource) not in processes
        if outside:
            return True
    return False


def forward_owners(requests: Sequence[Request], points: Sequence[MetricPoint],
                   processes: Collection[str] | None = None) -> ForwardOwners:
    """Each forward span of ``requests`` with the process whose GPU points it is lined up with:
    the process that recorded the span when that process ran no request (a model server that
    records ``queue`` and ``forward`` under a gateway's request span, trace context propagated)
    and some GPU point comes from a process that ran no request (:func:`unowned_gpu_senders`:
    else no GPU point can be that process's); otherwise the request's process (the common case,
    one process recording the request and its forward, pays one identity test per forward).
    ``processes``: every request process (default: those of ``requests``)."""
    name = semconv.STAGE_FORWARD
    keys = process_keys(requests)
    requesting = frozenset(keys) if processes is None else frozenset(processes)
    resources = {id(r.resource): r.resource for r in requests}
    split = unowned_gpu_senders(points, requesting)
    known: dict[int, str] = {}
    windows: list[tuple[str, int, int]] = []
    for r, proc in zip(requests, keys):
        for s in r.spans:
            if s.name != name:
                continue
            owner = proc
            if split and s.resource is not r.resource:
                key = known.get(id(s.resource))
                if key is None:
                    key = known[id(s.resource)] = process_key(s.resource)
                if key not in requesting:
                    owner = key
                    resources[id(s.resource)] = s.resource
            windows.append((owner, s.start_ns, s.end_ns))
    return ForwardOwners(windows, requesting | {w[0] for w in windows},
                         request_hosts(resources.values()))


def owned_points(points: Sequence[MetricPoint], name: str, request_processes: Collection[str],
                 scale: float | None = None, hosts: Mapping[str, str] | None = None
                 ) -> dict[SeriesKey, list[tuple[int, float, str]]]:
    """:func:`owned_series` with each point's sending process: ``(time_ns, value, sender)``, for
    rules that must not read two senders' readings of one GPU as one sequence (a GPU exporter's
    memory reading 1 GiB below the service's own is not memory released)."""
    sent: dict[SeriesKey, list[tuple[int, float]]] = defaultdict(list)
    sender_host: dict[str, str] = {}
    chosen = [p for p in points if p.name == name
              and (name != semconv.HW_GPU_UTILIZATION or is_model_utilization(p))]
    procs = point_processes(chosen)
    # only utilization is guessed; said once per report: ambiguous_unit_lines
    divisors = {} if scale is None else _divisors(chosen, procs, scale)
    for p, proc in zip(chosen, procs):
        value = p.value
        if scale is not None and is_guessed(p.unit):
            divide = divisors[proc, p.unit]
            if divide is None:
                continue
            value /= divide
        sent[proc, str(p.attributes.get(semconv.HW_ID, ""))].append((p.time_ns, value))
        if proc not in sender_host:
            host = p.resource.get(semconv.HOST_NAME)
            sender_host[proc] = host if isinstance(host, str) else ""
    on_host: dict[str, list[str]] = defaultdict(list)
    hostless = []
    for proc in request_processes:
        if hosts and hosts.get(proc):
            on_host[hosts[proc]].append(proc)
        else:
            hostless.append(proc)
    out: dict[SeriesKey, list[tuple[int, float, str]]] = defaultdict(list)
    for (proc, hw_id), samples in sent.items():
        if proc in request_processes:
            out[proc, hw_id].extend((t, v, proc) for t, v in samples)
            continue
        host = sender_host[proc]
        for owner in _foreign_owners(host, on_host, hostless, request_processes):
            # the request process's host: its own GPU; else the sender's GPU as its own series
            own_host = bool(host) and hosts is not None and hosts.get(owner) == host
            part = hw_id if own_host else series_hw(hw_id, proc)
            out[owner, part].extend((t, v, proc) for t, v in samples)
    for found in out.values():
        found.sort()
    return dict(out)


def unplaced_senders(points: Sequence[MetricPoint], request_processes: Collection[str],
                     hosts: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(host.name, process key)`` (sorted) of the processes with GPU points (:data:`GPU_METRICS`)
    and no request whose points :func:`owned_points` gives to no request process: on a host that
    no request process names, while every request process names one (``hosts``:
    :func:`request_hosts`; pass :class:`ForwardOwners`' ``owners`` and ``hosts``: a GPU worker
    that recorded forwards places its own points). The ClickHouse SQL counts the same
    (:func:`otel_stages.analysis.clickhouse_queries.foreign_gpu_sql`)."""
    on_host = {h for p, h in hosts.items() if p in request_processes and h}
    hostless = [p for p in request_processes if not hosts.get(p)]
    out: set[tuple[str, str]] = set()
    chosen = [p for p in points if p.name in GPU_METRICS]
    for p, proc in zip(chosen, point_processes(chosen)):
        if proc in request_processes:
            continue
        host = p.resource.get(semconv.HOST_NAME)
        if isinstance(host, str) and host and host not in on_host and not hostless:
            out.add((host, proc))
    return sorted(out)


def unplaced_lines(count: int, host: str) -> list[str]:
    """The problem line for :func:`unplaced_senders` (``count`` processes, the first ``host``);
    none for 0. The same text from the file report and the ClickHouse report."""
    if not count:
        return []
    return [f"GPU points of {count} process{'es' if count != 1 else ''} that ran no request, on"
            f" hosts no request process names (e.g. host.name {host}), were lined up with no"
            " forward: a node's GPU exporter goes to the request processes that name its host."
            " Set host.name to the same node name on both (in Kubernetes the resource detector"
            " may set the pod's name; use the node's, k8s.node.name), or leave it unset on the"
            " exporter"]


def _foreign_owners(host: str, on_host: Mapping[str, list[str]], hostless: list[str],
                    request_processes: Collection[str]) -> Collection[str]:
    """The request processes a sender without requests on ``host`` describes: those on its host;
    where the request processes name hosts and none is its, only those that name none (it is
    another machine's GPU); where its host or theirs is unknown, every one."""
    if not host or not on_host:
        return request_processes
    return on_host.get(host) or hostless


def shared_hw_ids(points: Sequence[MetricPoint], request_processes: Collection[str]
                  ) -> dict[str, list[str]]:
    """``hw.id`` -> the request processes (sorted; at least two) whose own GPU points carry it."""
    found: dict[str, set[str]] = defaultdict(set)
    chosen = [p for p in points if p.name in GPU_METRICS]
    for p, proc in zip(chosen, point_processes(chosen)):
        if proc in request_processes:
            found[str(p.attributes.get(semconv.HW_ID, ""))].add(proc)
    return {hw: sorted(procs) for hw, procs in sorted(found.items()) if len(procs) > 1}


def shared_hw_id_lines(shared: Mapping[str, Sequence[str]]) -> list[str]:
    """The problem line for :func:`shared_hw_ids`'s answer (none when empty); the same text from
    the file report and the ClickHouse report."""
    if not shared:
        return []
    parts = []
    for hw_id, procs in list(shared.items())[:MAX_NAMED]:
        named = ", ".join(procs[:MAX_NAMED]) + (", ..." if len(procs) > MAX_NAMED else "")
        parts.append(f"{hw_id or '(no hw.id)'} by {len(procs)} processes ({named})")
    more = f"; {len(shared) - MAX_NAMED} more" if len(shared) > MAX_NAMED else ""
    return [
        "GPU hw.id reported by more than one process: " + "; ".join(parts) + more
        + ". Each process's GPU points are lined up with its own forwards, not merged into one"
        " GPU: hw.id is unique only within a host (an index such as '0' repeats across hosts)"]
