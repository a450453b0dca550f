"""The change history of a watched set, in the state store: per key its visits and changes,
per site the hours it changes in, the keys due next and the budget's allowance.

The keys (one hash tag per watched set, `utils.keyspace.Keyspace.recrawl`, so each of the
two scripts runs on one Redis Cluster slot) and what each holds: docs/scheduling.md.

Observing is all or nothing per batch: the script applies every key's new record only if none
moved since it was read (another drainer observed the same key), else the batch is read and
computed again. Times are the clock's (`utils/clock.py`): simulated in tests and benchmarks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from scheduling.recrawl import model as m
from scheduling.recrawl.watch import Watch
from utils.keyspace import Keyspace
from utils.lua import load_lua
from utils.redis import as_str

DEFAULT_RATE = 1.0 / m.DAY  # changes per active second assumed of a site nothing is known of
MIN_GAP = 1.0  # seconds: a second observation of a key this soon is the same visit
HOURS_KEPT = 48
RETRY_AFTER = 900.0  # a key sent and not stored is looked at again after at least this long
MAX_MISSES = 3  # sends in a row that stored nothing before a key is dropped (gone from the site)
CONFLICT_RETRIES = 8
TOTALS = ("visits", "changes", "bought", "found", "dispatched", "dropped")

_OBSERVE = load_lua(__file__, "observe.lua")
_DISPATCH = load_lua(__file__, "dispatch.lua")


@dataclass(frozen=True)
class KeyRecord:
    n: int  # visit intervals seen
    x: int  # of them ended by a changed value
    active: float  # their active seconds
    last: float  # the last visit (s)
    rate: float  # the key's rate when last computed (changes per active second)

    def encode(self) -> str:
        return f"{self.n} {self.x} {self.active:.1f} {self.last:.3f} {self.rate:.6e}"

    @classmethod
    def decode(cls, raw: bytes | str) -> KeyRecord:
        n, x, active, last, rate = as_str(raw).split()
        return cls(int(n), int(x), float(active), float(last), float(rate))


@dataclass(frozen=True)
class Observed:
    """What one batch changed: visits (of keys seen before), changes among them, new keys."""

    visits: int = 0
    changes: int = 0
    enrolled: int = 0


@dataclass(frozen=True)
class Totals:
    raw: dict[str, float]

    def get(self, name: str) -> float:
        return self.raw.get(name, 0.0)

    @property
    def profile(self) -> m.Profile:
        return m.Profile.learned(
            [self.get(f"e{h}") for h in range(m.HOURS)], [self.get(f"c{h}") for h in range(m.HOURS)]
        )

    @property
    def site_rate(self) -> float:
        """The pooled rate of every key's intervals (the prior of a key seen little)."""
        return m.improved_rate(self.get("n"), self.get("x"), self.get("active")) or DEFAULT_RATE


class History:
    """One watched set's history (see the module docstring)."""

    def __init__(self, client: Any, prefix: str, watch: Watch) -> None:
        self.r = client
        self.watch = watch
        ks = Keyspace(prefix)
        name = watch.name
        self.k_records = ks.recrawl(name, "keys")
        self.k_due = ks.recrawl(name, "due")
        self.k_inflight = ks.recrawl(name, "inflight")
        self.k_misses = ks.recrawl(name, "misses")
        self.k_totals = ks.recrawl(name, "totals")
        self.k_hours = ks.recrawl(name, "hours")
        self.k_watches = ks.recrawl_watches
        self._observe = client.register_script(_OBSERVE)
        self._dispatch = client.register_script(_DISPATCH)

    # --- the watch's settings, for every observer -----------------------------------------

    def publish(self) -> None:
        """Make the watch known to every worker's observer (written at each trigger tick)."""
        self.r.hset(self.k_watches, self.watch.name, orjson.dumps(self.watch.to_dict()))

    # --- reads ------------------------------------------------------------------------------

    def totals(self) -> Totals:
        raw = self.r.hgetall(self.k_totals)
        out: dict[str, float] = {}
        for k, v in raw.items():
            try:
                out[as_str(k)] = float(v)
            except ValueError:
                continue
        return Totals(out)

    def record(self, key: str) -> KeyRecord | None:
        raw = self.r.hget(self.k_records, key)
        return KeyRecord.decode(raw) if raw is not None else None

    def due_at(self, key: str) -> float | None:
        score = self.r.zscore(self.k_due, key)
        return float(score) if score is not None else None

    # --- observing --------------------------------------------------------------------------

    def observe(self, seen: Iterable[tuple[str, bool]], now: float) -> Observed:
        """Record one batch of visits: (key, whether its value changed since the last one, as
        the dedup store judged it). A key seen for the first time is enrolled; every key's
        next visit is planned from its new rate."""
        merged: dict[str, bool] = {}
        for key, changed in seen:
            merged[key] = merged.get(key, False) or changed
        keys = list(merged)
        if not keys:
            return Observed()
        for _ in range(CONFLICT_RETRIES):
            olds = self.r.hmget(self.k_records, keys)
            args, result = self._plan(keys, olds, merged, now)
            if not args:
                return result
            moved = self._observe(
                keys=[
                    self.k_records,
                    self.k_due,
                    self.k_inflight,
                    self.k_totals,
                    self.k_hours,
                    self.k_misses,
                ],
                args=args,
            )
            if not moved:
                return result
        raise RuntimeError(f"recrawl {self.watch.name}: keys kept moving under the observer")

    def _plan(
        self,
        keys: Sequence[str],
        olds: Sequence[bytes | None],
        changed: dict[str, bool],
        now: float,
    ) -> tuple[list[Any], Observed]:
        knobs = self.watch.knobs
        totals = self.totals()
        profile = totals.profile
        srate = totals.site_rate
        exposure = [0.0] * m.HOURS
        attributed = [0.0] * m.HOURS
        dn = dx = dactive = dsum = drsum = 0.0
        enrolled = visits = changes = 0
        rows: list[tuple[str, str, KeyRecord, bool]] = []
        for key, raw in zip(keys, olds, strict=True):
            old = KeyRecord.decode(raw) if raw is not None else None
            ch = changed[key]
            if old is None:
                new = KeyRecord(0, 0, 0.0, now, srate)
                enrolled += 1
            else:
                if now - old.last < MIN_GAP:
                    continue  # the same visit heard twice (a hook retried, two drainers)
                a = m.active(old.last, now, profile)
                for h, s in enumerate(m.exposure(old.last, now)):
                    exposure[h] += s
                if ch:
                    for h, w in enumerate(m.attribute(old.last, now, profile)):
                        attributed[h] += w
                n, x, act = old.n + 1, old.x + int(ch), old.active + a
                new = KeyRecord(n, x, act, now, m.key_rate(n, x, act, srate))
                dn, dx, dactive = dn + 1, dx + int(ch), dactive + a
                dsum -= old.rate**knobs.alpha
                drsum -= old.rate
                visits += 1
                changes += int(ch)
            dsum += new.rate**knobs.alpha
            drsum += new.rate
            rows.append((key, as_str(raw) if raw is not None else "", new, ch))
        result = Observed(visits, changes, enrolled)
        if not rows:
            return [], result
        c = m.budget_constant(knobs, max(0.0, totals.get("sum") + dsum), profile)
        args: list[Any] = [
            int(now // m.HOUR),
            len(rows),
            *exposure,
            *attributed,
            dn,
            dx,
            dactive,
            dsum,
            drsum,
            enrolled,
        ]
        for key, old_raw, new, ch in rows:
            due = m.next_visit(now, new.rate, c, profile, knobs)
            args += [key, old_raw, new.encode(), f"{due:.3f}", int(ch)]
        return args, result

    # --- dispatching ------------------------------------------------------------------------

    def dispatch(self, now: float, most: int = 10_000) -> tuple[list[str], list[str]]:
        """The keys to visit now, within the allowance (pages per day accrue continuously, up
        to one day's worth): each is marked sent and looked at again after RETRY_AFTER unless
        its visit is stored first. Returns (sent, dropped: sent MAX_MISSES times, never stored)."""
        knobs = self.watch.knobs
        retry_at = now + max(RETRY_AFTER, knobs.min_interval)
        out = self._dispatch(
            keys=[self.k_due, self.k_inflight, self.k_totals, self.k_misses, self.k_records],
            args=[
                f"{now:.3f}",
                knobs.budget,
                knobs.budget,
                f"{retry_at:.3f}",
                most,
                MAX_MISSES,
                knobs.alpha,
            ],
        )
        keys = [as_str(k) for k in out]
        cut = keys.index("")
        self._trim_hours(now)
        return keys[:cut], keys[cut + 1 :]

    def _trim_hours(self, now: float) -> None:
        oldest = int(now // m.HOUR) - HOURS_KEPT
        stale = [f for f in self.r.hkeys(self.k_hours) if int(as_str(f).split(":")[0]) < oldest]
        if stale:
            self.r.hdel(self.k_hours, *stale)

    # --- what `status` shows ------------------------------------------------------------------

    def summary(self, now: float) -> dict[str, Any]:
        """The watch's budget, what it bought and found (in the last day and in all), the keys
        it watches, when the site changes, and what the model expects."""
        t = self.totals()
        day: dict[str, int] = {"v": 0, "c": 0, "b": 0, "f": 0}
        since = int(now // m.HOUR) - 24
        for f, v in self.r.hgetall(self.k_hours).items():
            hour, _, what = as_str(f).partition(":")
            if int(hour) >= since and what in day:
                day[what] += int(v)
        keys = int(t.get("keys"))
        profile = t.profile
        return {
            "watch": self.watch.name,
            "site": self.watch.site,
            "item_type": self.watch.item_type,
            "budget": self.watch.knobs.budget,
            "keys": keys,
            "due_now": int(self.r.zcount(self.k_due, "-inf", now)),
            "in_flight": int(self.r.zcard(self.k_inflight)),
            "last_day": {name: day[name[0]] for name in ("visits", "changes", "bought", "found")},
            "total": {k: int(t.get(k)) for k in TOTALS},
            "changes_per_day": round(t.get("rsum") * m.DAY, 2),  # the model's expectation
            "site_rate_per_day": round(t.site_rate * m.DAY, 4),
            "hot_hours": profile.hot_hours(),
            "mean_interval_h": _mean_interval(self.watch.knobs, keys),
        }


def _mean_interval(knobs: m.Knobs, keys: int) -> float | None:
    """Hours between two visits of a key on average, if the budget is spent."""
    if keys <= 0 or knobs.budget <= 0:
        return None
    return round(keys / knobs.budget * 24, 2)
