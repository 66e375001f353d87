"""Generator frames and stages: when a ``with stage()`` block may become the current context,
and the wrappers that make ``@stage`` work on generator and async-generator functions.

A scope's ``_open`` / ``_attach`` / ``_detach`` / ``_close`` (see :class:`otel_stages.stages.Scope`)
are what the wrappers drive: the stage's span stays open across ``yield`` and is current only
while the generator's own code runs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_stages.stages import Scope

# A ``with stage()`` block in a generator that yields inside it: see StageScope.__enter__.
_GENERATOR_CODE = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


def _contextlib_entries() -> frozenset[object]:
    """Code objects that drive a generator as a context manager (``@contextmanager``)."""
    import contextlib

    return frozenset({contextlib._GeneratorContextManager.__enter__.__code__,
                      contextlib._AsyncGeneratorContextManager.__aenter__.__code__})


_CONTEXTLIB_ENTRIES = _contextlib_entries()


def _driven_by_contextlib(frame: Any) -> bool:
    """Whether generator ``frame`` runs a ``with stage()`` block it may make current.

    Not when the generator is iterated by someone else: the block stays open across ``yield``, so
    the consumer would see the stage as its current span between items, and a generator closed
    from another task or thread would detach a context token made in a different context
    ("Failed to detach context"). The span is still timed and parented; stages nested in such a
    block become its siblings. A generator driven by ``@contextmanager`` is entered and left by
    one ``with`` statement, so its block is current as usual. (Callers test the cheap
    ``co_flags & _GENERATOR_CODE`` first: this runs only for generator frames.)
    """
    caller = frame.f_back
    return caller is not None and caller.f_code in _CONTEXTLIB_ENTRIES


def may_attach(frame: Any) -> bool:
    """Whether a stage entered from ``frame`` may become the current context (see
    :func:`_driven_by_contextlib`)."""
    return not frame.f_code.co_flags & _GENERATOR_CODE or _driven_by_contextlib(frame)


def wrap_generator(fn: Callable[..., Any], new_scope: Callable[[], Scope]) -> Callable[..., Any]:
    """The span covers the generator's whole life; its context is active only while it runs."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        scope = new_scope()
        scope._open()
        error: BaseException | None = None
        gen = fn(*args, **kwargs)
        try:
            method, value = gen.send, None
            while True:
                scope._attach()
                try:
                    item = method(value)
                except StopIteration as stop:
                    return stop.value
                finally:
                    scope._detach()
                try:
                    method, value = gen.send, (yield item)
                except GeneratorExit:
                    gen.close()
                    raise
                except BaseException as thrown:  # noqa: BLE001 - forwarded into the generator
                    method, value = gen.throw, thrown
        except BaseException as exc:
            error = exc
            raise
        finally:
            scope._close(error)

    return wrapper


def wrap_async_generator(fn: Callable[..., Any],
                          new_scope: Callable[[], Scope]) -> Callable[..., Any]:
    """Async twin of :func:`wrap_generator` (``asend`` / ``athrow`` are forwarded)."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        scope = new_scope()
        scope._open()
        error: BaseException | None = None
        agen = fn(*args, **kwargs)
        try:
            method, value = agen.asend, None
            while True:
                scope._attach()
                try:
                    item = await method(value)
                except StopAsyncIteration:
                    return
                finally:
                    scope._detach()
                try:
                    method, value = agen.asend, (yield item)
                except GeneratorExit:
                    await agen.aclose()
                    raise
                except BaseException as thrown:  # noqa: BLE001 - forwarded into the generator
                    method, value = agen.athrow, thrown
        except BaseException as exc:
            error = exc
            raise
        finally:
            scope._close(error)

    return wrapper
