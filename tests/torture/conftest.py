"""Torture-suite fixtures: a private Redis per test, the process pointed at it, worker fleets,
and a report of the figures (kills survived, items checked, duplicates) at the end of the run.

Sizes: every crash test is parametrized with `SIZES`; `short` runs in CI's extended run
(`integration`, listed in tests/extended.txt), `long` only on demand (`slow`); the default
`-m 'not slow and not extended'` runs neither:

    ./control.sh test -m extended tests/torture     # short versions
    ./control.sh test -m slow tests/torture         # long versions
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.torture.harness import Fleet, base_env, process_env
from utils.servers import RedisClusterServer, RedisServer

# name -> figures; printed in the terminal summary and appended to $TORTURE_REPORT (JSON lines)
REPORTS: dict[str, dict[str, Any]] = {}


def sizes(short: Any, long: Any, timeouts: tuple[float, float] = (600, 3600)) -> list[Any]:
    """Parameters for a short (CI) and a long (on demand) version of one test, each with a
    pytest-timeout of its own (the default 300 s is too short for a long torture)."""
    return [
        pytest.param(
            short, id="short", marks=[pytest.mark.integration, pytest.mark.timeout(timeouts[0])]
        ),
        pytest.param(long, id="long", marks=[pytest.mark.slow, pytest.mark.timeout(timeouts[1])]),
    ]


def broker_env(broker: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """The worker settings for a test's broker: "redis" (the torture's private Redis, the
    default), "amqp" (a private RabbitMQ vhost, `amqp_broker`; run state, outbox and items
    stay in the Redis) or "cluster" (the broker is the private Redis, the state store a
    Redis Cluster of the test's own: `torture_factory(cluster=True)`, see `on_cluster`)."""
    if broker == "amqp":
        return {"CHAINCRAWL_BROKER_URL": request.getfixturevalue("amqp_broker")}
    return {}


def report(name: str, **figures: Any) -> None:
    REPORTS[name] = {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), **figures}
    path = os.environ.get("TORTURE_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": name, **REPORTS[name]}, default=str) + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not REPORTS:
        return
    terminalreporter.section("torture report")
    for name, figures in REPORTS.items():
        terminalreporter.write_line(f"{name}: {json.dumps(figures, default=str)}")


def on_cluster(broker: str) -> bool:
    """Whether a test's broker parameter puts the state store on a Redis Cluster."""
    return broker == "cluster"


@dataclass
class Torture:
    """One test's private world: its Redis, its var dir, the environment its workers get;
    with `cluster`, the state store is that Redis Cluster and the Redis only the broker."""

    redis: RedisServer
    env: dict[str, str]
    var: Path
    logs: Path
    prefix: str
    cluster: RedisClusterServer | None = None

    @property
    def items(self) -> Path:
        return self.var / "items"


@pytest.fixture
def torture_factory(
    tmp_path: Path,
) -> Iterator[Callable[..., Torture]]:
    """Build a private world: `torture_factory(password=None, cluster=False, **env)`; applies
    it to this process too (settings, clients, the Celery app) until the test ends.

    `cluster=True`: the state store (`CHAINCRAWL_REDIS_URL`) is a Redis Cluster of the
    world's own (3 masters, a replica each, free ports), the private Redis stays the broker:
    the sweeper and the unacked-owner restorer need a Redis broker."""
    stack: list[tuple[Any, Any, RedisClusterServer | None]] = []

    def make(password: str | None = None, cluster: bool = False, **extra: str) -> Torture:
        root = tmp_path / f"w{len(stack)}"
        server = RedisServer(root / "redis", appendonly=True, password=password).start()
        nodes: RedisClusterServer | None = None
        if cluster:
            try:
                nodes = RedisClusterServer(root / "cluster", password=password).start()
            except BaseException:
                server.kill()
                raise
            extra = {"CHAINCRAWL_REDIS_URL": nodes.url, **extra}
        var, logs = root / "var", root / "logs"
        var.mkdir(parents=True)
        logs.mkdir()
        prefix = f"tt{uuid.uuid4().hex[:6]}"
        env = base_env(server.url, var, prefix, **extra)
        ctx = process_env(env)
        try:
            ctx.__enter__()
        except BaseException:
            server.kill()
            if nodes is not None:
                nodes.stop()
            raise
        stack.append((server, ctx, nodes))
        return Torture(server, env, var, logs, prefix, nodes)

    try:
        yield make
    finally:
        for server, ctx, nodes in reversed(stack):
            ctx.__exit__(None, None, None)
            server.kill()
            if nodes is not None:
                nodes.stop()


@pytest.fixture
def fleets() -> Iterator[Callable[..., Fleet]]:
    """`fleets(torture, **worker_options)` -> a Fleet stopped at the end of the test."""
    made: list[Fleet] = []

    def make(t: Torture, env: dict[str, str] | None = None, **options: Any) -> Fleet:
        f = Fleet({**t.env, **(env or {})}, t.logs, **options)
        made.append(f)
        return f

    try:
        yield make
    finally:
        for f in made:
            f.stop()
