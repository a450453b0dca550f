"""The proxy providers the fetch layer calls around every request.

Registered in `external_interface.resources.base.providers`:

    proxy          the mode from CHAINCRAWL_PROXY_MODE (default "channel")
    proxy_channel  exclusive leases from the site's channel pool
    proxy_robin    haipproxy's client, round-robin over the selected proxies
    proxy_greedy   haipproxy's client, keep the head while it answers fast

`prepare` lends a proxy (never one in `task.avoid`) and `feedback` turns the request's outcome
into score changes and the lease's return. Only ids ("host:port") are logged or put in
`req.leases`; the URL with credentials exists only in `req.proxy` and in Redis.
"""

from __future__ import annotations

import logging
import threading

import redis

from exceptions import ResourceUnavailable
from external_interface.resources.base import (
    Outcome,
    OutgoingRequest,
    Provider,
    TaskState,
    providers,
)
from external_interface.resources.inflight import IN_FLIGHT
from external_interface.resources.proxy.channel import ChannelPool, settle
from external_interface.resources.proxy.judge import (
    avoided_proxies,
    ban_hold,
    judge_outcome,
    note_failure,
)
from external_interface.resources.proxy.models import Event
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.proxy.select import Rotation, Selector
from settings.proxy import ProxySettings, get_proxy_settings

log = logging.getLogger(__name__)

NO_PROXY_WAIT = 2.0  # a task with no proxy free waits this long, or until the soonest return


class ChannelProxyProvider:
    """Exclusive proxies per site: checkout in `prepare`, return in `feedback`. Leases of
    requests in flight are kept in `inflight.IN_FLIGHT` (with the cookies' and devices'), so any
    instance's `feedback` finds the lease another's `prepare` took."""

    kind = "proxy"

    def __init__(
        self,
        site: str,
        platform: str = "",
        *,
        rds: redis.Redis | None = None,
        prefix: str | None = None,
        settings: ProxySettings | None = None,
    ) -> None:
        self.site = site
        self.platform = platform
        self.pool = GlobalPool(rds, prefix, settings)
        self.channel = ChannelPool(site, self.pool, held=True)

    def prepare(self, req: OutgoingRequest, task: TaskState) -> None:
        lease, wait = self.channel.lend(avoid=avoided_proxies(task))
        if lease is None:  # back when the soonest return known is due (a rest, a bench)
            raise ResourceUnavailable(
                f"no proxy free for site {self.site} (or it is at its fleet share of proxies)",
                retry_after=NO_PROXY_WAIT if wait is None else min(max(wait, 0.1), NO_PROXY_WAIT),
            )
        IN_FLIGHT.put(req, self.channel, lease)
        req.proxy = lease.url

    def feedback(self, req: OutgoingRequest, outcome: Outcome, task: TaskState) -> None:
        proxy_id = req.leases.get("proxy")
        if not proxy_id:
            return
        held = IN_FLIGHT.take(req, self.channel)
        lease = held[1] if held is not None else None
        event = judge_outcome(self.site, outcome)
        note_failure(task, proxy_id, event)
        holding = self.channel.holding()
        if (
            lease is not None
            and holding is not None
            and event in (Event.SUCCESS, Event.NEUTRAL)
            and holding.note(
                lease, successes=int(event is Event.SUCCESS), last_elapsed=outcome.elapsed
            )
        ):  # summed while held: written with the proxy's return (a neutral changes nothing)
            self.channel.release(lease, event)
            return
        hold = ban_hold(outcome, self.pool.settings) if event is Event.BANNED else None
        settle(self.pool, self.channel, lease, proxy_id, event, outcome.elapsed, hold)
        if lease is None:
            log.warning("proxy %s: feedback without a lease here; it returns on expiry", proxy_id)

    def cancel(self, req: OutgoingRequest, task: TaskState) -> None:
        """A later provider refused the request: it is never sent, so the proxy goes back
        untouched (no score change)."""
        held = IN_FLIGHT.take(req, self.channel)
        req.leases.pop(self.kind, None)
        req.proxy = None
        if held is not None:
            held[0].cancel(held[1])


class RotationProxyProvider:
    """haipproxy's client: shared (non-exclusive) proxies, round-robin or greedy."""

    kind = "proxy"

    def __init__(
        self,
        site: str,
        platform: str = "",
        strategy: str = "robin",
        *,
        rds: redis.Redis | None = None,
        prefix: str | None = None,
        settings: ProxySettings | None = None,
    ) -> None:
        self.site = site
        self.platform = platform
        self.pool = GlobalPool(rds, prefix, settings)
        self.rotation = Rotation(Selector(self.pool), strategy)
        self._urls: dict[str, str] = {}

    def prepare(self, req: OutgoingRequest, task: TaskState) -> None:
        avoid = avoided_proxies(task)
        for _ in range(2):  # a second try after dropping an id whose URL is gone
            pid = self.rotation.get(avoid)
            if pid is None:
                break
            url = self._urls.get(pid) or self.pool.urls([pid]).get(pid)
            if url is None:
                self.rotation.feedback(pid, Event.DEAD)
                continue
            self._urls[pid] = url
            req.proxy = url
            req.leases["proxy"] = pid
            return
        raise ResourceUnavailable(f"no proxy qualifies for site {self.site}", retry_after=5.0)

    def feedback(self, req: OutgoingRequest, outcome: Outcome, task: TaskState) -> None:
        pid = req.leases.get("proxy")
        if not pid:
            return
        event = judge_outcome(self.site, outcome)
        note_failure(task, pid, event)
        if (
            event is not Event.BANNED
            and self.pool.record(pid, event, outcome.elapsed).state == "removed"
        ):
            self._urls.pop(pid, None)
        hold = ban_hold(outcome, self.pool.settings) if event is Event.BANNED else None
        self.rotation.feedback(pid, event, outcome.elapsed, hold)


_cache: dict[tuple[str, str, str], Provider] = {}
_cache_lock = threading.Lock()


def make_provider(site: str, platform: str = "", mode: str | None = None) -> Provider:
    """One provider per (site, platform, mode) per process, so rotation state is shared."""
    mode = mode or get_proxy_settings().mode
    key = (site, platform, mode)
    with _cache_lock:
        prov = _cache.get(key)
        if prov is None:
            if mode == "channel":
                prov = ChannelProxyProvider(site, platform)
            elif mode in Rotation.STRATEGIES:
                prov = RotationProxyProvider(site, platform, mode)
            else:
                raise ValueError(f"unknown proxy mode {mode!r}: channel, robin or greedy")
            _cache[key] = prov
    return prov


def reset_providers() -> None:
    """Forget cached providers (tests that switch Redis servers call this)."""
    with _cache_lock:
        _cache.clear()


providers.add("proxy", lambda site, platform: make_provider(site, platform))
providers.add("proxy_channel", lambda site, platform: make_provider(site, platform, "channel"))
providers.add("proxy_robin", lambda site, platform: make_provider(site, platform, "robin"))
providers.add("proxy_greedy", lambda site, platform: make_provider(site, platform, "greedy"))
