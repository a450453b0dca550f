"""The run-ledger sweeper: re-sends run tasks whose message the broker lost.

kombu's Redis transport pops a message (BRPOP) and only afterwards records it in `unacked`; a
worker killed in between takes the message with it, and nothing would ever redeliver it. Every
task of a run is therefore in the run's ledger (`run:{rid}:ledger`, tid -> message) from before
it is sent until it commits (ledger/state.py). A stalled run (no commit for `sweep_stall`
seconds) whose ledger holds a task found nowhere in the broker - not in a queue list (priority
sub-queues included), not in `unacked` (where messages being run, waiting for an ETA or
prefetched are; one held there for twice the visibility timeout counts as lost), not in the
run's backpressure list - and not committed, has lost that message:
the sweeper sends it again with its task id. A re-send of a message that was not in fact lost is
harmless (the commit runs once per task id); the stall condition and a second look after
`confirm` seconds keep that rare. A task id a worker refused as unknown (broker/workers.py,
lifecycle/unknown.py) is never re-sent: the worker dead-lettered it, naming the fix.

The same pass first gives back the unacknowledged messages of dead workers (heartbeat gone for
`dead_worker_after` seconds; broker/owners.py), which kombu would restore only after the
visibility timeout. A death is also the moment a message can have been lost (the killed worker
may have popped one it had not yet recorded), and so is a restart of the broker's Redis (a
popped message whose reply never reached its worker): after either, the pass checks the ledger
of every active run at once, stalled or not, rather than letting a run finish its other work
and then wait `sweep_stall` seconds for its lost task.

Every worker process runs a sweeper thread; a Redis lock (SET NX EX) lets one of them sweep per
interval. While the fleet is idle the interval backs off: a pass that finds no active run, no
unacknowledged message, no dead worker, no restart and nothing to compact (or a lock attempt
another process won while the holder found nothing) doubles this process's wait, up to
`SWEEP_IDLE_MAX` (60 s); with nothing active and nothing unacknowledged there is nothing to
lose or restore. The wait is back to `CHAINCRAWL_SWEEP_INTERVAL` after a pass that finds any
of those, after a lock attempt that finds the holder's `sweeper:busy` mark (set by a pass that
found work, for three intervals: the others stay ready to take over should it die), as soon
as this process runs a task (utils/process.py, counted from the worker's task_prerun signal:
no command) and while it has a dropped broker connection to report. So every sweeper tries
every interval while work exists, and within `SWEEP_IDLE_MAX` of work appearing where no
task of it runs.

Redis brokers only: RabbitMQ keeps a delivered message until it is acknowledged and gives it
back when its consumer's connection dies, so it cannot lose a message this way (and its
queues cannot be listed without consuming them, so lost and queued could not be told apart).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, cast

import redis

from base_task import queue_for
from broker import drops, owners
from broker.workers import TaskSets
from chains.broker_scan import BATCH_TASK, broker_task_ids, kid_id, message_ids
from config import Settings, get_settings
from ledger.publish import send_kid
from ledger.state import RunState
from utils import process
from utils.lua import script
from utils.redis import as_str, get_redis
from utils.slots import LostRange, known_lost, lost_for, lost_ranges
from utils.wire import TaskEnvelope

log = logging.getLogger("chaincrawl.sweeper")

__all__ = ["BATCH_TASK", "CLEAN_MAX", "Sweeper", "broker_task_ids", "message_ids"]

CLEAN_MAX = 300.0  # longest wait before a stalled run found whole is looked at again
SWEEP_IDLE_MAX = 60.0  # longest wait between two passes while the fleet is idle (doubling)
COMPACT_LOOK = 20  # newest runs the sweep looks at for a finished run not compacted yet


class _LockLost(Exception):
    """The sweep lock expired during a pass and another worker took it: stop this pass."""


class Sweeper:
    """Finds stalled runs and re-sends the ledger entries the broker no longer holds.

    `send(kid)` publishes one message (`ledger.publish.send_kid` with the worker's app)."""

    def __init__(
        self,
        client: redis.Redis,
        broker: redis.Redis,
        broker_prefix: str,
        send: Callable[[dict[str, Any]], None],
        settings: Settings | None = None,
        *,
        interval: float | None = None,
        stall: float | None = None,
        confirm: float = 1.0,
        restore: Callable[[list[str]], int] | None = None,
    ) -> None:
        self.s = settings or get_settings()
        self.r = client
        self.broker = broker
        self.broker_prefix = broker_prefix
        self.send = send
        self.state = RunState(client, self.s)
        self.sets = TaskSets(client, self.s)
        self.interval = self.s.sweep_interval if interval is None else interval
        self.stall = self.s.sweep_stall if stall is None else stall
        self.confirm = confirm
        # restore(tags) -> restored: a dead worker's unacknowledged messages, through kombu
        self.restore = restore
        self.dead_after = self.s.dead_worker_after if restore is not None else 0.0
        self.restored = 0  # by this process
        self.lock_key = self.s.key("sweeper", "lock")
        self._lock: tuple[str, float] | None = None  # (token, monotonic time last extended)
        self._token: str | None = None  # the token of this process's last pass
        self._info: dict[str, Any] | None = None  # the broker's INFO, read this pass
        self._extend = client.register_script(script(__file__, "extend_lock.lua"))
        self.resent = 0  # by this process
        # why the next pass checks every active run, not only stalled ones ("" = no reason)
        self.check_all = ""
        self.stale: set[str] = set()  # ids held unacknowledged too long, at the last look
        self._broker_id: str | None = None  # the broker Redis's run_id, to notice a restart
        self.broker_id_key = self.s.key("sweeper", "broker_run_id")
        self.check_key = self.s.key("sweeper", "check_all")  # why, from any process
        self.busy_key = self.s.key("sweeper", "busy")  # the last pass found work (3 intervals)
        self.idle_max = max(self.interval, SWEEP_IDLE_MAX)
        self.wait = self.interval  # until the next pass: doubles while passes find nothing
        self.saw_work = False  # the last pass found something to watch (module docstring)
        self._busy = False  # this process ran a task since the last pass
        self._work = process.Watch()  # tasks started here (the worker's task_prerun signal)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_app(cls, app: Any, settings: Settings | None = None, **kw: Any) -> Sweeper | None:
        """The sweeper of a worker process, or None when the broker is not Redis."""
        s = settings or get_settings()
        if not s.redis_broker or (s.sweep_stall <= 0 and s.dead_worker_after <= 0):
            return None
        restore = owners.restorer(app) if s.dead_worker_after > 0 else None
        return cls(
            get_redis(s.redis_url),
            get_redis(s.broker_url),
            s.broker_key_prefix,
            lambda kid: send_kid(app, kid, queue_for, redelivered=True),  # begins look it up
            s,
            restore=restore,
            **kw,
        )

    # -- deciding

    def stalled_runs(
        self, now: float | None = None, *, skip_clean: bool = False, stall: float | None = None
    ) -> list[str]:
        """Active runs with ledger entries and no commit for `stall` seconds (the sweeper's
        own by default; 0: every one); with `skip_clean`, not those found whole since their
        last commit and still in their back-off (`mark_clean`). A paused run makes no commits
        on purpose: it is not stalled (a death or a restart still checks it; `resume` restarts
        its stall clock)."""
        now = time.time() if now is None else now
        stall = self.stall if stall is None else stall
        rids = self.state.active_runs()
        if not rids:
            return []
        self.saw_work = True
        ranges = lost_ranges(self.r)  # a run on a lost slot range: paused, nothing to read
        rids = [rid for rid in rids if not lost_for(ranges, self.state.run_key(rid))]
        if not rids:
            return []
        # a run's clean mark is a global key (its own slot, not the run's): one on a lost
        # range is not read (as if none), or its error would fail the pass for every run
        unmarked = self._marks_lost(rids, ranges)
        pipe = self.r.pipeline(transaction=False)
        for rid in rids:
            pipe.hmget(self.state.run_key(rid), "last", "created", "paused")
            pipe.hlen(self.state.ledger_key(rid))
            if rid not in unmarked:
                pipe.get(self.clean_key(rid))
        res = iter(pipe.execute())
        out = []
        for rid in rids:
            (last, created, paused), ledger = next(res), next(res)
            mark = None if rid in unmarked else next(res)
            stamp = last or created or b"0"
            if not ledger or (stall > 0 and (paused or now - float(stamp) < stall)):
                continue
            if skip_clean and mark is not None:
                m_stamp, until, _ = mark.split(b"|")
                if m_stamp == stamp and now < float(until):
                    continue
            out.append(rid)
        return out

    def clean_key(self, rid: str) -> str:
        return self.s.key("sweeper", "clean", rid)

    def _marks_lost(self, rids: Iterable[str], ranges: list[LostRange] | None = None) -> set[str]:
        """Those of `rids` whose clean mark is on a lost slot range (`utils.slots`)."""
        ranges = lost_ranges(self.r) if ranges is None else ranges
        if not ranges:
            return set()
        return {rid for rid in rids if lost_for(ranges, self.clean_key(rid))}

    def mark_clean(self, rids: Iterable[str], now: float | None = None) -> None:
        """Stalled runs found whole: not looked at again until `stall` seconds later, then
        twice as long each time (up to CLEAN_MAX), while they make no commit. A run stalled
        for minutes on purpose (its tasks waiting out a rate limit) would otherwise have the
        whole broker read every interval; with a backlog of 100,000 messages one look costs
        seconds of CPU (`bench/sweep_scan.py`). A death or a restart still checks it at once."""
        rids = list(rids)
        lost = self._marks_lost(rids)  # not marked: looked at again at the next stall
        rids = [rid for rid in rids if rid not in lost]
        if not rids:
            return
        now = time.time() if now is None else now
        pipe = self.r.pipeline(transaction=False)
        for rid in rids:
            pipe.hmget(self.state.run_key(rid), "last", "created")
            pipe.get(self.clean_key(rid))
        res = pipe.execute()
        pipe = self.r.pipeline(transaction=False)
        for i, rid in enumerate(rids):
            (last, created), mark = res[2 * i : 2 * i + 2]
            stamp = last or created or b"0"
            wait = max(self.stall, self.interval)
            if mark is not None:
                m_stamp, _, m_wait = mark.split(b"|")
                if m_stamp == stamp:
                    wait = min(CLEAN_MAX, 2 * float(m_wait))
            pipe.set(
                self.clean_key(rid),
                b"|".join([stamp, b"%.3f" % (now + wait), b"%g" % wait]),
                ex=24 * 3600,
            )
        pipe.execute()

    def _present(self, rids: Iterable[str]) -> set[str]:
        """Task ids that will run without us: in the broker, in a run's waiting list, or staged
        in `run:{rid}:staged` by a committed task whose own message is still in the broker (its
        redelivery sends them). Children staged by a task whose message is gone are not."""
        self.stale = set()
        ids = broker_task_ids(
            self.broker,
            self.broker_prefix,
            2 * self.s.visibility_timeout,
            self.stale,
            tick=self.keep_lock,
        )
        for rid in rids:
            for raw in self.r.lrange(self.state.pending_key(rid), 0, -1):
                ids.update(kid_id(raw))
            for tid, kid_ids in self.r.hgetall(self.state.staged_key(rid)).items():
                if as_str(tid) in ids:
                    ids.update(as_str(k) for k in kid_ids.split())
        return ids

    def runs_to_check(self, now: float | None = None) -> list[str]:
        """Stalled runs; every active run with ledger entries after a death or a restart."""
        if self.check_all:
            return self.stalled_runs(now, stall=0)
        return self.stalled_runs(now, skip_clean=True)

    def lost(self, rids: list[str]) -> dict[str, dict[str, bytes]]:
        """run -> {tid: message} of ledger entries found nowhere, twice `confirm` apart, in
        runs that stayed stalled (any run, after a death or a restart), and not committed."""
        if not rids:
            return {}
        ledgers = {rid: self.state.ledger(rid) for rid in rids}
        present = self._present(rids)
        missing = {rid: set(lg) - present for rid, lg in ledgers.items()}
        missing = {rid: m for rid, m in missing.items() if m}
        if not missing:
            return {}
        if self.confirm > 0:
            self.sleep(self.confirm)
        still = set(self.runs_to_check())
        present = self._present(missing)
        out: dict[str, dict[str, bytes]] = {}
        for rid, tids in missing.items():
            if rid not in still:
                continue
            cand = sorted(tids - present)
            if not cand:
                continue
            done = self.r.smismember(self.state.done_key(rid, ""), cand)
            committed = [t for t, d in zip(cand, done, strict=True) if d]
            if committed:  # committed but left in the ledger: nothing to send
                self.r.hdel(self.state.ledger_key(rid), *committed)
            lost = {t: ledgers[rid][t] for t, d in zip(cand, done, strict=True) if not d}
            refused = self.sets.unknown(lost)  # a worker did not know the task: its
            for t in refused:  # dead letter says so; re-sending would only loop
                del lost[t]
            if lost:
                out[rid] = lost
        return out

    # -- acting

    def restore_dead_owners(self) -> int:
        """Give back the messages that dead worker processes held unacknowledged (their
        heartbeat gone for `dead_worker_after` s); -> messages restored."""
        if self.restore is None or self.dead_after <= 0:
            return 0
        n = 0
        held: dict[str, list[str]] = {}
        info, self._info = self._info, None
        found = owners.orphans(
            self.broker, self.broker_prefix, self.dead_after, self.confirm, self.sleep, held, info
        )
        self.saw_work = self.saw_work or bool(held) or bool(found)
        for who, tags in found.items():
            k = self.restore(tags) if tags else 0
            log.warning(
                "worker %s is gone (no heartbeat for %gs): %d of its %d "
                "unacknowledged messages restored",
                who,
                self.dead_after,
                k,
                len(tags),
            )
            n += k
        if found:  # it may have popped a message it never recorded: check every run now
            self.check_all = self.check_all or "a worker died"
            owners.forget(self.broker, self.broker_prefix, found)
        if n:  # shown by `control.sh status` and the exporter
            self.r.hincrby(self.s.key("metrics", "broker"), "dead_worker_restored", n)
        self.restored += n
        return n

    def note_broker_restart(self) -> bool:
        """Notice a restart of the broker's Redis (its run_id changed since the last pass)."""
        # the default sections (server, persistence): the dead-owner check reads them too
        self._info = cast("dict[str, Any]", self.broker.info())
        bid = str(self._info.get("run_id", ""))
        if bid == self._broker_id:
            return False
        # kept in Redis, for whichever worker process holds the sweep lock next
        seen = self.r.set(self.broker_id_key, bid, ex=30 * 24 * 3600, get=True)
        self._broker_id = bid
        restarted = seen is not None and as_str(seen) != bid
        if restarted:
            log.info("the broker's Redis restarted: checking every active run's ledger")
            self.check_all = self.check_all or "the broker restarted"
        return restarted

    def note_connection_drops(self) -> None:
        """Hand this process's broker connection drops (broker/drops.py) to whichever
        process sweeps next: its pass checks every active run."""
        whys = drops.take()
        if not whys:
            return
        try:
            self.r.set(self.check_key, whys[-1], ex=3600)
        except redis.RedisError:
            drops.put_back(whys)
            raise

    def restore_held_before_drop(self, now: float | None = None) -> int:
        """Give back what this process took before its broker connection dropped (and still
        holds: its ack or reject failed, or it is still running, then it runs twice, which a
        task's commit allows); -> messages restored. Two intervals after the drop."""
        who = owners.owner()
        if self.restore is None or who is None:
            return 0
        at = drops.dropped_before(time.time() if now is None else now, 2 * self.interval)
        if at is None:
            return 0
        try:
            tags = [
                t
                for t, taken in owners.held_since(self.broker, self.broker_prefix, who).items()
                if taken < at
            ]
            n = self.restore(tags) if tags else 0
        except redis.RedisError:
            drops.put_back_drop(at)
            raise
        if n:
            log.warning(
                "%d message(s) taken before the broker connection dropped given back "
                "(their ack or reject could not reach the broker)",
                n,
            )
        self.restored += n
        return n

    def take_check_request(self) -> None:
        """A drop noted by any process (`note_connection_drops`): check every run now."""
        why = self.r.getdel(self.check_key)
        if why is not None:
            log.info("%s: checking every active run's ledger", as_str(why))
            self.check_all = self.check_all or as_str(why)

    def compact_finished(self) -> list[str]:
        """Compact the newest runs that are complete and stored but not compacted yet: the
        drainer that stores a run's last items does it, unless that drainer runs on its own
        (`python -m external_interface.storage.outbox`) without the worker's hook."""
        ranges = known_lost(self.r)  # a run on a lost slot range is not finished
        rids = self.state.recent(COMPACT_LOOK)
        return self.state.compact_settled(
            [rid for rid in rids if not lost_for(ranges, self.state.run_key(rid))]
        )

    def sweep_once(self) -> int:
        """One pass over the stalled runs; -> messages re-sent."""
        n = 0
        try:
            self.saw_work = bool(self.compact_finished()) or self.saw_work
        except redis.exceptions.RedisError as exc:
            log.warning("compacting finished runs failed: %s", exc)
        if self.stall <= 0:
            return 0
        why = self.check_all
        self.saw_work = self.saw_work or bool(why)
        checked = self.runs_to_check()
        found = self.lost(checked)
        self.check_all = ""  # done (a pass that failed before here keeps it for the next)
        if not why:
            self.mark_clean(rid for rid in checked if rid not in found)
        for rid, lost in found.items():
            self.keep_lock()
            steps: Counter[str] = Counter()
            for tid, raw in lost.items():
                kid = TaskEnvelope.decode(raw)
                self.send(kid.to_dict())
                steps[kid.meta.get("step", "")] += 1
                log.warning(
                    "run %s: task %s (%s) lost by the broker; re-sent (%s%s)",
                    rid,
                    tid,
                    kid.task,
                    why or "the run stalled",
                    "; it sat in unacked past twice the visibility timeout"
                    if tid in self.stale
                    else "",
                )
            pipe = self.r.pipeline(transaction=False)
            ck = self.state.counters_key(rid)
            pipe.hincrby(ck, "resent", len(lost))
            for step, c in steps.items():
                if step:
                    pipe.hincrby(ck, f"{step}:resent", c)
            self.state.note_resends(rid, len(lost), pipe)
            pipe.execute()
            n += len(lost)
        self.resent += n
        return n

    @property
    def lock_ttl(self) -> float:
        return max(1.0, self.interval)

    def sleep(self, seconds: float) -> None:
        """Wait inside a pass (the second look's delay), keeping the sweep lock meanwhile."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, self.lock_ttl / 4))
            self.keep_lock()

    def _extend_lock(self, token: str) -> bool:
        """The lock for another `lock_ttl`, if it is still ours or free (`extend_lock.lua`)."""
        return bool(self._extend(keys=[self.lock_key], args=[token, int(self.lock_ttl * 1000)]))

    def keep_lock(self) -> None:
        """Called through a long pass (each chunk of the broker read, each run acted on): push
        the sweep lock's expiry out again once a third of its TTL has gone by, so no other
        worker starts a pass over this one (both would re-send the same lost messages: safe,
        but pages fetched twice). A lock lost anyway (this process stalled past the TTL, and
        another took it) ends the pass: `_LockLost`; one that expired with nobody taking it is
        taken again."""
        if self._lock is None:
            return
        token, at = self._lock
        now = time.monotonic()
        if now - at < self.lock_ttl / 3:
            return
        if not self._extend_lock(token):
            self._lock = None
            raise _LockLost("the sweep lock expired during a pass and another worker took it")
        self._lock = (token, now)

    def try_sweep(self) -> int:
        """Sweep if no other worker did within the interval. The lock is kept through a long
        pass (`keep_lock`) and left to expire one interval after it; a sweeper killed
        mid-pass blocks the others for at most one interval."""
        # the last pass's own lock is taken again as it expires (else the holder could lose
        # the race with its own expiry and take the miss for an idle fleet)
        token = uuid.uuid4().hex
        if not self.r.set(self.lock_key, token, nx=True, px=int(self.lock_ttl * 1000)):
            token = self._token or ""
            if not token or not self._extend_lock(token):
                self._token = None
                # the holder found work: stay at the interval, ready to take over if it dies
                self.saw_work = bool(self.r.get(self.busy_key)) or self.saw_work
                return 0
        self._token = token
        self._lock = (token, time.monotonic())
        try:
            try:  # first: a stalled run may only be waiting for these
                self.saw_work = self.note_broker_restart() or self.saw_work
                self.take_check_request()
                self.restore_dead_owners()
            except _LockLost:
                raise
            except Exception:  # the run ledgers are swept all the same
                log.warning("restoring dead workers' messages failed", exc_info=True)
                self.saw_work = True
            return self.sweep_once()
        except _LockLost as exc:
            log.warning("run ledger sweep stopped: %s", exc)
            return 0
        finally:
            if self._lock is not None:  # the next pass: one interval after this one ended
                self._extend_lock(token)
                if self.saw_work:  # the processes that lost the lock keep the interval too
                    self.r.set(self.busy_key, b"1", px=int(3 * self.lock_ttl * 1000))
            self._lock = None

    def ran_task(self) -> bool:
        """Whether this process started a task (or other work: utils/process.py) since the
        last pass began: then the next pass comes within one interval, and every interval
        after it. One integer compared, no command."""
        if self._work.worked():
            self._busy = True
        return self._busy

    def next_wait(self) -> float:
        """The wait after a pass: the interval while there is work, else doubled (capped)."""
        if self.saw_work or self.ran_task() or drops.noted():
            return self.interval
        return min(self.idle_max, 2 * self.wait)

    def run(self, stop: threading.Event | None = None) -> None:
        stop = stop or self._stop
        self.wait = self.interval
        due = time.monotonic() + self.wait
        # woken every interval to look at the in-process signals; a pass only when due
        while not stop.wait(max(0.01, min(self.interval, due - time.monotonic()))):
            if time.monotonic() < due and not self.ran_task() and not drops.noted():
                continue
            self.saw_work, self._busy = self.ran_task(), False  # a task ran here: work
            try:
                self.note_connection_drops()
                self.restore_held_before_drop()
                self.try_sweep()
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # Redis down: next time
                log.warning("run ledger sweep skipped: %s", exc)
                self.saw_work = True  # back soon: a restart may have lost a message
            except Exception:  # a bug or a bad ledger entry: try again next interval
                log.warning("run ledger sweep failed", exc_info=True)
                self.saw_work = True
            self.wait = self.next_wait()
            due = time.monotonic() + self.wait

    def start_thread(self, name: str = "run-sweeper") -> threading.Thread:
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, args=(self._stop,), name=name, daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
