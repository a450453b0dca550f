"""Scheduling fixtures: the private Redis, a timestamping test site, real workers and beat
(the AMQP priority test's private RabbitMQ vhost is `amqp_broker`, tests/conftest.py).

Every test gets its own key prefix (so its queues, run records and gate keys are its own)."""

from __future__ import annotations

import importlib
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from config import DEFAULT_POOL, get_settings, reset_settings
from scheduling.gate import reset_gate
from tests.procs import LoggedProc as Proc
from tests.scheduling.server import SchedSite
from utils import environ
from utils.redis import cluster_client, reset_clients
from utils.servers import RedisServer

QUEUES = "sched,resources,default"


@pytest.fixture(params=["redis", pytest.param("cluster", marks=pytest.mark.integration)])
def new_client(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Callable[[], Any]]:
    """`new_client()`: a client of the state store, a fresh one per call (as each worker has
    its own): the private Redis, then a Redis Cluster, where each script of the gate and the
    throttle must keep its keys on one slot."""
    made: list[Any] = []

    def new() -> Any:
        if request.param == "cluster":
            client: Any = cluster_client(request.getfixturevalue("redis_cluster").url)
        else:
            client = redis.Redis.from_url(redis_url)
        made.append(client)
        return client

    yield new
    for c in made:
        c.close()


@pytest.fixture(scope="session")
def sched_site() -> Iterator[SchedSite]:
    site = SchedSite().start()
    try:
        yield site
    finally:
        site.stop()


def _reload() -> None:
    """This process anew from its environment: settings, clients, sites, the Celery app."""
    reset_settings()
    reset_clients()
    reset_gate()
    import sites
    import worker

    sites.load_all()
    worker.configure(get_settings())
    # configure() leaves Celery's cached queue table as it was first computed (before this
    # session loaded our site); a fresh process computes it anew, so do what it would do
    for attr in ("queues", "default_queue", "router"):
        worker.app.amqp.__dict__.pop(attr, None)
    worker.app.amqp._rtable = None  # type: ignore[attr-defined]
    if "tests.scheduling.schedsite" in get_settings().extra_site_packages:
        # chains register once per process: other test packages may have loaded them already
        importlib.import_module("tests.scheduling.schedchains.defs")


@pytest.fixture
def sched_env(
    redis_server: RedisServer, sched_site: SchedSite, tmp_path: Path
) -> Iterator[dict[str, str]]:
    """Point this process (and the workers it starts) at the private Redis and test site."""
    env = {
        "CHAINCRAWL_REDIS_URL": redis_server.url,
        "CHAINCRAWL_BROKER_URL": "",
        "CHAINCRAWL_KEY_PREFIX": f"s{uuid.uuid4().hex[:8]}",
        "CHAINCRAWL_EXTRA_SITE_PACKAGES": "tests.scheduling.schedsite",
        "CHAINCRAWL_EXTRA_CHAIN_PACKAGES": "tests.scheduling.schedchains",
        "CHAINCRAWL_VAR_DIR": str(tmp_path / "var"),
        "CHAINCRAWL_VISIBILITY_TIMEOUT": "30",
        "CHAINCRAWL_RETRY_BACKOFF": "0.2",
        "CHAINCRAWL_RETRY_BACKOFF_MAX": "1",
        "CHAINCRAWL_MAX_RETRIES": "3",
        "CHAINCRAWL_SINKS": "jsonl",
        "CHAINCRAWL_OUTBOX_FLUSH_INTERVAL": "0.1",
        "CHAINCRAWL_PREFETCH_MULTIPLIER": "1",
        "CHAINCRAWL_LIMITS": "",
        "SCHEDSITE_URL": sched_site.url,
    }
    saved = environ.apply(env)
    _reload()
    try:
        yield env
    finally:
        environ.restore(saved)
        _reload()


def worker_cmd(name: str, pool: str, concurrency: int, queues: str) -> list[str]:
    return [
        sys.executable, "-m", "celery", "-A", "worker", "worker",
        "-P", pool, "-c", str(concurrency), "-Q", queues, "-n", f"{name}@%h",
        "--include", "scheduling.tasks",
        "--without-gossip", "--without-mingle", "-E", "-l", "INFO",
    ]  # fmt: skip


@pytest.fixture
def start_workers(sched_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., list[Proc]]]:
    """start_workers(n, pool=, concurrency=, **env): n worker processes, started in parallel."""
    procs: list[Proc] = []

    def start(
        n: int = 1, pool: str = DEFAULT_POOL, concurrency: int = 8, queues: str = QUEUES, **env: Any
    ) -> list[Proc]:
        batch = []
        for _ in range(n):
            name = f"w{len(procs)}"
            p = Proc(worker_cmd(name, pool, concurrency, queues), {**sched_env, **env},
                     tmp_path / f"{name}.log")  # fmt: skip
            procs.append(p)
            batch.append(p)
        for p in batch:
            p.wait_ready()
        return batch

    try:
        yield start
    finally:
        for p in procs:  # warm shutdowns in parallel
            if p.proc.poll() is None:
                p.proc.send_signal(signal.SIGTERM)
        for p in procs:
            p.stop()


@pytest.fixture
def start_beat(sched_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[[Path], Proc]]:
    procs: list[Proc] = []

    def start(schedule: Path) -> Proc:
        cmd = [sys.executable, "-m", "cli.beat", "--schedule", str(schedule),
               "--loglevel", "INFO"]  # fmt: skip
        p = Proc(cmd, sched_env, tmp_path / f"beat{len(procs)}.log")
        p.ready_marker = b"beat: Starting"
        procs.append(p)
        return p.wait_ready()

    try:
        yield start
    finally:
        for p in procs:
            p.stop()
