"""Per-site resource pools in Redis (cookies, device ids): exclusive leases with rotation,
cool-down, use limits, a health score, retire-on-ban, and production when a pool runs low.

Keys of pool `<p>:pool:<kind>:<site>` (kind = the provider kind, "cookie" or "device_id"):

    :idle     zset  id -> ready at (ms)   members not lent; usable once `ready at` <= now, so the
                                          least recently used ready member goes out first (rotation)
    :lease    zset  id -> expiry (ms)     lent members; Redis server time, worker clocks never matter
    :token    hash  id -> lease token     fences a late return from a lease that was reclaimed
    :uses     hash  id -> uses            completed requests per member (use limit)
    :score    hash  id -> health score    +1 per success, -penalty per failure, retired at 0
    :secret   hash  id -> JSON            the secret itself (cookie values, device id, its UA):
                                          the only place it lives; messages carry the opaque id
    :stats    hash  produced checkouts bans retired retired:<reason> reclaimed cancelled
                    production_runs production_dry_runs   (counters since the pool was created)
    :retired  zset  id -> unix time       the last 1000 retired ids, for inspection
    :producing  str "<run id> <produced>" the latest production run (PX produce_ttl): while it
                                          is not done no other run starts (stampede guard)
    :produce_gap str (PX gap)             least time between two production runs; doubles
    :dry_streak  int                      with every run in a row that added nothing
    <p>:pools   set "kind:site"           every pool, for health reports

Every state change is one Lua script, so checkouts are exclusive across all workers: a member
is in `:idle` or in `:lease`, never both, and only the holder of the current token returns it.
A ban retires the member even when its lease had already been reclaimed (the site has spoken).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import redis

from config import SITE_VARS, get_settings
from exceptions import BannedError, ConfigError, LoginRequired, ResourceUnavailable
from external_interface.base import Outcome, OutgoingRequest
from utils.redis import get_redis
from utils.registry import UnknownNameError

log = logging.getLogger(__name__)

RECLAIM_LIMIT = 32
MAX_PRODUCE_GAP = 300.0  # longest back-off between production runs that add nothing
RETIRED_KEEP = 1000


# --- configuration -------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolConfig:
    """Tunables of one pool. Per kind and per site; see `pool_config` for where they come from."""

    cooldown: float = 0.0  # seconds a member rests after each use (rate per member)
    max_uses: int = 0  # retire a member after this many uses; 0 = never
    lease_ttl: float = 60.0  # a lent member comes back by itself after this (holder died)
    low_water: int = 2  # fewer members than this starts the production chain...
    target: int = 5  # ...which produces up to this many members
    initial_score: int = 5
    max_score: int = 10
    fail_penalty: int = 2  # score lost on a failure that is the member's fault
    wait: float = 1.0  # longest retry_after when nothing is free
    produce_ttl: float = 180.0  # a production run older than this stops blocking the next one
    produce_gap: float = 1.0  # least seconds between the starts of two production runs


_KIND_DEFAULTS: dict[str, dict[str, Any]] = {}
_SITE_DEFAULTS: dict[tuple[str, str], dict[str, Any]] = {}


def configure_pool(kind: str, site: str = "*", **values: Any) -> None:
    """Code-level defaults (a site's resource module calls this); the environment still wins."""
    unknown = set(values) - {f.name for f in fields(PoolConfig)}
    if unknown:
        raise TypeError(f"unknown pool settings: {', '.join(sorted(unknown))}")
    target = (
        _KIND_DEFAULTS.setdefault(kind, {})
        if site == "*"
        else _SITE_DEFAULTS.setdefault((kind, site), {})
    )
    target.update(values)
    pool_config.cache_clear()


@functools.lru_cache(maxsize=256)
def pool_config(kind: str, site: str) -> PoolConfig:
    """Defaults < configure_pool(kind) < configure_pool(kind, site) < env CHAINCRAWL_POOL_<KIND>
    < env CHAINCRAWL_POOL_<KIND>_<SITE>; the variables hold JSON objects ({"cooldown": 2})."""
    cfg = PoolConfig()
    layers: list[Mapping[str, Any]] = [
        _KIND_DEFAULTS.get(kind, {}),
        _SITE_DEFAULTS.get((kind, site), {}),
    ]
    spec = SITE_VARS["pool"]
    for var in (spec.default_name(kind=kind), spec.name(site, kind=kind)):
        raw = os.environ.get(var or "")
        if raw:
            layers.append(_env_layer(var or "", raw))
    for layer in layers:
        clean = {k: type(getattr(cfg, k))(v) for k, v in layer.items() if hasattr(cfg, k)}
        cfg = replace(cfg, **clean)
    return cfg


def _env_layer(var: str, raw: str) -> dict[str, Any]:
    """A pool variable's JSON object; a key PoolConfig lacks is an error, not ignored."""
    try:
        layer = json.loads(raw)
    except ValueError:
        layer = None
    if not isinstance(layer, dict):
        raise ConfigError(f'{var} must be a JSON object like {{"target": 6}}')
    known = [f.name for f in fields(PoolConfig)]
    for key in layer:
        if key not in known:
            raise ConfigError(f"{var}: {UnknownNameError('pool setting', key, known)}")
    return layer


def reset_pool_config() -> None:
    """Forget cached configs (tests that change the environment call this)."""
    pool_config.cache_clear()


# --- ban detection ------------------------------------------------------------------------


class Verdict:
    """What a response says about the member that was lent for it."""

    OK = "ok"  # it worked: score +1
    FAILED = "failed"  # the member's fault (e.g. an unexplained 403): score -penalty
    NEUTRAL = "neutral"  # not the member's business (5xx, timeouts, an IP ban): no change
    BANNED = "banned"  # the site rejected the member: retire it, raise a BannedError


@dataclass(frozen=True)
class Rule:
    """A ban-detection rule: matches when the status fits (None = any) and, if `markers` are
    given, one of them occurs in the body's first bytes."""

    verdict: str
    status: frozenset[int] | None = None
    markers: tuple[str, ...] = ()
    error: type[BannedError] = BannedError
    reason: str = ""

    def matches(self, outcome: Outcome) -> bool:
        if outcome.status is None:
            return False
        if self.status is not None and outcome.status not in self.status:
            return False
        return not self.markers or any(m in outcome.text_sample for m in self.markers)


def rule(
    verdict: str,
    status: Iterable[int] | None = None,
    markers: Iterable[str] = (),
    error: type[BannedError] = BannedError,
    reason: str = "",
) -> Rule:
    return Rule(
        verdict, frozenset(status) if status is not None else None, tuple(markers), error, reason
    )


_RULES: dict[tuple[str, str], list[Rule]] = {}

# What every site gets after its own rules: generic signs of a dead session or device.
GENERIC_RULES: dict[str, list[Rule]] = {
    "cookie": [
        rule(Verdict.BANNED, {401}, error=LoginRequired, reason="401"),
        rule(Verdict.FAILED, {403}, reason="403"),
    ],
    "device_id": [rule(Verdict.FAILED, {401, 403}, reason="forbidden")],
}


def add_rules(site: str, kind: str, *rules: Rule) -> None:
    """Register a site's ban rules for a pool kind; earlier rules win."""
    _RULES.setdefault((site, kind), []).extend(rules)


def site_rule(site: str, kind: str, outcome: Outcome) -> Rule | None:
    """The first of the site's own rules for `kind` that matches (no generic rules): lets a
    provider with its own default judgement (the proxy's `classify`) defer to the site."""
    return next((r for r in _RULES.get((site, kind), ()) if r.matches(outcome)), None)


def judge(site: str, kind: str, outcome: Outcome) -> tuple[str, Rule | None]:
    """The verdict on a lent member: the site's rules, then the generic ones, then by status."""
    for r in (*_RULES.get((site, kind), ()), *GENERIC_RULES.get(kind, ())):
        if r.matches(outcome):
            return r.verdict, r
    if outcome.error is not None or outcome.status is None:
        return Verdict.NEUTRAL, None
    return (Verdict.OK if outcome.status < 400 else Verdict.NEUTRAL), None


# --- production ---------------------------------------------------------------------------


@dataclass
class Producer:
    """How a pool is refilled: a chain (built lazily, so endpoint modules load first) and the
    seeds for `n` new members."""

    chain: Callable[[], Any]
    seeds: Callable[[int], list[dict[str, Any]]] = field(
        default=lambda n: [{"slot": i} for i in range(n)]
    )


_PRODUCERS: dict[tuple[str, str], Producer] = {}
_warned: set[str] = set()


def register_producer(kind: str, site: str, producer: Producer) -> None:
    _PRODUCERS[(kind, site)] = producer


def get_producer(kind: str, site: str) -> Producer | None:
    return _PRODUCERS.get((kind, site))


def known_kinds() -> set[str]:
    """Pool kinds this process knows of: produced, or configured in code."""
    return {k for k, _ in _PRODUCERS} | set(_KIND_DEFAULTS) | {k for k, _ in _SITE_DEFAULTS}


def _start_run(chain: Any, seeds: list[dict[str, Any]], run_id: str) -> None:
    import chains

    chains.run(chain, seeds=seeds, priority=9, run_id=run_id)


def _run_finished(rds: redis.Redis, run_id: str) -> bool:
    from chains.state import RunState

    return RunState(rds, get_settings()).info(run_id).get("status") in ("done", "cancelled")


# --- Lua ----------------------------------------------------------------------------------

# KEYS: idle lease token uses score secret stats retired ; shared prologue: server time, and
# leases whose holder vanished go back to idle (ready at once).
_PROLOGUE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, RECLAIM_LIMIT)
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  if redis.call('HEXISTS', KEYS[6], id) == 1 then
    redis.call('ZADD', KEYS[1], now, id)
    redis.call('HINCRBY', KEYS[7], 'reclaimed', 1)
  end
end
local function retire(id, reason)
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  redis.call('HDEL', KEYS[5], id)
  redis.call('HDEL', KEYS[6], id)
  redis.call('HINCRBY', KEYS[7], 'retired', 1)
  redis.call('HINCRBY', KEYS[7], 'retired:' .. reason, 1)
  redis.call('ZADD', KEYS[8], math.floor(now / 1000), id)
  redis.call('ZREMRANGEBYRANK', KEYS[8], 0, -RETIRED_KEEP)
end
local function sizes()
  local avail = redis.call('ZCOUNT', KEYS[1], '-inf', now)
  return avail, redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
end
""".replace("RECLAIM_LIMIT", str(RECLAIM_LIMIT)).replace("RETIRED_KEEP", str(RETIRED_KEEP + 1))

# ARGV: lease_ms token avoid...
# -> {id, secret, uses, score, available, size, 0} | {'', '', 0, 0, available, size, wait_ms}
_CHECKOUT = (
    _PROLOGUE
    + """
local avoid, n_avoid = {}, 0
for i = 3, #ARGV do
  if not avoid[ARGV[i]] then avoid[ARGV[i]] = true; n_avoid = n_avoid + 1 end
end
local function lend(id)
  redis.call('ZREM', KEYS[1], id)
  local secret = redis.call('HGET', KEYS[6], id)
  if not secret then return nil end
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), id)
  redis.call('HSET', KEYS[3], id, ARGV[2])
  redis.call('HINCRBY', KEYS[7], 'checkouts', 1)
  local avail, size = sizes()
  return {id, secret, redis.call('HGET', KEYS[4], id) or '0',
          redis.call('HGET', KEYS[5], id) or '0', avail, size, 0}
end
local cands = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, n_avoid + 1)
local fallback = nil
for _, id in ipairs(cands) do
  if not avoid[id] then
    local res = lend(id)
    if res then return res end
  elseif not fallback then
    fallback = id
  end
end
-- Every ready member is one the task avoids. Waiting helps while a member it does not avoid
-- exists (lent, resting); when none does, nothing would ever come and the task would wait
-- for good (bug 9): it gets the avoided member idle longest after all.
if fallback then
  local others = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
  for id in pairs(avoid) do
    if redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id) then
      others = others - 1
    end
  end
  if others <= 0 then
    local res = lend(fallback)
    if res then return res end
  end
end
local avail, size = sizes()
local wait = -1
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then wait = math.max(0, tonumber(first[2]) - now) end
return {'', '', 0, 0, avail, size, wait}
"""
)

# ARGV: id token action cooldown_ms max_uses delta max_score reason
# action: ok | fail | neutral (a use) ; cancel (no use) ; ban | retire
# -> {state, size}: state 0 stale/unknown, 1 back to idle, 2 retired
_RELEASE = (
    _PROLOGUE
    + """
local id, action = ARGV[1], ARGV[3]
if redis.call('HEXISTS', KEYS[6], id) == 0 then
  local _, size = sizes()
  return {0, size}
end
if redis.call('HGET', KEYS[3], id) ~= ARGV[2] then
  if action == 'ban' then
    redis.call('HINCRBY', KEYS[7], 'bans', 1)
    retire(id, 'banned')
    local _, size = sizes()
    return {2, size}
  end
  local _, size = sizes()
  return {0, size}
end
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
local state = 1
if action == 'ban' then
  redis.call('HINCRBY', KEYS[7], 'bans', 1)
  retire(id, 'banned')
  state = 2
elseif action == 'retire' then
  retire(id, ARGV[8])
  state = 2
elseif action == 'cancel' then
  redis.call('ZADD', KEYS[1], now, id)
  redis.call('HINCRBY', KEYS[7], 'cancelled', 1)
else
  local uses = redis.call('HINCRBY', KEYS[4], id, 1)
  local score = tonumber(redis.call('HGET', KEYS[5], id) or '0') + tonumber(ARGV[6])
  score = math.min(score, tonumber(ARGV[7]))
  local max_uses = tonumber(ARGV[5])
  if score <= 0 then
    retire(id, 'unhealthy')
    state = 2
  elseif max_uses > 0 and uses >= max_uses then
    retire(id, 'used_up')
    state = 2
  else
    redis.call('HSET', KEYS[5], id, score)
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), id)
  end
end
local _, size = sizes()
return {state, size}
"""
)

# ARGV: id secret initial_score -> 1 added, 0 already known
_ADD = (
    _PROLOGUE
    + """
if redis.call('HSETNX', KEYS[6], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HSET', KEYS[5], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[4], ARGV[1], 0)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('HINCRBY', KEYS[7], 'produced', 1)
return 1
"""
)

# ARGV: id reason -> 1 retired, 0 unknown (whether idle or lent)
_RETIRE = (
    _PROLOGUE
    + """
if redis.call('HEXISTS', KEYS[6], ARGV[1]) == 0 then return 0 end
retire(ARGV[1], ARGV[2])
return 1
"""
)

# ARGV: (none) -> {available, size, leased, now_ms}
_SIZES = (
    _PROLOGUE
    + """
local avail, size = sizes()
return {avail, size, redis.call('ZCARD', KEYS[2]), now}
"""
)

# KEYS: producing gap ; ARGV: expected ('' = none) run_id ttl_ms gap_ms -> 1 acquired
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1]) or ''
if cur ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', tonumber(ARGV[3]))
if tonumber(ARGV[4]) > 0 then redis.call('SET', KEYS[2], '1', 'PX', tonumber(ARGV[4])) end
return 1
"""


# --- the pool -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    """One exclusive checkout. `secret` holds the member's values: kept out of repr and logs."""

    kind: str
    site: str
    id: str
    token: str
    uses: int
    score: int
    secret: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Checkout:
    lease: Lease | None
    available: int  # ready members left after this checkout
    size: int  # members in the pool (idle or lent)
    wait: float | None  # seconds until the next member is ready (None: pool empty)


class Pool:
    """One site's pool of one kind; see the module docstring for keys and atomicity."""

    def __init__(
        self,
        kind: str,
        site: str,
        *,
        rds: redis.Redis | None = None,
        prefix: str | None = None,
        config: PoolConfig | None = None,
    ) -> None:
        self.kind, self.site = kind, site
        self.name = f"{kind}:{site}"
        self._rds = rds
        self.prefix = prefix if prefix is not None else get_settings().key_prefix
        self._config = config
        self.base = f"{self.prefix}:pool:{kind}:{site}"
        b = self.base
        self.keys = [
            f"{b}:{k}"
            for k in ("idle", "lease", "token", "uses", "score", "secret", "stats", "retired")
        ]
        (
            self.k_idle,
            self.k_lease,
            _,
            self.k_uses,
            self.k_score,
            self.k_secret,
            self.k_stats,
            self.k_retired,
        ) = self.keys
        self.k_producing, self.k_gap = f"{b}:producing", f"{b}:produce_gap"
        self.k_pools = f"{self.prefix}:pools"
        self._scripts: dict[str, Any] = {}

    @property
    def rds(self) -> redis.Redis:
        """The given client, else the process's (looked up per call: safe across fork)."""
        return self._rds if self._rds is not None else get_redis()

    @property
    def config(self) -> PoolConfig:
        return self._config or pool_config(self.kind, self.site)

    def _run(self, name: str, src: str, keys: list[str], args: list[Any]) -> Any:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self.rds.register_script(src)
        return script(keys=keys, args=args, client=self.rds)

    # --- lending -------------------------------------------------------------------------
    def checkout(self, avoid: Collection[str] = ()) -> Checkout:
        """Lend the ready member idle longest, not in `avoid`, exclusively until released.
        `avoid` is a preference: when every member of the pool is in it, waiting could never
        end (nothing comes back, a pool at its low-water mark produces nothing), so the
        avoided member idle longest is lent after all (bug 9)."""
        cfg = self.config
        token = secrets.token_hex(8)
        res = self._run(
            "checkout", _CHECKOUT, self.keys, [int(cfg.lease_ttl * 1000), token, *avoid]
        )
        mid, raw, uses, score, avail, size, wait = res
        mid = _s(mid)
        if not mid:
            return Checkout(
                None, int(avail), int(size), None if int(wait) < 0 else int(wait) / 1000
            )
        lease = Lease(
            self.kind, self.site, mid, token, int(uses), int(float(score)), json.loads(raw)
        )
        return Checkout(lease, int(avail), int(size), 0.0)

    def release(self, lease: Lease, verdict: str) -> tuple[str, int]:
        """Return a lease with the request's verdict; -> (state, pool size), state one of
        "returned", "retired", "stale" (the lease had expired and was reclaimed)."""
        cfg = self.config
        action, delta = {
            Verdict.OK: ("ok", 1),
            Verdict.FAILED: ("fail", -cfg.fail_penalty),
            Verdict.NEUTRAL: ("neutral", 0),
            Verdict.BANNED: ("ban", 0),
        }[verdict]
        return self._release(lease, action, delta)

    def cancel(self, lease: Lease) -> None:
        """Give a lease back unused (the request was never sent): no use, no cool-down."""
        self._release(lease, "cancel", 0)

    def _release(self, lease: Lease, action: str, delta: int, reason: str = "") -> tuple[str, int]:
        cfg = self.config
        state, size = self._run(
            "release",
            _RELEASE,
            self.keys,
            [
                lease.id,
                lease.token,
                action,
                int(cfg.cooldown * 1000),
                cfg.max_uses,
                delta,
                cfg.max_score,
                reason,
            ],
        )
        return {0: "stale", 1: "returned", 2: "retired"}[int(state)], int(size)

    # --- membership ----------------------------------------------------------------------
    def add(self, secret: Mapping[str, Any], member_id: str | None = None) -> str | None:
        """Add a member (idempotent per id); returns its opaque id, None if it was known."""
        mid = member_id or f"{self.kind[:2]}-{uuid.uuid4().hex[:12]}"
        payload = json.dumps(dict(secret), separators=(",", ":"))
        pipe = self.rds.pipeline(transaction=False)
        pipe.sadd(self.k_pools, self.name)
        pipe.execute()
        added = self._run("add", _ADD, self.keys, [mid, payload, self.config.initial_score])
        return mid if int(added) else None

    def retire(self, member_id: str, reason: str = "removed") -> bool:
        return bool(int(self._run("retire", _RETIRE, self.keys, [member_id, reason])))

    def __contains__(self, member_id: object) -> bool:
        return bool(self.rds.hexists(self.k_secret, str(member_id)))

    def ids(self) -> list[str]:
        return sorted(_s(x) for x in self.rds.hkeys(self.k_secret))

    def retired(self) -> list[str]:
        return [_s(x) for x in self.rds.zrange(self.k_retired, 0, -1)]

    def uses(self, member_id: str) -> int | None:
        v = self.rds.hget(self.k_uses, member_id)
        return int(v) if v is not None else None

    def score(self, member_id: str) -> int | None:
        v = self.rds.hget(self.k_score, member_id)
        return int(float(v)) if v is not None else None

    def clear(self) -> None:
        self.rds.delete(*self.keys, self.k_producing, self.k_gap, f"{self.base}:dry_streak")
        self.rds.srem(self.k_pools, self.name)

    # --- health --------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """size (members), available (ready now), cooling, leased, and the counters."""
        avail, size, leased, _ = self._run("sizes", _SIZES, self.keys, [])
        pipe = self.rds.pipeline(transaction=False)
        pipe.hgetall(self.k_stats)
        pipe.hvals(self.k_score)
        pipe.get(self.k_producing)
        raw, scores, producing = pipe.execute()
        counters = {_s(k): int(v) for k, v in raw.items()}
        idle = int(size) - int(leased)
        vals = [float(x) for x in scores]
        out: dict[str, Any] = {
            "pool": self.name,
            "kind": self.kind,
            "site": self.site,
            "size": int(size),
            "available": int(avail),
            "cooling": idle - int(avail),
            "leased": int(leased),
            "score_avg": round(sum(vals) / len(vals), 2) if vals else None,
            "last_run": _s(producing).split(" ")[0] if producing else None,  # latest production run
        }
        for name in (
            "produced",
            "checkouts",
            "bans",
            "retired",
            "reclaimed",
            "cancelled",
            "production_runs",
            "production_dry_runs",
        ):
            out[name] = counters.pop(name, 0)
        out["retired_by"] = {
            k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("retired:")
        }
        return out

    # --- production ----------------------------------------------------------------------
    def try_start_production(
        self,
        n: int,
        start: Callable[[Any, list[dict[str, Any]], str], None] | None = None,
        finished: Callable[[str], bool] | None = None,
    ) -> str | None:
        """Start the production chain for `n` members unless a run is already going (one run
        per pool at a time); returns the new run id or None."""
        producer = get_producer(self.kind, self.site)
        if producer is None:
            if self.name not in _warned:
                _warned.add(self.name)
                log.warning("pool %s is low and has no production chain: register_producer() "
                            "or fill it from outside (add_cookies/add_device)", self.name)  # fmt: skip
            return None
        if n <= 0:
            return None
        cfg = self.config
        cur = self.rds.get(self.k_producing)
        expected = _s(cur) if cur else ""  # "<run id> <produced count when it started>"
        prev_rid, _, produced_then = expected.partition(" ")
        if prev_rid and not (finished or (lambda r: _run_finished(self.rds, r)))(prev_rid):
            return None
        produced_now = int(self.rds.hget(self.k_stats, "produced") or 0)
        k_streak = f"{self.base}:dry_streak"
        # the last run added nothing (site down, accounts refused): back off 2, 4, 8... x gap
        dry = bool(prev_rid and produced_then.isdigit() and int(produced_then) >= produced_now)
        streak = int(self.rds.get(k_streak) or 0) + 1 if dry else 0
        gap = (
            min(cfg.produce_gap * 2 ** min(streak, 12), MAX_PRODUCE_GAP)
            if streak
            else cfg.produce_gap
        )
        rid = f"prod-{self.kind}-{self.site}-{uuid.uuid4().hex[:8]}"
        got = self._run(
            "acquire",
            _ACQUIRE,
            [self.k_producing, self.k_gap],
            [
                expected,
                f"{rid} {produced_now}",
                max(1, int(cfg.produce_ttl * 1000)),
                int(gap * 1000),
            ],
        )
        if not int(got):
            return None
        if dry:
            self.rds.set(k_streak, streak)
            self.rds.hincrby(self.k_stats, "production_dry_runs", 1)
            log.warning("pool %s: the last production run added nothing (%d in a row); next "
                        "one no sooner than %.0fs after this", self.name, streak, gap)  # fmt: skip
        else:
            self.rds.delete(k_streak)
        try:
            (start or _start_run)(producer.chain(), producer.seeds(n), rid)
        except Exception:
            self.rds.delete(self.k_producing)
            raise
        self.rds.hincrby(self.k_stats, "production_runs", 1)
        self.rds.sadd(self.k_pools, self.name)
        log.info("pool %s: production run %s started for %d members", self.name, rid, n)
        return rid


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


# --- lending on behalf of providers ---------------------------------------------------------


class Lender:
    """What the cookie and device providers share: checkout in `prepare`, verdict and return
    in `feedback`, production when the pool runs low, waiting when it is empty.

    Leases in flight are kept per process (the fetch layer hands the same request object to
    `feedback`), keyed by the request; only opaque ids reach `req.leases` and the logs.
    """

    kind: str = ""
    _lent: dict[tuple[str, int], tuple[Pool, Lease, float]] = {}
    _lent_lock = threading.Lock()

    def __init__(
        self,
        site: str,
        platform: str = "",
        *,
        rds: redis.Redis | None = None,
        prefix: str | None = None,
        config: PoolConfig | None = None,
        start: Callable[[Any, list[dict[str, Any]], str], None] | None = None,
        finished: Callable[[str], bool] | None = None,
    ) -> None:
        self.site, self.platform = site, platform
        self.pool = Pool(self.kind, site, rds=rds, prefix=prefix, config=config)
        self._start, self._finished = start, finished
        self._last_check = 0.0

    # subclasses put the secret on the request
    def apply(self, req: OutgoingRequest, lease: Lease) -> None:
        raise NotImplementedError

    def prepare(self, req: OutgoingRequest, task: Any) -> None:
        avoid = avoided(task, self.kind)
        co = self.pool.checkout(avoid)
        self._supply(co.size)
        if co.lease is None:
            cancel_leases(req)  # what other pools lent this request must not sit idle meanwhile
            wait = (
                self.pool.config.wait
                if co.wait is None
                else min(max(co.wait, 0.2), self.pool.config.wait)
            )
            raise ResourceUnavailable(
                f"no {self.kind} free for site {self.site} ({co.size} in pool)", retry_after=wait
            )
        with self._lent_lock:
            if len(self._lent) > 2000:  # requests that never got feedback: long expired
                old = time.monotonic() - 3600
                for k in [k for k, v in self._lent.items() if v[2] < old]:
                    del self._lent[k]
            self._lent[(self.kind, id(req))] = (self.pool, co.lease, time.monotonic())
        req.leases[self.kind] = co.lease.id
        self.apply(req, co.lease)

    def feedback(self, req: OutgoingRequest, outcome: Outcome, task: Any) -> None:
        held = self._take(req)
        if held is None:
            return
        pool, lease, _ = held
        verdict, why = judge(self.site, self.kind, outcome)
        state, size = pool.release(lease, verdict)
        if verdict in (Verdict.FAILED, Verdict.BANNED):
            avoid = getattr(task, "avoid", None)
            if isinstance(avoid, set):
                avoid.add(f"{self.kind}:{lease.id}")
        if state == "retired":
            self._supply(size)
        if verdict == Verdict.BANNED:
            err = why.error if why is not None else BannedError
            reason = why.reason if why is not None and why.reason else "ban"
            log.info(
                "%s %s of site %s banned (%s); retired", self.kind, lease.id, self.site, reason
            )
            raise err(f"{self.kind} {lease.id} of site {self.site} rejected by the site ({reason})")

    def cancel(self, req: OutgoingRequest, task: Any = None) -> None:
        """Give back an unused lease (the request was not sent)."""
        held = self._take(req)
        if held is not None:
            held[0].cancel(held[1])

    def _take(self, req: OutgoingRequest) -> tuple[Pool, Lease, float] | None:
        with self._lent_lock:
            return self._lent.pop((self.kind, id(req)), None)

    def _supply(self, size: int) -> None:
        """Below the low-water mark: start production (checked at most twice a second here,
        one run per pool across all workers)."""
        cfg = self.pool.config
        if size >= cfg.low_water:
            return
        now = time.monotonic()
        if now - self._last_check < 0.5:
            return
        self._last_check = now
        try:
            self.pool.try_start_production(cfg.target - size, self._start, self._finished)
        except Exception:
            log.exception("pool %s: could not start production", self.pool.name)


def avoided(task: Any, kind: str) -> set[str]:
    """Member ids of `kind` this task must not get again (`task.avoid` holds "kind:id")."""
    p = f"{kind}:"
    return {a[len(p) :] for a in getattr(task, "avoid", ()) or () if a.startswith(p)}


def cancel_leases(req: OutgoingRequest) -> None:
    """Return every pool lease this process lent `req` unused (a later provider could not lend)."""
    with Lender._lent_lock:
        held = [Lender._lent.pop(k) for k in [k for k in Lender._lent if k[1] == id(req)]]
    for pool, lease, _ in held:
        try:
            pool.cancel(lease)
        except redis.RedisError:
            log.warning(
                "%s %s: cancel failed; it returns when its lease expires", pool.kind, lease.id
            )
        req.leases.pop(pool.kind, None)


# --- health ---------------------------------------------------------------------------------


def pool_names(client: redis.Redis, prefix: str) -> list[str]:
    return sorted(_s(x) for x in client.smembers(f"{prefix}:pools"))


def pool_stats(
    client: redis.Redis, prefix: str, kind: str | None = None
) -> dict[str, dict[str, Any]]:
    """Every pool's stats (size, available, cooling, leased, bans, retired, produced...) by name."""
    out = {}
    for name in pool_names(client, prefix):
        k, _, site = name.partition(":")
        if kind is None or k == kind:
            out[name] = Pool(k, site, rds=client, prefix=prefix, config=PoolConfig()).stats()
    return out


def health_records(client: redis.Redis, prefix: str, kind: str) -> list[Any]:
    """The pools of `kind` as monitor.health.PoolHealth records (bans = cooling down now)."""
    from monitor.health import PoolHealth

    return [
        PoolHealth(name, s["size"], s["cooling"], s["produced"], kind=kind, site=s["site"])
        for name, s in pool_stats(client, prefix, kind).items()
    ]


__all__ = [
    "Checkout",
    "Lease",
    "Lender",
    "Pool",
    "PoolConfig",
    "Producer",
    "Rule",
    "Verdict",
    "add_rules",
    "avoided",
    "cancel_leases",
    "configure_pool",
    "get_producer",
    "health_records",
    "judge",
    "pool_config",
    "pool_stats",
    "register_producer",
    "reset_pool_config",
    "rule",
]
