"""The provider's prepare/feedback cycle end to end through real proxies, with `requests`; on
one Redis and on a Redis Cluster (`[cluster]`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import redis

from config import reset_settings
from demo.proxy_farm import ForwardProxy, TargetSite
from exceptions import ResourceUnavailable
from external_interface.resources.base import Outcome, OutgoingRequest, providers
from external_interface.resources.proxy import (
    ChannelProxyProvider,
    RotationProxyProvider,
    avoided_proxies,
    reset_providers,
)
from external_interface.resources.proxy.models import ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from settings.proxy import ProxySettings, reset_proxy_settings
from tests.external_interface.proxy_fixtures import ProxyFactory, Task, fetch
from tests.external_interface.stores import rds_on_both_stores  # noqa: F401 - fixture `rds`
from utils.redis import reset_clients

# the retries here are told apart by the channel's least-used order, kept within a sub-pool
pytestmark = pytest.mark.usefixtures("one_part")


def admit(pool: GlobalPool, *ps: ForwardProxy) -> None:
    for p in ps:
        pool.admit(ProxyAddress.parse(p.url), 0.05)


@pytest.fixture
def site(key_prefix: str) -> str:
    return f"shop-{key_prefix}"


@pytest.fixture
def provider(
    rds: redis.Redis, key_prefix: str, proxy_settings: ProxySettings, site: str
) -> ChannelProxyProvider:
    return ChannelProxyProvider(site, "demo", rds=rds, prefix=key_prefix, settings=proxy_settings)


def test_prepare_feedback_through_a_real_proxy(
    provider: ChannelProxyProvider,
    proxies: ProxyFactory,
    target_site: TargetSite,
    site: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    p = proxies.with_auth("crawler", "hunter2")
    admit(provider.pool, p)
    task = Task(site)

    req, outcome = fetch(provider, task, target_site.url(f"/site/{site}"))

    assert outcome.ok and outcome.text_sample == f"welcome to {site}"
    assert req.proxy == p.url and req.leases == {"proxy": p.id}
    assert target_site.hits[(f"/site/{site}", p.host)] == 1  # the site saw the proxy's address
    assert provider.pool.score(p.id) == 6
    info = provider.pool.info(p.id)
    assert info is not None and info.speed is not None and info.speed < 1
    assert provider.channel.idle() == [(p.id, 1)]  # returned, one use
    assert task.avoid == set()
    assert "hunter2" not in caplog.text


def test_a_refused_proxy_is_dropped_and_the_retry_gets_another(
    provider: ChannelProxyProvider, proxies: ProxyFactory, target_site: TargetSite, site: str
) -> None:
    good, doomed = proxies.healthy(2)
    admit(provider.pool, good, doomed)
    provider.channel.refill()
    provider.pool.rds.hset(provider.channel.k_uses, good.id, 3)
    provider.pool.rds.zadd(provider.channel.k_idle, {good.id: 3})
    proxies.stop(doomed)
    task = Task(site)

    req1, out1 = fetch(provider, task, target_site.url(f"/site/{site}"))
    assert req1.leases["proxy"] == doomed.id and not out1.ok
    assert task.avoid == {f"proxy:{doomed.id}"}
    assert doomed.id not in provider.pool
    assert doomed.id not in provider.channel.members()

    req2, out2 = fetch(provider, task, target_site.url(f"/site/{site}"))
    assert req2.leases["proxy"] == good.id and out2.ok


def test_a_timed_out_proxy_stays_pooled_but_the_retry_avoids_it(
    provider: ChannelProxyProvider, proxies: ProxyFactory, target_site: TargetSite, site: str
) -> None:
    slow = proxies.slow(delay=2.5)
    fast = proxies.healthy(1)[0]
    admit(provider.pool, slow, fast)
    provider.channel.refill()
    provider.pool.rds.hset(provider.channel.k_uses, fast.id, 3)
    provider.pool.rds.zadd(provider.channel.k_idle, {fast.id: 3})
    task = Task(site)

    req1, out1 = fetch(provider, task, target_site.url(f"/site/{site}"), timeout=1.0)
    assert req1.leases["proxy"] == slow.id and out1.error is not None
    assert provider.pool.score(slow.id) == 4  # timeout: -1
    assert (slow.id, 1) in provider.channel.idle()  # back in the channel, still least used...
    req2, out2 = fetch(provider, task, target_site.url(f"/site/{site}"))
    assert req2.leases["proxy"] == fast.id and out2.ok  # ...yet the retry does not get it
    assert avoided_proxies(task) == {slow.id}


def test_a_site_ban_rotates_without_touching_the_score(
    provider: ChannelProxyProvider,
    proxies: ProxyFactory,
    target_site: TargetSite,
    site: str,
    rds: redis.Redis,
    key_prefix: str,
    proxy_settings: ProxySettings,
) -> None:
    a, b = proxies.healthy(2)
    admit(provider.pool, a, b)
    target_site.ban(site, a.host)
    target_site.ban(site, b.host)
    task = Task(site)
    _, out1 = fetch(provider, task, target_site.url(f"/site/{site}"))
    _, out2 = fetch(provider, task, target_site.url(f"/site/{site}"))
    assert out1.status == out2.status == 403
    assert avoided_proxies(task) == {a.id, b.id}
    assert sorted(provider.channel.banned()) == sorted([a.id, b.id])
    with pytest.raises(ResourceUnavailable):
        fetch(provider, task, target_site.url(f"/site/{site}"))
    assert provider.pool.score(a.id) == provider.pool.score(b.id) == 5
    # another site is not affected
    other_site = f"news-{key_prefix}"
    other = ChannelProxyProvider(other_site, rds=rds, prefix=key_prefix, settings=proxy_settings)
    _, out = fetch(other, Task(other_site), target_site.url(f"/site/{other_site}"))
    assert out.ok


def test_empty_pool_means_wait(provider: ChannelProxyProvider, site: str) -> None:
    with pytest.raises(ResourceUnavailable) as err:
        provider.prepare(OutgoingRequest("GET", "http://x/"), Task(site))
    assert err.value.retry_after > 0


def test_feedback_reaches_the_lease_through_another_instance(
    provider: ChannelProxyProvider,
    proxies: ProxyFactory,
    target_site: TargetSite,
    site: str,
    rds: redis.Redis,
    key_prefix: str,
    proxy_settings: ProxySettings,
) -> None:
    [p] = proxies.healthy(1)
    admit(provider.pool, p)
    req = OutgoingRequest("GET", target_site.url(f"/site/{site}"))
    provider.prepare(req, Task(site))
    twin = ChannelProxyProvider(site, rds=rds, prefix=key_prefix, settings=proxy_settings)
    twin.feedback(req, Outcome(0.1, status=200), Task(site))
    assert provider.channel.idle() == [(p.id, 1)] and provider.channel.lent() == []


def test_round_robin_provider_spreads_requests(
    rds: redis.Redis,
    key_prefix: str,
    proxy_settings: ProxySettings,
    proxies: ProxyFactory,
    target_site: TargetSite,
    site: str,
) -> None:
    prov = RotationProxyProvider(
        site, strategy="robin", rds=rds, prefix=key_prefix, settings=proxy_settings
    )
    ps = proxies.healthy(3)
    admit(prov.pool, *ps)
    for _ in range(6):
        assert fetch(prov, Task(site), target_site.url(f"/site/{site}"))[1].ok
    assert [target_site.hits[(f"/site/{site}", p.host)] for p in ps] == [2, 2, 2]
    assert all(prov.pool.score(p.id) == 7 for p in ps)


def test_greedy_provider_sticks_to_a_fast_proxy(
    rds: redis.Redis,
    key_prefix: str,
    proxy_settings: ProxySettings,
    proxies: ProxyFactory,
    target_site: TargetSite,
    site: str,
) -> None:
    settings = proxy_settings.model_copy(update={"fast_response": 0.5})
    prov = RotationProxyProvider(
        site, strategy="greedy", rds=rds, prefix=key_prefix, settings=settings
    )
    slowish = proxies.slow(delay=0.7)  # answers, but slower than fast_response
    fast = proxies.healthy(2)
    admit(prov.pool, slowish, *fast)
    prov.pool.rds.zadd(prov.pool.keys.speed, {slowish.id: 0.01})  # looks fastest: goes first
    used = [
        fetch(prov, Task(site), target_site.url(f"/site/{site}"))[0].leases["proxy"]
        for _ in range(5)
    ]
    assert used[0] == slowish.id  # tried once, too slow: sent to the back
    assert len(set(used[1:])) == 1 and used[1] != slowish.id  # then one fast proxy, greedily


@pytest.fixture
def env(
    monkeypatch: pytest.MonkeyPatch,
    store_url: str,
    redis_url: str,
    key_prefix: str,
    target_site: TargetSite,
) -> Iterator[None]:
    monkeypatch.setenv("CHAINCRAWL_REDIS_URL", store_url)
    if store_url != redis_url:  # a cluster cannot be the broker: the one Redis is (unused here)
        monkeypatch.setenv("CHAINCRAWL_BROKER_URL", redis_url)
    monkeypatch.setenv("CHAINCRAWL_KEY_PREFIX", key_prefix)
    monkeypatch.setenv("CHAINCRAWL_PROXY_CHECK_URL", target_site.url("/headers"))
    for reset in (reset_settings, reset_clients, reset_proxy_settings, reset_providers):
        reset()
    yield
    monkeypatch.undo()
    for reset in (reset_settings, reset_clients, reset_proxy_settings, reset_providers):
        reset()


@pytest.mark.usefixtures("env")
def test_registered_under_proxy(
    proxies: ProxyFactory, target_site: TargetSite, site: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prov = providers.get("proxy")(site, "demo")
    assert isinstance(prov, ChannelProxyProvider)
    assert providers.get("proxy")(site, "demo") is prov  # one per site and process
    assert isinstance(providers.get("proxy_greedy")(site, "demo"), RotationProxyProvider)
    [p] = proxies.healthy(1)
    admit(prov.pool, p)
    assert fetch(prov, Task(site), target_site.url(f"/site/{site}"))[1].ok
    monkeypatch.setenv("CHAINCRAWL_PROXY_MODE", "robin")
    reset_proxy_settings()
    assert isinstance(providers.get("proxy")(site, "other"), RotationProxyProvider)


def test_with_the_real_fetch_layer(
    provider: ChannelProxyProvider, proxies: ProxyFactory, target_site: TargetSite, site: str
) -> None:
    """The fetch layer's typed errors (ProxyError, FetchTimeout) reach the right rules."""
    fetch_layer = pytest.importorskip("external_interface.fetch")
    good, slow, doomed = *proxies.healthy(1), proxies.slow(delay=2.0), proxies.healthy(1)[0]
    admit(provider.pool, good, slow, doomed)
    proxies.stop(doomed)
    fetcher = fetch_layer.RequestsFetcher()
    task = Task(site)
    seen = {}
    for _ in range(3):
        req = OutgoingRequest("GET", target_site.url(f"/site/{site}"))
        provider.prepare(req, task)
        t0 = time.monotonic()
        try:
            resp = fetcher.fetch(
                fetch_layer.FetchRequest("GET", req.url, proxy=req.proxy, timeout=1.0)
            )
            outcome = Outcome(resp.elapsed, status=resp.status)
        except Exception as exc:
            outcome = Outcome(time.monotonic() - t0, error=exc)
        provider.feedback(req, outcome, task)
        seen[req.leases["proxy"]] = outcome
    assert set(seen) == {good.id, slow.id, doomed.id}  # each attempt avoided the failed ones
    assert seen[good.id].ok and provider.pool.score(good.id) == 6
    assert type(seen[slow.id].error).__name__ == "FetchTimeout"
    assert provider.pool.score(slow.id) == 4
    assert type(seen[doomed.id].error).__name__ == "ProxyError"
    assert doomed.id not in provider.pool
    assert avoided_proxies(task) == {slow.id, doomed.id}
