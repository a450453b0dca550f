"""Celery tasks and beat schedule of the proxy pool, run eagerly and by a real worker."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from celery import Celery, current_app
from celery.beat import Scheduler
from celery.contrib.testing.worker import start_worker
from celery.local import Proxy

from config import reset_settings
from demo.proxy_farm import ForwardProxy, TargetSite
from external_interface.resources.proxy import tasks as proxy_tasks
from external_interface.resources.proxy.channel import ChannelPool
from external_interface.resources.proxy.pool import GlobalPool
from settings.proxy import reset_proxy_settings
from tests.external_interface.proxy_fixtures import DeadProxy, ProxyFactory
from utils.redis import get_redis, reset_clients

RESETS = (reset_settings, reset_clients, reset_proxy_settings)


@pytest.fixture
def env(
    monkeypatch: pytest.MonkeyPatch,
    redis_url: str,
    key_prefix: str,
    target_site: TargetSite,
    tmp_path: Path,
) -> Iterator[Path]:
    """Worker-style configuration through the environment; yields the proxy list file."""
    listing = tmp_path / "proxies.txt"
    listing.write_text("")
    monkeypatch.setenv("CHAINCRAWL_REDIS_URL", redis_url)
    monkeypatch.setenv("CHAINCRAWL_KEY_PREFIX", key_prefix)
    monkeypatch.setenv("CHAINCRAWL_PROXY_CHECK_URL", target_site.url("/headers"))
    monkeypatch.setenv("CHAINCRAWL_PROXY_CHECK_TIMEOUT", "1.5")
    monkeypatch.setenv("CHAINCRAWL_PROXY_SOURCES", json.dumps([f"file:{listing}"]))
    monkeypatch.setenv(
        "CHAINCRAWL_PROXY_SITE_CHECKS",
        json.dumps({f"shop-{key_prefix}": target_site.url(f"/site/shop-{key_prefix}")}),
    )
    for reset in RESETS:
        reset()
    yield listing
    monkeypatch.undo()
    for reset in RESETS:
        reset()


def test_tasks_are_named_and_routed() -> None:
    for t, name in (
        (proxy_tasks.harvest, "harvest"),
        (proxy_tasks.validate_new, "validate_new"),
        (proxy_tasks.validate, "validate"),
        (proxy_tasks.validate_site, "validate_site"),
        (proxy_tasks.validate_sites, "validate_sites"),
    ):
        assert t.name == f"resources.proxy.{name}"
        assert cast(Any, t).queue == "resources"  # a decorator option; the stubs lack it


def test_beat_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAINCRAWL_PROXY_HARVEST_MINUTES", "15")
    monkeypatch.setenv("CHAINCRAWL_PROXY_VALIDATE_SECONDS", "20")
    reset_proxy_settings()
    try:
        sched = proxy_tasks.beat_schedule()
    finally:
        monkeypatch.undo()
        reset_proxy_settings()
    assert sched["proxy-harvest"]["schedule"] == 900
    assert sched["proxy-validate"]["schedule"] == 20
    assert sched["proxy-validate-new"]["schedule"] == 20
    for entry in sched.values():
        assert entry["task"].startswith("resources.proxy.")
        assert entry["options"]["queue"] == "resources"
    assert set(proxy_tasks.PROXY_BEAT_SCHEDULE) == set(sched)
    # beat accepts it as it is
    app = Celery("beat-check", set_as_current=False)
    app.conf.beat_schedule = proxy_tasks.PROXY_BEAT_SCHEDULE
    beat = Scheduler(app, lazy=True)
    beat.setup_schedule()
    assert set(proxy_tasks.PROXY_BEAT_SCHEDULE) <= set(beat.schedule)


def test_pool_lifecycle_through_the_tasks(
    env: Path, proxies: ProxyFactory, target_site: TargetSite, key_prefix: str
) -> None:
    good = proxies.healthy(2)
    leaky = proxies.transparent()
    dead = proxies.dead()
    every: list[ForwardProxy | DeadProxy] = [*good, leaky, dead]
    env.write_text("\n".join(p.url for p in every))
    site = f"shop-{key_prefix}"
    target_site.ban(site, good[1].host)

    assert proxy_tasks.harvest.apply().get() == {"found": 4, "queued": 4, "failed_sources": 0}
    counts = proxy_tasks.validate_new.apply().get()
    assert counts["admitted"] == 2 and counts["dropped_transparent"] == 1
    pool = GlobalPool(get_redis())
    assert sorted(pool.ids()) == sorted(p.id for p in good)

    sites = proxy_tasks.validate_sites.apply().get()
    assert sites == {site: {"checked": 2, "success": 1, "banned": 1}}
    assert ChannelPool(site, pool).members() == {good[0].id}

    proxies.stop(good[0])
    counts = proxy_tasks.validate.apply(kwargs={"limit": 10}).get()
    assert counts["checked"] == 0  # everything was validated moments ago
    pool.rds.zadd(pool.keys.checked, {p.id: 0 for p in good})  # make them stale
    counts = proxy_tasks.validate.apply().get()
    assert counts["removed"] == 1 and counts["purged_from_channels"] == 1
    assert pool.ids() == [good[1].id]
    assert ChannelPool(site, pool).members() == set()


def test_check_page_outage_aborts_validation(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAINCRAWL_PROXY_CHECK_URL", "http://127.0.0.1:1/headers")
    reset_proxy_settings()
    assert proxy_tasks.validate_new.apply().get() == {"aborted": 1}
    assert proxy_tasks.validate.apply().get()["aborted"] == 1


@pytest.mark.integration
def test_a_worker_on_the_resources_queue_runs_them(
    env: Path, proxies: ProxyFactory, redis_server: object
) -> None:
    good = proxies.healthy(1)[0]
    env.write_text(good.url)
    url = redis_server.url.rsplit("/", 1)[0] + "/7"  # type: ignore[attr-defined]
    previous = cast("Proxy[Celery]", current_app)._get_current_object()
    app = Celery("proxy-tasks-test", broker=url, backend=url, set_as_current=True)
    app.conf.update(task_default_queue="default", broker_connection_retry_on_startup=True)
    # an in-process worker sets up logging, and the worker module's signal handler then puts
    # its redacting filter on the test process's handlers (pytest's log capture among them)
    filters = [(h, list(h.filters)) for h in logging.getLogger().handlers]
    try:
        with start_worker(app, queues=["resources"], perform_ping_check=False, pool="solo"):
            assert proxy_tasks.harvest.apply_async().get(timeout=30)["queued"] == 1
            assert proxy_tasks.validate_new.apply_async().get(timeout=30)["admitted"] == 1
    finally:
        app.close()
        previous.set_current()
        for handler, kept in filters:
            handler.filters[:] = kept
    assert GlobalPool(get_redis()).ids() == [good.id]
