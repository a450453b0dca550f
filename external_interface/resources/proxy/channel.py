"""Per-site channel pools: exclusive, leased checkouts of proxies from the global pool.

A channel is a pool on the lease engine (`external_interface.resources.lease`, whose docstring lists the
keys) under `<p>:site:{<site>}:proxy` (the site's Redis Cluster slot) and, split into
`CHAINCRAWL_POOL_PARTS` sub-pools, `<p>:site:{<site>~<j>}:proxy` (lease.py), ordered by use: `:idle` holds each idle proxy's use count
and the least used goes out first. Its secret hash is named `:url` (the proxy URL, sealed
like every secret of the engine; the channel's own copy, so it keeps serving after the proxy left the global pool because of another
site), `:ban` holds the proxies this site benched, until when, and `:stats` counts
`retired:banned` (benched by the site) and `retired:dead` (dead for it) among the engine's
counters. A lease that ends without its holder's return still counts as a use.

What the engine makes atomic, for proxies:

* checkout lends the least-used idle proxy not in the task's `avoid` (unless every proxy of
  the channel is), after reclaiming leases that expired (their worker died);
* release only acts if the caller's token is still the lease's token; the use count is the
  exact `HINCRBY` of `:uses`, copied into `:idle`;
* refill adds a global-pool proxy only if the channel does not know it (`HSETNX`), it is not
  benched and it is still in the global pool: a proxy lent right now can never be added a
  second time (the double checkout through a refill). On a Redis Cluster the global pool
  (`{proxy}`) and the channel (`{<site>}`) are two slots, so "still in the global pool" is
  checked in steps instead (`refill`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Collection
from typing import Any, cast

from config import get_settings
from external_interface.resources.holding import Holding
from external_interface.resources.lease import Lease, LeasePool, Profile
from external_interface.resources.pool import configure_pool, pool_config, pool_holding
from external_interface.resources.proxy.models import Event
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.proxy.select import Selector
from utils.redis import as_str, is_cluster

log = logging.getLogger(__name__)

KIND = "proxy"
# least used first, a lost lease counts as a use; no health score (the global pool scores
# proxies), refilled from the global pool rather than produced
PROFILE = Profile(order="uses", lost_uses=True, scored=False, produced=False)
DRY_REFILL_MAX = 5.0  # longest wait between watermark refills that keep finding nothing new
# a request with no proxy free waits in its process up to this long for one held there
# (`hold_wait`, holding.py): the proxies rest between requests (`cooldown`), so a held one
# is back within a request's time and its rest; each process holds at most its share of
# the channel (`hold_share`, share.py), so the processes wait for their own proxies instead
# of competing for the channel's
configure_pool(KIND, hold_wait=1.0, hold_share=True)


class ProxyLease(Lease):
    """A channel lease; its secret is the proxy URL (maybe with credentials: kept out of repr)."""

    @property
    def url(self) -> str:
        return str(self.secret)


class ChannelPool(LeasePool):
    """The proxies one site draws from; see the module docstring for keys and atomicity."""

    def __init__(
        self,
        site: str,
        pool: GlobalPool,
        selector: Selector | None = None,
        held: bool = False,
        parts: int | None = None,
    ) -> None:
        bases = pool.keys.channel_parts(site, get_settings().pool_parts if parts is None else parts)
        super().__init__(
            KIND,
            site,
            bases[0],
            rds=pool.rds,
            profile=PROFILE,
            secret_key="url",
            sealer=pool.sealer,
            parts=bases,
        )
        self.pool = pool
        self.settings = pool.settings
        self.selector = selector or Selector(pool)
        self.k_url = self.k_secret
        self.held = held  # lend through this process's holding (the provider's channel)
        self._last_refill = 0.0
        self._dry = 0  # refills in a row that found nothing to add (their interval doubles)
        self._refill_lock = threading.Lock()
        self._bench_ends_ms = 0.0  # the soonest bench end (unix ms) the last refill read

    def _lease(self, mid: str, token: str, uses: int, score: int, exp: int, text: str) -> Lease:
        return ProxyLease(self.kind, self.site, mid, token, uses, score, exp, text)

    # --- lending -----------------------------------------------------------------------------
    def checkout(
        self, avoid: Collection[str] = (), lease_ttl: float | None = None
    ) -> ProxyLease | None:
        """Lend the least-used proxy not in `avoid`, refilling from the global pool when the
        channel runs low (at most once per `refill_wait()` per instance). `avoid` is a
        preference: when every proxy of the channel is in it, the least used is lent anyway.
        None when nothing is free, or the site is at its share of the fleet's proxy leases."""
        return self.lend(avoid, lease_ttl)[0]

    def lend(
        self, avoid: Collection[str] = (), lease_ttl: float | None = None
    ) -> tuple[ProxyLease | None, float | None]:
        """`checkout`, with the seconds until the soonest return it knows of when it lends
        nothing (a proxy resting here or in the channel, the end of a bench, the fleet
        share's wait; None: none known)."""
        ttl = self.settings.lease_ttl if lease_ttl is None else lease_ttl
        held = self.holding()
        take = held.take if held is not None else self.take
        co = take(avoid, ttl, fallback=False)
        if co.local:  # lent from this process's holding: the channel was not touched
            return cast("ProxyLease", co.lease), None
        if co.shared:  # the site is at its share of the fleet's proxies: a refill cannot help
            return None, co.wait
        low = co.lease is None or co.available < self.settings.refill_below
        due = time.monotonic() - self._last_refill >= self.refill_wait()
        if held is not None:  # the first take waited for a proxy held here already
            take = functools.partial(held.take, wait=False)
        if low and due:
            if self.refill() and held is not None:
                held.refreshed()
            if co.lease is None:  # this refill, or another thread's just before it, filled it
                co = take(avoid, ttl, fallback=False)
        if co.lease is None and avoid:  # every proxy here avoided? then one of them
            co = take(avoid, ttl, fallback=True)
        if co.lease is not None:
            return cast("ProxyLease", co.lease), None  # built by _lease
        # returns known: a proxy resting in this process, a bench's end (a checkout's own
        # `wait` may only say how long the holding believes the channel empty)
        rest = held.soonest(avoid) if held is not None else None
        known = [w for w in (rest, self.bench_ends()) if w is not None]
        return None, min(known) if known else None

    def bench_ends(self) -> float | None:
        """Seconds until the soonest bench of this site ends, as the last refill read it (a
        benched proxy comes back with the refill after that); None if none is known."""
        if not self._bench_ends_ms:
            return None
        left = self._bench_ends_ms / 1000 - time.time()
        return left if left > 0 else None

    def rest(self) -> float:
        """Seconds a proxy rests after each request for this site before it is lent again:
        the pool setting `cooldown` (`CHAINCRAWL_POOL_PROXY[_<SITE>]`, or the site's
        `configure_pool("proxy", site, cooldown=...)`), 1 / the site's per-address rate, so
        requests back to back through one proxy keep under the site's per-IP limit."""
        return pool_config(KIND, self.site).cooldown

    def refill_wait(self) -> float:
        """Least seconds between two watermark refills of this instance: the setting, doubled
        after each refill in a row that found nothing to add (every proxy the selection
        ranks is in the channel or benched from it), up to DRY_REFILL_MAX (or the setting,
        if longer); one that adds a proxy starts again from the setting."""
        every = self.settings.refill_interval
        return min(every * 2 ** min(self._dry, 16), max(every, DRY_REFILL_MAX))

    def release(
        self, lease: Lease, event: Event = Event.SUCCESS, ban_ttl: float | None = None
    ) -> str:
        """Give a lease back. Success, timeout and neutral return it (it rests `rest()`
        seconds before it is lent again, here or in the channel); dead drops it; banned
        drops it and keeps it out of this channel for `ban_ttl` (default: the setting; a site
        that says how long, e.g. a 429's retry-after, passes that). Returns "returned",
        "dropped" or "stale" (the lease had expired; the use still counts)."""
        held = self.holding()
        give = held.give if held is not None else self.give_back
        if event is Event.BANNED:
            cap = self.settings.ban_ttl
            hold = max(cap if ban_ttl is None else min(ban_ttl, cap), 0.001)
            state, _ = give(lease, "ban", reason="banned", hold=hold)
        elif event is Event.DEAD:
            state, _ = give(lease, "retire", reason="dead")
        else:
            state, _ = give(lease, rest=self.rest())
        if state == "stale":
            log.warning(
                "proxy %s: lease for site %s had expired before release", lease.id, self.site
            )
        return "dropped" if state == "retired" else state

    def cancel(self, lease: Lease) -> None:
        """Give a lease back unused: to this process's holding when it holds proxies."""
        held = self.holding()
        (held.give if held is not None else self.give_back)(lease, "cancel")

    def holding(self) -> Holding | None:
        """This process's holding of the channel, by `CHAINCRAWL_POOL_PROXY[_<SITE>]`'s
        `hold_*` settings (holding.py); None with `hold_requests` 1 or unless `held`."""
        held = pool_holding(self, pool_config(KIND, self.site), self.held)
        if held is not None and held.on_return is None:
            held.on_return = self._record_held
        return held

    def _record_held(self, lease: Lease, notes: dict[str, Any]) -> None:
        """A held proxy goes back: its successes into the global score, one call."""
        n = int(notes.get("successes", 0))
        if n:
            self.pool.record(lease.id, Event.SUCCESS, notes.get("last_elapsed"), times=n)

    def renew(self, lease: Lease, lease_ttl: float | None = None) -> bool:
        """Extend a lease for a long request; False if it had already expired and gone back."""
        return self.renew_lease(lease, self.settings.lease_ttl if lease_ttl is None else lease_ttl)

    # --- upkeep ------------------------------------------------------------------------------
    def refill(self, limit: int | None = None) -> int:
        """Copy qualifying global proxies this channel does not know yet; returns how many.

        On one Redis the add checks, in its script, that each proxy is still in the global pool.
        On a Redis Cluster that script cannot read the global pool's slot, so the check is
        split in per-slot steps: (1) keep the proxies still in the global pool, (2) add them
        (the channel's slot: known, lent or benched ones are still skipped atomically), (3)
        take back out of the channel, idle, those that left the global pool meanwhile.
        A crash between (2) and (3) leaves a channel copy of a proxy that has just left the
        global pool: the state a channel is in anyway when another site's requests kill a
        proxy (the channel keeps its copy). It is repaired the same way: this site's own
        request through it settles dead and retires it, or the validator that found it dead
        purges it from every channel (`validate.purge_channels`)."""
        limit = self.settings.refill_batch if limit is None else limit
        with self._refill_lock:
            self._last_refill = time.monotonic()
        ranked = self.selector.select().ids
        if not ranked:
            self._dry += 1
            return 0
        # cheap pre-filter so `limit` counts new proxies; the script re-checks atomically.
        # Benched ones are left out here too: a refill while the site benches a proxy would
        # otherwise call the add script for it every time, to skip it there
        parts = len(self.part_keys)
        pipe = self.rds.pipeline(transaction=False)
        for key in self._key(5):  # every sub-pool's urls
            pipe.hmget(key, ranked)
        for key in self._key(8):  # every sub-pool's bench (id -> until, ms)
            pipe.zmscore(key, ranked)
        pipe.hmget(self.pool.keys.url, ranked)
        got = pipe.execute()
        known, benched, urls = got[:parts], got[parts:-1], got[-1]
        now_ms = time.time() * 1000
        ends = [x for part in benched for x in part if x is not None and x > now_ms]
        self._bench_ends_ms = min(ends) if ends else 0.0
        fresh = [
            (pid, url)
            for pid, url, *k in zip(ranked, urls, *known, *benched, strict=True)
            if url is not None
            and all(x is None for x in k[:parts])
            and all(x is None or x <= now_ms for x in k[parts:])
        ][: max(limit, 0)]
        if not fresh:
            self._dry += 1
            return 0
        self.rds.sadd(self.pool.keys.channels, self.site)
        if not is_cluster(self.rds):
            opened = [(pid, self.pool.open_url(pid, url)) for pid, url in fresh]
            added = self.add_members(opened, source=self.pool.keys.score)
        else:
            added = self._refill_in_steps(fresh)
        self._dry = 0 if added else self._dry + 1
        return added

    def _refill_in_steps(self, fresh: list[tuple[str, bytes]]) -> int:
        """`refill`'s add on a Redis Cluster: global check, add, global re-check (see there)."""
        score = self.pool.keys.score
        present = self.rds.zmscore(score, [pid for pid, _ in fresh])
        kept = [(pid, url) for (pid, url), sc in zip(fresh, present, strict=True) if sc is not None]
        if not kept:
            return 0
        added = self.add_members([(pid, self.pool.open_url(pid, url)) for pid, url in kept])
        after = self.rds.zmscore(score, [pid for pid, _ in kept])
        gone = [pid for (pid, _), sc in zip(kept, after, strict=True) if sc is None]
        return max(0, added - self.retire_members(gone, "purged", only_idle=True))

    def purge(self, ids: Collection[str]) -> int:
        """Take idle copies of `ids` out of this channel (proxies found dead by a validator)."""
        return self.retire_members(ids, "purged", only_idle=True)

    # --- reads -------------------------------------------------------------------------------
    def idle(self) -> list[tuple[str, int]]:
        """Idle members with their use counts, least used first."""
        idle = [
            (as_str(i), int(s))
            for key in self._key(0)
            for i, s in cast(
                "list[tuple[bytes, float]]", self.rds.zrange(key, 0, -1, withscores=True)
            )
        ]
        return sorted(idle, key=lambda x: (x[1], x[0]))  # as one zset orders them

    def clear(self) -> None:
        super().clear()
        self.rds.srem(self.pool.keys.channels, self.site)


def channel_stats(channel: ChannelPool) -> dict[str, int]:
    """Counters of one channel: `banned` (benched by the site), `dropped` (dead for it)."""
    counters = channel.counters()
    out = {"banned": counters.get("retired:banned", 0), "dropped": counters.get("retired:dead", 0)}
    return {k: v for k, v in out.items() if v}


def channels(pool: GlobalPool) -> list[str]:
    """Sites that have a channel pool."""
    return sorted(as_str(x) for x in pool.rds.smembers(pool.keys.channels))


def settle(
    pool: GlobalPool,
    channel: ChannelPool | None,
    lease: Lease | None,
    proxy_id: str,
    event: Event,
    elapsed: float | None,
    ban_ttl: float | None = None,
) -> None:
    """Apply one request's outcome: global score (haipproxy's rule), then the channel lease.

    A ban only concerns the site that banned: the global score is left alone, so other sites
    keep using the proxy, and this site benches it for `ban_ttl` (default: the setting). A dead
    proxy leaves the global pool and this channel; other channels keep their copy until their
    own requests fail, or a validator purges it.
    """
    if event is not Event.BANNED and pool.record(proxy_id, event, elapsed).state == "removed":
        event = Event.DEAD  # e.g. a timeout took the score to 0: gone from this channel too
    if channel is not None and lease is not None:
        channel.release(lease, event, ban_ttl=ban_ttl)
