"""Fleet-wide budgets shared between sites: a work-conserving weighted fair share.

A fleet budget (`CHAINCRAWL_FLEET_BUDGET`) caps what every site together may use at once:
`tasks` in flight, `rate` requests a second, and leases of a resource kind out at once
(`cookie=16`, `proxy=20`, any pool kind). Each site named in `CHAINCRAWL_FLEET_SHARES` has a
weight and a priority; its share of a dimension is computed afresh at every admission by one
Lua script (`shares.lua`) from every site's holders and waiters:

- a site with demand (tasks running or refused and still asking) first gets up to its nominal
  share, `capacity x weight / sum of weights`;
- what is left goes to the sites whose demand is not met, the highest priority first and by
  weight within a priority: an idle site's share serves the busy ones, and it comes back as
  soon as the idle site asks again (a site over its share is admitted nothing new until it is
  back under; its running tasks finish as they would).

A site's rate share is the fleet rate times its share of the tasks dimension (so `rate`
needs `tasks`): the gate spaces the site's requests by it, beside the site's own limits.
Sites the shares do not name take no part (their own limits still hold).

Keys (on the `{fleet}` slot: the script water-fills over every site in one call):

    {fleet}:<dim>:held:<site>   zset  holder -> expiry (us of Redis time): a task, a lease
    {fleet}:<dim>:want:<site>   zset  holder -> expiry: refused and still asking (its demand)
    {fleet}:<dim>:alloc         hash  site -> its share x1000 at the last call, `at`
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config import get_settings
from exceptions import ConfigError
from scheduling.limits import parse_rate
from settings.scheduling import FleetSettings, get_fleet_settings
from utils.keyspace import Keyspace
from utils.lua import load_lua
from utils.redis import as_str, get_redis

TASKS = "tasks"
DEFAULT_PRIORITY = 5
_SCRIPT = load_lua(__file__, "server_time.lua", "shares.lua")


@dataclass(frozen=True)
class Share:
    weight: float = 1.0
    priority: int = DEFAULT_PRIORITY


@dataclass(frozen=True)
class FleetBudget:
    """What every site together may use at once, and each site's share of it."""

    dims: dict[str, int] = field(default_factory=dict)  # "tasks", or a resource kind -> capacity
    rate: float | None = None  # requests per second, shared like `tasks`
    shares: dict[str, Share] = field(default_factory=dict)

    @property
    def on(self) -> bool:
        return bool(self.shares) and bool(self.dims)

    def nominal(self, site: str, dim: str) -> float:
        """The site's share of `dim` when every site is busy."""
        total = sum(s.weight for s in self.shares.values())
        return self.dims.get(dim, 0) * self.shares[site].weight / total if total else 0.0


def _terms(text: str, what: str) -> list[tuple[str, str]]:
    out = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, eq, value = term.partition("=")
        if not eq:
            out.append(("", key.strip()))
        else:
            out.append((key.strip().lower(), value.strip()))
    if not out:
        raise ConfigError(f"{what}: empty")
    return out


def parse_budget(
    text: str, source: str = "CHAINCRAWL_FLEET_BUDGET"
) -> tuple[dict[str, int], float | None]:
    """`tasks=32, rate=40/s, cookie=16` -> ({"tasks": 32, "cookie": 16}, 40.0)."""
    dims: dict[str, int] = {}
    rate = None
    for key, value in _terms(text, source):
        try:
            if key == "rate":
                rate = parse_rate(value)
            elif key and value.isdigit() and int(value) > 0:
                dims[key] = int(value)
            else:
                raise ValueError(f"{key or value!r}: expected tasks=N, rate=N/s or <kind>=N")
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    if rate is not None and TASKS not in dims:
        raise ConfigError(
            f"{source}: a fleet rate is shared by the tasks' shares: give tasks=N too"
        )
    return dims, rate


def parse_shares(text: str, source: str = "CHAINCRAWL_FLEET_SHARES") -> dict[str, Share]:
    """`demo=1; news=2,priority=7` -> each site's Share (a bare number is the weight)."""
    shares: dict[str, Share] = {}
    for entry in filter(None, (e.strip() for e in text.replace("\n", ";").split(";"))):
        site, eq, rest = entry.partition("=")
        site = site.strip()
        try:
            if not eq or not site:
                raise ValueError("expected site=weight[,priority=N]")
            weight, prio = 1.0, DEFAULT_PRIORITY
            for key, value in _terms(rest, entry):
                if key in ("", "weight"):
                    weight = float(value)
                elif key == "priority":
                    prio = int(value)
                else:
                    raise ValueError(f"unknown term {key!r}: weight or priority")
            if weight <= 0 or not 0 <= prio <= 9:
                raise ValueError("the weight must be positive, the priority 0..9")
        except ValueError as exc:
            raise ConfigError(f"{source}: entry {entry!r}: {exc}") from None
        shares[site] = Share(weight, prio)
    return shares


def load_budget(settings: FleetSettings | None = None) -> FleetBudget:
    """The fleet budget of the settings: inline, or a YAML/JSON file holding `budget:` and
    `shares:` (shares may also be mappings: `news: {weight: 2, priority: 7}`)."""
    s = settings or get_fleet_settings()
    raw = s.budget.strip()
    if not raw:
        return FleetBudget()
    if "=" in raw:
        dims, rate = parse_budget(raw)
        return FleetBudget(dims, rate, parse_shares(s.shares))
    path = Path(raw.removeprefix("@")).expanduser()
    if not path.is_file():
        raise ConfigError(f"CHAINCRAWL_FLEET_BUDGET names a file that does not exist: {path}")
    import yaml

    doc = (
        json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    )
    if not isinstance(doc, Mapping) or "budget" not in doc:
        raise ConfigError(f"fleet file {path}: expected `budget:` (and `shares:`)")
    budget = doc["budget"]
    text = (
        ", ".join(f"{k}={v}" for k, v in budget.items())
        if isinstance(budget, Mapping)
        else str(budget)
    )
    dims, rate = parse_budget(text, f"fleet file {path}")
    shares_doc = doc.get("shares") or {}
    if isinstance(shares_doc, Mapping):
        entries = []
        for site, spec in shares_doc.items():
            if isinstance(spec, Mapping):
                entries.append(f"{site}=" + ",".join(f"{k}={v}" for k, v in spec.items()))
            else:
                entries.append(f"{site}={spec}")
        shares = parse_shares("; ".join(entries), f"fleet file {path}")
    else:
        shares = parse_shares(str(shares_doc), f"fleet file {path}")
    return FleetBudget(dims, rate, shares)


def allocate(
    capacity: float, demand: Mapping[str, float], shares: Mapping[str, Share]
) -> dict[str, float]:
    """The water-fill `shares.lua` computes, in Python (for views: what a site would get with
    this demand): nominal shares first, then what is left by priority and weight."""
    wsum = sum(s.weight for s in shares.values())
    alloc = {k: min(demand.get(k, 0.0), capacity * s.weight / wsum) for k, s in shares.items()}
    spare = capacity - sum(alloc.values())
    for prio in sorted({s.priority for s in shares.values()}, reverse=True):
        while spare > 1e-9:
            open_ = [
                k
                for k, s in shares.items()
                if s.priority == prio and demand.get(k, 0.0) - alloc[k] > 1e-9
            ]
            if not open_:
                break
            wo = sum(shares[k].weight for k in open_)
            full = [
                k for k in open_ if spare * shares[k].weight / wo >= demand.get(k, 0.0) - alloc[k]
            ]
            if not full:
                for k in open_:
                    alloc[k] += spare * shares[k].weight / wo
                spare = 0.0
            else:
                for k in full:
                    spare -= demand.get(k, 0.0) - alloc[k]
                    alloc[k] = demand.get(k, 0.0)
    return alloc


@dataclass(frozen=True)
class Decision:
    ok: bool
    share: float  # the site's share of the dimension now
    held: int  # held by the site, this one included if admitted
    total: int  # held by every site


class FairShare:
    """One dimension of the fleet budget (see the module docstring)."""

    def __init__(
        self, client: Any, prefix: str, dim: str, budget: FleetBudget, want_ttl: float
    ) -> None:
        self.r, self.dim, self.budget = client, dim, budget
        self.capacity = budget.dims[dim]
        self.sites = sorted(budget.shares)
        self._index = {s: i + 1 for i, s in enumerate(self.sites)}
        ks = Keyspace(prefix)
        self.k_alloc = ks.fleet(dim, "alloc")
        self.keys = [self.k_alloc]
        for s in self.sites:
            self.keys += [ks.fleet(dim, "held", s), ks.fleet(dim, "want", s)]
        self._tail: list[Any] = []
        for s in self.sites:
            sh = budget.shares[s]
            self._tail += [s, sh.weight, sh.priority]
        self.want_us = int(want_ttl * 1e6)
        self._script = client.register_script(_SCRIPT)

    def __contains__(self, site: object) -> bool:
        return site in self._index

    def _call(self, op: str, site: str, holder: str, ttl: float) -> Any:
        args = [
            op,
            self._index.get(site, 0),
            holder,
            int(ttl * 1e6),
            self.want_us,
            self.capacity,
            len(self.sites),
            *self._tail,
        ]
        return self._script(keys=self.keys, args=args)

    def take(self, site: str, holder: str, ttl: float) -> Decision:
        """Admit `holder` for up to `ttl` seconds if the site is under its share now (a
        holder already admitted is renewed); else it counts as waiting for `want_ttl`."""
        ok, share, held, total = self._call("take", site, holder, ttl)
        return Decision(bool(ok), share / 1000, int(held), int(total))

    def give(self, site: str, holder: str) -> None:
        self._call("give", site, holder, 0)

    def view(self) -> dict[str, dict[str, float]]:
        """Per site: held, waiting and its share now (computed afresh)."""
        rows = self._call("view", "", "", 0)
        return {
            s: {"held": int(h), "want": int(w), "share": a / 1000}
            for s, (h, w, a) in zip(self.sites, rows, strict=True)
        }

    def shares_now(self) -> dict[str, float]:
        """The shares the last call computed (one read, for the rate shares)."""
        raw = self.r.hgetall(self.k_alloc)
        return {as_str(k): int(v) / 1000 for k, v in raw.items() if as_str(k) in self._index}


class Fleet:
    """This process's view of the fleet budget: the tasks share the gate takes at admission,
    the rate share it spaces requests by, and the lease shares the resource pools take."""

    def __init__(
        self, client: Any, prefix: str, budget: FleetBudget, settings: FleetSettings | None = None
    ) -> None:
        s = settings or get_fleet_settings()
        self.budget = budget
        self.refresh = s.refresh
        self.dims = {d: FairShare(client, prefix, d, budget, s.want_ttl) for d in budget.dims}
        self._rates: tuple[float, dict[str, float]] = (0.0, {})
        self._lock = threading.Lock()

    def takes_part(self, site: str) -> bool:
        return site in self.budget.shares

    def take_task(self, site: str, task_id: str, ttl: float) -> bool:
        """A place among the fleet's tasks in flight for `ttl` seconds (True when no tasks
        budget applies to the site)."""
        dim = self.dims.get(TASKS)
        if dim is None or site not in dim:
            return True
        return dim.take(site, task_id, ttl).ok

    def give_task(self, site: str, task_id: str) -> None:
        dim = self.dims.get(TASKS)
        if dim is not None and site in dim:
            dim.give(site, task_id)

    def rate_of(self, site: str) -> float | None:
        """The site's share of the fleet rate (requests a second), read at most every
        `refresh` seconds; None when the fleet has no rate or the site takes no part."""
        if self.budget.rate is None or not self.takes_part(site):
            return None
        at, rates = self._rates
        if time.monotonic() - at >= self.refresh:
            shares = self.dims[TASKS].shares_now()
            total = sum(shares.values())
            rates = {k: self.budget.rate * v / total for k, v in shares.items()} if total else {}
            with self._lock:
                self._rates = (time.monotonic(), rates)
        # a site no share was computed for at the last read (it had no demand then) goes at its
        # nominal rate until the next read
        return rates.get(site) or self.budget.rate * self.budget.nominal(site, TASKS) / max(
            1, self.budget.dims[TASKS]
        )

    def take_lease(self, kind: str, site: str, holder: str, ttl: float) -> float | None:
        """A share of the fleet's `kind` leases for one lease: None when taken (or no share
        applies), else the seconds to wait before asking again."""
        dim = self.dims.get(kind)
        if dim is None or site not in dim or kind == TASKS:
            return None
        if dim.take(site, holder, ttl).ok:
            return None
        return 0.5 * random.uniform(0.5, 1.5)

    def give_lease(self, kind: str, site: str, holder: str) -> None:
        dim = self.dims.get(kind)
        if dim is not None and site in dim and kind != TASKS:
            dim.give(site, holder)


def fleet_from_settings(client: Any = None) -> Fleet | None:
    """The fleet budget of the settings (CHAINCRAWL_FLEET_*), None when there is none."""
    budget = load_budget()
    if not budget.on:
        return None
    s = get_settings()
    return Fleet(client if client is not None else get_redis(s.redis_url), s.key_prefix, budget)
