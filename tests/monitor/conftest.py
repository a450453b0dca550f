"""Fixtures of the monitoring tests: settings on a private key prefix, a webhook receiver,
and (re-exported) the integration fixtures that start real workers."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from config import Settings
from monitor.metrics import TaskMetrics
from tests.integration import conftest as integration
from tests.integration.conftest import start_worker, test_site  # noqa: F401 - fixtures


def _fresh_kombu_pools() -> None:
    """Forget kombu's cached connection pools: `worker.configure()` closes the app's pool but
    kombu keeps it registered, so configuring the same broker twice would hand out a closed one."""
    from kombu import pools

    pools.reset()


@pytest.fixture(scope="module")
def cc_env(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The integration environment (tests/integration/conftest.py `cc_env`).

    Shared when the integration suite's session fixture is already live in this run; otherwise
    set up by its own code for this module and undone afterwards, leaving fresh kombu pools so
    whichever suite configures the app next starts clean.
    """
    if os.environ.get("TESTSITE_URL") and os.environ.get("CHAINCRAWL_KEY_PREFIX") == "it":
        yield {
            k: v
            for k, v in os.environ.items()
            if k.startswith("CHAINCRAWL_") or k == "TESTSITE_URL"
        }
        return
    setup = getattr(integration.cc_env, "__wrapped__", integration.cc_env)
    gen = setup(
        *(request.getfixturevalue(n) for n in ("redis_server", "test_site", "tmp_path_factory"))
    )
    env = next(gen)
    _fresh_kombu_pools()
    try:
        yield env
    finally:
        gen.close()
        _fresh_kombu_pools()


@pytest.fixture
def mon(redis_url: str, key_prefix: str, tmp_path: Path) -> Settings:
    """Settings on the session Redis under a fresh prefix (nothing else sees these keys)."""
    return Settings(redis_url=redis_url, key_prefix=key_prefix, var_dir=tmp_path / "var")


def record(r: Any, s: Settings, task: str, *, ok: int = 0, failed: int = 0, retried: int = 0,
           error: str = "ServerError", status: int = 200, latency: float = 0.05,
           nbytes: int = 100, items: int = 0) -> None:  # fmt: skip
    """Count task attempts exactly as SiteTask does (TaskMetrics flushed into a pipeline)."""
    m = TaskMetrics()
    for _ in range(ok):
        m.outcome("started")
        m.request(status, nbytes)
        m.outcome("succeeded")
        m.latency(latency)
    for _ in range(failed):
        m.outcome("started")
        m.request(500, 10)
        m.outcome("failed", error)
        m.latency(latency)
    for _ in range(retried):
        m.outcome("started")
        m.request(503, 10)
        m.outcome("retried", error)
        m.latency(latency)
    m.counts["items"] += items
    pipe = r.pipeline()
    m.flush(pipe, task, task.split(".")[0], s)
    pipe.execute()


class Receiver:
    """A local HTTP endpoint that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.fail_next = 0
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if outer.fail_next > 0:
                    outer.fail_next -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                outer.bodies.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rcv = Receiver()
    try:
        yield rcv
    finally:
        rcv.close()
