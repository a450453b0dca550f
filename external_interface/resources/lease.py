"""The lease engine under every resource pool (cookies, device ids, proxy channels): members
lent exclusively to one request at a time, with use counts, a health score, cool-down,
retirement and a bench, all in Redis and shared by every worker.

Keys of a pool under its base `<b>` (`<p>:site:{<site>}:pool:<kind>` for cookies and devices,
`<p>:site:{<site>}:proxy` for a site's proxies: utils/keyspace.py), all on the site's Redis
Cluster slot:

    :idle     zset  id -> ready at (ms)   members not lent; usable once `ready at` <= now, so the
                                          one idle longest goes out first (rotation). A pool
                                          ordered by use ("uses") keeps the use count here
                                          instead: always ready, least used first
    :lease    zset  id -> expiry (ms)     lent members; Redis server time, worker clocks never matter
    :token    hash  id -> lease token     fences a late return from a lease that was reclaimed
    :uses     hash  id -> uses            completed requests per member (use limit)
    :score    hash  id -> health score    +1 per success, -penalty per failure, retired at 0
                                          (pools that score members: cookies, devices)
    :secret   hash  id -> sealed secret   the only place it lives (cookie values, a device id,
                                          a proxy URL with credentials), sealed (utils/seal.py:
                                          Redis's files never show it); messages carry the id.
                                          The proxy channel names this hash `:url`
    :stats    hash  produced checkouts bans retired retired:<reason> reclaimed cancelled
                                          (checkouts: in pools that are `produced`)
    :retired  zset  id -> unix time       the last 1000 retired ids, for inspection
    :ban      zset  id -> until (ms)      retired ids that may not be added again before then
    :holders  zset  process -> until (ms) the processes holding members (first part only;
                                          pools with `hold_share`: share.py)

**Sub-pools.** A pool may be split into parts (`parts`: the bases of `Keyspace.pool_parts`,
`CHAINCRAWL_POOL_PARTS`), each a pool of its own with all the keys above under its own hash tag,
so on a Redis Cluster one site's pool spreads over several masters. A member lives in exactly
one part: a new one goes to the part its id hashes to (`home`: CRC-32 of the id, stable) unless
another part knows it already (a member added before the split stays in the first part, whose
keys are the layout before sub-pools, and is lent from there). A checkout asks the parts in
turn, starting with the next one of this process's round robin, and falls over to the next
while one has nothing ready (an avoided member only after no part has another); for a second
after a checkout found every part empty, a checkout asks only the one its round robin names; the lease
names its part, so its release, renewal, ban and expiry happen in that part's script. Reads and
retirements by id ask every part; a pool's counters are the parts' sums.

Every operation is one call of one Lua script (`lease.lua`; a pool's `Profile` — its order,
whether lost leases count, whether it scores and is produced — is compiled into its copy), so
each is atomic and a checkout and its release are one round trip each (a process holding a
member makes them serve several requests: holding.py): a member is in `:idle` or in `:lease`, never
both, only the holder of the current token returns it, and a ban retires the member even when
its lease had already been reclaimed. `LeasesInFlight` keeps this process's leases of requests in flight,
for every kind, so the provider that hears the outcome (or cancels) finds the lease.

A lease guard (`set_lease_guard`) may hold every checkout to a share: the fleet budget's share
of a kind's leases a site may have out at once (scheduling/shares.py, installed by the worker).
A checkout it refuses gives the member back at once and says so (`Checkout.shared`).
"""

from __future__ import annotations

import functools
import logging
import random
import secrets
import time
import zlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import redis

from exceptions import SecretUnreadable
from utils.redis import as_str, get_redis
from utils.seal import Sealer, get_sealer

log = logging.getLogger(__name__)

SCRIPT = Path(__file__).with_name("lease.lua").read_text()
KEY_NAMES = ("idle", "lease", "token", "uses", "score", "secret", "stats", "retired", "ban")
ORDERS = ("lru", "uses")
KNOWN_FOR = 1.0  # seconds a part's "nothing ready" keeps it out of the first asks
STATES = {0: "stale", 1: "returned", 2: "retired", 3: "renewed"}
ACTIONS = ("use", "cancel", "ban", "retire")


@dataclass(frozen=True)
class Profile:
    """How a pool behaves, compiled into its copy of the script (no argument on the page path).

    `order`: "lru" lends the member idle longest, with cool-down; "uses" the least used.
    `lost_uses`: a lease that ends without its holder's return (reclaimed, or returned late)
    counts as a use. `scored`: members carry a health score. `produced`: the pool is refilled
    by production when low, so checkout and release report its size and checkouts are counted.
    """

    order: str = "lru"
    lost_uses: bool = False
    scored: bool = True
    produced: bool = True

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"unknown lease order {self.order!r}: one of {', '.join(ORDERS)}")


@dataclass(frozen=True)
class Lease:
    """One exclusive checkout. `secret` holds the member's values: kept out of repr and logs."""

    kind: str
    site: str
    id: str
    token: str
    uses: int
    score: int
    expires_ms: int
    secret: Any = field(repr=False)
    part: int = 0  # the sub-pool it was lent from (`LeasePool.part_keys`)


@dataclass(frozen=True)
class Checkout:
    lease: Lease | None
    available: int  # ready members left after this checkout
    size: int  # members in the pool (idle or lent); -1 unless the profile is `produced`
    wait: float | None  # seconds until the next member is ready (None: nothing idle)
    shared: bool = (
        False  # refused by the lease guard: the site is at its share, the pool is not empty
    )
    local: bool = False  # lent from this process's holding (holding.py): no Redis call


class LeaseGuard(Protocol):
    """Holds checkouts to a share (the fleet budget's): one unit per lease, by its token."""

    def take_lease(self, kind: str, site: str, holder: str, ttl: float) -> float | None:
        """None: taken (or no share applies); else seconds to wait before asking again."""
        ...

    def give_lease(self, kind: str, site: str, holder: str) -> None: ...


_guard: LeaseGuard | None = None


def set_lease_guard(guard: LeaseGuard | None) -> None:
    """Hold every pool's checkouts to `guard`'s shares from now on (None: no guard)."""
    global _guard
    _guard = guard


class LeasePool:
    """One pool on the engine; see the module docstring for keys and atomicity, `Profile` for
    how it behaves. Secrets are sealed on the way in and opened at checkout (`sealer`: this
    process's by default); subclasses turn the opened text into what their callers use
    (`_lease`).
    """

    def __init__(
        self,
        kind: str,
        site: str,
        base: str,
        *,
        rds: redis.Redis | None = None,
        profile: Profile = Profile(),
        secret_key: str = "secret",
        sealer: Sealer | None = None,
        parts: Sequence[str] = (),
    ) -> None:
        self.kind, self.site, self.base = kind, site, base
        self.name = f"{kind}:{site}"
        self._rds = rds
        self._sealer = sealer
        names = {n: n for n in KEY_NAMES} | {"secret": secret_key}
        # the sub-pools' bases, the first `base` itself (the layout before sub-pools)
        self.bases = [base, *(b for b in parts if b != base)]
        self.part_keys = [[f"{b}:{names[n]}" for n in KEY_NAMES] for b in self.bases]
        self.keys = self.part_keys[0]
        self._next = random.randrange(len(self.bases))  # round robin while no part has any
        self._sizes: list[int | None] = [None] * len(self.bases)  # as each part last said
        self._avail: list[int] = [0] * len(self.bases)
        self._turns: list[int] = [0] * len(self.bases)  # `_start`'s weighted round robin
        self._heard: list[float] = [0.0] * len(self.bases)  # monotonic: each part's last answer
        self._dry_at = -KNOWN_FOR  # monotonic: a checkout last found every part empty
        (
            self.k_idle,
            self.k_lease,
            self.k_token,
            self.k_uses,
            self.k_score,
            self.k_secret,
            self.k_stats,
            self.k_retired,
            self.k_ban,
        ) = self.keys
        self.profile = profile
        self._script: Any = None

    @property
    def rds(self) -> redis.Redis:
        """The given client, else the process's (looked up per call: safe across fork)."""
        return self._rds if self._rds is not None else get_redis()

    @property
    def sealer(self) -> Sealer:
        """The given sealer, else the process's (its keys from the settings)."""
        return self._sealer if self._sealer is not None else get_sealer()

    def _run(
        self, op: str, args: Iterable[Any] = (), keys: list[str] | None = None, part: int = 0
    ) -> Any:
        client = self.rds
        if self._script is None:
            self._script = client.register_script(_source(self.profile))
        return self._script(keys=keys or self.part_keys[part], args=[op, *args], client=client)

    def _each(self, op: str, args: Iterable[Any] = ()) -> list[Any]:
        """One script call per part (one slot each), their answers in part order."""
        args = list(args)
        return [self._run(op, args, part=i) for i in range(len(self.part_keys))]

    def _start(self) -> int:
        """The part a checkout asks first: a smooth weighted round robin, each part weighted
        by the members it had ready at its last answer (at least 1 once that answer is older
        than KNOWN_FOR, or when the last checkout found nothing anywhere), so over a round
        every member is lent about as often as in one pool (2 members ready in one part and
        1 in another lend 2:1); with nothing ready anywhere, plain turns. Then the next parts
        in turn (`take`)."""
        now = time.monotonic()
        weights = [
            a if now - heard < KNOWN_FOR else max(a, 1)
            for a, heard in zip(self._avail, self._heard, strict=True)
        ]
        total = sum(weights)
        if not total:
            self._next = (self._next + 1) % len(weights)
            return self._next
        cur = self._turns
        for i, w in enumerate(weights):
            cur[i] += w
        pick = max(range(len(cur)), key=cur.__getitem__)
        cur[pick] -= total
        return pick

    def _only_avoided(self, avoid: Collection[str]) -> bool:
        """Whether every member of every part (idle or lent) is in `avoid` (read apart from the
        checkout: a member added meanwhile may see an avoided one lent, as a preference allows)."""
        ids = list(avoid)
        pipe = self.rds.pipeline(transaction=False)
        for keys in self.part_keys:
            for key in keys[0], keys[1]:  # idle, lease
                pipe.zcard(key)
                pipe.zmscore(key, ids)
        got = pipe.execute()
        total = sum(got[0::2])
        avoided = sum(1 for scores in got[1::2] for x in scores if x is not None)
        return total - avoided <= 0

    def time_passed(self, seconds: float) -> None:
        """As if `seconds` had gone by for this instance's memory of its parts (tests that
        move the pool's Redis times instead of sleeping)."""
        self._dry_at -= seconds
        self._heard = [t - seconds for t in self._heard]

    def home(self, member_id: str) -> int:
        """The part a new member goes to: a stable hash of its id."""
        n = len(self.part_keys)
        return zlib.crc32(member_id.encode()) % n if n > 1 else 0

    def _total(self, current: int) -> int:
        """A pool's size from its parts' last answers (one not heard from yet counts 0: a
        low estimate, which `PoolProvider` checks with `sizes` before it starts production):
        -1 when the profile does not report sizes (`current` -1)."""
        if current < 0:
            return current
        return sum(v or 0 for v in self._sizes)

    def _lease(self, mid: str, token: str, uses: int, score: int, exp: int, text: str) -> Lease:
        """The lease handed to callers; subclasses decode the opened secret."""
        return Lease(self.kind, self.site, mid, token, uses, score, exp, text)

    def _open(self, mid: str, raw: bytes) -> str:
        """A checked-out member's secret, opened. One that no key opens (sealed with another
        key, stored in clear) is retired, so it fails one task, loudly, and never another."""
        try:
            return self.sealer.open(raw, f"the secret of {self.kind} {mid} of site {self.site}")
        except SecretUnreadable:
            self.retire_members([mid], "unreadable")
            log.error(
                "%s %s of site %s: its secret does not open with this process's keys; "
                "retired (docs/security.md)",
                self.kind,
                mid,
                self.site,
            )
            raise

    # --- lending -------------------------------------------------------------------------
    def take(self, avoid: Collection[str], lease_ttl: float, fallback: bool = True) -> Checkout:
        """Lend the first ready member not in `avoid`, exclusively for `lease_ttl` seconds.
        With `fallback`, `avoid` is a preference: when every member is in it, waiting could
        never end, so the first avoided one is lent after all."""
        token = secrets.token_hex(8)
        n = len(self.part_keys)
        # every part had nothing ready a moment ago: ask one, not each of them (one this
        # process gave a member back to since, else the next in turn)
        dry = n > 1 and time.monotonic() - self._dry_at < KNOWN_FOR
        if dry:
            back = [i for i in range(n) if self._avail[i] > 0]
            self._next = (self._next + 1) % n
            order = [back[self._next % len(back)] if back else self._next]
        else:
            start = self._start() if n > 1 else 0
            order = [(start + k) % n for k in range(n)]
        # avoided members are a last resort: lent only once no part has another member
        passes = [0, 1] if fallback and avoid and n > 1 else [int(fallback)]
        ttl_ms = int(lease_ttl * 1000)
        waits: list[int] = []
        res: Any = None
        part = order[0]
        for fb in passes:
            if fb and len(passes) > 1:
                if not self._only_avoided(avoid):
                    break
                order = [i for i in order if self._avail[i] > 0]  # ready, all avoided
            for part in order:
                res = self._run("checkout", [ttl_ms, token, fb, *avoid], part=part)
                self._sizes[part], self._avail[part] = int(res[5]), int(res[4])
                self._heard[part] = time.monotonic()
                if res[0]:
                    break
                waits.append(int(res[6]))
            if res is not None and res[0]:
                break
        size = self._total(int(res[5]) if res is not None else -1)
        avail = sum(self._avail)
        if res is None or not res[0]:
            self._heard = [0.0] * n  # members may come to any part: ask each again
            if not dry:
                self._dry_at = time.monotonic()
            known = [w for w in waits if w >= 0]
            return Checkout(None, avail, size, min(known) / 1000 if known else None)
        mid, raw, uses, score, _, _, _, exp = res
        mid = as_str(mid)
        self._dry_at = -KNOWN_FOR
        guard = _guard
        if guard is not None:
            wait_s = guard.take_lease(self.kind, self.site, token, lease_ttl)
            if wait_s is not None:  # at its share: the member goes back untouched
                self._run("release", [mid, token, "cancel"], part=part)
                return Checkout(None, avail + 1, size, wait_s, shared=True)
        text = self._open(mid, raw)
        lease = self._lease(mid, token, int(uses), int(float(score)), int(exp), text)
        if part:
            lease = replace(lease, part=part)
        return Checkout(lease, avail, size, 0.0)

    def give_back(
        self,
        lease: Lease,
        action: str = "use",
        *,
        rest: float = 0.0,
        max_uses: int = 0,
        delta: int = 0,
        max_score: int = 0,
        reason: str = "",
        hold: float = 0.0,
        uses: int = 1,
    ) -> tuple[str, int]:
        """End a lease; -> (state, pool size: -1 unless `produced`), state "returned", "retired"
        or "stale" (the lease had expired and was reclaimed). Actions: "use" (the request was sent: a use, the score
        moves by `delta`, then `rest` seconds of cool-down, retired at `max_uses`), "cancel"
        (never sent: back at once), "ban" / "retire" (forget it with `reason`; `hold` seconds
        before its id may be added again). `uses`: requests the
        use stands for (a holding's sum, holding.py)."""
        args: list[Any] = [lease.id, lease.token, action]
        if action == "use":
            extra = [int(rest * 1000), max_uses, delta, max_score, uses]
            defaults = [0, 0, 0, 0, 1]
            while extra and extra[-1] == defaults[len(extra) - 1]:  # the script's defaults
                extra.pop()
            args += extra
        elif action in ("ban", "retire"):
            args += [reason, int(hold * 1000)]
        elif action != "cancel":
            raise ValueError(f"unknown lease action {action!r}: one of {', '.join(ACTIONS)}")
        state, size = self._run("release", args, part=lease.part)
        if action in ("use", "cancel"):  # back in its part (ready, or after its rest)
            self._avail[lease.part] += 1
        if int(size) >= 0 and len(self.part_keys) > 1:
            self._sizes[lease.part] = int(size)
            size = self._total(int(size))
        guard = _guard
        if guard is not None:
            guard.give_lease(self.kind, self.site, lease.token)
        return STATES[int(state)], int(size)

    def cancel(self, lease: Lease) -> None:
        """Give a lease back unused (the request was never sent): no use, no cool-down."""
        self.give_back(lease, "cancel")

    def renew_lease(self, lease: Lease, lease_ttl: float) -> bool:
        """Extend a lease for a long request; False if it had already expired and gone back."""
        args = [lease.id, lease.token, "renew", int(lease_ttl * 1000)]
        state, _ = self._run("release", args, part=lease.part)
        return STATES[int(state)] == "renewed"

    # --- membership ----------------------------------------------------------------------
    def add_members(
        self,
        members: Iterable[tuple[str, str]],
        initial_score: int = 0,
        source: str | None = None,
    ) -> int:
        """Add (id, secret) pairs, each secret sealed; an id already known, benched, or (with
        `source`) not in that zset is skipped. Returns how many were added. `source` is one
        more key of the script: on a Redis Cluster it must share the pool's slot."""
        members = list(members)
        if len(self.part_keys) > 1:
            members = self._not_elsewhere(members)
        box = self.sealer
        by_part: dict[int, list[str | bytes]] = {}
        for mid, secret in members:
            by_part.setdefault(self.home(mid), []).extend((mid, box.seal(secret)))
        added = 0
        for part, flat in sorted(by_part.items()):
            keys = [*self.part_keys[part], source] if source else None
            added += int(self._run("add", [initial_score, *flat], keys, part=part))
        if added:  # new members: the next checkout asks every part again
            self._dry_at = -KNOWN_FOR
        return added

    def _not_elsewhere(self, members: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The members no part but their home knows or has benched (a member of the layout
        before sub-pools stays where it is). Not atomic with the add: a member benched in
        another part between the two may still be added to its home part."""
        ids = [mid for mid, _ in members]
        if not ids:
            return members
        pipe = self.rds.pipeline(transaction=False)
        for keys in self.part_keys:
            pipe.hmget(keys[5], ids)  # secret
            pipe.zmscore(keys[8], ids)  # ban
        found = pipe.execute()
        sec, usec = self.rds.time()
        now_ms = int(sec) * 1000 + int(usec) // 1000
        skip: set[str] = set()
        for part in range(len(self.part_keys)):
            known, bans = found[2 * part], found[2 * part + 1]
            for mid, k, b in zip(ids, known, bans, strict=True):
                if self.home(mid) != part and (k is not None or (b is not None and b > now_ms)):
                    skip.add(mid)
        return [(mid, secret) for mid, secret in members if mid not in skip]

    def retire_members(
        self, ids: Iterable[str], reason: str, hold: float = 0.0, only_idle: bool = False
    ) -> int:
        """Retire members (only idle ones with `only_idle`); returns how many."""
        ids = list(ids)
        if not ids:
            return 0
        args = [reason, int(hold * 1000), int(only_idle), *ids]
        return sum(int(x) for x in self._each("retire", args))

    def reclaim(self) -> int:
        """Give back every expired lease now (every operation also does it, a few at a time)."""
        return sum(int(x) for x in self._each("reclaim"))

    # --- reads (every part) --------------------------------------------------------------
    def key_for(self, name: str, member_id: str) -> str:
        """The key `name` (one of KEY_NAMES) of the part that holds `member_id`, or of its
        home part when none does (inspection, tests)."""
        index = KEY_NAMES.index(name)
        if len(self.part_keys) > 1:
            for keys in self.part_keys:
                if self.rds.hexists(keys[5], member_id) or self.rds.zscore(keys[8], member_id):
                    return keys[index]
        return self.part_keys[self.home(member_id)][index]

    def _key(self, index: int) -> list[str]:
        """One key (by its place in KEY_NAMES) of every part."""
        return [keys[index] for keys in self.part_keys]

    def sizes(self) -> tuple[int, int, int]:
        """(available now, members, lent)."""
        got = [[int(x) for x in r] for r in self._each("sizes")]
        avail, size, leased = (sum(col) for col in zip(*got, strict=True))
        return avail, size, leased

    def counters(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for key in self._key(6):
            for k, v in self.rds.hgetall(key).items():
                out[as_str(k)] = out.get(as_str(k), 0) + int(v)
        return out

    def __contains__(self, member_id: object) -> bool:
        return any(self.rds.hexists(key, str(member_id)) for key in self._key(5))

    def members(self) -> set[str]:
        """Every member, idle or lent."""
        return {as_str(x) for key in self._key(5) for x in self.rds.hkeys(key)}

    def lent(self) -> list[str]:
        return [as_str(i) for key in self._key(1) for i in self.rds.zrange(key, 0, -1)]

    def _field(self, index: int, member_id: str) -> Any:
        for key in self._key(index):
            v = self.rds.hget(key, member_id)
            if v is not None:
                return v
        return None

    def uses(self, member_id: str) -> int | None:
        v = self._field(3, member_id)
        return int(v) if v is not None else None

    def score(self, member_id: str) -> int | None:
        v = self._field(4, member_id)
        return int(float(v)) if v is not None else None

    def retired(self) -> list[str]:
        return [as_str(x) for key in self._key(7) for x in self.rds.zrange(key, 0, -1)]

    def banned(self) -> list[str]:
        """Ids benched now (they may not be added again yet)."""
        sec, usec = self.rds.time()
        now_ms = sec * 1000 + usec // 1000
        return [
            as_str(i) for key in self._key(8) for i in self.rds.zrangebyscore(key, now_ms, "+inf")
        ]

    def unban(self, member_id: str) -> None:
        for key in self._key(8):
            self.rds.zrem(key, member_id)

    def clear(self) -> None:
        for keys in self.part_keys:  # one slot a call
            self.rds.delete(*keys)
        self.rds.delete(f"{self.base}:holders")  # the holding processes' count (share.py)


@functools.lru_cache(maxsize=8)
def _source(p: Profile) -> str:
    """The script for pools of profile `p`: its constants, then `lease.lua`."""
    flags = ", ".join("true" if f else "false" for f in (p.lost_uses, p.scored, p.produced))
    return f"local ORDER, LOST, SCORED, PRODUCED = '{p.order}', {flags}\n{SCRIPT}"
