"""The proxy provider the fetch layer calls around every request, and the public proxy API.

Registered in `external_interface.base.providers`:

    proxy          the mode from CHAINCRAWL_PROXY_MODE (default "channel")
    proxy_channel  exclusive leases from the site's channel pool (seed 001)
    proxy_robin    haipproxy's client, round-robin over the selected proxies
    proxy_greedy   haipproxy's client, keep the head while it answers fast

`prepare` lends a proxy (never one in `task.avoid`) and `feedback` turns the request's outcome
into score changes and the lease's return. Only ids ("host:port") are logged or put in
`req.leases`; the URL with credentials exists only in `req.proxy` and in Redis.
"""

from __future__ import annotations

import logging
import re
import threading
import time

import redis

from exceptions import ResourceUnavailable
from external_interface.base import Outcome, OutgoingRequest, Provider, TaskState, providers
from external_interface.pool import Verdict, site_rule
from external_interface.proxy_channel import ChannelPool, Lease, channels, settle
from external_interface.proxy_config import ProxySettings, get_proxy_settings
from external_interface.proxy_models import Event, ProxyAddress, classify, next_score, redact
from external_interface.proxy_pool import GlobalPool, ProxyKeys
from external_interface.proxy_select import Rotation, Selection, Selector

__all__ = [
    "ChannelPool",
    "ChannelProxyProvider",
    "Event",
    "GlobalPool",
    "Lease",
    "ProxyAddress",
    "ProxyKeys",
    "ProxySettings",
    "Rotation",
    "RotationProxyProvider",
    "Selection",
    "Selector",
    "avoided_proxies",
    "ban_hold",
    "channels",
    "classify",
    "judge_outcome",
    "make_provider",
    "next_score",
    "redact",
    "settle",
]

log = logging.getLogger(__name__)

AVOID_PREFIX = "proxy:"


def avoided_proxies(task: TaskState) -> set[str]:
    """Proxy ids this task must not get again (`task.avoid` holds "proxy:<id>")."""
    return {
        r[len(AVOID_PREFIX) :]
        for r in getattr(task, "avoid", ()) or ()
        if r.startswith(AVOID_PREFIX)
    }


_VERDICT_EVENT = {
    Verdict.OK: Event.SUCCESS,
    Verdict.NEUTRAL: Event.NEUTRAL,
    Verdict.FAILED: Event.BANNED,
    Verdict.BANNED: Event.BANNED,
}
_RETRY_AFTER_IN_BODY = re.compile(r"""retry[_-]after["']?\s*[:=]\s*["']?(\d+(?:\.\d+)?)""", re.I)


def judge_outcome(site: str, outcome: Outcome) -> Event:
    """What a request says about the proxy that carried it, for this site.

    Transport failures (dead, timed out) are always the proxy's. An answer goes first to the
    site's own proxy rules (`pool.add_rules(site, "proxy", ...)`), because a site's 401/403 is
    often about something else that was lent (a session, a device, a user agent): blaming the
    proxy for those benches healthy proxies until the channel runs dry. Without a rule,
    `classify` decides (401/403/429 are bans).
    """
    event = classify(outcome.status, outcome.error)
    if event in (Event.DEAD, Event.TIMEOUT):
        return event
    rule = site_rule(site, "proxy", outcome)
    return _VERDICT_EVENT[rule.verdict] if rule is not None else event


def ban_hold(outcome: Outcome, settings: ProxySettings) -> float | None:
    """How long a ban keeps the proxy out of the channel: the site's Retry-After (header, or a
    `retry_after` field in the body), else `throttle_ttl` for a 429, else None (`ban_ttl`).
    A rate limit is over in seconds; benching the proxy for an hour would empty the channel."""
    hint = outcome.retry_after
    if hint is None and outcome.text_sample:
        m = _RETRY_AFTER_IN_BODY.search(outcome.text_sample)
        hint = float(m.group(1)) if m else None
    if hint is not None:
        return max(hint, 0.5)
    return settings.throttle_ttl if outcome.status == 429 else None


def _note_failure(task: TaskState, proxy_id: str, event: Event) -> None:
    """Put a failed proxy into `task.avoid` so the retry gets another (the fetch layer may too)."""
    if event in (Event.DEAD, Event.TIMEOUT, Event.BANNED):
        avoid = getattr(task, "avoid", None)
        if isinstance(avoid, set):
            avoid.add(AVOID_PREFIX + proxy_id)


class ChannelProxyProvider:
    """Exclusive proxies per site: checkout in `prepare`, return in `feedback`."""

    kind = "proxy"

    # Leases in flight, shared by every instance in the process: the fetch layer may build a
    # provider per task, and `feedback` must find the lease `prepare` took.
    _lent: dict[tuple[str, str, int], Lease] = {}
    _lent_lock = threading.Lock()

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
        self.channel = ChannelPool(site, self.pool)

    def prepare(self, req: OutgoingRequest, task: TaskState) -> None:
        lease = self.channel.checkout(avoid=avoided_proxies(task))
        if lease is None:
            raise ResourceUnavailable(f"no proxy free for site {self.site}", retry_after=2.0)
        with self._lent_lock:
            if len(self._lent) > 1000:  # requests that never got feedback: leases long expired
                now_ms = time.time() * 1000
                for k in [k for k, v in self._lent.items() if v.expires_ms < now_ms]:
                    del self._lent[k]
            self._lent[(self.channel.base, lease.id, id(req))] = lease
        req.proxy = lease.url
        req.leases["proxy"] = lease.id

    def feedback(self, req: OutgoingRequest, outcome: Outcome, task: TaskState) -> None:
        proxy_id = req.leases.get("proxy")
        if not proxy_id:
            return
        lease = self._take_lease(proxy_id, req)
        event = judge_outcome(self.site, outcome)
        _note_failure(task, proxy_id, event)
        hold = ban_hold(outcome, self.pool.settings) if event is Event.BANNED else None
        settle(self.pool, self.channel, lease, proxy_id, event, outcome.elapsed, hold)
        if lease is None:
            log.warning("proxy %s: feedback without a lease here; it returns on expiry", proxy_id)

    def cancel(self, req: OutgoingRequest, task: TaskState) -> None:
        """A later provider refused the request: it is never sent, so the proxy goes back
        untouched (no score change)."""
        proxy_id = req.leases.pop("proxy", None)
        if not proxy_id:
            return
        lease = self._take_lease(proxy_id, req)
        if lease is not None:
            self.channel.release(lease, Event.NEUTRAL)
        req.proxy = None

    def _take_lease(self, proxy_id: str, req: OutgoingRequest) -> Lease | None:
        """The lease `prepare` stored for this request (or for a copy of it)."""
        base = self.channel.base
        with self._lent_lock:
            lease = self._lent.pop((base, proxy_id, id(req)), None)
            if lease is None:
                keys = [k for k in self._lent if k[0] == base and k[1] == proxy_id]
                if len(keys) == 1:
                    lease = self._lent.pop(keys[0])
        return lease


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
        _note_failure(task, pid, event)
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
