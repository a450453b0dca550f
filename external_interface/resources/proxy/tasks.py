"""Celery tasks that keep the proxy pool alive, on the `resources` queue, plus their beat schedule.

Arguments are only names and numbers: proxy URLs (which may carry credentials) stay in Redis.
Every task reads Redis, the key prefix and the proxy settings from the environment of the worker.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from external_interface.resources.proxy.channel import ChannelPool, channels
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.proxy.sources import harvest as harvest_sources
from external_interface.resources.proxy.sources import source_from_spec
from external_interface.resources.proxy.validate import CheckPageDown, ProxyValidator, SiteValidator
from settings.proxy import get_proxy_settings

log = logging.getLogger(__name__)

QUEUE = "resources"


def _pool() -> GlobalPool:
    return GlobalPool()


@shared_task(name="resources.proxy.harvest", queue=QUEUE)
def harvest() -> dict[str, int]:
    """Read every configured source and queue new proxies for their first validation."""
    srcs = [source_from_spec(spec) for spec in get_proxy_settings().sources]
    return harvest_sources(_pool(), srcs)


@shared_task(name="resources.proxy.validate_new", queue=QUEUE)
def validate_new(limit: int | None = None) -> dict[str, int]:
    """First validation: admit anonymous proxies that answer, drop transparent and dead ones."""
    try:
        return ProxyValidator(_pool()).validate_new(limit)
    except CheckPageDown as exc:  # judge no proxy while the yardstick is down
        log.warning("first validation skipped: %s", exc)
        return {"aborted": 1}


@shared_task(name="resources.proxy.validate", queue=QUEUE)
def validate(limit: int | None = None) -> dict[str, int]:
    """Re-validate the stalest members, drop long-unvalidated ones, reclaim expired leases."""
    pool = _pool()
    try:
        counts = ProxyValidator(pool).revalidate(limit)
    except CheckPageDown as exc:
        log.warning("re-validation skipped: %s", exc)
        counts = {"aborted": 1}
    counts["reclaimed_leases"] = sum(ChannelPool(site, pool).reclaim() for site in channels(pool))
    return counts


@shared_task(name="resources.proxy.validate_site", queue=QUEUE)
def validate_site(site: str, limit: int | None = None) -> dict[str, int]:
    """Try the site's channel proxies against its own page (CHAINCRAWL_PROXY_SITE_CHECKS)."""
    url = get_proxy_settings().site_checks.get(site)
    if not url:
        return {"checked": 0}
    return SiteValidator(ChannelPool(site, _pool()), url).run(limit)


@shared_task(name="resources.proxy.validate_sites", queue=QUEUE)
def validate_sites() -> dict[str, dict[str, int]]:
    """Run the per-site validator of every site that configures a check page."""
    return {site: validate_site(site) for site in get_proxy_settings().site_checks}


def beat_schedule() -> dict[str, dict[str, Any]]:
    """Harvest every N minutes, validate every M seconds; `expires` drops runs that piled up
    while no worker was listening, instead of running them all at once."""
    s = get_proxy_settings()
    harvest_every = s.harvest_minutes * 60.0
    validate_every = s.validate_seconds

    def entry(task: str, every: float) -> dict[str, Any]:
        return {"task": task, "schedule": every, "options": {"queue": QUEUE, "expires": every}}

    return {
        "proxy-harvest": entry("resources.proxy.harvest", harvest_every),
        "proxy-validate-new": entry("resources.proxy.validate_new", validate_every),
        "proxy-validate": entry("resources.proxy.validate", validate_every),
        "proxy-validate-sites": entry("resources.proxy.validate_sites", validate_every * 2),
    }


PROXY_BEAT_SCHEDULE: dict[str, dict[str, Any]] = beat_schedule()
