"""Shared fixtures: a private redis-server per test session, never the machine's shared one;
and the `extended` mark on the tests `tests/extended.txt` lists (out of the quick default run)."""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

import sites
from config import ROOT, Settings, get_settings, reset_settings, settings_classes
from lifecycle import runtime
from settings import base as settings_base
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


EXTENDED = Path(__file__).with_name("extended.txt")


def extended_entries(text: str) -> list[str]:
    """The node ids (or their prefixes: a module, a test with every parameter) of a list in
    the form of `tests/extended.txt`; `#` starts a comment."""
    return [e for e in (line.split("#", 1)[0].strip() for line in text.splitlines()) if e]


def matches(nodeid: str, entry: str) -> bool:
    """`entry` names the test `nodeid`, one of its parameters, or its module or folder."""
    return nodeid == entry or nodeid.startswith(
        (entry + "::", entry + "[", entry.rstrip("/") + "/")
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `extended` the tests tests/extended.txt lists, except one named on the command line
    (`path::test` runs whatever its list). An entry that names nothing in a module collected
    whole is an error: a renamed test must not slip back into the quick run unnoticed."""
    entries = extended_entries(EXTENDED.read_text())
    named = [str(a) for a in config.args if "::" in str(a)]  # tests named on the command line
    used: set[str] = set()
    for item in items:
        hit = next((e for e in entries if matches(item.nodeid, e)), None)
        if hit is not None:
            used.add(hit)
            slow = item.get_closest_marker("slow") is not None  # its own run, -m slow
            if not slow and not any(matches(item.nodeid, n) for n in named):  # named: as asked
                item.add_marker(pytest.mark.extended)
    if config.option.keyword or named:
        return  # part of a module collected: its other tests are not here to match
    collected = {item.nodeid.split("::")[0] for item in items}
    stale = [e for e in entries if e not in used and e.split("::")[0] in collected]
    if stale:
        raise pytest.UsageError(f"{EXTENDED.name} names tests that do not exist: {stale}")


@pytest.fixture(scope="session", autouse=True)
def _testsite_endpoints() -> None:
    """Every test sees the sites' endpoints and the test site's (no servers are started)."""
    if "tests.testsite" not in get_settings().extra_site_packages:
        os.environ["CHAINCRAWL_EXTRA_SITE_PACKAGES"] = "tests.testsite"
        reset_settings()
    sites.load_all()


# the variables the settings read: CHAINCRAWL_* and the plain names some fields also take
_SETTINGS_VARS = frozenset(
    n for cls in settings_classes() for names in cls.env_names().values() for n in names
)


def _settings_var(name: str) -> bool:
    return name.startswith(settings_base.PREFIX) or name in _SETTINGS_VARS


@pytest.fixture
def process_settings(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Settings]:
    """The process's settings (every part of a page reads them) on this test's Redis and key
    prefix, with `CHAINCRAWL_<NAME>=value` overrides: `process_settings(MAX_REDELIVERIES="2")`.
    Put back after the test (monkeypatch's undo, then `_process_settings_restored`)."""

    def use(**env: str) -> Settings:
        base = {"REDIS_URL": redis_url, "BROKER_URL": redis_url, "KEY_PREFIX": key_prefix}
        for k, v in {**base, **env}.items():
            monkeypatch.setenv(f"{settings_base.PREFIX}{k}", v)
        reset_settings()
        return get_settings()

    return use


@pytest.fixture(autouse=True)
def _process_settings_restored() -> Iterator[None]:
    """Each test leaves the process's settings as it found them: the settings variables, the
    cached settings objects (`get_settings()`, each area's `current()`) and the runtime
    (`lifecycle.runtime.current()`) are put back after it. A test that pointed them elsewhere
    and did not undo it (a `reset_settings()` after changing the environment, a runtime
    installed) made every later test in its process run on that. What a session or module
    fixture set before the test is what is put back, so those stay in force for their scope.
    A few microseconds a test: the environment is compared as its raw mapping, and decoded
    only when the test changed it."""
    raw = dict(os.environ._data)  # type: ignore[attr-defined]
    cached = dict(settings_base._current)
    rt = runtime._current
    yield
    if os.environ._data != raw:  # type: ignore[attr-defined]
        decoded = ((os.fsdecode(k), os.fsdecode(v)) for k, v in raw.items())
        environ = {k: v for k, v in decoded if _settings_var(k)}
        for k in [k for k in os.environ if _settings_var(k) and k not in environ]:
            del os.environ[k]
        os.environ.update(environ)
    settings_base._current.clear()
    settings_base._current.update(cached)
    runtime._current = rt


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


@pytest.fixture
def checkout_files() -> Iterator[None]:
    """The checkout's own files to themselves: the new-site tests write a site into `sites/`
    and remove it, the tests that read every file of the checkout (the line limit, the import
    graph, the environment scans, the packaging's copy) would meet it half written or gone.
    One holder at a time across every pytest worker of the checkout (`./control.sh test` runs 3)."""
    path = ROOT / "var" / "checkout-files.lock"
    path.parent.mkdir(exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes
        yield
