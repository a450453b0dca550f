"""Pool health: how full the resource pools are (proxies, cookies, device ids, ...).

One `PoolHealth` record per pool (`external_interface.resources.health`, where the pools build them):

    PoolHealth(name="cookie:demo", size=12, bans=3, produced=40)

A pool reports its health in one of two ways (both may coexist; a live source wins):

* **push** (any process, any language): `report(client, PoolHealth(...))` writes the pool's health hash and adds
  its name to the set of reporting pools (both keys: docs/monitoring.md); `add_produced(client, name, n)` increments `produced`
  where the pool only knows it made n more. Reports older than `STALE_AFTER` (5 minutes,
  `external_interface.resources.health`) are still shown, with their age, so a pool whose owner died
  is visible as such.
* **pull**: a module listed in `SOURCE_MODULES` that defines
  `pool_health(client, settings) -> Iterable[PoolHealth]` is asked on every read, and
  `register_source(fn)` adds a callable of that signature at run time.

The proxy pool (external_interface.resources.proxy: pool and channel) is read directly from its own
keys when that package is present: `proxy` (the global pool) and `proxy:{site}` (channels).
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from config import Settings, get_settings
from external_interface.resources.health import PoolHealth

log = logging.getLogger(__name__)

# modules asked for `pool_health(client, settings)` when present (ImportError = not deployed)
SOURCE_MODULES = (
    "external_interface.resources.cookie",
    "external_interface.resources.device_id",
    "external_interface.resources.accounts",
    "external_interface.resources.user_agent",
)

Source = Callable[[Any, Settings], Iterable[PoolHealth]]
_sources: list[Source] = []


def pools_key(s: Settings | None = None) -> str:
    return (s or get_settings()).key("health", "pools")


def pool_key(name: str, s: Settings | None = None) -> str:
    return (s or get_settings()).key("health", "pool", name)


# --- push ------------------------------------------------------------------------------------


def report(client: Any, h: PoolHealth, s: Settings | None = None) -> None:
    """Record a pool's current health (size and bans are gauges, `produced` is set as given)."""
    pipe = client.pipeline(transaction=False)
    pipe.hset(
        pool_key(h.name, s),
        mapping={
            "size": int(h.size),
            "bans": int(h.bans),
            "produced": int(h.produced),
            "kind": h.kind,
            "site": h.site,
            "updated": f"{h.updated:.3f}",
        },
    )
    pipe.sadd(pools_key(s), h.name)
    pipe.execute()


def add_produced(client: Any, name: str, n: int = 1, s: Settings | None = None) -> None:
    """Count n new members of a pool (works on a pipeline too, to ride an existing round trip)."""
    client.hincrby(pool_key(name, s), "produced", n)
    client.sadd(pools_key(s), name)


def forget(client: Any, name: str, s: Settings | None = None) -> None:
    client.delete(pool_key(name, s))
    client.srem(pools_key(s), name)


def reported(client: Any, s: Settings | None = None) -> list[PoolHealth]:
    names = sorted(m.decode() for m in client.smembers(pools_key(s)))
    if not names:
        return []
    pipe = client.pipeline(transaction=False)
    for n in names:
        pipe.hgetall(pool_key(n, s))
    out = []
    for name, raw in zip(names, pipe.execute(), strict=True):
        if not raw:
            continue
        f = {k.decode(): v.decode() for k, v in raw.items()}
        out.append(
            PoolHealth(
                name=name,
                size=int(f.get("size", 0)),
                bans=int(f.get("bans", 0)),
                produced=int(f.get("produced", 0)),
                kind=f.get("kind", ""),
                site=f.get("site", ""),
                updated=float(f.get("updated") or 0),
                source="report",
            )
        )
    return out


# --- pull ------------------------------------------------------------------------------------


def register_source(fn: Source) -> Source:
    """Add a live source (usable as a decorator); called on every read."""
    if fn not in _sources:
        _sources.append(fn)
    return fn


def proxy_health(client: Any, s: Settings) -> list[PoolHealth]:
    """The proxy pools, read from the keys documented in external_interface.resources.proxy.pool."""
    try:
        from external_interface.resources.proxy.pool import ProxyKeys
    except ImportError:
        return []
    k = ProxyKeys(s.key_prefix)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(k.score)
    pipe.hget(k.stats, "admitted")
    pipe.smembers(k.channels)
    size, admitted, chans = pipe.execute()
    if not size and not admitted and not chans:
        return []  # no proxy pool in this deployment
    out = [PoolHealth("proxy", int(size), 0, int(admitted or 0), kind="proxy", site="")]
    sites = sorted(c.decode() for c in chans)
    now_ms = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    parts = s.pool_parts
    for site in sites:
        for base in k.channel_parts(site, parts):  # every sub-pool of the channel
            pipe.hlen(f"{base}:uses")
            pipe.zcount(f"{base}:ban", now_ms, "+inf")
    res = pipe.execute()
    for i, site in enumerate(sites):
        mine = res[2 * parts * i : 2 * parts * (i + 1)]
        size, benched = sum(int(x) for x in mine[0::2]), sum(int(x) for x in mine[1::2])
        out.append(PoolHealth(f"proxy:{site}", size, benched, 0))
    return out


def _module_sources() -> list[Source]:
    found: list[Source] = [proxy_health]
    for mod in SOURCE_MODULES:
        try:
            m = importlib.import_module(mod)
        except ImportError as exc:
            if exc.name and mod.startswith(exc.name):  # the module itself is absent
                continue
            log.warning("pool health source %s failed to import: %s", mod, exc)
            continue
        fn = getattr(m, "pool_health", None)
        if callable(fn):
            found.append(fn)
    return found


def collect(client: Any, s: Settings | None = None) -> list[PoolHealth]:
    """Every pool's health: pushed reports, overridden by live sources of the same name."""
    s = s or get_settings()
    by_name = {h.name: h for h in reported(client, s)}
    for src in [*_module_sources(), *_sources]:
        try:
            for h in src(client, s):
                by_name[h.name] = h
        except Exception:  # one broken source must not hide the others
            log.exception("pool health source %r failed", getattr(src, "__name__", src))
    return sorted(by_name.values(), key=lambda h: h.name)
