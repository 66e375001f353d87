"""gunicorn settings for examples/fastapi_app.py: 3 uvicorn workers, app preloaded in the master.

    gunicorn -c examples/gunicorn_conf.py examples.fastapi_app:app

is the same as ``gunicorn -w 3 --preload -k uvicorn.workers.UvicornWorker examples.fastapi_app:app``
plus the two hooks below. ``--preload`` imports the app once in the master (shared memory, fast
worker restarts), so nothing telemetry-related may be built there: exporters, files, gRPC channels
and threads do not survive ``fork()``. Each worker calls ``otel_stages.configure()`` right after it
is forked (``post_fork``), which gives it its own ``service.instance.id`` and span files;
otel_stages restarts ``request.seq`` at 1 in every forked process, and the model session is
created on each worker's first forward, so each worker reports its own cold start.
``uvicorn.workers`` is deprecated upstream in favour of the ``uvicorn-worker`` package: with it
installed, ``worker_class = "uvicorn_worker.UvicornWorker"`` works the same.
"""

import os

bind = os.environ.get("BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "3"))
worker_class = "uvicorn.workers.UvicornWorker"
preload_app = True


def post_fork(server: object, worker: object) -> None:
    """In the new worker, before it serves: its own telemetry (instance id, files, exporters)."""
    from examples.fastapi_app import setup_telemetry

    setup_telemetry()


def worker_exit(server: object, worker: object) -> None:
    """Flush the worker's spans before it goes (also done at interpreter exit)."""
    from examples.fastapi_app import shutdown_telemetry

    shutdown_telemetry()
