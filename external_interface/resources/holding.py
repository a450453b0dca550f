"""Holding: a worker process keeps a pool member's Redis lease for a few requests and lends
the member locally, so a page costs no Redis round trip per resource.

Without holding every request checks a member out of its pool (one `lease.lua` call) and
returns it (another). With holding (`HoldRule.requests` > 1) the process takes the Redis
lease once and lends the member to its own requests, one at a time:

* **exclusive**: a held member serves one request at a time (`busy`); the Redis lease, held by
  the process, keeps every other process away;
* **bounded**: the member goes back to the pool after `requests` requests or `seconds` since
  its checkout, whichever comes first; `seconds` is kept below half the lease TTL, so a
  request lent locally always has at least half a TTL before the Redis lease could expire and
  a crashed process's members come back by expiry, as before;
* **summed**: uses and score changes are summed here and written with the return (one call:
  `LeasePool.give_back(..., uses=n)`); the score is tracked as the script would (capped at
  `max_score`), so the write is the exact net change. A use limit or a score at 0 returns the
  member at once (the script retires it); a ban or a retirement is applied at once and the
  member leaves the holding, so it never serves another request after the site banned it;
* **rotation**: a member rests `rest` seconds after each use here too (cool-down), the one
  idle longest (or least used, for channels ordered by use) goes first, and a member not in
  use for `idle` seconds goes back (`Reaper`, a thread per process), so an idle process
  hoards nothing;
* **share** (`HoldRule.share`): the process holds at most its share of the pool (share.py:
  ceil(members / live holding processes)); a take at it waits for a member held here with
  no Redis call, a member over it goes back at its return;
* **shutdown**: `return_all` gives everything back (the worker's shutdown signals); a member
  in flight then goes back with its request's feedback.

The fleet share guard (`lease.set_lease_guard`) counts Redis leases: a held member holds its
place until it goes back. A crash loses the summed uses and score changes of the members it
held (their leases expire; a pool whose profile counts lost leases counts one use).
`requests` = 1 is no holding: every call goes straight to the pool, as without this module.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from external_interface.resources.lease import Checkout, Lease, LeasePool
from external_interface.resources.share import Share

log = logging.getLogger(__name__)

EMPTY_FOR = 0.2  # longest a pool's "nothing ready" answer is believed without asking again...
EMPTY_MAX = 1.0  # ...doubled with each such answer in a row, up to this (a checkout that lends
# starts again): a pool its processes keep drained is asked a few times a second, not five


@dataclass(frozen=True)
class HoldRule:
    """How long a process may keep a member: `requests` requests, `seconds` since checkout
    (capped below half the lease TTL by `Holding`), `idle` seconds unused; `wait`: how long a
    take that finds nothing free here nor in the pool waits for a member this process holds
    to come back from its request."""

    requests: int = 1
    seconds: float = 5.0
    idle: float = 1.0
    wait: float = 0.0  # longest a take waits for a member held here to come back (0: none)
    share: bool = False  # hold at most this process's share of the pool (share.py)

    @property
    def holds(self) -> bool:
        return self.requests > 1


@dataclass
class _Held:
    lease: Lease  # the Redis lease (its token, its uses and score at checkout)
    taken: float  # monotonic, read before the checkout call (conservative)
    deadline: float  # no local lending from then on
    score: int  # the member's score now, as the script would have it
    busy: bool = True
    served: int = 0  # requests sent under this Redis lease (uses not written yet)
    ready: float = 0.0  # monotonic: cool-down over
    idle_since: float = 0.0
    last_rest: float = 0.0
    args: dict[str, Any] = field(default_factory=dict)  # the last use's max_uses/max_score
    notes: dict[str, Any] = field(default_factory=dict)  # the pool's own sums (`note`)


@dataclass(eq=False)
class _Waiter:
    """A take waiting in the process for a member held here (`Holding.take`)."""

    avoid: Collection[str]
    event: threading.Event = field(default_factory=threading.Event)
    got: _Held | None = None  # handed over, busy for this take (None: ask again)
    at: float = 0.0  # monotonic: when asking again may find the member (its rest in the pool)


class Holding:
    """The members this process holds of one pool; thread- and greenlet-safe."""

    def __init__(self, pool: LeasePool, rule: HoldRule) -> None:
        self.pool = pool
        self.rule = rule
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._waiters: deque[_Waiter] = deque()  # takes waiting for a member, first come first
        self.size = -1  # the pool's size, as the last Redis call said
        self.available = 0
        self.closing = False
        self.calls = 0  # Redis calls made (checkouts and returns), for tests and benchmarks
        self.waited = 0  # takes that waited in the process for a member held here
        self.handed = 0  # members handed from a return straight to a waiting take
        # nothing was ready in the pool for anyone: no need to ask again before then
        self._empty_until = 0.0
        self._empty_streak = 0  # "nothing ready" answers in a row
        # called with a member's notes when it goes back (the proxy channel: global scores)
        self.on_return: Callable[[Lease, dict[str, Any]], None] | None = None
        self.share: Share | None = None  # with the rule's `share`: this process's share
        self.capped = 0  # takes that found this process at its share (waited for its own)

    def __len__(self) -> int:
        return len(self._held)

    def held(self) -> list[str]:
        with self._lock:
            return list(self._held)

    # --- lending -------------------------------------------------------------------------
    def take(
        self, avoid: Collection[str], lease_ttl: float, fallback: bool = True, wait: bool = True
    ) -> Checkout:
        """A held member free, rested and within its bounds (not in `avoid`), else one more
        from the pool (`LeasePool.take`, the guard's share included). When neither has one
        and a member held here may serve this take soon (in use, or resting), waits up to the
        rule's `wait` for it (`wait`: the caller's leave to): the takes waiting in a process
        queue first come first served on an in-process event, a member given back here goes
        straight to the first of them it may serve (after its rest), and one that goes back
        to the pool wakes the first to ask the pool once; no waiting take polls Redis. So a
        task meets a busy pool by waiting a request's time, not by going back to the broker
        for a message of its own. A take that still has nothing says, in `wait`, the soonest
        return it knows of (a member resting here or in the pool)."""
        co = self._take(avoid, lease_ttl, fallback)
        limit = min(self.rule.wait, self.rule.seconds)
        if co.lease is not None or not wait or limit <= 0 or self.closing:
            return co
        deadline = time.monotonic() + limit
        while True:
            got = self._await(avoid, deadline)
            if isinstance(got, _Held):
                return self._lent(got)
            if got is None:  # nothing held here will serve it in time
                break
            co = self._take(avoid, lease_ttl, fallback)  # a member went back to the pool
            if co.lease is not None or time.monotonic() >= deadline:
                break
        rest = self.soonest(avoid) if co.lease is None else None
        if rest is not None:
            co = replace(co, wait=rest if co.wait is None else min(co.wait, rest))
        return co

    def _await(self, avoid: Collection[str], deadline: float) -> _Held | bool | None:
        """Wait for a member held here: the member (busy for this take, rested), True when
        one went back to the pool (ask it), None when none comes before `deadline`."""
        now = time.monotonic()
        with self._lock:
            h = self._claim(avoid, now, deadline)
            if h is None:
                if not any(x.busy and x.lease.id not in avoid for x in self._held.values()):
                    return None
                w = _Waiter(avoid)
                self._waiters.append(w)
                self.waited += 1
        if h is None:
            try:
                w.event.wait(max(0.0, deadline - now))
            except BaseException:  # the take killed while waiting (a time limit)
                with self._lock:
                    if not w.event.is_set():
                        self._waiters.remove(w)
                if w.got is not None:  # handed over meanwhile: not lost with the take
                    self._unclaim(w.got)
                raise
            with self._lock:  # a hand-over sets the event under the lock: read it there
                if not w.event.is_set():
                    self._waiters.remove(w)
                    return None
            h = w.got
            if h is None:
                pause = min(w.at, deadline) - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                return True
        pause = h.ready - time.monotonic()
        if pause > 0:  # its rest: kept busy meanwhile, so no one else takes it
            try:
                time.sleep(pause)
            except BaseException:  # the take killed meanwhile (a time limit): not lost
                self._unclaim(h)
                raise
        return h

    def _unclaim(self, h: _Held) -> None:
        """A member claimed for a take that ended before using it: free (or to the next)."""
        now = time.monotonic()
        with self._lock:
            if self._held.get(h.lease.id) is h:
                h.busy, h.idle_since = False, now
                self._hand_over(h, now)

    def _claim(self, avoid: Collection[str], now: float, deadline: float) -> _Held | None:
        """A held member free and within its bounds, ready by `deadline` (the first ready),
        made busy; under the lock."""
        best: _Held | None = None
        for h in self._held.values():
            if h.busy or h.lease.id in avoid or h.ready > deadline or not self._lendable(h, now):
                continue
            if best is None or h.ready < best.ready:
                best = h
        if best is not None:
            best.busy = True
        return best

    def _lendable(self, h: _Held, now: float) -> bool:
        """Within its bounds: its requests, its time (its rest included)."""
        return h.served < self.rule.requests and max(now, h.ready) < h.deadline

    def _lent(self, h: _Held) -> Checkout:
        lease = replace(h.lease, uses=h.lease.uses + h.served, score=h.score)
        return Checkout(lease, self.available, self.size, 0.0, local=True)

    def soonest(self, avoid: Collection[str] = ()) -> float | None:
        """Seconds until the first member held here and resting (not in `avoid`) is ready;
        None if none rests."""
        now = time.monotonic()
        with self._lock:
            ready = [
                h.ready - now for h in self._held.values() if not h.busy and h.lease.id not in avoid
            ]
        return min((x for x in ready if x > 0), default=None)

    def _cap(self, now: float) -> int | None:
        """The most members this process may hold (the rule's `share`), else None."""
        if not self.rule.share or self.closing:
            return None
        if self.share is None:
            self.share = Share(self.pool)
        return self.share.cap(now)

    def _take(self, avoid: Collection[str], lease_ttl: float, fallback: bool) -> Checkout:
        now = time.monotonic()
        cap = self._cap(now)
        with self._lock:
            pick = self._pick(avoid, now)
            if pick is not None:
                pick.busy = True
                return self._lent(pick)
            soonest = min(
                (h.ready for h in self._held.values() if not h.busy and h.lease.id not in avoid),
                default=None,
            )
            # at its share: wait for a member held here (one the take may have), no Redis call
            if (
                cap is not None
                and len(self._held) >= cap
                and any(i not in avoid for i in self._held)
            ):
                self.capped += 1
                wait = None if soonest is None else max(0.0, soonest - now)
                return Checkout(None, 0, self.size, wait, shared=True)
        if now < self._empty_until:  # the pool said nothing is ready, a moment ago
            return Checkout(None, 0, self.size, max(self._empty_until - now, 0.0))
        co = self.pool.take(avoid, lease_ttl, fallback)
        self.calls += 1
        self.size, self.available = co.size, co.available
        if co.lease is None:
            if co.available == 0 and not co.shared:
                span = min(EMPTY_FOR * 2**self._empty_streak, EMPTY_MAX)
                self._empty_streak = min(self._empty_streak + 1, 8)
                self._empty_until = time.monotonic() + min(co.wait or span, span)
            if soonest is not None:  # a member held here rests: it is ready sooner
                wait = max(0.0, soonest - time.monotonic())
                co = replace(co, wait=wait if co.wait is None else min(co.wait, wait))
            return co
        self._empty_streak = 0
        span = min(self.rule.seconds, lease_ttl / 2)
        if self.closing:
            span = 0.0
        with self._lock:
            self._held[co.lease.id] = _Held(co.lease, now, now + span, co.lease.score)
        return co

    def _pick(self, avoid: Collection[str], now: float) -> _Held | None:
        best: _Held | None = None
        for h in self._held.values():
            if h.busy or h.lease.id in avoid or h.ready > now or not self._lendable(h, now):
                continue
            if self.pool.profile.order == "uses":
                if best is None or h.lease.uses + h.served < best.lease.uses + best.served:
                    best = h
            elif best is None or h.idle_since < best.idle_since:
                best = h
        return best

    def refreshed(self) -> None:
        """The pool may have members again (a refill added some): ask it at the next take."""
        self._empty_until = 0.0

    def note(self, lease: Lease, **sums: float) -> bool:
        """Add to the pool's own sums for a member lent from here (the channel's successes);
        False if it is not held here (the caller writes them itself)."""
        with self._lock:
            h = self._held.get(lease.id)
            if h is None or h.lease.token != lease.token or self.closing:
                return False
            for k, v in sums.items():
                h.notes[k] = v if k.startswith("last_") else h.notes.get(k, 0) + v
        return True

    # --- returns -------------------------------------------------------------------------
    def give(self, lease: Lease, action: str = "use", **how: Any) -> tuple[str, int]:
        """`LeasePool.give_back` for a member lent from here: a use is summed and the member
        stays held unless a bound, its use limit or a score at 0 says it goes back now; a ban
        or a retirement goes to the pool at once; a cancel frees it unused (back to the pool
        unless it served a request here already). A member that stays held goes to the first
        take waiting here that may have it; one that left wakes the first waiting take to ask
        the pool (after the member's rest there)."""
        try:
            return self._give(lease, action, **how)
        finally:
            with self._lock:
                h = self._held.get(lease.id)
                if (h is None or h.lease.token != lease.token) and self._waiters:
                    w = self._waiters.popleft()
                    w.at = time.monotonic() + float(how.get("rest", 0.0))
                    w.event.set()

    def _hand_over(self, h: _Held, now: float) -> None:
        """A member free again, held: to the first waiting take it may serve; under the lock."""
        if not self._lendable(h, now):
            return
        for w in self._waiters:
            if h.lease.id not in w.avoid:
                self._waiters.remove(w)
                h.busy, w.got = True, h
                self.handed += 1
                w.event.set()
                return

    def _give(
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
    ) -> tuple[str, int]:
        now = time.monotonic()
        with self._lock:
            h = self._held.get(lease.id)
            if h is None or h.lease.token != lease.token:
                h = None
            elif action in ("ban", "retire"):
                del self._held[lease.id]
            elif action == "cancel":
                h.busy, h.idle_since = False, now
                if h.served > 0 and not self._due(h, now):
                    self._hand_over(h, now)
                    return "returned", self.size
                # taken for a request that never went out (a later provider made the task
                # wait): straight back, so no other worker waits for it meanwhile
                del self._held[lease.id]
            else:
                h.served += 1
                if delta:
                    h.score = min(h.score + delta, max_score)
                h.ready, h.last_rest = now + rest, rest
                h.args = {"max_uses": max_uses, "max_score": max_score}
                h.busy, h.idle_since = False, now
                used_up = max_uses > 0 and h.lease.uses + h.served >= max_uses
                unhealthy = self.pool.profile.scored and delta != 0 and h.score <= 0
                if not (used_up or unhealthy or self._due(h, now)):
                    self._hand_over(h, now)
                    return "returned", self.size
                del self._held[lease.id]
        if h is None:  # not held here (taken before holding, or the lease went back)
            return self._call(lease, action, rest, max_uses, delta, max_score, reason, hold)
        if action in ("ban", "retire"):
            return self._call(h.lease, action, 0.0, 0, 0, 0, reason, hold, notes=h.notes)
        return self._flush(h, now)

    def _due(self, h: _Held, now: float) -> bool:
        """Whether `h` goes back to the pool: a bound, shutdown, or more held than the share."""
        over = self.share is not None and len(self._held) > (self.share.limit or len(self._held))
        return self.closing or now >= h.deadline or h.served >= self.rule.requests or over

    def _flush(self, h: _Held, now: float) -> tuple[str, int]:
        """Give a member no longer held back to the pool with what it did here, one call."""
        if h.served == 0:
            return self._call(h.lease, "cancel", 0.0, 0, 0, 0, "", 0.0, notes=h.notes)
        rest = max(0.0, h.ready - now)
        delta = h.score - h.lease.score
        return self._call(
            h.lease,
            "use",
            rest,
            int(h.args.get("max_uses", 0)),
            delta,
            int(h.args.get("max_score", 0)),
            "",
            0.0,
            uses=h.served,
            notes=h.notes,
        )

    def _call(
        self,
        lease: Lease,
        action: str,
        rest: float,
        max_uses: int,
        delta: int,
        max_score: int,
        reason: str,
        hold: float,
        uses: int = 1,
        notes: dict[str, Any] | None = None,
    ) -> tuple[str, int]:
        if notes and self.on_return is not None:
            try:
                self.on_return(lease, notes)
            except redis.RedisError:
                log.warning("%s %s: its sums were not written", self.pool.kind, lease.id)
        self.calls += 1
        # a member goes back: the pool has one ready again; once its rest there is over, if
        # the pool had none ready at the last checkout (a take asking meanwhile would only
        # find it resting)
        drained = action == "use" and rest > 0 and self.available <= 0
        self._empty_until = time.monotonic() + rest if drained else 0.0
        self._empty_streak = 0
        state, size = self.pool.give_back(
            lease,
            action,
            rest=rest,
            max_uses=max_uses,
            delta=delta,
            max_score=max_score,
            reason=reason,
            hold=hold,
            uses=uses,
        )
        self.size = size
        return state, size

    def release_idle(self, now: float | None = None) -> int:
        """Give back every member not in use for `idle` seconds or past its time bound (and,
        when closing, every member not in use); returns how many went back."""
        now = time.monotonic() if now is None else now
        with self._lock:
            gone = [
                h
                for h in self._held.values()
                if not h.busy
                and (self.closing or now - h.idle_since >= self.rule.idle or now >= h.deadline)
            ]
            for h in gone:
                del self._held[h.lease.id]
        try:
            self._flush_all(gone, now)
        finally:
            with self._lock:  # back in the pool: as many waiting takes ask it
                for _ in gone[: len(self._waiters)]:
                    self._waiters.popleft().event.set()
        return len(gone)

    def _flush_all(self, gone: list[_Held], now: float) -> None:
        for h in gone:
            try:
                self._flush(h, now)
            except redis.RedisError:
                log.warning(
                    "%s %s: return failed; it returns when its lease expires",
                    self.pool.kind,
                    h.lease.id,
                )

    def return_all(self) -> int:
        """Shutdown: everything not in use goes back now, the rest with its feedback."""
        self.closing = True
        try:
            return self.release_idle()
        finally:
            if self.share is not None:
                self.share.leave()


# --- the process's holdings -------------------------------------------------------------------

_holdings: dict[tuple[str, int], Holding] = {}
_lock = threading.Lock()
_reaper: Reaper | None = None
_enabled = True


def set_enabled(on: bool) -> None:
    """Off: every pool lends per request whatever its hold_* settings (tests of the engine)."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    return _enabled


def holding_for(pool: LeasePool, rule: HoldRule) -> Holding:
    """This process's holding of `pool` (one per pool and client, shared by every provider
    instance), with `rule` from now on; starts the reaper."""
    key = (pool.base, id(pool._rds))
    with _lock:
        h = _holdings.get(key)
        if h is None:
            h = _holdings[key] = Holding(pool, rule)
        h.rule = rule
        _start_reaper()
    return h


def holdings() -> list[Holding]:
    with _lock:
        return list(_holdings.values())


def return_all() -> int:
    """Give back every member this process holds and is not using (worker shutdown)."""
    n = sum(h.return_all() for h in holdings())
    if n:
        log.info("returned %d held resources", n)
    return n


def forget() -> None:
    """Drop every holding without returning anything (tests that switch servers)."""
    with _lock:
        _holdings.clear()


class Reaper(threading.Thread):
    """Gives idle and overdue members back, every `interval` seconds; one per process."""

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(name="chaincrawl-holding", daemon=True)
        self.interval = interval
        self.pid = os.getpid()
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            for h in holdings():
                try:
                    h.release_idle()
                except Exception:  # never end the thread: the next round tries again
                    log.exception("holding of %s: idle return failed", h.pool.name)


def _start_reaper() -> None:
    global _reaper
    if _reaper is None or _reaper.pid != os.getpid() or not _reaper.is_alive():
        _reaper = Reaper()
        _reaper.start()


atexit.register(return_all)
