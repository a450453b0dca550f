"""Integration fixtures: one private Redis, the test site, and real worker processes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from config import DEFAULT_POOL, get_settings, reset_settings
from tests.procs import LoggedProc
from tests.testsite.server import TestSite
from utils import environ
from utils.redis import reset_clients
from utils.servers import RedisServer


@pytest.fixture(scope="session")
def test_site() -> Iterator[TestSite]:
    site = TestSite().start()
    try:
        yield site
    finally:
        site.stop()


@pytest.fixture(scope="session")
def cc_env(
    redis_server: RedisServer, test_site: TestSite, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """Point this process (and the workers it starts) at the private Redis and test site."""
    var = tmp_path_factory.mktemp("var")
    env = {
        "CHAINCRAWL_REDIS_URL": redis_server.url,
        "CHAINCRAWL_KEY_PREFIX": "it",
        "CHAINCRAWL_EXTRA_SITE_PACKAGES": "tests.testsite",
        "CHAINCRAWL_VAR_DIR": str(var),
        "CHAINCRAWL_VISIBILITY_TIMEOUT": "6",
        "CHAINCRAWL_RETRY_BACKOFF": "0.2",
        "CHAINCRAWL_RETRY_BACKOFF_MAX": "1",
        "CHAINCRAWL_MAX_RETRIES": "3",
        "CHAINCRAWL_SINKS": "jsonl",
        "CHAINCRAWL_OUTBOX_FLUSH_INTERVAL": "0.1",
        "CHAINCRAWL_OUTBOX_CLAIM_IDLE": "2",
        "TESTSITE_URL": test_site.url,
    }
    saved = environ.apply(env)
    reset_settings()
    reset_clients()
    import sites
    import worker

    sites.load_all()
    worker.configure(get_settings())
    try:
        yield env
    finally:
        environ.restore(saved)
        reset_settings()
        reset_clients()


class WorkerProc(LoggedProc):
    """A real `celery worker` process; the log file tells when it is ready."""

    def __init__(self, env: dict[str, str], log: Path, pool: str, concurrency: int, name: str,
                 queues: str = "testsite,resources,default") -> None:  # fmt: skip
        cmd = [
            sys.executable, "-m", "celery", "-A", "worker", "worker",
            "-P", pool, "-c", str(concurrency), "-Q", queues, "-n", f"{name}@%h",
            "--without-gossip", "--without-mingle", "-E", "-l", "INFO",
        ]  # fmt: skip
        super().__init__(cmd, env, log)

    def stop(self, timeout: float = 30) -> None:
        super().stop(timeout)


@pytest.fixture
def start_worker(cc_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., WorkerProc]]:
    procs: list[WorkerProc] = []

    def start(
        pool: str = DEFAULT_POOL,
        concurrency: int = 8,
        name: str = "w",
        queues: str | None = None,
        **env: str,
    ) -> WorkerProc:
        """`queues` (comma-separated) replaces the default testsite,resources,default."""
        w = WorkerProc({**cc_env, **env}, tmp_path / f"{name}{len(procs)}.log", pool, concurrency,
                       f"{name}{len(procs)}", **({"queues": queues} if queues else {}))  # fmt: skip
        procs.append(w)
        return w.wait_ready()

    try:
        yield start
    finally:
        for w in procs:
            w.stop()
