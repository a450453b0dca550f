"""The global proxy pool in Redis: haipproxy's three indexes plus the URL of every member.

    <p>:proxy:score    zset  id -> score            (success rate; new = 5)
    <p>:proxy:checked  zset  id -> unix time        (last passed validation / successful use)
    <p>:proxy:speed    zset  id -> seconds          (last response time)
    <p>:proxy:url      hash  id -> full proxy URL   (the only place credentials live)
    <p>:proxy:raw      zset  id -> harvest time     (harvested, waiting for the first validation)
    <p>:proxy:stats    hash  counter -> n           (admitted, removed_dead, dropped_transparent...)

Membership of `score` *is* membership of the pool: every score change runs in one Lua script
that reads the current score, so concurrent feedback never loses an update and a late success
never resurrects a proxy another worker just removed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import redis

from config import get_settings
from external_interface.proxy_config import ProxySettings, get_proxy_settings
from external_interface.proxy_models import Event, ProxyAddress
from utils.redis import get_redis

log = logging.getLogger(__name__)


class ProxyKeys:
    """Names of every key of the proxy subsystem under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.base = f"{prefix}:proxy"
        self.score = f"{self.base}:score"
        self.checked = f"{self.base}:checked"
        self.speed = f"{self.base}:speed"
        self.url = f"{self.base}:url"
        self.raw = f"{self.base}:raw"
        self.stats = f"{self.base}:stats"
        self.channels = f"{self.base}:channels"

    def channel(self, site: str) -> str:
        return f"{self.base}:chan:{site}"


# KEYS: score checked speed url stats   ARGV: id event elapsed|'' now smooth_above
# Returns {state, score}: state 0 = not in the pool, 1 = updated, 2 = removed.
_RECORD = """
local id, ev = ARGV[1], ARGV[2]
local s = redis.call('ZSCORE', KEYS[1], id)
if not s then return {0, ''} end
s = tonumber(s)
local new
if ev == 'success' then
  if s < tonumber(ARGV[5]) then new = s + 1
  else new = s + tonumber(string.format('%.2f', 10 / s)) end
elseif ev == 'timeout' then
  new = s - 1
  if new <= 0 then new = nil end
elseif ev == 'dead' then
  new = nil
else
  return {1, string.format('%.17g', s)}
end
if new == nil then
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  redis.call('HINCRBY', KEYS[5], 'removed_' .. ev, 1)
  return {2, ''}
end
local v = string.format('%.17g', new)
redis.call('ZADD', KEYS[1], v, id)
if ARGV[3] ~= '' then redis.call('ZADD', KEYS[3], ARGV[3], id) end
if ev == 'success' then redis.call('ZADD', KEYS[2], ARGV[4], id) end
return {1, v}
"""

# KEYS: raw url   ARGV: n   -> flat list id, url, id, url ... (each goes to one validator only)
_TAKE_RAW = """
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local out = {}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local url = redis.call('HGET', KEYS[2], id)
  if url then out[#out + 1] = id; out[#out + 1] = url end
end
return out
"""

# KEYS: score raw url   ARGV: id url now  -> 1 if queued (unknown to the pool and not queued yet)
_ADD_RAW = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
if redis.call('ZADD', KEYS[2], 'NX', ARGV[3], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
return 1
"""


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
    """Scores, indexes and URLs of every validated proxy, shared by all sites."""

    def __init__(
        self,
        rds: redis.Redis | None = None,
        prefix: str | None = None,
        settings: ProxySettings | None = None,
    ) -> None:
        self.rds = rds if rds is not None else get_redis()
        self.prefix = prefix if prefix is not None else get_settings().key_prefix
        self.settings = settings or get_proxy_settings()
        self.keys = ProxyKeys(self.prefix)
        self._record = self.rds.register_script(_RECORD)
        self._take_raw = self.rds.register_script(_TAKE_RAW)
        self._add_raw = self.rds.register_script(_ADD_RAW)

    # --- harvest -> first validation -----------------------------------------------------
    def add_raw(self, proxies: Iterable[str | ProxyAddress], now: float | None = None) -> int:
        """Queue harvested proxies for their first validation; returns how many were new."""
        now = time.time() if now is None else now
        k = self.keys
        pipe = self.rds.pipeline(transaction=False)
        n = 0
        for p in proxies:
            try:
                addr = p if isinstance(p, ProxyAddress) else ProxyAddress.parse(p)
            except ValueError:
                continue
            self._add_raw(keys=[k.score, k.raw, k.url], args=[addr.id, addr.url, now], client=pipe)
            n += 1
        return sum(int(x) for x in pipe.execute()) if n else 0

    def take_raw(self, limit: int) -> list[ProxyAddress]:
        """Pop up to `limit` proxies awaiting their first validation (each goes to one caller)."""
        flat = self._take_raw(keys=[self.keys.raw, self.keys.url], args=[limit])
        out = []
        for i in range(0, len(flat), 2):
            try:
                out.append(ProxyAddress.parse(_s(flat[i + 1])))
            except ValueError:
                self.rds.hdel(self.keys.url, flat[i])
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
        pipe.hset(k.url, addr.id, addr.url)
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
        self, proxy_id: str, event: Event, elapsed: float | None = None, now: float | None = None
    ) -> RecordResult:
        """Apply one outcome with haipproxy's rule, atomically. Absent proxies stay absent."""
        now = time.time() if now is None else now
        k = self.keys
        state, score = self._record(
            keys=[k.score, k.checked, k.speed, k.url, k.stats],
            args=[
                proxy_id,
                event.value,
                "" if elapsed is None else repr(float(elapsed)),
                repr(float(now)),
                repr(float(self.settings.smooth_above)),
            ],
        )
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
        return [_s(x) for x in self.rds.zrange(self.keys.score, 0, -1)]

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
        ids = list(ids)
        if not ids:
            return {}
        vals = self.rds.hmget(self.keys.url, ids)
        return {i: _s(v) for i, v in zip(ids, vals, strict=True) if v is not None}

    def address(self, proxy_id: str) -> ProxyAddress | None:
        url = self.rds.hget(self.keys.url, proxy_id)
        return ProxyAddress.parse(_s(url)) if url is not None else None

    def stalest(self, older_than: float, limit: int, now: float | None = None) -> list[str]:
        """Members last validated more than `older_than` seconds ago, oldest first."""
        now = time.time() if now is None else now
        return [
            _s(x)
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
        return {_s(k): int(v) for k, v in self.rds.hgetall(self.keys.stats).items()}

    def clear(self) -> None:
        """Delete every global key (tests and `control.sh reset`)."""
        k = self.keys
        self.rds.delete(k.score, k.checked, k.speed, k.url, k.raw, k.stats)


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
