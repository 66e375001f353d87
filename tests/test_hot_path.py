"""What the hot-path cuts of issue 11 must leave unchanged: the live stage's direct use of the
OpenTelemetry API's context variable (and its fallback), request spans made by the stage class,
the disabled stage's shared no-op, the package's lazy ``configure`` / ``Telemetry``, and the
switch between them that ``configure()`` and ``Telemetry.shutdown()`` make."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from contextvars import Token
from pathlib import Path

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context.context import Context, _RuntimeContext
from opentelemetry.trace import INVALID_SPAN

import otel_stages as ots
from otel_stages import semconv, sequence, stages
from otel_stages._runtime import OFF, RUNTIME
from otel_stages.analysis import load_paths


def test_a_live_stage_is_current_through_the_api_and_restores_the_context(captured):
    before = otel_context.get_current()
    with ots.request() as req, ots.stage("decode") as span:
        assert trace.get_current_span() is span  # what other instrumentation reads
        assert otel_context.get_current() == trace.set_span_in_context(
            span, trace.set_span_in_context(req, before))  # as the API builds it
    assert otel_context.get_current() is before
    assert captured.one("decode").parent.span_id == captured.one("request").context.span_id


def test_the_hot_path_uses_the_apis_own_context_variable():
    runtime = otel_context._RUNTIME_CONTEXT
    assert stages._get_current == runtime._current_context.get
    assert stages._attach == runtime._current_context.set


class _DictRuntime(_RuntimeContext):
    """A runtime context that is not the API's default (OTEL_PYTHON_CONTEXT picks such a one)."""

    def __init__(self) -> None:
        self.current = Context()
        self.tokens: list[Context] = []

    def attach(self, context: Context) -> Token[Context]:
        self.tokens.append(self.current)
        self.current = context
        return len(self.tokens)  # type: ignore[return-value]

    def get_current(self) -> Context:
        return self.current

    def detach(self, token: Token[Context]) -> None:
        self.current = self.tokens.pop()


def test_another_runtime_context_gets_the_api_functions(monkeypatch):
    monkeypatch.setattr(otel_context, "_RUNTIME_CONTEXT", _DictRuntime())
    assert stages._api_context() == (otel_context.get_current, otel_context.attach,
                                     otel_context.detach)


def test_a_detach_that_fails_is_logged_as_the_api_logs_it(captured, caplog):
    """A stage left in another thread than it was entered in: ``ContextVar.reset`` fails there;
    the stage falls back to the API's detach, which logs "Failed to detach context" (and the span
    is still ended)."""
    before = otel_context.get_current()
    scope = ots.stage("decode")
    scope.__enter__()
    errors: list[BaseException] = []

    def leave() -> None:
        try:
            scope.__exit__(None, None, None)
        except BaseException as exc:
            errors.append(exc)

    with caplog.at_level(logging.ERROR, logger="opentelemetry.context"):
        worker = threading.Thread(target=leave)
        worker.start()
        worker.join()
    assert errors == []
    assert "Failed to detach context" in caplog.text
    assert captured.names() == ["decode"]
    otel_context.attach(before)  # this thread's context still holds the span: put it back


def test_request_span_attributes_and_fields_as_before(captured, monkeypatch):
    monkeypatch.setattr(sequence, "_SEQUENCE", sequence._Sequence())
    scope = ots.request(request_id="r-1", cold_start=False, **{"image.count": 2})
    assert isinstance(scope, stages.StageScope)
    assert (scope.request_id, scope.cold_start) == ("r-1", False)
    assert (ots.stage("decode").request_id, ots.stage("decode").cold_start) == (None, None)
    with scope:
        pass
    with ots.request():
        pass
    first, second = captured.by_name("request")
    assert dict(first.attributes) == {"image.count": 2, semconv.REQUEST_SEQ: 1,
                                      semconv.REQUEST_COLD_START: False, semconv.REQUEST_ID: "r-1"}
    assert dict(second.attributes) == {semconv.REQUEST_SEQ: 2, semconv.REQUEST_COLD_START: False}


def test_a_decorated_request_keeps_its_cold_start_and_a_stage_stays_a_stage(captured):
    @ots.request(cold_start=True)
    def handle() -> None:
        with ots.stage("forward"):
            pass

    handle()
    handle()
    assert [s.attributes[semconv.REQUEST_COLD_START] for s in captured.by_name("request")] == [True, True]
    assert all(semconv.REQUEST_SEQ not in s.attributes for s in captured.by_name("forward"))


def test_the_disabled_no_op_returns_the_invalid_span_and_never_swallows():
    RUNTIME.enabled = False
    try:
        scope = ots.stage("decode")
        assert scope is ots.stage("decode") is ots.request("decode")
        assert scope.__enter__() is INVALID_SPAN
        assert scope.__exit__(ValueError, ValueError("x"), None) is None  # falsy: re-raised
        with pytest.raises(ValueError, match="kept"), ots.request() as span:
            assert span is INVALID_SPAN
            raise ValueError("kept")
    finally:
        RUNTIME.enabled = True


def _written(folder: Path) -> list[str]:
    return sorted(s.name for s in load_paths(sorted(folder.glob("traces-*.jsonl"))).spans)


def test_configure_and_shutdown_switch_what_a_stage_does(tmp_path):
    """configure(enabled=False): the shared no-op; configure(): recorded spans; after shutdown:
    the default tracer (OpenTelemetry's global, here unset: nothing recorded); configure() again:
    recorded again. The mode is read on every call, so one ``stage`` function follows all of it."""
    off = ots.configure(data_dir=tmp_path / "off", enabled=False, set_global=False)
    assert RUNTIME.mode == OFF and ots.stage("decode") is ots.stage("decode")
    off.shutdown()
    first = ots.configure(data_dir=tmp_path / "first", gpu="off", set_global=False)
    with ots.request(), ots.stage("decode") as span:
        assert span.is_recording()
    assert first.shutdown()
    with ots.request(), ots.stage("decode") as span:
        assert not span.is_recording()  # the global provider's tracer: none set in tests
    second = ots.configure(data_dir=tmp_path / "second", gpu="off", set_global=False)
    with ots.request(), ots.stage("decode") as span:
        assert span.is_recording()
    assert second.shutdown()
    assert _written(tmp_path / "first") == _written(tmp_path / "second") == ["decode", "request"]


def test_the_packages_lazy_names_become_plain_attributes_once_the_sdk_is_imported():
    """Until ``otel_stages.sdk`` is imported, ``configure`` / ``Telemetry`` come from the package's
    ``__getattr__``; then they are plain attributes and ``__getattr__`` is gone (CPython does not
    specialise attribute loads on a module that has one: every ``ots.stage`` would pay for it)."""
    code = (
        "import sys, otel_stages as o\n"
        "assert '__getattr__' in vars(o) and 'opentelemetry.sdk' not in sys.modules\n"
        "with o.request():\n"
        "    with o.stage('decode'): pass\n"
        "assert 'opentelemetry.sdk' not in sys.modules\n"
        "configure = o.configure\n"
        "import otel_stages.sdk as sdk\n"
        "assert '__getattr__' not in vars(o)\n"
        "assert configure is o.configure is sdk.configure and o.Telemetry is sdk.Telemetry\n"
        "try:\n"
        "    o.missing\n"
        "except AttributeError:\n"
        "    print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
