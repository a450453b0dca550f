"""Torture-suite fixtures: a private Redis per test, the process pointed at it, worker fleets,
and a report of the figures (kills survived, items checked, duplicates) at the end of the run.

Sizes: every crash test is parametrized with `SIZES`; `short` runs in CI (`integration`),
`long` only on demand (`slow`, excluded by the default `-m 'not slow'`):

    ./control.sh test tests/torture                 # short versions
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
from utils.servers import RedisServer

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
    default) or "amqp" (a private RabbitMQ vhost, `amqp_broker`; run state, outbox and items
    stay in the Redis)."""
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


@dataclass
class Torture:
    """One test's private world: its Redis, its var dir, the environment its workers get."""

    redis: RedisServer
    env: dict[str, str]
    var: Path
    logs: Path
    prefix: str

    @property
    def items(self) -> Path:
        return self.var / "items"


@pytest.fixture
def torture_factory(
    tmp_path: Path,
) -> Iterator[Callable[..., Torture]]:
    """Build a private world: `torture_factory(password=None, **env)`; applies it to this
    process too (settings, clients, the Celery app) until the test ends."""
    stack: list[Any] = []

    def make(password: str | None = None, **extra: str) -> Torture:
        root = tmp_path / f"w{len(stack)}"
        server = RedisServer(root / "redis", appendonly=True, password=password).start()
        var, logs = root / "var", root / "logs"
        var.mkdir(parents=True)
        logs.mkdir()
        prefix = f"tt{uuid.uuid4().hex[:6]}"
        env = base_env(server.url, var, prefix, **extra)
        ctx = process_env(env)
        ctx.__enter__()
        stack.append((server, ctx))
        return Torture(server, env, var, logs, prefix)

    try:
        yield make
    finally:
        for server, ctx in reversed(stack):
            ctx.__exit__(None, None, None)
            server.kill()


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
