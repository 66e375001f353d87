"""What counting an asyncio loop's turns costs the loop (otel_stages.signals.loop, issue 13).

The :class:`~otel_stages.signals.loop.LoopMonitor` wraps a selector loop's ``_selector`` so that
each iteration's ``select`` call adds one to a counter. This measures the loop's CPU time per
iteration in three set-ups, interleaved round by round on fresh loops:

* ``plain``: an asyncio loop without a monitor (the baseline);
* ``ticks``: the monitor's 20 ms timer only (the turn counter switched off, as on uvloop);
* ``turns``: the monitor as it runs on a selector loop: the timer and the counting proxy.

Two workloads: ``yield`` (one task awaiting ``asyncio.sleep(0)``: nothing but loop iterations,
the worst case for a per-iteration cost) and ``echo`` (a client and server exchanging 64-byte
messages over loopback TCP with asyncio streams: each round trip is a few iterations with real
socket I/O, what a service's loop does). Figures are the loop thread's CPU ns per operation (one
``sleep(0)``, one round trip), medians over rounds; each set-up's ratio against ``plain``; the
iterations per operation (counted by ``turns``) and from them what counting adds to one
iteration (``turns`` minus ``ticks``).

``designs`` compares ways to count on a stub selector whose ``select`` does nothing: the
library's (the selector's ``select`` shadowed by a counting function) against a proxy object
around the selector, with and without ``__getattr__`` forwarding (ns added per call, the least
disturbed of interleaved rounds).

Usage: ``python benchmarks/loop_turns.py [--rounds N] [--smoke]``; prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from otel_stages.signals import loop as loop_signals

SETUPS = ("plain", "ticks", "turns")


def _yield_work(iterations: int) -> Callable[[], Coroutine[Any, Any, int]]:
    async def work() -> int:
        for _ in range(iterations):
            await asyncio.sleep(0)
        return iterations
    return work


def _echo_work(messages: int) -> Callable[[], Coroutine[Any, Any, int]]:
    async def work() -> int:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(64):
                writer.write(data)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        host, port = server.sockets[0].getsockname()[:2]
        reader, writer = await asyncio.open_connection(host, port)
        payload = b"x" * 64
        for _ in range(messages):
            writer.write(payload)
            await writer.drain()
            await reader.readexactly(64)
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        return messages
    return work


def _round(setup: str, work: Callable[[], Coroutine[Any, Any, int]]) -> tuple[int, int, int]:
    """(loop thread CPU ns, operations, loop iterations or 0 where not counted) of one run of
    ``work`` on a fresh loop."""
    runner = asyncio.new_event_loop()
    try:
        monitor = None
        if setup != "plain":
            saved = loop_signals._count_turns
            if setup == "ticks":
                loop_signals._count_turns = lambda running, monitor: False  # type: ignore[assignment]
            try:
                monitor = loop_signals.LoopMonitor(runner)
            finally:
                loop_signals._count_turns = saved
        start = time.thread_time_ns()
        operations = runner.run_until_complete(work())
        cpu_ns = time.thread_time_ns() - start
        iterations = monitor.turns if monitor is not None and monitor.exact else 0
    finally:
        runner.close()
    return cpu_ns, operations, iterations


def measure(rounds: int, yield_iterations: int, echo_messages: int) -> dict[str, Any]:
    workloads = {"yield": _yield_work(yield_iterations), "echo": _echo_work(echo_messages)}
    results: dict[str, Any] = {}
    for name, work in workloads.items():
        for setup in SETUPS:  # warm-up: imports, first-connection costs
            _round(setup, work)
        per_op: dict[str, list[float]] = {setup: [] for setup in SETUPS}
        turns_per_op: list[float] = []
        for index in range(rounds):
            order = SETUPS if index % 2 == 0 else SETUPS[::-1]  # interleaved, both orders
            for setup in order:
                cpu_ns, operations, iterations = _round(setup, work)
                per_op[setup].append(cpu_ns / operations)
                if setup == "turns":
                    turns_per_op.append(iterations / operations)
        medians = {setup: statistics.median(values) for setup, values in per_op.items()}
        iterations_per_op = statistics.median(turns_per_op)
        results[name] = {
            "cpu_ns_per_op": {setup: round(value, 1) for setup, value in medians.items()},
            "ratio_vs_plain": {setup: round(medians[setup] / medians["plain"], 4) for setup in SETUPS},
            "loop_iterations_per_op": round(iterations_per_op, 3),
            # what the counting proxy adds to one iteration (turns against the timer alone)
            "counting_ns_per_iteration": round((medians["turns"] - medians["ticks"])
                                               / iterations_per_op, 1),
        }
    return {"python": sys.version.split()[0], "rounds": rounds, "yield_ops": yield_iterations,
            "echo_ops": echo_messages, "workloads": results}


class _StubSelector:
    """A selector whose ``select`` does nothing: what a wrapper adds is all that is timed."""

    def select(self, timeout: float | None = None) -> list[Any]:
        return []


class _Counter:
    __slots__ = ("turns",)

    def __init__(self) -> None:
        self.turns = 0


class _ProxyWithGetattr:
    """A proxy forwarding everything but ``select`` through ``__getattr__``."""

    __slots__ = ("monitor", "selector")

    def __init__(self, selector: Any, monitor: _Counter) -> None:
        self.selector, self.monitor = selector, monitor

    def select(self, timeout: float | None = None) -> Any:
        self.monitor.turns += 1
        return self.selector.select(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.selector, name)


class _ProxyListed:
    """A proxy with the same ``select`` and no ``__getattr__`` (it would list every method)."""

    __slots__ = ("monitor", "selector")

    def __init__(self, selector: Any, monitor: _Counter) -> None:
        self.selector, self.monitor = selector, monitor

    def select(self, timeout: float | None = None) -> Any:
        self.monitor.turns += 1
        return self.selector.select(timeout)


class _LoopLike:
    """Calls ``self._selector.select(timeout)`` as ``BaseEventLoop._run_once`` does."""

    def __init__(self, selector: Any) -> None:
        self._selector = selector

    def once(self) -> Any:
        return self._selector.select(0)


def designs(rounds: int, calls: int) -> dict[str, Any]:
    """ns per ``select`` call each way of counting adds, against the bare stub (min over
    interleaved rounds: the least disturbed figure on a shared machine)."""
    shadowed = _StubSelector()
    counting = loop_signals._counting_select(shadowed.select, _Counter())  # type: ignore[arg-type]
    shadowed.select = counting  # type: ignore[method-assign]  # as _count_turns installs it
    loops = {"bare": _LoopLike(_StubSelector()), "shadowed_select": _LoopLike(shadowed),
             "proxy_getattr": _LoopLike(_ProxyWithGetattr(_StubSelector(), _Counter())),
             "proxy_listed": _LoopLike(_ProxyListed(_StubSelector(), _Counter()))}
    best = {name: float("inf") for name in loops}
    for _ in range(rounds):
        for name, fake in loops.items():
            once = fake.once
            start = time.perf_counter_ns()
            for _ in range(calls):
                once()
            best[name] = min(best[name], (time.perf_counter_ns() - start) / calls)
    return {"bare_ns_per_call": round(best["bare"], 1),
            "added_ns_per_call": {name: round(best[name] - best["bare"], 1)
                                  for name in loops if name != "bare"}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--smoke", action="store_true", help="a few short rounds (tests)")
    args = parser.parse_args(argv)
    if args.smoke:
        report = measure(rounds=2, yield_iterations=2_000, echo_messages=100)
        report["designs"] = designs(rounds=2, calls=2_000)
    else:
        report = measure(rounds=args.rounds, yield_iterations=200_000, echo_messages=5_000)
        report["designs"] = designs(rounds=args.rounds * 3, calls=100_000)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
