"""Run records and exact completion counters in Redis.

Keys (prefix `cc` by default):
    run:{rid}            hash  chain, status (running|done|cancelled), created, finished,
                               priority, def, cancelled (time) and cancel_reason once cancelled,
                               paused (time) and pause_reason while paused
    run:{rid}:counters   hash  outstanding, dispatched, succeeded, failed, retried, items, stored,
                               and per step `{step}:{counter}`
    run:{rid}:done       set   task ids that have committed (makes commit idempotent)
    run:{rid}:uniq:{step} set  parameter fingerprints of `unique` steps
    run:{rid}:pending    list  children waiting behind the run's cap (backpressure), and
                               every task of a paused run (`pause`)
    run:{rid}:parked     set   task ids parked since the last resume (parked once each)
    run:{rid}:ledger     hash  tid -> message of every task sent and not yet committed, so
                               chains.sweeper can re-send what the broker lost (bug 1);
                               `last` in the run hash is the time of the last commit
    kids:{tid}           list  child messages a committed task still has to send
    runs:active          set   run ids not yet done
    runs:recent          zset  run ids by start time, the newest RECENT_KEEP (`control.sh runs`)
    outbox               stream items handed off for storage (drained by external_interface.outbox)

A task's whole result is committed in one Lua script (a batch's tasks in one call): its items go
to the outbox, its children are staged in `kids:{tid}`, the counters move, and `outstanding`
drops by one. The script runs at most once per task id (the `done` set), so a redelivered or
duplicated message can neither store items twice nor count twice. Children are sent after the commit and the staging list
deleted; a redelivered task that finds itself committed only re-sends what is still staged.
A run is complete exactly when `outstanding` reaches zero, whatever the number of workers.

Cancelling a run (`cancel`) drops its waiting children at once; each of its tasks still in
the broker is skipped when it begins (no fetch, committed as `cancelled`), and a task that was
running commits its items but sends no children. When the last one has committed, the run's
status is `cancelled`. What was stored stays stored.

Pausing a run (`pause`) holds it without losing its place: its children go to the waiting
list instead of the broker, and each of its tasks still in the broker is parked there when it
begins (no fetch, not committed; its delivery not counted). A running task finishes. `resume`
releases the waiting list (up to the cap), and the run goes on where it stopped; cancelling a
paused run drops what waits. Both are one script each, so a task is parked or runs, never both.

Backpressure: a run may have a `cap` on tasks in the broker (`inflight`). Children beyond it
wait in `run:{rid}:pending` (still counted as dispatched and outstanding); every commit frees
one slot and moves waiting children into the committing task's staging list, in the same
script, so the broker never holds more than the cap of one run's tasks. While nothing waits and
the cap has room, children go to the staging list directly (the usual case: no hop through
`pending`, 2.5 fewer Redis calls per page); once some wait, new ones queue behind them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import redis

from config import Settings, get_settings

RUN_TTL = 7 * 24 * 3600  # run records and done sets outlive the run for a week
RECENT_KEEP = 10_000  # runs listed by `recent` (their records expire after RUN_TTL anyway)

COUNTERS = (
    "dispatched", "succeeded", "failed", "retried", "items", "stored", "store_failed",
    "resent",  # re-sent by the sweeper after the broker lost their message (bug 1)
    "cancelled",  # not run: their run was cancelled (`RunState.cancel`)
)  # fmt: skip

_COMMIT = """
-- Commits of one run's tasks (a batch's, or a single task's), each at most once per task id.
-- KEYS: 1 counters, 2 run hash, 3 outbox, 4 active runs, 5 pending, 6 ledger (tid -> message
--       of every task sent and not yet committed: bug 1's sweeper); then per commit:
--       its done set|key, its kids list
-- ARGV: 1 run, 2 now, 3 ttl, 4 uniq key prefix, 5 number of commits; then per commit: tid,
--       step, outcome, n_items, n_entries, per entry: n_fields, fields...; n_kids, per kid:
--       step, uniq, json
-- Reply per commit: 0 (already committed) or {outstanding tasks of the run (0 without a run),
-- the staged child messages...}, so the caller publishes them with no LRANGE round trip.
-- Counters, EXPIREs and the run's `last` are written once per call, summed over its commits.
local run, now, ttl, uprefix = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local n = tonumber(ARGV[5])
local i = 6
local cap, cancelled, paused = 0, false, false
if run ~= '' then
  local rh = redis.call('HMGET', KEYS[2], 'cap', 'cancelled', 'paused')
  cap, cancelled, paused = tonumber(rh[1] or '0'), rh[2] ~= false, rh[3] ~= false
end
local replies, counts, touched = {}, {}, {}
local delta, committed, ledger_grew = 0, 0, false
local inflight0, inflight, waiting = nil, 0, nil  -- with a cap: tasks in the broker; pending's length
local function count(field, by) counts[field] = (counts[field] or 0) + by end
local function waits()  -- the waiting list's length: read once per call, then kept here
  if waiting == nil then waiting = redis.call('LLEN', KEYS[5]) end
  return waiting
end
for c = 1, n do
  local done_key, kids_key = KEYS[5 + 2 * c], KEYS[6 + 2 * c]
  local tid, step, outcome = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local n_items = tonumber(ARGV[i + 3])
  i = i + 4
  local fresh_task
  if run == '' then
    fresh_task = redis.call('SET', done_key, '1', 'NX', 'EX', ttl)
  else
    fresh_task = redis.call('SADD', done_key, tid) == 1
    if fresh_task then touched[done_key] = true end
  end
  local n_entries = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n_entries do
    local nf = tonumber(ARGV[i]); i = i + 1
    if fresh_task then redis.call('XADD', KEYS[3], '*', unpack(ARGV, i, i + nf - 1)) end
    i = i + nf
  end
  local n_kids = tonumber(ARGV[i]); i = i + 1
  if not fresh_task then
    i = i + 3 * n_kids
    replies[c] = 0
  else
    committed = committed + 1
    if run ~= '' then redis.call('HDEL', KEYS[6], tid) end
    if cap > 0 then  -- backpressure: this task leaves the broker (`inflight` is written once, at
      if inflight0 == nil then  -- the end, as the net change)
        inflight0 = tonumber(redis.call('HGET', KEYS[1], 'inflight') or '0')
        inflight = inflight0
      end
      inflight = inflight - 1
    end
    local staged = {}  -- the reply: the staged messages (the run's outstanding count goes first)
    -- children: to this task's staging list; with a cap, to the run's waiting list when the
    -- cap is reached or others wait ahead of them (order kept), and always while it is paused
    local total = 0
    if cancelled then  -- a cancelled run sends no more children (its items are kept)
      i = i + 3 * n_kids
      n_kids = 0
    end
    for _ = 1, n_kids do
      local kstep, uniq, msg = ARGV[i], ARGV[i + 1], ARGV[i + 2]; i = i + 3
      local fresh = 1
      if uniq ~= '' and run ~= '' then
        local ukey = uprefix .. kstep
        fresh = redis.call('SADD', ukey, uniq)
        touched[ukey] = true
      end
      if fresh == 1 then
        local target = kids_key
        if paused or (cap > 0 and (inflight >= cap or waits() > 0)) then
          target = KEYS[5]
          if waiting ~= nil then waiting = waiting + 1 end
        elseif cap > 0 then
          inflight = inflight + 1
        end
        redis.call('RPUSH', target, msg)
        touched[target] = true
        if target == kids_key then table.insert(staged, msg) end
        if run ~= '' then
          local kid_id = string.match(msg, '^{"id":"([^"]+)"') or cjson.decode(msg)['id']
          redis.call('HSET', KEYS[6], kid_id, msg)
          ledger_grew = true
          count(kstep .. ':dispatched', 1)
        end
        total = total + 1
      end
    end
    if run ~= '' then
      -- release waiting children into the freed slots, oldest first
      if cap > 0 and not paused then
        while inflight < cap and waits() > 0 do
          local m = redis.call('LPOP', KEYS[5])
          if not m then waiting = 0; break end
          redis.call('RPUSH', kids_key, m)
          touched[kids_key] = true
          table.insert(staged, m)
          waiting = waiting - 1
          inflight = inflight + 1
        end
      end
      count(step .. ':' .. outcome, 1)
      count(outcome, 1)
      if n_items > 0 then
        count(step .. ':items', n_items)
        count('items', n_items)
      end
      if total > 0 then count('dispatched', total) end
      delta = delta + total - 1
    end
    replies[c] = staged
  end
end
for key in pairs(touched) do redis.call('EXPIRE', key, ttl) end
local left = 0
if run ~= '' and committed > 0 then
  if ledger_grew then redis.call('EXPIRE', KEYS[6], ttl) end
  redis.call('HSET', KEYS[2], 'last', now)
  if inflight0 ~= nil and inflight ~= inflight0 then
    redis.call('HINCRBY', KEYS[1], 'inflight', inflight - inflight0)
  end
  for field, by in pairs(counts) do redis.call('HINCRBY', KEYS[1], field, by) end
  left = redis.call('HINCRBY', KEYS[1], 'outstanding', delta)
  if left <= 0 then
    redis.call('HSET', KEYS[2], 'status', cancelled and 'cancelled' or 'done', 'finished', now)
    redis.call('SREM', KEYS[4], run)
    redis.call('DEL', KEYS[6])
  end
end
for c = 1, n do
  if replies[c] ~= 0 then table.insert(replies[c], 1, left) end
end
return replies
"""

_RELEASE_LOOP = """
local moved = 0
while cap == 0 or inflight + moved < cap do
  local m = redis.call('LPOP', KEYS[3])
  if not m then break end
  redis.call('RPUSH', KEYS[4], m)
  moved = moved + 1
end
if moved > 0 then
  redis.call('HINCRBY', KEYS[1], 'inflight', moved)
  redis.call('EXPIRE', KEYS[4], 86400)
end
"""

_RELEASE = (
    """
-- KEYS: 1 counters, 2 run hash, 3 pending, 4 staging; moves waiting tasks up to the cap
-- (none while the run is paused)
if redis.call('HEXISTS', KEYS[2], 'paused') == 1 then return 0 end
local cap = tonumber(redis.call('HGET', KEYS[2], 'cap') or '0')
local inflight = tonumber(redis.call('HGET', KEYS[1], 'inflight') or '0')
"""
    + _RELEASE_LOOP
    + "return moved\n"
)

_PAUSE = """
-- KEYS: 1 run hash; ARGV: 1 now, 2 reason
-- Reply: {status before ('' = no such run), paused already (0|1), cancelled (0|1)}
local rh = redis.call('HMGET', KEYS[1], 'status', 'paused', 'cancelled')
if not rh[1] then return {'', 0, 0} end
local was_paused, cancelled = rh[2] and 1 or 0, rh[3] and 1 or 0
if rh[1] == 'running' and was_paused == 0 and cancelled == 0 then
  redis.call('HSET', KEYS[1], 'paused', ARGV[1], 'pause_reason', ARGV[2])
end
return {rh[1], was_paused, cancelled}
"""

_RESUME = (
    """
-- KEYS: 1 counters, 2 run hash, 3 pending, 4 staging, 5 parked set; ARGV: 1 now
-- Reply: {status before ('' = no such run), was paused (0|1), cancelled (0|1), tasks released
-- into staging}; a cancelled run is left as it is (its waiting list was dropped)
local rh = redis.call('HMGET', KEYS[2], 'status', 'paused', 'cap', 'cancelled')
if not rh[1] then return {'', 0, 0, 0} end
if not rh[2] or rh[4] then return {rh[1], rh[2] and 1 or 0, rh[4] and 1 or 0, 0} end
redis.call('HDEL', KEYS[2], 'paused', 'pause_reason')
redis.call('DEL', KEYS[5])
redis.call('HSET', KEYS[2], 'last', ARGV[1])  -- the sweeper's stall clock starts again
local cap = tonumber(rh[3] or '0')
local inflight = tonumber(redis.call('HGET', KEYS[1], 'inflight') or '0')
"""
    + _RELEASE_LOOP
    + "return {rh[1], 1, 0, moved}\n"
)

_PARK = """
-- A task of a paused run, at its begin: back to the run's waiting list instead of running.
-- KEYS: 1 run hash, 2 counters, 3 pending, 4 ledger, 5 done set, 6 deliveries key, 7 parked
--       set (task ids parked since the last resume: a redelivery is not parked twice)
-- ARGV: 1 tid, 2 message (`Kid.encode()` form), 3 ttl, 4 '1': this delivery was counted
-- Reply: 1 parked (or already), 0 not paused (resumed meanwhile, or cancelled: run the task
-- as usual), -1 committed meanwhile by another delivery
local rh = redis.call('HMGET', KEYS[1], 'paused', 'cancelled', 'cap')
if not rh[1] or rh[2] then return 0 end
if redis.call('SISMEMBER', KEYS[5], ARGV[1]) == 1 then return -1 end
if ARGV[4] == '1' and tonumber(redis.call('GET', KEYS[6]) or '0') > 0 then
  redis.call('DECR', KEYS[6])  -- parking is no delivery: a poison cap must not count it
end
if redis.call('SADD', KEYS[7], ARGV[1]) == 0 then return 1 end
redis.call('EXPIRE', KEYS[7], tonumber(ARGV[3]))
redis.call('RPUSH', KEYS[3], ARGV[2])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
if tonumber(rh[3] or '0') > 0 then redis.call('HINCRBY', KEYS[2], 'inflight', -1) end
return 1
"""

_CANCEL = """
-- KEYS: 1 counters, 2 run hash, 3 active, 4 pending, 5 ledger; ARGV: 1 run, 2 now, 3 reason
-- Reply: {status before, children dropped from the waiting list, tasks still outstanding}
local status = redis.call('HGET', KEYS[2], 'status')
if not status then return {'', 0, 0} end
if status == 'done' or status == 'cancelled' then return {status, 0, 0} end
redis.call('HSET', KEYS[2], 'cancelled', ARGV[2], 'cancel_reason', ARGV[3])
local dropped, steps = 0, {}
for _, m in ipairs(redis.call('LRANGE', KEYS[4], 0, -1)) do
  local ok, msg = pcall(cjson.decode, m)
  if ok and type(msg) == 'table' then
    if msg['id'] then redis.call('HDEL', KEYS[5], msg['id']) end
    local step = type(msg['meta']) == 'table' and msg['meta']['step'] or nil
    if type(step) == 'string' then steps[step] = (steps[step] or 0) + 1 end
  end
  dropped = dropped + 1
end
redis.call('DEL', KEYS[4])
for step, k in pairs(steps) do redis.call('HINCRBY', KEYS[1], step .. ':cancelled', k) end
local left = tonumber(redis.call('HGET', KEYS[1], 'outstanding') or '0')
if dropped > 0 then
  redis.call('HINCRBY', KEYS[1], 'cancelled', dropped)
  left = redis.call('HINCRBY', KEYS[1], 'outstanding', -dropped)
end
if left <= 0 then
  redis.call('HSET', KEYS[2], 'status', 'cancelled', 'finished', ARGV[2])
  redis.call('SREM', KEYS[3], ARGV[1])
  redis.call('DEL', KEYS[5])
end
return {status, dropped, left}
"""

_DISPATCH = """
-- KEYS: 1 counters, 2 run hash, 3 active; ARGV: 1 run, 2 step, 3 n
local n = tonumber(ARGV[3])
redis.call('HINCRBY', KEYS[1], ARGV[2] .. ':dispatched', n)
redis.call('HINCRBY', KEYS[1], 'dispatched', n)
redis.call('HINCRBY', KEYS[1], 'outstanding', n)
redis.call('HSET', KEYS[2], 'status', 'running')
redis.call('HDEL', KEYS[2], 'finished')
redis.call('SADD', KEYS[3], ARGV[1])
return 1
"""


@dataclass
class Kid:
    """A child task staged by a commit: sent to the broker right after it."""

    step: str
    task: str
    params: dict[str, Any]
    meta: dict[str, Any]
    task_id: str
    uniq: str = ""

    def encode(self) -> bytes:
        return orjson.dumps(
            {"id": self.task_id, "task": self.task, "params": self.params, "meta": self.meta}
        )


@dataclass
class CommitCall:
    """One task's commit, waiting to be sent with others (`RunState.run_commits`)."""

    rid: str
    done_key: str
    kids_key: str
    args: list[Any]  # its part of the script's ARGV: tid, step, outcome, n_items, entries, kids


@dataclass
class Committed:
    """What a commit left: the run's outstanding tasks (0 without a run) and the child
    messages staged in `kids:{tid}` (`Kid.encode()` form) that the task must now send."""

    outstanding: int
    staged: list[bytes]


class Begun(NamedTuple):
    """What `begin` found for a task about to run."""

    committed: bool  # a redelivery of a task that has committed: only re-send what it staged
    deliveries: int  # of this attempt (0 inside a batch: the batch message's count)
    cancelled: bool = False  # its run was cancelled: skip it (commit it as `cancelled`)
    paused: bool = False  # its run is paused: park it in the run's waiting list (`park`)


@dataclass
class Cancelled:
    """What `RunState.cancel` did."""

    run_id: str
    was: str  # the run's status before: running, done or cancelled ("" = no such run)
    dropped: int  # children waiting behind the run's cap, dropped at once
    outstanding: int  # tasks still in the broker or running: skipped as they begin


@dataclass
class Paused:
    """What `RunState.pause` found: `was` is the status before (running, paused, cancelling,
    done, cancelled; "" = no such run); the run is paused now only if it was running."""

    run_id: str
    was: str


@dataclass
class Resumed:
    """What `RunState.resume` did: `was` as for `Paused`; `released` tasks were moved from
    the waiting list to be sent (the rest follow as the run's cap allows)."""

    run_id: str
    was: str
    released: int


def _committed(reply: Any) -> Committed | None:
    if not isinstance(reply, list):  # 0: this task id had already committed
        return None
    return Committed(int(reply[0]), list(reply[1:]))


class RunState:
    """All run bookkeeping against one Redis; cheap to build, thread-safe."""

    def __init__(self, client: redis.Redis, settings: Settings | None = None) -> None:
        self.r = client
        self.s = settings or get_settings()
        self._commit = client.register_script(_COMMIT)
        self._dispatch = client.register_script(_DISPATCH)
        self._cancel = client.register_script(_CANCEL)
        self._release = client.register_script(_RELEASE)
        self._pause = client.register_script(_PAUSE)
        self._resume = client.register_script(_RESUME)
        self._park = client.register_script(_PARK)

    # keys
    def run_key(self, rid: str) -> str:
        return self.s.key("run", rid)

    def counters_key(self, rid: str) -> str:
        return self.s.key("run", rid, "counters")

    def done_key(self, rid: str, tid: str) -> str:
        return self.s.key("run", rid, "done") if rid else self.s.key("done", tid)

    def kids_key(self, tid: str) -> str:
        return self.s.key("kids", tid)

    def pending_key(self, rid: str) -> str:
        return self.s.key("run", rid, "pending")

    def parked_key(self, rid: str) -> str:
        return self.s.key("run", rid, "parked")

    def ledger_key(self, rid: str) -> str:
        return self.s.key("run", rid, "ledger")

    @property
    def active_key(self) -> str:
        return self.s.key("runs", "active")

    @property
    def recent_key(self) -> str:
        return self.s.key("runs", "recent")

    @property
    def outbox_key(self) -> str:
        return self.s.key("outbox")

    # run lifecycle
    def create_run(
        self, rid: str, chain_name: str, chain_json: bytes, priority: int, cap: int = 0
    ) -> None:
        """Record a run. `cap` bounds the run's tasks in the broker at once (0 = no bound);
        children beyond it wait in `run:{rid}:pending` and are released as tasks finish."""
        now = f"{time.time():.3f}"
        pipe = self.r.pipeline()
        pipe.hset(
            self.run_key(rid),
            mapping={
                "chain": chain_name,
                "status": "running",
                "created": now,
                "priority": priority,
                "def": chain_json,
                "cap": cap,
            },
        )
        pipe.expire(self.run_key(rid), RUN_TTL)
        pipe.hset(self.counters_key(rid), "outstanding", 0)
        pipe.expire(self.counters_key(rid), RUN_TTL)
        pipe.sadd(self.active_key, rid)
        pipe.zadd(self.recent_key, {rid: float(now)})
        pipe.zremrangebyrank(self.recent_key, 0, -RECENT_KEEP - 1)
        pipe.execute()

    def recent(self, limit: int = 20, offset: int = 0) -> list[str]:
        """Run ids, newest first from `offset`, finished or not (whose records have not
        expired: those are dropped from the index as they are met)."""
        rids = [
            m.decode()
            for m in self.r.zrevrange(self.recent_key, offset, offset + max(0, limit - 1))
        ]
        if not rids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for rid in rids:
            pipe.exists(self.run_key(rid))
        alive = pipe.execute()
        gone = [rid for rid, ok in zip(rids, alive, strict=True) if not ok]
        if gone:
            self.r.zrem(self.recent_key, *gone)
        return [rid for rid, ok in zip(rids, alive, strict=True) if ok]

    def cancel(self, rid: str, reason: str = "") -> Cancelled:
        """Stop a run without touching the workers or other runs: its waiting children are
        dropped, its tasks in the broker are skipped as they begin, running ones send no
        children. Idempotent; a finished run is left as it is."""
        was, dropped, left = self._cancel(
            keys=[self.counters_key(rid), self.run_key(rid), self.active_key,
                  self.pending_key(rid), self.ledger_key(rid)],
            args=[rid, f"{time.time():.3f}", reason[:500]],
        )  # fmt: skip
        was = was.decode() if isinstance(was, bytes) else str(was)
        return Cancelled(rid, was, int(dropped), max(0, int(left)))

    def pause(self, rid: str, reason: str = "") -> Paused:
        """Hold a running run (see the module docstring); idempotent."""
        status, paused, cancelled = self._pause(
            keys=[self.run_key(rid)], args=[f"{time.time():.3f}", reason[:500]]
        )
        return Paused(rid, _shown(status, paused, cancelled))

    def resume(self, rid: str, staging: str) -> Resumed:
        """Un-pause a run: what waits is moved into `staging` (up to the cap) for the caller
        to send; the rest is released by commits as usual."""
        status, paused, cancelled, moved = self._resume(
            keys=[
                self.counters_key(rid),
                self.run_key(rid),
                self.pending_key(rid),
                staging,
                self.parked_key(rid),
            ],
            args=[f"{time.time():.3f}"],
        )
        return Resumed(rid, _shown(status, paused, cancelled), int(moved))

    def park(self, rid: str, tid: str, msg: bytes, attempt: int, counted: bool) -> int:
        """Put a task of a paused run back in its waiting list instead of running it: 1 parked,
        0 not paused any more (run it), -1 committed meanwhile. `counted`: its delivery was
        counted at begin (under `attempt`) and is taken back."""
        keys = [self.run_key(rid), self.counters_key(rid), self.pending_key(rid),
                self.ledger_key(rid), self.done_key(rid, tid), self.s.key("deliv", tid, attempt),
                self.parked_key(rid)]  # fmt: skip
        return int(self._park(keys=keys, args=[tid, msg, RUN_TTL, "1" if counted else "0"]))

    def add_dispatched(self, rid: str, step: str, n: int) -> None:
        """Count tasks about to be sent by a client (seeds, replays) before sending them."""
        self._dispatch(
            keys=[self.counters_key(rid), self.run_key(rid), self.active_key], args=[rid, step, n]
        )

    def enqueue_and_release(self, rid: str, step: str, msgs: Sequence[bytes], staging: str) -> None:
        """Client-side dispatch (seeds, replays): count, queue behind the cap, release what
        fits into `staging` for the caller to send."""
        self.add_dispatched(rid, step, len(msgs))
        self.ledger_add(rid, msgs)
        if msgs:
            self.r.rpush(self.pending_key(rid), *msgs)
            self.r.expire(self.pending_key(rid), RUN_TTL)
        self._release(
            keys=[self.counters_key(rid), self.run_key(rid), self.pending_key(rid), staging]
        )

    def ledger_add(self, rid: str, msgs: Sequence[bytes]) -> None:
        """Record tasks a client is about to send (seeds, replays) in the run's ledger, where
        the sweeper finds them if the broker loses their message (bug 1); marks progress."""
        pipe = self.r.pipeline(transaction=False)
        if msgs:
            pipe.hset(self.ledger_key(rid), mapping={orjson.loads(m)["id"]: m for m in msgs})
            pipe.expire(self.ledger_key(rid), RUN_TTL)
        pipe.hset(self.run_key(rid), "last", f"{time.time():.3f}")
        pipe.execute()

    def ledger(self, rid: str) -> dict[str, bytes]:
        """tid -> message of the run's tasks sent and not yet committed."""
        return {k.decode(): v for k, v in self.r.hgetall(self.ledger_key(rid)).items()}

    def waiting(self, rid: str) -> int:
        return int(self.r.llen(self.pending_key(rid)))

    def hold(self, rid: str) -> str:
        """What holds the run's tasks back: "cancelled", "paused" or "" (nothing)."""
        cancelled, paused = self.r.hmget(self.run_key(rid), "cancelled", "paused")
        return "cancelled" if cancelled else "paused" if paused else ""

    def chain_def(self, rid: str) -> bytes | None:
        return self.r.hget(self.run_key(rid), "def")

    def info(self, rid: str) -> dict[str, str]:
        return {
            k.decode(): v.decode()
            for k, v in self.r.hgetall(self.run_key(rid)).items()
            if k != b"def"
        }

    def counters(self, rid: str) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.r.hgetall(self.counters_key(rid)).items()}

    def active_runs(self, chain: str | None = None) -> list[str]:
        """Run ids not yet done (of one chain if given)."""
        rids = sorted(m.decode() for m in self.r.smembers(self.active_key))
        if chain is None or not rids:
            return rids
        pipe = self.r.pipeline(transaction=False)
        for rid in rids:
            pipe.hget(self.run_key(rid), "chain")
        names = pipe.execute()
        return [rid for rid, c in zip(rids, names, strict=True) if c == chain.encode()]

    # task lifecycle
    def begin(self, rid: str, tid: str, retries: int) -> Begun:
        """(already committed?, deliveries of this attempt, run cancelled?) in one round trip."""
        return self.begin_many([(rid, tid, retries)])[0][0]

    def commit(
        self,
        *,
        rid: str,
        tid: str,
        step: str,
        outcome: str,
        n_items: int,
        entries: Sequence[Mapping[str, Any]],
        kids: Sequence[Kid],
        pipe_extra: Any = None,
        defer: list[CommitCall] | None = None,
    ) -> Committed | None:
        """Atomically record a finished task: the run's outstanding count and the staged
        children to send, or None if it had already committed. With `defer` the call is only
        appended there (None returned) for `run_commits`."""
        args: list[Any] = [tid, step, outcome, n_items, len(entries)]
        for e in entries:
            args.append(2 * len(e))
            for k, v in e.items():
                args.extend((k, v))
        args.append(len(kids))
        for k in kids:
            args.extend((k.step, k.uniq, k.encode()))
        call = CommitCall(rid, self.done_key(rid, tid), self.kids_key(tid), args)
        if defer is not None:  # the caller sends it with others: run_commits(defer)
            defer.append(call)
            return None
        return self.run_commits([call], pipe_extra=pipe_extra)[0]

    def _commit_script_call(self, rid: str, calls: Sequence[CommitCall]) -> list[Any]:
        """KEYS and ARGV of one commit script call for `calls`, all of run `rid`."""
        norun = self.s.key("norun")
        keys: list[Any] = [
            self.counters_key(rid) if rid else norun,
            self.run_key(rid) if rid else norun,
            self.outbox_key,
            self.active_key,
            self.pending_key(rid) if rid else norun,
            self.ledger_key(rid) if rid else norun,
        ]
        args: list[Any] = [
            rid, f"{time.time():.3f}", RUN_TTL, self.s.key("run", rid, "uniq", ""), len(calls)
        ]  # fmt: skip
        for c in calls:
            keys += (c.done_key, c.kids_key)
            args += c.args
        return [len(keys), *keys, *args]

    def run_commits(
        self,
        calls: Sequence[CommitCall],
        pipe_pre: Any = None,
        pipe_extra: Any = None,
    ) -> list[Committed | None]:
        """Send commit calls (from `commit(defer=...)`) in one round trip: one script call per
        run, so a batch's counters, EXPIREs and `last` are written once, summed over its
        pages, and each task id still commits at most once. `pipe_pre` adds commands before
        them, `pipe_extra` after. EVALSHA straight into the pipeline: a registered `Script`
        would make redis-py send SCRIPT EXISTS in a round trip of its own first."""
        groups: dict[str, list[int]] = {}
        for n, c in enumerate(calls):
            groups.setdefault(c.rid, []).append(n)
        pipe = self.r.pipeline(transaction=False)
        if pipe_pre is not None:
            pipe_pre(pipe)
        first = len(pipe.command_stack)
        sha = self._commit.sha
        script_calls = [
            self._commit_script_call(rid, [calls[n] for n in idx]) for rid, idx in groups.items()
        ]
        for sc in script_calls:
            pipe.evalsha(sha, *sc)
        if pipe_extra is not None:
            pipe_extra(pipe)
        res = pipe.execute(raise_on_error=False)
        out: list[Committed | None] = [None] * len(calls)
        error: Exception | None = None
        for g, (idx, sc) in enumerate(zip(groups.values(), script_calls, strict=True)):
            r = res[first + g]
            if isinstance(r, redis.exceptions.NoScriptError):  # a restarted or flushed server
                self.r.script_load(_COMMIT)
                r = self.r.evalsha(sha, *sc)
            elif isinstance(r, Exception):
                error = error or r
                continue
            for n, reply in zip(idx, r, strict=True):
                out[n] = _committed(reply)
        error = error or next(
            (
                r
                for r in res
                if isinstance(r, Exception) and not isinstance(r, redis.exceptions.NoScriptError)
            ),
            None,
        )
        if error is not None:
            raise error
        return out

    def begin_many(
        self, calls: Sequence[tuple[str, str, int]], batch_id: str = ""
    ) -> tuple[list[Begun], int]:
        """`begin` for several (rid, tid, retries) in one round trip (a batch's entries).

        With `batch_id`, the entries' deliveries are not counted: the batch message's are
        (the second element), and a redelivered batch runs its entries one by one, each
        counted as it starts, so a worker death is charged to the entry that was running."""
        pipe = self.r.pipeline(transaction=False)
        rids = sorted({rid for rid, _, _ in calls if rid})
        for rid in rids:
            pipe.hmget(self.run_key(rid), "cancelled", "paused")
        for rid, tid, retries in calls:
            if rid:
                pipe.sismember(self.done_key(rid, tid), tid)
            else:
                pipe.exists(self.done_key(rid, tid))
            if not batch_id:
                deliv_key = self.s.key("deliv", tid, retries)
                pipe.incr(deliv_key)
                pipe.expire(deliv_key, 2 * 24 * 3600)
        if batch_id:
            deliv_key = self.s.key("deliv", batch_id, 0)
            pipe.incr(deliv_key)
            pipe.expire(deliv_key, 2 * 24 * 3600)
        res = pipe.execute()
        off = len(rids)
        cancelled = {rid for rid, (c, _) in zip(rids, res[:off], strict=True) if c}
        paused = {rid for rid, (_, p) in zip(rids, res[:off], strict=True) if p}
        res = res[off:]
        if batch_id:
            return [
                Begun(bool(res[i]), 0, calls[i][0] in cancelled, calls[i][0] in paused)
                for i in range(len(calls))
            ], int(res[len(calls)])
        return [
            Begun(bool(res[3 * i]), int(res[3 * i + 1]), calls[i][0] in cancelled,
                  calls[i][0] in paused)
            for i in range(len(calls))
        ], 0  # fmt: skip

    def staged_kids(self, tid: str) -> list[dict[str, Any]]:
        return [orjson.loads(m) for m in self.r.lrange(self.kids_key(tid), 0, -1)]

    def clear_kids(self, tid: str) -> None:
        self.r.delete(self.kids_key(tid))

    def count_retry(self, rid: str, step: str, pipe: Any) -> None:
        if rid:
            pipe.hincrby(self.counters_key(rid), f"{step}:retried", 1)
            pipe.hincrby(self.counters_key(rid), "retried", 1)

    def reopen_failed(self, rid: str, step: str, msg: bytes | None = None) -> None:
        """A dead-lettered task is replayed: it is outstanding again and no longer failed.
        `msg` (the replayed message, `Kid.encode()` form) goes to the run's ledger."""
        if msg is not None:
            self.ledger_add(rid, [msg])
        pipe = self.r.pipeline()
        ck = self.counters_key(rid)
        pipe.hincrby(ck, f"{step}:failed", -1)
        pipe.hincrby(ck, "failed", -1)
        pipe.hincrby(ck, "outstanding", 1)
        pipe.hincrby(ck, "inflight", 1)
        pipe.hset(self.run_key(rid), "status", "running")
        pipe.sadd(self.active_key, rid)
        pipe.execute()


def run_status(info: Mapping[str, Any]) -> str:
    """A run's status as shown (from its run hash, str values): `cancelling` while a cancelled
    run's tasks still drain, `paused` while it is held."""
    status = info.get("status") or "unknown"
    if status != "running":
        return status
    return "cancelling" if info.get("cancelled") else "paused" if info.get("paused") else status


def _shown(status: Any, paused: Any, cancelled: Any) -> str:
    """`run_status` of a script's reply ("" = no such run)."""
    status = status.decode() if isinstance(status, bytes) else str(status or "")
    if not status:
        return ""
    return run_status({"status": status, "paused": int(paused), "cancelled": int(cancelled)})


def step_counters(counters: Mapping[str, int], steps: Sequence[str]) -> dict[str, dict[str, int]]:
    """Reshape flat `{step}:{counter}` fields into {step: {counter: n}} in chain order."""
    out = {s: dict.fromkeys(COUNTERS, 0) for s in steps}
    for k, v in counters.items():
        s, _, c = k.rpartition(":")
        if s in out and c in out[s]:
            out[s][c] = v
    return out
