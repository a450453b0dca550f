"""Per-site resource pools in Redis (cookies, device ids): exclusive leases with rotation,
cool-down, use limits, a health score, retire-on-ban, and production when a pool runs low.

A pool of kind <kind> ("cookie", "device_id": the provider kind) for site <site> runs on the
lease engine (`external_interface.resources.lease`, whose docstring lists its keys) under the base
`<p>:site:{<site>}:pool:<kind>` (utils/keyspace.py), ordered least recently used first, with
these keys besides:

    :producing  str "<run id> <produced>" the latest production run (PX produce_ttl): while it
                                          is not done no other run starts (stampede guard)
    :produce_gap str (PX gap)             least time between two production runs; doubles
    :dry_streak  int                      with every run in a row that added nothing
    <p>:pools   set "kind:site"           every pool, for health reports

Every key of a pool carries its site's hash tag, so each script (`lease.lua`, `produce.lua`)
runs on one Redis Cluster slot. The pool is split into `CHAINCRAWL_POOL_PARTS` sub-pools
(lease.py), the first under the base above, the others under `<p>:site:{<site>~<j>}:pool:<kind>`
(`Keyspace.pool_parts`), each on a slot of its own; the production keys stay in the first. The registry `<p>:pools` is global: it is only ever written by
a plain, idempotent SADD beside a script (`add`, `try_start_production`), never inside one, so
on a cluster it lives on its own slot and `pool_names`/`pool_stats` still find every pool.

The secret (`:secret`, sealed: utils/seal.py) is a JSON object: {"cookies": {...}} for a
session, {"device_id", "user_agent", ...} for a device. A site registers how its pools are refilled
(`register_producer`) and tunes them (`configure_pool`) when its modules load.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import redis

from config import SITE_VARS, get_settings
from exceptions import BannedError, ConfigError, ResourceUnavailable
from external_interface.resources.base import Outcome, OutgoingRequest
from external_interface.resources.health import PoolHealth
from external_interface.resources.holding import Holding, HoldRule, holding_for
from external_interface.resources.holding import enabled as holding_enabled
from external_interface.resources.inflight import (
    IN_FLIGHT,
    avoid_next_time,
    avoided,
    cancel_leases,
)
from external_interface.resources.lease import Checkout, Lease, LeasePool
from external_interface.resources.rules import Verdict, judge
from utils.keyspace import Keyspace
from utils.redis import as_str
from utils.registry import UnknownNameError
from utils.seal import Sealer

log = logging.getLogger(__name__)

MAX_PRODUCE_GAP = 300.0  # longest back-off between production runs that add nothing
ACQUIRE = Path(__file__).with_name("produce.lua").read_text()


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
    # holding (holding.py): a worker process keeps a member for up to hold_requests requests
    # or hold_seconds (below half of lease_ttl), giving it back after hold_idle unused;
    # hold_requests 1: a checkout and a return per request; a request that finds nothing
    # free here nor in the pool waits up to hold_wait for a member this process holds (0: it
    # waits as a message; the proxy channels default to 1 s, their proxies resting `cooldown`
    # between requests: docs/resources.md)
    hold_requests: int = 32
    hold_seconds: float = 5.0
    hold_idle: float = 0.5
    hold_wait: float = 0.0
    # hold_share: a process holds at most its share of the pool, ceil(members / the live
    # processes holding from it) (share.py; the proxy channels: on)
    hold_share: bool = False

    @property
    def hold(self) -> HoldRule:
        return HoldRule(
            self.hold_requests, self.hold_seconds, self.hold_idle, self.hold_wait, self.hold_share
        )


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


# --- production ---------------------------------------------------------------------------

Seeds = list[dict[str, Any]]


def _slots(n: int) -> Seeds:
    return [{"slot": i} for i in range(n)]


@dataclass(frozen=True)
class Producer:
    """How a pool is refilled, supplied by the site code that registers it: `start(seeds,
    run_id)` launches a production run under that id (a chain run, say), `finished(run_id)`
    tells whether that run is over (done or cancelled), `seeds(n)` are the seeds for n new
    members. `name` says what runs, for logs."""

    name: str
    start: Callable[[Seeds, str], None]
    finished: Callable[[str], bool]
    seeds: Callable[[int], Seeds] = field(default=_slots)


# Test hooks in place of a producer's own start and finished: start(producer, seeds, run_id).
Starter = Callable[[Producer, Seeds, str], None]
Finished = Callable[[str], bool]

_PRODUCERS: dict[tuple[str, str], Producer] = {}
_warned: set[str] = set()


def register_producer(kind: str, site: str, producer: Producer) -> None:
    _PRODUCERS[(kind, site)] = producer


def get_producer(kind: str, site: str) -> Producer | None:
    return _PRODUCERS.get((kind, site))


def known_kinds() -> set[str]:
    """Pool kinds this process knows of: produced, or configured in code."""
    produced = {k for k, _ in _PRODUCERS}
    # "proxy": the channels read their hold_* settings from CHAINCRAWL_POOL_PROXY[_<SITE>]
    return produced | {"proxy"} | set(_KIND_DEFAULTS) | {k for k, _ in _SITE_DEFAULTS}


def pool_holding(pool: LeasePool, cfg: PoolConfig, held: bool = True) -> Holding | None:
    """This process's holding of `pool` when it lends `held` and `cfg` holds members
    (hold_requests > 1); else None: a checkout and a return per request."""
    if not (held and cfg.hold_requests > 1 and holding_enabled()):
        return None
    return holding_for(pool, cfg.hold)


# --- the pool -----------------------------------------------------------------------------


class Pool(LeasePool):
    """One site's pool of one kind; see the module docstring for keys and atomicity."""

    def __init__(
        self,
        kind: str,
        site: str,
        *,
        rds: redis.Redis | None = None,
        prefix: str | None = None,
        config: PoolConfig | None = None,
        sealer: Sealer | None = None,
        held: bool = False,
        parts: int | None = None,
    ) -> None:
        self.prefix = prefix if prefix is not None else get_settings().key_prefix
        self.held = held  # lend through this process's holding (the providers' pools)
        ks = Keyspace(self.prefix)
        n = get_settings().pool_parts if parts is None else parts
        bases = ks.pool_parts(kind, site, n)
        super().__init__(kind, site, bases[0], rds=rds, sealer=sealer, parts=bases)
        self._config = config
        b = self.base
        self.k_producing, self.k_gap, self.k_streak = (
            f"{b}:producing",
            f"{b}:produce_gap",
            f"{b}:dry_streak",
        )
        self.k_pools = ks.pools
        self._acquire: Any = None

    @property
    def config(self) -> PoolConfig:
        return self._config or pool_config(self.kind, self.site)

    def _lease(self, mid: str, token: str, uses: int, score: int, exp: int, text: str) -> Lease:
        return Lease(self.kind, self.site, mid, token, uses, score, exp, json.loads(text))

    # --- lending -------------------------------------------------------------------------
    def checkout(self, avoid: Collection[str] = ()) -> Checkout:
        """Lend the ready member idle longest, not in `avoid`, exclusively until released.
        `avoid` is a preference: when every member of the pool is in it, waiting could never
        end (nothing comes back, a pool at its low-water mark produces nothing), so the
        avoided member idle longest is lent after all (test_avoid_starvation.py)."""
        cfg = self.config
        held = pool_holding(self, cfg, self.held)
        return (held if held is not None else self).take(avoid, cfg.lease_ttl)

    def release(self, lease: Lease, verdict: str) -> tuple[str, int]:
        """Return a lease with the request's verdict; -> (state, pool size), state one of
        "returned" (or kept by this process's holding), "retired", "stale" (the lease had
        expired and was reclaimed). A ban is written at once, held or not."""
        cfg = self.config
        held = pool_holding(self, cfg, self.held)
        give = held.give if held is not None else self.give_back
        if verdict == Verdict.BANNED:
            return give(lease, "ban", reason="banned")
        delta = {Verdict.OK: 1, Verdict.FAILED: -cfg.fail_penalty, Verdict.NEUTRAL: 0}[verdict]
        return give(
            lease,
            rest=cfg.cooldown,
            max_uses=cfg.max_uses,
            delta=delta,
            max_score=cfg.max_score,
        )

    def cancel(self, lease: Lease) -> None:
        """Give a lease back unused: to this process's holding when it holds members."""
        held = pool_holding(self, self.config, self.held)
        (held.give if held is not None else self.give_back)(lease, "cancel")

    # --- membership ----------------------------------------------------------------------
    def add(self, secret: Mapping[str, Any], member_id: str | None = None) -> str | None:
        """Add a member (idempotent per id); returns its opaque id, None if it was known."""
        mid = member_id or f"{self.kind[:2]}-{uuid.uuid4().hex[:12]}"
        payload = json.dumps(dict(secret), separators=(",", ":"))
        self.rds.sadd(self.k_pools, self.name)
        added = self.add_members([(mid, payload)], self.config.initial_score)
        return mid if added else None

    def retire(self, member_id: str, reason: str = "removed") -> bool:
        return bool(self.retire_members([member_id], reason))

    def ids(self) -> list[str]:
        return sorted(self.members())

    def clear(self) -> None:
        super().clear()
        self.rds.delete(self.k_producing, self.k_gap, self.k_streak)
        self.rds.srem(self.k_pools, self.name)

    # --- health --------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """size (members), available (ready now), cooling, leased, and the counters."""
        avail, size, leased = self.sizes()
        pipe = self.rds.pipeline(transaction=False)
        for key in self._key(4):  # every part's scores
            pipe.hvals(key)
        pipe.get(self.k_producing)
        *scores, producing = pipe.execute()
        counters = self.counters()
        vals = [float(x) for part in scores for x in part]
        out: dict[str, Any] = {
            "pool": self.name,
            "kind": self.kind,
            "site": self.site,
            "size": size,
            "available": avail,
            "cooling": size - leased - avail,
            "leased": leased,
            "score_avg": round(sum(vals) / len(vals), 2) if vals else None,
            "last_run": as_str(producing).split(" ")[0] if producing else None,
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
        self, n: int, start: Starter | None = None, finished: Finished | None = None
    ) -> str | None:
        """Start the registered producer for `n` members unless a run is already going (one
        run per pool at a time); returns the new run id or None. `start` and `finished`
        stand in for the producer's own (tests)."""
        producer = get_producer(self.kind, self.site)
        if producer is None:
            if self.name not in _warned:
                _warned.add(self.name)
                log.warning(
                    "pool %s is low and has no producer: a site registers one with "
                    "register_producer(), or fill it from outside (add_cookies/add_device)",
                    self.name,
                )
            return None
        if n <= 0:
            return None
        cfg = self.config
        cur = self.rds.get(self.k_producing)
        expected = as_str(cur) if cur else ""  # "<run id> <produced count when it started>"
        prev_rid, _, produced_then = expected.partition(" ")
        if prev_rid and not (finished or producer.finished)(prev_rid):
            return None
        produced_now = self.counters().get("produced", 0)  # every part's
        # the last run added nothing (site down, accounts refused): back off 2, 4, 8... x gap
        dry = bool(prev_rid and produced_then.isdigit() and int(produced_then) >= produced_now)
        streak = int(self.rds.get(self.k_streak) or 0) + 1 if dry else 0
        gap = (
            min(cfg.produce_gap * 2 ** min(streak, 12), MAX_PRODUCE_GAP)
            if streak
            else cfg.produce_gap
        )
        rid = f"prod-{self.kind}-{self.site}-{uuid.uuid4().hex[:8]}"
        if self._acquire is None:
            self._acquire = self.rds.register_script(ACQUIRE)
        got = self._acquire(
            keys=[self.k_producing, self.k_gap],
            args=[
                expected,
                f"{rid} {produced_now}",
                max(1, int(cfg.produce_ttl * 1000)),
                int(gap * 1000),
            ],
            client=self.rds,
        )
        if not int(got):
            return None
        if dry:
            self.rds.set(self.k_streak, streak)
            self.rds.hincrby(self.k_stats, "production_dry_runs", 1)
            log.warning(
                "pool %s: the last production run added nothing (%d in a row); next "
                "one no sooner than %.0fs after this",
                self.name,
                streak,
                gap,
            )
        else:
            self.rds.delete(self.k_streak)
        seeds = producer.seeds(n)
        try:
            if start is not None:
                start(producer, seeds, rid)
            else:
                producer.start(seeds, rid)
        except Exception:
            self.rds.delete(self.k_producing)
            raise
        self.rds.hincrby(self.k_stats, "production_runs", 1)
        self.rds.sadd(self.k_pools, self.name)
        log.info(
            "pool %s: production run %s (%s) started for %d members",
            self.name,
            rid,
            producer.name,
            n,
        )
        return rid


# --- lending on behalf of providers ---------------------------------------------------------


class PoolProvider:
    """What the cookie and device providers share: checkout in `prepare`, verdict and return
    in `feedback`, production when the pool runs low, waiting when it is empty. Leases of
    requests in flight are kept in `inflight.IN_FLIGHT`, with every other kind's."""

    kind: str = ""

    def __init__(
        self,
        site: str,
        platform: str = "",
        *,
        rds: redis.Redis | None = None,
        prefix: str | None = None,
        config: PoolConfig | None = None,
        start: Starter | None = None,
        finished: Finished | None = None,
    ) -> None:
        self.site, self.platform = site, platform
        self.pool = Pool(self.kind, site, rds=rds, prefix=prefix, config=config, held=True)
        self._start, self._finished = start, finished
        self._last_check = 0.0

    # subclasses put the secret on the request
    def apply(self, req: OutgoingRequest, lease: Lease) -> None:
        raise NotImplementedError

    def prepare(self, req: OutgoingRequest, task: Any) -> None:
        co = self.pool.checkout(avoided(task, self.kind))
        if not co.local:  # a member lent from this process's holding says nothing new
            self._supply(co.size)
        if co.lease is None and co.shared:
            cancel_leases(req)
            raise ResourceUnavailable(
                f"site {self.site} is at its share of the fleet's {self.kind} leases",
                retry_after=co.wait or 0.5,
            )
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
        IN_FLIGHT.put(req, self.pool, co.lease)
        self.apply(req, co.lease)

    def feedback(self, req: OutgoingRequest, outcome: Outcome, task: Any) -> None:
        held = IN_FLIGHT.take(req, self.pool)
        if held is None:
            return
        pool = held[0] if isinstance(held[0], Pool) else self.pool
        lease = held[1]
        verdict, why = judge(self.site, self.kind, outcome)
        state, size = pool.release(lease, verdict)
        if verdict in (Verdict.FAILED, Verdict.BANNED):
            avoid_next_time(task, self.kind, lease.id)
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
        held = IN_FLIGHT.take(req, self.pool)
        if held is not None:
            held[0].cancel(held[1])

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
            if len(self.pool.part_keys) > 1:  # the size was the parts' last answers: read it
                size = self.pool.sizes()[1]
                if size >= cfg.low_water:
                    return
            self.pool.try_start_production(cfg.target - size, self._start, self._finished)
        except Exception:
            log.exception("pool %s: could not start production", self.pool.name)


# --- health ---------------------------------------------------------------------------------


def pool_names(client: redis.Redis, prefix: str) -> list[str]:
    return sorted(as_str(x) for x in client.smembers(Keyspace(prefix).pools))


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


def health_records(client: redis.Redis, prefix: str, kind: str) -> list[PoolHealth]:
    """The pools of `kind` as PoolHealth records (bans = cooling down now)."""
    return [
        PoolHealth(name, s["size"], s["cooling"], s["produced"], kind=kind, site=s["site"])
        for name, s in pool_stats(client, prefix, kind).items()
    ]


__all__ = [
    "Lease",
    "Pool",
    "PoolConfig",
    "PoolProvider",
    "Producer",
    "Seeds",
    "configure_pool",
    "get_producer",
    "health_records",
    "pool_config",
    "pool_stats",
    "register_producer",
    "reset_pool_config",
]
