"""Per-site channel pools (seed 001): exclusive, leased checkouts of proxies from the global pool.

Keys of site S under `<p>:proxy:chan:S`:

    :idle   zset  id -> use count     proxies free to check out, least used first
    :uses   hash  id -> use count     exact counts of every member, idle or lent
    :url    hash  id -> proxy URL     the channel's own copy, so it keeps serving after the
                                      proxy left the global pool because of another site
    :lease  zset  id -> expiry (ms)   lent proxies; Redis server time, so worker clocks never matter
    :token  hash  id -> lease token   fences a late return from a lease that was already reclaimed
    :ban    zset  id -> until (ms)    proxies this site blocked; refills skip them until then
    :stats  hash  banned dropped      how often this site benched or dropped a proxy (counters)

Every state change is one Lua script, so each is atomic:

* checkout moves the least-used idle proxy (not in the task's `avoid`, unless every proxy of
  the channel is) to `:lease` with a fresh token, after first reclaiming leases that expired
  (their worker died).
* release only acts if the caller's token is still the lease's token; the use count is the
  exact `HINCRBY` of `:uses`, copied into `:idle` (seed 001's hash variant, no ZADD INCR drift).
* refill adds a global-pool proxy only if `:uses` does not know it (`HSETNX`): a proxy that is
  lent right now can never be added a second time, which is the double-checkout race of seed 001.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field

import redis

from external_interface.proxy_models import Event
from external_interface.proxy_pool import GlobalPool, _s
from external_interface.proxy_select import Selector

log = logging.getLogger(__name__)

# Shared prologue: server time in ms, then give back leases whose holder vanished.
# KEYS[1..6] = idle uses url lease token ban ; ARGV[1] = reclaim limit
_PROLOGUE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reclaimed = 0
local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[4], id)
  redis.call('HDEL', KEYS[5], id)
  if redis.call('HEXISTS', KEYS[3], id) == 1 then
    local n = redis.call('HINCRBY', KEYS[2], id, 1)
    redis.call('ZADD', KEYS[1], n, id)
    reclaimed = reclaimed + 1
  end
end
"""

# ARGV: reclaim_limit lease_ms token fallback(0|1) avoid...
# -> {} | {id, url, uses, expires_ms, idle_left}
_CHECKOUT = (
    _PROLOGUE
    + """
local avoid, n_avoid = {}, 0
for i = 5, #ARGV do
  if not avoid[ARGV[i]] then avoid[ARGV[i]] = true; n_avoid = n_avoid + 1 end
end
local function lend(id)
  redis.call('ZREM', KEYS[1], id)
  local url = redis.call('HGET', KEYS[3], id)
  if not url then
    redis.call('HDEL', KEYS[2], id)
    return nil
  end
  local exp = now + tonumber(ARGV[2])
  redis.call('ZADD', KEYS[4], exp, id)
  redis.call('HSET', KEYS[5], id, ARGV[3])
  local uses = redis.call('HGET', KEYS[2], id) or '0'
  return {id, url, uses, tostring(exp), redis.call('ZCARD', KEYS[1])}
end
local cands = redis.call('ZRANGE', KEYS[1], 0, n_avoid)
local fallback = nil
for _, id in ipairs(cands) do
  if not avoid[id] then
    local res = lend(id)
    if res then return res end
  elseif not fallback then
    fallback = id
  end
end
-- with `fallback`, when every proxy of the channel is one the task avoids (none would ever
-- come back for it: bug 9), the least used avoided one is lent after all
if fallback and ARGV[4] == '1' then
  local others = redis.call('HLEN', KEYS[2])
  for id in pairs(avoid) do
    if redis.call('HEXISTS', KEYS[2], id) == 1 then others = others - 1 end
  end
  if others <= 0 then
    local res = lend(fallback)
    if res then return res end
  end
end
return {}
"""
)

# ARGV: reclaim_limit -> number reclaimed
_RECLAIM = _PROLOGUE + "return reclaimed"

# ARGV: reclaim_limit id token action(ok|drop|ban) ban_ms lease_ms
# -> 1 returned idle, 2 dropped, 3 renewed, 0 stale token (lease had been reclaimed)
_RELEASE = (
    _PROLOGUE
    + """
local id, action = ARGV[2], ARGV[4]
local function drop()
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  if action == 'ban' then redis.call('ZADD', KEYS[6], now + tonumber(ARGV[5]), id) end
end
if redis.call('HGET', KEYS[5], id) ~= ARGV[3] then
  -- our lease expired and the proxy went back (maybe to another worker): count the use,
  -- and let a failure take it out of the channel if nobody holds it now
  if action == 'renew' then return 0 end
  if redis.call('HEXISTS', KEYS[2], id) == 1 then
    local n = redis.call('HINCRBY', KEYS[2], id, 1)
    if redis.call('ZSCORE', KEYS[1], id) then
      if action == 'ok' then redis.call('ZADD', KEYS[1], n, id) else drop() end
    end
  end
  return 0
end
if action == 'renew' then
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[6]), id)
  return 3
end
redis.call('ZREM', KEYS[4], id)
redis.call('HDEL', KEYS[5], id)
if action == 'ok' then
  local n = redis.call('HINCRBY', KEYS[2], id, 1)
  redis.call('ZADD', KEYS[1], n, id)
  return 1
end
drop()
return 2
"""
)

# KEYS: idle uses url lease token ban gscore gurl ; ARGV: reclaim_limit id... -> number added
_REFILL = (
    _PROLOGUE
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
local added = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  if not redis.call('ZSCORE', KEYS[6], id) and redis.call('ZSCORE', KEYS[7], id) then
    local url = redis.call('HGET', KEYS[8], id)
    if url and redis.call('HSETNX', KEYS[2], id, 0) == 1 then
      redis.call('HSET', KEYS[3], id, url)
      redis.call('ZADD', KEYS[1], 0, id)
      added = added + 1
    end
  end
end
return added
"""
)

# ARGV: reclaim_limit id... -> number purged (idle members only; lent ones fail on their own)
_PURGE = (
    _PROLOGUE
    + """
local n = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    n = n + 1
  end
end
return n
"""
)

RECLAIM_LIMIT = 32


@dataclass(frozen=True)
class Lease:
    """One exclusive checkout. `url` may hold credentials: it is kept out of repr."""

    site: str
    id: str
    token: str
    uses: int
    expires_ms: int
    url: str = field(repr=False)


class ChannelPool:
    """The proxies one site draws from; see the module docstring for keys and atomicity."""

    def __init__(
        self,
        site: str,
        pool: GlobalPool,
        selector: Selector | None = None,
    ) -> None:
        self.site = site
        self.pool = pool
        self.rds: redis.Redis = pool.rds
        self.settings = pool.settings
        self.selector = selector or Selector(pool)
        base = pool.keys.channel(site)
        self.base = base
        self.k_idle, self.k_uses, self.k_url = f"{base}:idle", f"{base}:uses", f"{base}:url"
        self.k_lease, self.k_token, self.k_ban = f"{base}:lease", f"{base}:token", f"{base}:ban"
        self.k_stats = f"{base}:stats"
        self._keys = [self.k_idle, self.k_uses, self.k_url, self.k_lease, self.k_token, self.k_ban]
        self._checkout = self.rds.register_script(_CHECKOUT)
        self._release = self.rds.register_script(_RELEASE)
        self._refill = self.rds.register_script(_REFILL)
        self._reclaim = self.rds.register_script(_RECLAIM)
        self._purge = self.rds.register_script(_PURGE)
        self._last_refill = 0.0
        self._refill_lock = threading.Lock()

    # --- lending -----------------------------------------------------------------------------
    def checkout(self, avoid: Collection[str] = (), lease_ttl: float | None = None) -> Lease | None:
        """Lend the least-used proxy not in `avoid`, refilling from the global pool when the
        channel runs low (at most once per `refill_interval` per instance). `avoid` is a
        preference: when every proxy of the channel is in it, the least used is lent anyway."""
        lease, idle_left = self._take(avoid, lease_ttl)
        low = lease is None or idle_left < self.settings.refill_below
        due = time.monotonic() - self._last_refill >= self.settings.refill_interval
        if low and due:
            self.refill()
            if lease is None:  # this refill, or another thread's just before it, filled it
                lease, _ = self._take(avoid, lease_ttl)
        if lease is None and avoid:  # every proxy here avoided? then one of them (bug 9)
            lease, _ = self._take(avoid, lease_ttl, fallback=True)
        return lease

    def _take(
        self, avoid: Collection[str], lease_ttl: float | None, fallback: bool = False
    ) -> tuple[Lease | None, int]:
        ttl = self.settings.lease_ttl if lease_ttl is None else lease_ttl
        token = secrets.token_hex(8)
        args = [RECLAIM_LIMIT, int(ttl * 1000), token, int(fallback), *avoid]
        res = self._checkout(keys=self._keys, args=args)
        if not res:
            return None, 0
        pid, url, uses, exp, idle_left = res
        return Lease(self.site, _s(pid), token, int(uses), int(exp), _s(url)), int(idle_left)

    def release(
        self, lease: Lease, event: Event = Event.SUCCESS, ban_ttl: float | None = None
    ) -> str:
        """Give a lease back. Success, timeout and neutral return it; dead drops it; banned
        drops it and keeps it out of this channel for `ban_ttl` (default: the setting; a site
        that says how long, e.g. a 429's retry-after, passes that). Returns what happened."""
        action = {Event.DEAD: "drop", Event.BANNED: "ban"}.get(event, "ok")
        state = self._call_release(lease, action, ban_ttl=ban_ttl)
        if state == "dropped":
            self.rds.hincrby(self.k_stats, "banned" if action == "ban" else "dropped", 1)
        return state

    def renew(self, lease: Lease, lease_ttl: float | None = None) -> bool:
        """Extend a lease for a long request; False if it had already expired and gone back."""
        return self._call_release(lease, "renew", lease_ttl) == "renewed"

    def _call_release(
        self,
        lease: Lease,
        action: str,
        lease_ttl: float | None = None,
        ban_ttl: float | None = None,
    ) -> str:
        ttl = self.settings.lease_ttl if lease_ttl is None else lease_ttl
        ban = self.settings.ban_ttl if ban_ttl is None else min(ban_ttl, self.settings.ban_ttl)
        res = self._release(
            keys=self._keys,
            args=[
                RECLAIM_LIMIT,
                lease.id,
                lease.token,
                action,
                max(1, int(ban * 1000)),
                int(ttl * 1000),
            ],
        )
        state = {0: "stale", 1: "returned", 2: "dropped", 3: "renewed"}[int(res)]
        if state == "stale":
            log.warning(
                "proxy %s: lease for site %s had expired before release", lease.id, self.site
            )
        return state

    # --- upkeep ------------------------------------------------------------------------------
    def refill(self, limit: int | None = None) -> int:
        """Copy qualifying global proxies this channel does not know yet; returns how many."""
        limit = self.settings.refill_batch if limit is None else limit
        with self._refill_lock:
            self._last_refill = time.monotonic()
        ranked = self.selector.select().ids
        if not ranked:
            return 0
        # cheap pre-filter so `limit` counts new proxies; the script re-checks atomically
        known = self.rds.hmget(self.k_uses, ranked)
        fresh = [i for i, k in zip(ranked, known, strict=True) if k is None][: max(limit, 0)]
        if not fresh:
            return 0
        self.rds.sadd(self.pool.keys.channels, self.site)
        keys = [*self._keys, self.pool.keys.score, self.pool.keys.url]
        return int(self._refill(keys=keys, args=[RECLAIM_LIMIT, *fresh]))

    def reclaim(self) -> int:
        """Give back every expired lease now (checkout also does it, a few at a time)."""
        total = 0
        while True:
            n = int(self._reclaim(keys=self._keys, args=[RECLAIM_LIMIT]))
            total += n
            if n < RECLAIM_LIMIT:
                return total

    def purge(self, ids: Collection[str]) -> int:
        """Take idle copies of `ids` out of this channel (proxies found dead by a validator)."""
        if not ids:
            return 0
        return int(self._purge(keys=self._keys, args=[RECLAIM_LIMIT, *ids]))

    def unban(self, proxy_id: str) -> None:
        self.rds.zrem(self.k_ban, proxy_id)

    # --- reads -------------------------------------------------------------------------------
    def idle(self) -> list[tuple[str, int]]:
        """Idle members with their use counts, least used first."""
        return [(_s(i), int(s)) for i, s in self.rds.zrange(self.k_idle, 0, -1, withscores=True)]

    def lent(self) -> list[str]:
        return [_s(i) for i in self.rds.zrange(self.k_lease, 0, -1)]

    def members(self) -> set[str]:
        """Every proxy the channel knows, idle or lent."""
        return {_s(i) for i in self.rds.hkeys(self.k_uses)}

    def uses(self, proxy_id: str) -> int | None:
        v = self.rds.hget(self.k_uses, proxy_id)
        return int(v) if v is not None else None

    def banned(self) -> list[str]:
        now_ms = int(time.time() * 1000)
        return [_s(i) for i in self.rds.zrangebyscore(self.k_ban, now_ms, "+inf")]

    def clear(self) -> None:
        self.rds.delete(*self._keys, self.k_stats)
        self.rds.srem(self.pool.keys.channels, self.site)


def channel_stats(channel: ChannelPool) -> dict[str, int]:
    """Counters of one channel: `banned` (benched by the site), `dropped` (dead for it)."""
    return {_s(k): int(v) for k, v in channel.rds.hgetall(channel.k_stats).items()}


def channels(pool: GlobalPool) -> list[str]:
    """Sites that have a channel pool."""
    return sorted(_s(x) for x in pool.rds.smembers(pool.keys.channels))


def settle(
    pool: GlobalPool,
    channel: ChannelPool | None,
    lease: Lease | None,
    proxy_id: str,
    event: Event,
    elapsed: float | None,
    ban_ttl: float | None = None,
) -> None:
    """Apply one request's outcome: global score (haipproxy rule), then the channel lease.

    A ban only concerns the site that banned: the global score is left alone, so other sites
    keep using the proxy, and this site benches it for `ban_ttl` (default: the setting). A dead
    proxy leaves the global pool and this channel; other channels keep their copy until their
    own requests fail (seed 001), or a validator purges it.
    """
    if event is not Event.BANNED and pool.record(proxy_id, event, elapsed).state == "removed":
        event = Event.DEAD  # e.g. a timeout took the score to 0: gone from this channel too
    if channel is not None and lease is not None:
        channel.release(lease, event, ban_ttl=ban_ttl)
