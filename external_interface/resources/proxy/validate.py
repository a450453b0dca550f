"""Validators: the first check admits anonymous proxies, later checks re-score the stalest ones,
and a per-site check tries a channel's proxies against that site's own page.

The echo page answers `{"remote_addr": ..., "headers": {...}}`. A proxy is transparent when the
page sees our own address, either as the peer or inside a forwarding header (X-Forwarded-For,
Forwarded, X-Real-IP, Via...). Our address is learnt by fetching the page directly once per run;
if that fails the run is aborted, so an outage of the echo page never empties the pool.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import requests

from external_interface.resources.base import Outcome
from external_interface.resources.proxy.channel import ChannelPool, ProxyLease, channels, settle
from external_interface.resources.proxy.judge import ban_hold, judge_outcome
from external_interface.resources.proxy.models import Event, ProxyAddress, classify
from external_interface.resources.proxy.pool import GlobalPool

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

LEAK_HEADERS = (
    "x-forwarded-for",
    "x-real-ip",
    "forwarded",
    "via",
    "client-ip",
    "x-client-ip",
    "x-originating-ip",
    "true-client-ip",
    "x-proxy-id",
)
_TOKEN = re.compile(r"[\s,;=\"\[\]]+")


class CheckPageDown(RuntimeError):
    """The validation page does not answer directly; validating now would blame the proxies."""


@dataclass(frozen=True)
class Check:
    proxy_id: str
    event: Event
    elapsed: float
    status: int | None = None
    transparent: bool = False


def _session() -> requests.Session:
    s = requests.Session()
    s.trust_env = False  # no HTTP(S)_PROXY from the environment sneaking in
    return s


def leaks(payload: dict, own: set[str]) -> bool:
    """True if the echo payload shows our address (or, not knowing it, any forwarding header)."""
    headers = {str(k).lower(): str(v) for k, v in (payload.get("headers") or {}).items()}
    if not own:
        return any(h in headers for h in ("x-forwarded-for", "x-real-ip", "forwarded"))
    if payload.get("remote_addr") in own:
        return True
    for name in LEAK_HEADERS:
        for tok in _TOKEN.split(headers.get(name, "")):
            if tok and (tok in own or tok.rsplit(":", 1)[0] in own):  # "1.2.3.4:5678" too
                return True
    return False


class ProxyChecker:
    """One validation request through a proxy to the echo page."""

    def __init__(self, check_url: str, timeout: float = 10.0) -> None:
        self.check_url = check_url
        self.timeout = timeout
        self._own: set[str] | None = None

    def own_addresses(self, refresh: bool = False) -> set[str]:
        """Our address as the echo page sees it without a proxy (raises CheckPageDown)."""
        if self._own is None or refresh:
            try:
                with _session() as s:
                    r = s.get(self.check_url, timeout=self.timeout)
                    r.raise_for_status()
                    self._own = {str(r.json()["remote_addr"])}
            except (requests.RequestException, ValueError, KeyError) as exc:
                raise CheckPageDown(f"validation page unreachable: {type(exc).__name__}") from None
        return self._own

    def check(self, addr: ProxyAddress) -> Check:
        own = self.own_addresses()
        t0 = time.monotonic()
        try:
            with _session() as s:
                r = s.get(
                    self.check_url,
                    proxies={"http": addr.url, "https": addr.url},
                    timeout=self.timeout,
                )
        except (requests.RequestException, OSError) as exc:
            return Check(addr.id, classify(None, exc), time.monotonic() - t0)
        elapsed = time.monotonic() - t0
        try:
            payload = r.json() if r.status_code < 400 else None
        except ValueError:  # not JSON: a captive portal or ad page, not our echo
            payload = None
        if not isinstance(payload, dict):
            # the echo page answers us directly, so an error here is the proxy's doing
            return Check(addr.id, Event.DEAD, elapsed, r.status_code)
        return Check(addr.id, Event.SUCCESS, elapsed, r.status_code, leaks(payload, own))


def _parallel(fn: Callable[[T], R], items: Iterable[T], workers: int) -> list[R]:
    items = list(items)
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items)))) as ex:
        return list(ex.map(fn, items))


class ProxyValidator:
    """First validation (raw -> pool) and re-validation (pool members, stalest first)."""

    def __init__(self, pool: GlobalPool, checker: ProxyChecker | None = None) -> None:
        s = pool.settings
        self.pool = pool
        self.checker = checker or ProxyChecker(s.check_url, s.check_timeout)
        self.workers = s.validate_workers

    def validate_new(self, limit: int | None = None) -> dict[str, int]:
        """Admit harvested proxies that answer and hide us; drop the rest."""
        self.checker.own_addresses(refresh=True)
        addrs = self.pool.take_raw(self.pool.settings.validate_batch if limit is None else limit)
        counts: Counter[str] = Counter(checked=len(addrs))
        for addr, chk in zip(
            addrs, _parallel(self.checker.check, addrs, self.workers), strict=True
        ):
            if chk.event is Event.SUCCESS and not chk.transparent:
                self.pool.admit(addr, chk.elapsed)
                counts["admitted"] += 1
            else:
                reason = "transparent" if chk.transparent else chk.event.value
                self.pool.reject(addr, reason)
                counts[f"dropped_{reason}"] += 1
        log.info("first validation: %s", dict(counts))
        return dict(counts)

    def revalidate(
        self, limit: int | None = None, older_than: float | None = None
    ) -> dict[str, int]:
        """Re-check the members validated longest ago and re-score them."""
        s = self.pool.settings
        self.checker.own_addresses(refresh=True)
        older_than = s.revalidate_after if older_than is None else older_than
        ids = self.pool.stalest(older_than, s.validate_batch if limit is None else limit)
        urls = self.pool.urls(ids)
        addrs = [ProxyAddress.parse(urls[i]) for i in ids if i in urls]
        counts: Counter[str] = Counter(checked=len(addrs))
        gone: list[str] = []
        for chk in _parallel(self.checker.check, addrs, self.workers):
            if chk.transparent:
                self.pool.remove(chk.proxy_id, "transparent")
                state = "removed"
            else:
                state = self.pool.record(chk.proxy_id, chk.event, chk.elapsed).state
            counts[f"{chk.event.value}"] += 1
            if state == "removed":
                gone.append(chk.proxy_id)
        gone += self.pool.purge_stale(s.max_unvalidated)
        counts["removed"] = len(gone)
        counts["purged_from_channels"] = purge_channels(self.pool, gone)
        log.info("re-validation: %s", dict(counts))
        return dict(counts)


def purge_channels(pool: GlobalPool, ids: list[str]) -> int:
    """Take proxies a validator found dead out of every site's channel (idle copies)."""
    if not ids:
        return 0
    return sum(ChannelPool(site, pool).purge(ids) for site in channels(pool))


class SiteValidator:
    """Tries a channel's proxies against the site's own page: bans what the site blocks."""

    def __init__(
        self,
        channel: ChannelPool,
        url: str,
        timeout: float | None = None,
        expect: str | None = None,
    ) -> None:
        self.channel = channel
        self.url = url
        self.timeout = channel.settings.check_timeout if timeout is None else timeout
        self.expect = expect

    def run(self, limit: int | None = None) -> dict[str, int]:
        """Check out up to `limit` proxies (least used first), try each, settle the outcome.

        Checking out makes the check exclusive, so a worker never shares a proxy with it.
        """
        limit = self.channel.settings.site_check_batch if limit is None else limit
        self.channel.refill()
        leases: list[ProxyLease] = []
        for _ in range(limit):
            lease = self.channel.checkout(avoid=[x.id for x in leases])
            if lease is None:
                break
            leases.append(lease)
        counts: Counter[str] = Counter(checked=len(leases))
        for lease, (event, elapsed, hold) in zip(
            leases,
            _parallel(self._try, leases, self.channel.settings.validate_workers),
            strict=True,
        ):
            settle(self.channel.pool, self.channel, lease, lease.id, event, elapsed, hold)
            counts[event.value] += 1
        log.info("site validation for %s: %s", self.channel.site, dict(counts))
        return dict(counts)

    def _try(self, lease: ProxyLease) -> tuple[Event, float, float | None]:
        """(event, elapsed, ban hold): judged like a crawl request, by the site's proxy rules
        (a 403 about a missing session says nothing about the proxy) and its Retry-After."""
        url = lease.url
        t0 = time.monotonic()
        try:
            with _session() as s:
                r = s.get(self.url, proxies={"http": url, "https": url}, timeout=self.timeout)
                body = r.text
        except (requests.RequestException, OSError) as exc:
            return classify(None, exc), time.monotonic() - t0, None
        elapsed = time.monotonic() - t0
        retry_after = r.headers.get("Retry-After", "")
        outcome = Outcome(
            elapsed,
            status=r.status_code,
            text_sample=body[:2048],
            retry_after=float(retry_after) if retry_after.replace(".", "", 1).isdigit() else None,
        )
        event = judge_outcome(self.channel.site, outcome)
        if event is Event.SUCCESS and self.expect is not None and self.expect not in body:
            event = Event.BANNED  # a ban page or captcha served with 200
        hold = ban_hold(outcome, self.channel.settings) if event is Event.BANNED else None
        return event, elapsed, hold
