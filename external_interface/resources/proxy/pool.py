"""The global proxy pool in Redis: haipproxy's three indexes plus the URL of every member.

    <p>:{proxy}:score    zset  id -> score            (success rate; new = 5)
    <p>:{proxy}:checked  zset  id -> unix time        (last passed validation / successful use)
    <p>:{proxy}:speed    zset  id -> seconds          (last response time)
    <p>:{proxy}:url      hash  id -> sealed proxy URL (the only place credentials live; sealed:
                                                    utils/seal.py, so Redis's files never show them)
    <p>:{proxy}:raw      zset  id -> harvest time     (harvested, waiting for the first validation)
    <p>:{proxy}:stats    hash  counter -> n           (admitted, removed_dead, dropped_transparent...)
    <p>:{proxy}:channels set   sites that have a channel

The pool is shared by every site and its keys share the hash tag `{proxy}`: on a Redis Cluster
they are one slot by design, so its scripts and MULTI blocks stay atomic there.

Membership of `score` *is* membership of the pool: every score change runs in one Lua script
(`pool.lua`) that reads the current score, so concurrent feedback never loses an update and a
late success never resurrects a proxy another worker just removed. The per-site channels
(`channel.py`) live under `<p>:site:{<site>}:proxy`, on each site's slot, and
`<p>:{proxy}:channels` lists their sites.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from config import get_settings
from exceptions import SecretUnreadable
from external_interface.resources.proxy.models import Event, ProxyAddress
from settings.proxy import ProxySettings, get_proxy_settings
from utils.keyspace import Keyspace
from utils.redis import as_str, eval_scripts, get_redis
from utils.seal import Sealer, get_sealer

log = logging.getLogger(__name__)


class ProxyKeys:
    """Names of every key of the proxy subsystem under one prefix (from utils/keyspace.py)."""

    def __init__(self, prefix: str) -> None:
        self.ks = ks = Keyspace(prefix)
        self.base = ks.proxy()
        self.score = ks.proxy("score")
        self.checked = ks.proxy("checked")
        self.speed = ks.proxy("speed")
        self.url = ks.proxy("url")
        self.raw = ks.proxy("raw")
        self.stats = ks.proxy("stats")
        self.channels = ks.proxy("channels")

    def channel(self, site: str) -> str:
        """The base of a site's channel, on the site's slot (not the global pool's)."""
        return self.ks.proxy_channel(site)

    def channel_parts(self, site: str, parts: int) -> list[str]:
        """The bases of a site's channel's sub-pools, the first `channel(site)`."""
        return self.ks.proxy_channel_parts(site, parts)


SCRIPT = Path(__file__).with_name("pool.lua").read_text()


@dataclass(frozen=True)
class ProxyInfo:
    id: str
    score: float
    checked: float | None
    speed: float | None


@dataclass(frozen=True)
class RecordResult:
    state: str  # "absent" | "updated" | "removed"
    score: float | None


class GlobalPool:
    """Scores, indexes and URLs of every validated proxy, shared by all sites. URLs are
    sealed on the way in and opened on the way out (`sealer`: this process's by default)."""

    def __init__(
        self,
        rds: redis.Redis | None = None,
        prefix: str | None = None,
        settings: ProxySettings | None = None,
        sealer: Sealer | None = None,
    ) -> None:
        self.rds = rds if rds is not None else get_redis()
        self.prefix = prefix if prefix is not None else get_settings().key_prefix
        self.settings = settings or get_proxy_settings()
        self.sealer = sealer or get_sealer()
        self.keys = ProxyKeys(self.prefix)
        self._script = self.rds.register_script(SCRIPT)

    def open_url(self, proxy_id: str, raw: bytes | str) -> str:
        """A stored URL, opened (SecretUnreadable names the proxy if no key opens it)."""
        return self.sealer.open(raw, f"the URL of proxy {proxy_id}")

    # --- harvest -> first validation -----------------------------------------------------
    def add_raw(self, proxies: Iterable[str | ProxyAddress], now: float | None = None) -> int:
        """Queue harvested proxies for their first validation; returns how many were new."""
        now = time.time() if now is None else now
        k = self.keys
        calls: list[tuple[Any, list[str], list[Any]]] = []  # EVALSHAs in one round trip
        for p in proxies:
            try:
                addr = p if isinstance(p, ProxyAddress) else ProxyAddress.parse(p)
            except ValueError:
                continue
            args = ["add_raw", addr.id, self.sealer.seal(addr.url), now]
            calls.append((self._script, [k.score, k.raw, k.url], args))
        return sum(int(x) for x in eval_scripts(self.rds, calls)) if calls else 0

    def take_raw(self, limit: int) -> list[ProxyAddress]:
        """Pop up to `limit` proxies awaiting their first validation (each goes to one caller)."""
        flat = self._script(keys=[self.keys.raw, self.keys.url], args=["take_raw", limit])
        out = []
        for i in range(0, len(flat), 2):
            pid = as_str(flat[i])
            try:  # unreadable (another key) or unparseable: dropped, never validated
                out.append(ProxyAddress.parse(self.open_url(pid, flat[i + 1])))
            except SecretUnreadable as exc:
                log.error("%s; dropped", exc)
                self.rds.hdel(self.keys.url, pid)
            except ValueError:
                self.rds.hdel(self.keys.url, pid)
        return out

    def raw_count(self) -> int:
        return int(self.rds.zcard(self.keys.raw))

    def admit(self, addr: ProxyAddress, elapsed: float, now: float | None = None) -> bool:
        """Enter a proxy that passed its first validation, at the initial score."""
        now = time.time() if now is None else now
        k = self.keys
        pipe = self.rds.pipeline(transaction=True)
        pipe.zadd(k.score, {addr.id: self.settings.initial_score}, nx=True)
        pipe.zadd(k.checked, {addr.id: now})
        pipe.zadd(k.speed, {addr.id: elapsed})
        pipe.hset(k.url, addr.id, self.sealer.seal(addr.url))
        pipe.hincrby(k.stats, "admitted", 1)
        return bool(pipe.execute()[0])

    def reject(self, addr: ProxyAddress, reason: str) -> None:
        """Forget a proxy that failed its first validation (unless it is a pool member)."""
        k = self.keys
        if self.rds.zscore(k.score, addr.id) is None:
            self.rds.hdel(k.url, addr.id)
        self.rds.hincrby(k.stats, f"dropped_{reason}", 1)

    # --- scoring -------------------------------------------------------------------------
    def record(
        self,
        proxy_id: str,
        event: Event,
        elapsed: float | None = None,
        now: float | None = None,
        times: int = 1,
    ) -> RecordResult:
        """Apply one outcome with haipproxy's rule, atomically (a success `times` times: a
        held proxy's sum). Absent proxies stay absent."""
        now = time.time() if now is None else now
        k = self.keys
        args: list[Any] = [
            "record",
            proxy_id,
            event.value,
            "" if elapsed is None else repr(float(elapsed)),
            repr(float(now)),
            repr(float(self.settings.smooth_above)),
        ]
        if times != 1:
            args.append(times)
        state, score = self._script(keys=[k.score, k.checked, k.speed, k.url, k.stats], args=args)
        state = {0: "absent", 1: "updated", 2: "removed"}[int(state)]
        if state == "removed":
            log.info("proxy %s removed from the global pool (%s)", proxy_id, event.value)
        return RecordResult(state, float(score) if score else None)

    def remove(self, proxy_id: str, reason: str = "removed") -> bool:
        k = self.keys
        pipe = self.rds.pipeline(transaction=True)
        pipe.zrem(k.score, proxy_id)
        pipe.zrem(k.checked, proxy_id)
        pipe.zrem(k.speed, proxy_id)
        pipe.hdel(k.url, proxy_id)
        removed = bool(pipe.execute()[0])
        if removed:
            self.rds.hincrby(k.stats, f"removed_{reason}", 1)
            log.info("proxy %s removed from the global pool (%s)", proxy_id, reason)
        return removed

    # --- reads ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.rds.zcard(self.keys.score))

    def __contains__(self, proxy_id: object) -> bool:
        return self.rds.zscore(self.keys.score, str(proxy_id)) is not None

    def ids(self) -> list[str]:
        return [as_str(x) for x in self.rds.zrange(self.keys.score, 0, -1)]

    def info(self, proxy_id: str) -> ProxyInfo | None:
        pipe = self.rds.pipeline(transaction=False)
        pipe.zscore(self.keys.score, proxy_id)
        pipe.zscore(self.keys.checked, proxy_id)
        pipe.zscore(self.keys.speed, proxy_id)
        score, checked, speed = pipe.execute()
        if score is None:
            return None
        return ProxyInfo(proxy_id, score, checked, speed)

    def score(self, proxy_id: str) -> float | None:
        return self.rds.zscore(self.keys.score, proxy_id)

    def urls(self, ids: Iterable[str]) -> dict[str, str]:
        """The URLs of those of `ids` in the pool, opened."""
        ids = list(ids)
        if not ids:
            return {}
        vals = self.rds.hmget(self.keys.url, ids)
        return {i: self.open_url(i, v) for i, v in zip(ids, vals, strict=True) if v is not None}

    def address(self, proxy_id: str) -> ProxyAddress | None:
        url = self.rds.hget(self.keys.url, proxy_id)
        return ProxyAddress.parse(self.open_url(proxy_id, url)) if url is not None else None

    def stalest(self, older_than: float, limit: int, now: float | None = None) -> list[str]:
        """Members last validated more than `older_than` seconds ago, oldest first."""
        now = time.time() if now is None else now
        return [
            as_str(x)
            for x in self.rds.zrangebyscore(
                self.keys.checked, "-inf", now - older_than, start=0, num=limit
            )
        ]

    def purge_stale(self, max_age: float, now: float | None = None) -> list[str]:
        """Remove members that have not passed a validation for `max_age` seconds."""
        gone = self.stalest(max_age, 10_000, now)
        for pid in gone:
            self.remove(pid, "stale")
        return gone

    def stats(self) -> dict[str, int]:
        return {as_str(k): int(v) for k, v in self.rds.hgetall(self.keys.stats).items()}

    def clear(self) -> None:
        """Delete every global key (tests and `control.sh reset`)."""
        k = self.keys
        self.rds.delete(k.score, k.checked, k.speed, k.url, k.raw, k.stats)
