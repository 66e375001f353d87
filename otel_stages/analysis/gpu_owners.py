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

Points of a process that ran no request go to every request process (the file report and the
SQL alike), but where the sender's ``host.name`` is that of some request processes, to those only
(one DCGM exporter per node: node b's GPU "0" is not node a's), and where the request processes
name hosts and none is the sender's, only to those that name none. On the request process's own
host, or with an NVML UUID for ``hw.id`` (:data:`NVML_UUID`, unique everywhere), they join its
series of that ``hw.id`` (the node's exporter and the model's own sampler naming the same GPU);
an id such as ``0`` sent from elsewhere or from an unknown host (no ``host.name`` on one side) is
a series of its own per sender (:func:`series_hw`: the ``hw.id`` and the sender), so two
exporters' GPU ``0`` are two GPUs, of which the rules pick the one whose utilization rises during
the forwards, never a mix of both.

Utilization units: a series declared ``%`` is scaled when read
(:data:`otel_stages.analysis.otlp_json.PERCENT_UNIT`); a series whose largest value exceeds
:data:`PERCENT_GUESS` is percent. A series whose OTLP ``unit`` is undeclared
(:data:`UNDECLARED_UNIT`) and whose values are all whole numbers not above :data:`PERCENT_GUESS`
(only 0 and 1) is *ambiguous* (:func:`is_ambiguous`): a ratio of an idle or saturated GPU, or
integer percent of a near-idle one (NVIDIA dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL``, 0..100 with no
unit through the Collector's prometheus receiver, renamed ``hw.gpu.utilization``). Read as a ratio
an idle GPU would be called busy, so such a series is left out of the utilization evidence and
the charts, and the report says so (:func:`ambiguous_unit_lines`). A declared ``1`` is never
ambiguous (otel-stages' own sampler declares it and reads exactly 0.0 / 1.0 on an idle /
saturated GPU); a source without units (``MetricPoint.unit`` ``None``: PromQL) keeps the guess.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence

from otel_stages import semconv
from otel_stages.analysis.model import AttributeValue, MetricPoint
from otel_stages.analysis.requests import process_key

#: A utilization series with a value above this is percent (0..100) from a producer that did not
#: divide by 100 and did not declare the unit ``%`` (a ratio never exceeds 1; a series declared
#: ``%`` is scaled when read, :data:`otel_stages.analysis.otlp_json.PERCENT_UNIT`). One value
#: for the verdict (:mod:`otel_stages.analysis.gpu`) and the charts (``gpu_series``). An
#: undeclared series of whole numbers not above it is neither: :func:`is_ambiguous`.
PERCENT_GUESS = 1.0
#: ``MetricPoint.unit`` (and the exporter's ``MetricUnit``) of a metric whose producer declared no
#: unit: its utilization series may be ambiguous (module docstring, :func:`is_ambiguous`).
UNDECLARED_UNIT = ""

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
    """Whether a utilization series (its ``values`` as read; ``undeclared``: every point's unit is
    :data:`UNDECLARED_UNIT`) cannot be told ratio from percent: undeclared, and every value a whole
    number not above ``guess`` (module docstring). One fractional value makes it a ratio, one
    value above the guess percent."""
    return undeclared and all(v <= guess and float(v).is_integer() for v in values)


def ambiguous_series(points: Sequence[MetricPoint]) -> list[SeriesKey]:
    """The ``hw.gpu.utilization`` series, as ``(sending process, hw.id)`` sorted, that
    :func:`is_ambiguous` finds and :func:`owned_series` leaves out (the sender is its
    :func:`~otel_stages.analysis.requests.process_key`, whether or not it ran requests)."""
    values: dict[SeriesKey, list[float]] = defaultdict(list)
    declared: set[SeriesKey] = set()
    chosen = [p for p in points if p.name == semconv.HW_GPU_UTILIZATION]
    for p, proc in zip(chosen, point_processes(chosen)):
        key = proc, str(p.attributes.get(semconv.HW_ID, ""))
        values[key].append(p.value)
        if p.unit != UNDECLARED_UNIT:
            declared.add(key)
    return sorted(k for k, vs in values.items() if is_ambiguous(vs, k not in declared))


def ambiguous_unit_lines(series: Sequence[SeriesKey]) -> list[str]:
    """The problem line for :func:`ambiguous_series`'s answer (none when empty), naming the first
    as the example; the same text from the file report and the ClickHouse report."""
    if not series:
        return []
    proc, hw_id = series[0]
    return [
        f"hw.gpu.utilization without a declared unit reads only whole numbers not above"
        f" {PERCENT_GUESS:g} in {len(series)} series (e.g. {proc or '(no service)'}"
        f" hw.id {hw_id or '(none)'}): a ratio (an idle or saturated GPU) and integer percent"
        " (a near-idle GPU, as dcgm-exporter's DCGM_FI_DEV_GPU_UTIL) cannot be told apart, so"
        " they are left out of the GPU evidence. Declare the unit: '1' for a ratio, '%' for"
        " percent (e.g. the Collector's transform processor: set(metric.unit, \"%\") where"
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
    ``scale``: a series (per sending process and ``hw.id``) whose largest value exceeds it is
    divided by 100 (utilization given in percent), and pass :data:`PERCENT_GUESS` to leave out the
    series :func:`is_ambiguous` finds (undeclared unit, whole numbers not above it)."""
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


def owned_points(points: Sequence[MetricPoint], name: str, request_processes: Collection[str],
                 scale: float | None = None, hosts: Mapping[str, str] | None = None
                 ) -> dict[SeriesKey, list[tuple[int, float, str]]]:
    """:func:`owned_series` with each point's sending process: ``(time_ns, value, sender)``, for
    rules that must not read two senders' readings of one GPU as one sequence (a GPU exporter's
    memory reading 1 GiB below the service's own is not memory released)."""
    sent: dict[SeriesKey, list[tuple[int, float]]] = defaultdict(list)
    declared: set[SeriesKey] = set()
    sender_host: dict[str, str] = {}
    chosen = [p for p in points if p.name == name]
    for p, proc in zip(chosen, point_processes(chosen)):
        key = proc, str(p.attributes.get(semconv.HW_ID, ""))
        sent[key].append((p.time_ns, p.value))
        if scale is not None and p.unit != UNDECLARED_UNIT:  # only utilization is guessed
            declared.add(key)
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
        if scale is not None and is_ambiguous((v for _, v in samples), (proc, hw_id) not in declared,
                                             scale):
            continue  # said once per report: ambiguous_unit_lines
        divide = 100.0 if scale is not None and max(v for _, v in samples) > scale else 1.0
        if proc in request_processes:
            out[proc, hw_id].extend((t, v / divide, proc) for t, v in samples)
            continue
        host = sender_host[proc]
        for owner in _foreign_owners(host, on_host, hostless, request_processes):
            # the request process's host: its own GPU; else the sender's GPU as its own series
            own_host = bool(host) and hosts is not None and hosts.get(owner) == host
            part = hw_id if own_host else series_hw(hw_id, proc)
            out[owner, part].extend((t, v / divide, proc) for t, v in samples)
    for found in out.values():
        found.sort()
    return dict(out)


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
