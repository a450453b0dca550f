"""Validators against real proxies: first validation, re-scoring, per-site checks."""

from __future__ import annotations

import logging
import time

import pytest

from demo.proxy_farm import ForwardProxy, TargetSite
from external_interface.resources.proxy.channel import ChannelPool
from external_interface.resources.proxy.models import Event, ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.proxy.validate import (
    CheckPageDown,
    ProxyChecker,
    ProxyValidator,
    SiteValidator,
    leaks,
)
from tests.external_interface.proxy_fixtures import DeadProxy, ProxyFactory
from tests.external_interface.stores import rds_on_both_stores  # noqa: F401 - fixture `rds`


def test_first_validation_keeps_only_anonymous_live_proxies(
    pool: GlobalPool, proxies: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    good = proxies.healthy(2)
    secret = proxies.with_auth("crawler", "hunter2")
    slow = proxies.slow(delay=3.0)  # slower than check_timeout (1.5 s)
    leaky = proxies.transparent()
    dead = proxies.dead()
    every: list[ForwardProxy | DeadProxy] = [*good, secret, slow, leaky, dead]
    assert pool.add_raw([p.url for p in every]) == 6
    assert pool.add_raw([good[0].url]) == 0  # already queued

    counts = ProxyValidator(pool).validate_new()

    assert counts == {
        "checked": 6,
        "admitted": 3,
        "dropped_transparent": 1,
        "dropped_timeout": 1,
        "dropped_dead": 1,
    }
    assert sorted(pool.ids()) == sorted(p.id for p in (*good, secret))
    assert all(pool.score(p.id) == 5 for p in (*good, secret))
    assert pool.urls([secret.id]) == {secret.id: secret.url}  # credentials kept for use...
    assert "hunter2" not in caplog.text  # ...but never logged
    assert pool.urls([leaky.id, dead.id, slow.id]) == {}
    assert pool.raw_count() == 0
    assert pool.stats()["dropped_transparent"] == 1
    info = pool.info(good[0].id)
    assert info is not None and info.speed is not None and 0 < info.speed < 1.5


def test_proxies_reach_the_site_from_their_own_address(
    pool: GlobalPool, proxies: ProxyFactory, target_site: TargetSite
) -> None:
    a, b = proxies.healthy(2)
    checker = ProxyChecker(target_site.url("/headers"), 2.0)
    for p in (a, b):
        assert checker.check(ProxyAddress.parse(p.url)).event is Event.SUCCESS
        assert target_site.hits[("/headers", p.host)] == 1


def test_revalidation_rescores(pool: GlobalPool, proxies: ProxyFactory) -> None:
    steady, dying, slowing, turning = proxies.healthy(4)
    pool.add_raw([p.url for p in (steady, dying, slowing, turning)])
    ProxyValidator(pool).validate_new()
    assert len(pool) == 4
    proxies.stop(dying)  # port closed: refused from now on
    slowing.delay = 3.0
    turning.transparent = True

    counts = ProxyValidator(pool).revalidate(older_than=0)

    assert counts["checked"] == 4 and counts["removed"] == 2
    assert pool.score(steady.id) == 6
    assert pool.score(slowing.id) == 4
    assert dying.id not in pool and turning.id not in pool
    assert pool.stats()["removed_dead"] == 1 and pool.stats()["removed_transparent"] == 1


def test_revalidation_takes_the_stalest_first(pool: GlobalPool, proxies: ProxyFactory) -> None:
    old, new = proxies.healthy(2)
    now = time.time()
    pool.admit(ProxyAddress.parse(old.url), 0.1, now=now - 600)
    pool.admit(ProxyAddress.parse(new.url), 0.1, now=now - 300)
    assert pool.stalest(60, 10) == [old.id, new.id]
    ProxyValidator(pool).revalidate(limit=1, older_than=60)
    assert pool.score(old.id) == 6 and pool.score(new.id) == 5
    assert pool.stalest(60, 10) == [new.id]


def test_long_unvalidated_proxies_are_dropped(pool: GlobalPool, proxies: ProxyFactory) -> None:
    [p] = proxies.healthy(1)
    pool.admit(ProxyAddress.parse(p.url), 0.1, now=time.time() - 4000)
    counts = ProxyValidator(pool).revalidate(limit=0, older_than=60)
    assert counts["removed"] == 1 and p.id not in pool


def test_a_down_check_page_blames_no_proxy(pool: GlobalPool, proxies: ProxyFactory) -> None:
    [p] = proxies.healthy(1)
    pool.admit(ProxyAddress.parse(p.url), 0.1, now=time.time() - 300)
    dead_page = proxies.dead()
    checker = ProxyChecker(f"http://{dead_page.id}/headers", 1.0)
    with pytest.raises(CheckPageDown):
        ProxyValidator(pool, checker).revalidate(older_than=0)
    assert pool.score(p.id) == 5


def test_leak_detection() -> None:
    own = {"203.0.113.7"}
    assert not leaks({"remote_addr": "198.51.100.1", "headers": {"Via": "1.1 squid"}}, own)
    assert leaks(
        {"remote_addr": "198.51.100.1", "headers": {"X-Forwarded-For": "203.0.113.7"}}, own
    )
    assert leaks(
        {"remote_addr": "1.1.1.1", "headers": {"forwarded": 'for="203.0.113.7:5050"'}}, own
    )
    assert not leaks(
        {"remote_addr": "1.1.1.1", "headers": {"X-Forwarded-For": "203.0.113.70"}}, own
    )
    assert leaks({"remote_addr": "203.0.113.7", "headers": {}}, own)
    assert leaks({"remote_addr": "1.1.1.1", "headers": {"X-Real-IP": "9.9.9.9"}}, set())


def test_site_validator_bans_what_the_site_blocks(
    pool: GlobalPool, proxies: ProxyFactory, target_site: TargetSite, key_prefix: str
) -> None:
    ok, blocked, dead = *proxies.healthy(2), proxies.dead()
    for p in (ok, blocked, dead):
        pool.admit(ProxyAddress.parse(p.url), 0.1)
    site = f"shop-{key_prefix}"
    target_site.ban(site, blocked.host)
    channel = ChannelPool(site, pool)

    counts = SiteValidator(channel, target_site.url(f"/site/{site}"), timeout=2).run()

    assert counts == {"checked": 3, "success": 1, "banned": 1, "dead": 1}
    assert channel.members() == {ok.id}
    assert channel.banned() == [blocked.id]
    assert pool.score(ok.id) == 6  # a good answer is a success for the global score too
    assert pool.score(blocked.id) == 5  # a ban is the site's business only
    assert dead.id not in pool
    # another site still gets the proxy the shop bans
    other = ChannelPool(f"news-{key_prefix}", pool)
    SiteValidator(other, target_site.url(f"/site/news-{key_prefix}"), timeout=2).run()
    assert other.members() == {ok.id, blocked.id}


def test_site_validator_spots_ban_pages(
    pool: GlobalPool, proxies: ProxyFactory, target_site: TargetSite, key_prefix: str
) -> None:
    [p] = proxies.healthy(1)
    pool.admit(ProxyAddress.parse(p.url), 0.1)
    channel = ChannelPool(f"wall-{key_prefix}", pool)
    url = target_site.url(f"/site/wall-{key_prefix}")
    counts = SiteValidator(channel, url, timeout=2, expect="something else").run()
    assert counts["banned"] == 1 and channel.banned() == [p.id]
