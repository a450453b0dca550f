"""Against the real demo platform: harvest its proxy list, validate on its /headers page, and
see its per-IP rate limit count each proxy as a different client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import requests

from external_interface.resources.proxy import ChannelProxyProvider
from external_interface.resources.proxy.sources import PageSource, harvest
from external_interface.resources.proxy.validate import ProxyValidator
from settings.proxy import ProxySettings
from tests.external_interface.proxy_fixtures import ProxyFactory, Task, fetch

demo_testing = pytest.importorskip("demo.testing")

# the demo's per-address budget is spent evenly by the channel's least-used order, which
# holds within a sub-pool
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_part")]

BUDGET = 4  # requests per IP per window before the demo answers 429


@pytest.fixture
def demo_with_proxies(proxies: ProxyFactory) -> Iterator[tuple[object, dict[str, list]]]:
    kinds: dict[str, list] = {
        "good": proxies.healthy(3),
        "leaky": [proxies.transparent()],
        "dead": [proxies.dead()],
    }
    listed = [p.id for group in kinds.values() for p in group]
    server = demo_testing.DemoServer(
        size="tiny",
        features=["rate_limit"],
        rate_limit_requests=BUDGET,
        rate_limit_window_s=120,
        rate_limit_ban_after=0,
        proxies=listed,
    )
    with server:
        yield server, kinds


def test_harvest_validate_and_crawl_the_demo(
    demo_with_proxies: tuple[object, dict[str, list]],
    rds: redis.Redis,
    key_prefix: str,
) -> None:
    demo, kinds = demo_with_proxies
    base = demo.url  # type: ignore[attr-defined]
    settings = ProxySettings(check_url=f"{base}/headers", check_timeout=2, refill_interval=0)
    site = "demonews"
    provider = ChannelProxyProvider(site, "pc", rds=rds, prefix=key_prefix, settings=settings)
    pool = provider.pool

    # 127.0.0.1 spends 2 requests here (page 1, page 2 -> 404) ...
    assert harvest(pool, [PageSource(f"{base}/proxies?page={{page}}")])["queued"] == 5
    # ... and 1 more learning its own address; each proxy spends 1 on its validation
    counts = ProxyValidator(pool).validate_new()
    assert counts["admitted"] == 3
    assert counts["dropped_transparent"] == 1 and counts["dropped_dead"] == 1
    assert sorted(pool.ids()) == sorted(p.id for p in kinds["good"])

    # every proxy has BUDGET - 1 requests left, and the demo counts them apart
    task = Task(site, "pc")
    for _ in range(3 * (BUDGET - 1)):
        req, out = fetch(provider, task, f"{base}/pc/feed", timeout=3)
        assert out.status == 200, (req.leases, out)
    assert provider.channel.idle() == sorted(
        [(p.id, BUDGET - 1) for p in kinds["good"]], key=lambda x: x[0]
    )
    # the next request through any of them is limited: the proxy leaves this site's channel
    req, out = fetch(provider, task, f"{base}/pc/feed", timeout=3)
    assert out.status == 429
    banned = req.leases["proxy"]
    assert provider.channel.banned() == [banned] and f"proxy:{banned}" in task.avoid
    # 5 + 3 successes; the site's limit says nothing about the proxy's health
    assert pool.score(banned) == 5 + (BUDGET - 1)
    # while 127.0.0.1 itself still has budget left: the limits really are per proxy address
    with requests.Session() as s:
        s.trust_env = False
        assert s.get(f"{base}/pc/feed", timeout=3).status_code == 200
