"""Fixtures for the proxy tests: a farm of real proxies, a target site, a pool on the test Redis.

Loaded by `tests/external_interface/conftest.py`. Proxies are started per test on fresh 127.0.0.x
addresses and always stopped, even when the test fails.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import redis
import requests

from demo.proxy_farm import (
    ForwardProxy,
    ProxyFarm,
    TargetSite,
    dead_address,
)
from external_interface.resources.base import Outcome, OutgoingRequest
from external_interface.resources.proxy.pool import GlobalPool
from settings.proxy import ProxySettings


@dataclass(frozen=True)
class DeadProxy:
    """An address with nothing listening, shaped like a ForwardProxy for the tests."""

    host: str
    port: int

    @property
    def id(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass
class Task:
    """A stand-in for base_task's context (the TaskState protocol)."""

    site: str
    platform: str = "demo"
    task_name: str = "demo.page"
    avoid: set[str] = field(default_factory=set)


def fetch(
    provider: object, task: Task, url: str, timeout: float = 1.5
) -> tuple[OutgoingRequest, Outcome]:
    """What the fetch layer does around one request."""
    req = OutgoingRequest("GET", url)
    provider.prepare(req, task)  # type: ignore[attr-defined]
    t0 = time.monotonic()
    try:
        with requests.Session() as s:
            s.trust_env = False
            proxies = {"http": req.proxy, "https": req.proxy}  # None: direct
            r = s.get(req.url, proxies=proxies, timeout=timeout)  # type: ignore[arg-type]
        outcome = Outcome(time.monotonic() - t0, status=r.status_code, text_sample=r.text[:100])
    except requests.RequestException as exc:
        outcome = Outcome(time.monotonic() - t0, error=exc)
    provider.feedback(req, outcome, task)  # type: ignore[attr-defined]
    return req, outcome


class ProxyFactory:
    """Starts proxies of each kind for one test and stops them all at its end."""

    def __init__(self, farm: ProxyFarm) -> None:
        self.farm = farm
        self.started: list[ForwardProxy] = []

    def healthy(self, n: int = 1, **options: object) -> list[ForwardProxy]:
        return [self._add(**options) for _ in range(n)]

    def slow(self, delay: float = 3.0) -> ForwardProxy:
        return self._add(delay=delay)

    def transparent(self) -> ForwardProxy:
        return self._add(transparent=True)

    def with_auth(self, user: str = "crawler", password: str = "s3cr:t@pass") -> ForwardProxy:
        return self._add(auth=(user, password))

    def dead(self) -> DeadProxy:
        return DeadProxy(*dead_address())

    def stop(self, proxy: ForwardProxy) -> None:
        """Close a running proxy's port, making it a dead proxy."""
        self.farm.stop_proxy(proxy)

    def _add(self, **options: object) -> ForwardProxy:
        proxy = self.farm.add_proxy(**options)  # type: ignore[arg-type]
        self.started.append(proxy)
        return proxy

    def stop_all(self) -> None:
        for p in self.started:
            self.farm.stop_proxy(p)
        self.started.clear()


@pytest.fixture(scope="session")
def proxy_farm() -> Iterator[ProxyFarm]:
    farm = ProxyFarm().start()
    try:
        yield farm
    finally:
        farm.stop()


@pytest.fixture(scope="session")
def target_site(proxy_farm: ProxyFarm) -> TargetSite:
    """The echo/listing site (stand-in for the demo platform), stopped with the farm."""
    return proxy_farm.add_site()


@pytest.fixture
def proxies(proxy_farm: ProxyFarm) -> Iterator[ProxyFactory]:
    factory = ProxyFactory(proxy_farm)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def proxy_settings(target_site: TargetSite) -> ProxySettings:
    """Settings pointing the validators at the test site, with short timeouts."""
    return ProxySettings(
        check_url=target_site.url("/headers"),
        check_timeout=1.5,
        validate_workers=8,
        refill_interval=0.0,
    )


@pytest.fixture
def pool(rds: redis.Redis, key_prefix: str, proxy_settings: ProxySettings) -> GlobalPool:
    return GlobalPool(rds, key_prefix, proxy_settings)
