"""Shared fixtures: a private redis-server per test session, never the machine's shared one."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

import sites
from config import get_settings, reset_settings
from tests.polite_site import PoliteSite
from utils.servers import RedisClusterServer, RedisServer

# The polite defaults (default per-site limits, the adaptive throttle, robots.txt, the cap on
# renders per site) would pace every crawl of the local test sites; the tests of politeness
# turn them on where they need them (tests/scheduling/test_throttle*.py,
# tests/external_interface/fetch/test_robots.py, tests/scheduling/test_render_scope.py). Workers
# and control.sh inherit this environment.
for _name in (
    "CHAINCRAWL_DEFAULT_LIMITS",
    "CHAINCRAWL_THROTTLE",
    "CHAINCRAWL_ROBOTS",
    "CHAINCRAWL_BROWSER_SITE_LIMIT",
):
    os.environ.setdefault(_name, "off")


@pytest.fixture(scope="session", autouse=True)
def _testsite_endpoints() -> None:
    """Every test sees the sites' endpoints and the test site's (no servers are started)."""
    if "tests.testsite" not in get_settings().extra_site_packages:
        os.environ["CHAINCRAWL_EXTRA_SITE_PACKAGES"] = "tests.testsite"
        reset_settings()
    sites.load_all()


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
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    """A real Redis Cluster (3 masters, 1 replica each) on free ports; stopped at session end.
    Tests that kill a node start their own (`RedisClusterServer` in a `with` block)."""
    with RedisClusterServer(tmp_path_factory.mktemp("cluster")) as server:
        yield server


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


@pytest.fixture(scope="session")
def polite_site() -> Iterator[PoliteSite]:
    """The politeness tests' local site (tests/polite_site.py): robots.txt, sitemaps, 429s."""
    site = PoliteSite()
    site.start()
    try:
        yield site
    finally:
        site.stop()
