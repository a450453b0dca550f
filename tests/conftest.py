"""Shared fixtures: a private redis-server per test session, never the machine's shared one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from utils.servers import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on a free port with its own data dir; stopped at session end."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendonly=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def key_prefix() -> str:
    """A fresh key prefix per test, so tests sharing the session server never see each other."""
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def rds(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def amqp_broker() -> Iterator[str]:
    """The URL of a private RabbitMQ vhost (`tests/amqp.py`), deleted after the test; skips
    where RabbitMQ is not reachable."""
    from tests.amqp import private_vhost

    with private_vhost() as url:
        yield url
