"""A task's begin and commit: what a page reads before it runs, and its whole result
committed in one script call (a batch's pages in one round trip)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis

from ledger.records import DELIV_TTL, Begun, CommitCall, Committed, Kid
from ledger.runs import Runs
from utils.redis import as_str, wait_replicas
from utils.wire import CommitArgs, KidArgs, commit_argv

HOLDS = ("", "paused", "cancelled")  # the commit script's hold code -> `Runs.hold`'s answer


def _committed(reply: list[Any], calls: Sequence[CommitCall]) -> list[Committed | None]:
    """A commit script's flat reply for `calls`: outstanding, the run's hold, then per commit
    -1 (had already committed) or m and its m staged children: a kid staged as its number
    (the script does not copy back a message the caller holds), a waiting child released as
    its message."""
    left, hold, pos = int(reply[0]), HOLDS[int(reply[1])], 2
    out: list[Committed | None] = []
    for c in calls:
        m = int(reply[pos])
        pos += 1
        if m < 0:
            out.append(None)
            continue
        got = reply[pos : pos + m]
        pos += m
        staged = [c.kids[x - 1] if isinstance(x, int) else x for x in got]
        out.append(Committed(left, staged, hold))
    return out


def answered(replies: Sequence[Any], calls: Sequence[CommitCall]) -> list[Committed | None] | None:
    """What the script call of `calls` (one run's, queued first) answered in `replies`, the
    pipeline's replies `run_commits` gives when the pipeline raised: None if it did not
    answer (so whether they committed is not known)."""
    if not replies or not isinstance(replies[0], list):
        return None
    return _committed(replies[0], calls)


class Commits(Runs):
    """A task's begin and commit, exactly once per task id."""

    # task lifecycle
    def begin(
        self,
        rid: str,
        tid: str,
        retries: int,
        redelivered: bool | None = None,
        hold: str | None = None,
    ) -> Begun:
        """(already committed?, deliveries of this attempt, run cancelled?) in one round trip
        (`redelivered`: the broker's flag; `hold`: the run's hold as the caller knows it;
        `begin_many`)."""
        known = {rid: hold} if rid and hold is not None else None
        return self.begin_many([(rid, tid, retries)], redelivered=redelivered, known=known)[0][0]

    def begin_many(
        self,
        calls: Sequence[tuple[str, str, int]],
        batch_id: str = "",
        redelivered: bool | None = None,
        known: Mapping[str, str] | None = None,
    ) -> tuple[list[Begun], int]:
        """`begin` for several (rid, tid, retries) in one round trip (a batch's entries).

        With `batch_id`, the entries' deliveries are not counted: the batch message's are
        (the second element), and a redelivered batch runs its entries one by one, each
        counted as it starts, so a worker death is charged to the entry that was running.

        `redelivered` is the broker's flag on the message (kombu sets it on every message it
        restores or requeues, as AMQP does). False: no delivery counter is written, the
        delivery is the first (1) and the caller has no counter to drop; True: counted, the
        delivery is the counter + 1 (the first was not counted). So the counter (INCR,
        EXPIRE, and its UNLINK with the commit: three commands of a page on the run's keys)
        is paid only by a message delivered again, and the poison cap counts the same
        deliveries. None: every delivery counted, the first as 1 (no flag to go by).

        A first delivery (`redelivered` False) is not looked up in the done set either: only a
        message delivered again (a requeue, a restore: kombu and AMQP flag both) can be of a
        task that has committed, or a copy the broker never flagged (a re-send that raced its
        task's commit, a park's new message after a commit whose reply was lost). Such a copy
        runs its page again and its commit is refused (the script's `SADD` of the done set):
        the caller then sends what the first commit staged (`Committer.commit` reads it back),
        so a missed duplicate costs a fetch, never a second commit. It says not committed.

        `known`: run -> its hold ("cancelled", "paused" or "") as the caller read it lately
        (`lifecycle.runtime.Runtime.hold`): not read again (a compacted run is read as not:
        its late duplicate's commit is refused as compacted)."""
        pipe = self.r.pipeline(transaction=False)
        known = known or {}
        rids = sorted({rid for rid, _, _ in calls if rid})
        read = [rid for rid in rids if rid not in known]
        for rid in read:
            pipe.hmget(self.run_key(rid), "cancelled", "paused", "compacted")
        # committed already? one SMISMEMBER a run (a batch's entries share a few runs)
        looked = redelivered is not False
        of_run: dict[str, list[str]] = {rid: [] for rid in rids}
        for rid, tid, _ in calls:
            if rid:
                of_run[rid].append(tid)
        for rid in rids if looked else ():
            pipe.smismember(self.done_key(rid, ""), of_run[rid])
        runless = [tid for rid, tid, _ in calls if not rid] if looked else []
        for tid in runless:
            pipe.exists(self.done_key("", tid))
        if redelivered is False:  # a first delivery: nothing to count
            counted = []
        elif batch_id:
            counted = [self.batch_deliveries_key([rid for rid, _, _ in calls], batch_id)]
        else:
            counted = [self.deliveries_key(rid, tid, retries) for rid, tid, retries in calls]
        for deliv_key in counted:
            pipe.incr(deliv_key)
            pipe.expire(deliv_key, DELIV_TTL)
        res = pipe.execute() if len(pipe) else []
        off = len(read)
        cancelled = {rid for rid, (c, _, _) in zip(read, res[:off], strict=True) if c}
        paused = {rid for rid, (_, p, _) in zip(read, res[:off], strict=True) if p}
        compacted = {rid for rid, (_, _, x) in zip(read, res[:off], strict=True) if x}
        cancelled.update(rid for rid, h in known.items() if h == "cancelled")
        paused.update(rid for rid, h in known.items() if h == "paused")
        done: dict[tuple[str, str], bool] = {}
        if looked:
            for rid, flags in zip(rids, res[off : off + len(rids)], strict=True):
                done.update(((rid, t), bool(f)) for t, f in zip(of_run[rid], flags, strict=True))
            off += len(rids)
            flags = res[off : off + len(runless)]
            done.update((("", t), bool(f)) for t, f in zip(runless, flags, strict=True))
            off += len(runless)
        # INCR replies (EXPIRE's between them), + the uncounted first delivery when flagged
        if redelivered is False:
            counts = [1] * max(1, len(calls))
        else:
            counts = [int(c) + (redelivered is True) for c in res[off::2]]
        begun = [
            Begun(
                done.get((rid, tid), False) or rid in compacted,
                0 if batch_id else counts[n],
                rid in cancelled,
                rid in paused,
            )
            for n, (rid, tid, _) in enumerate(calls)
        ]
        return begun, counts[0] if batch_id else 0

    def batch_deliveries_key(self, rids: Iterable[str], batch_id: str) -> str:
        """A batch message's delivery counter (`begin_many`): on the slot of its pages' run
        when they share one, else of its own. On a slot of its own, a range lost elsewhere
        failed every delivery of a batch whose run is served, parking it for the whole loss."""
        one = set(rids)
        return self.deliveries_key(one.pop() if len(one) == 1 else "", batch_id, 0)

    def commit_call(
        self,
        *,
        rid: str,
        tid: str,
        step: str,
        outcome: str,
        n_items: int = 0,
        entries: Sequence[Mapping[str, Any]] = (),
        kids: Sequence[Kid] = (),
        forget: Sequence[str] = (),
        counts: Mapping[tuple[str, str], int] | None = None,
    ) -> CommitCall:
        """A finished task's commit, to send (with others) by `run_commits`. `forget`: keys
        unlinked in the same round trip (the attempt's delivery counter, `deliveries_key`).
        `counts`: (step, counter) -> n added with the commit, to the step's and the run's
        counter (`skipped_seen`)."""
        msgs = tuple(k.encode() for k in kids)
        args = CommitArgs(
            tid,
            step,
            outcome,
            n_items,
            tuple(KidArgs(k.step, k.uniq, m) for k, m in zip(kids, msgs, strict=True)),
            tuple((s, c, n) for (s, c), n in (counts or {}).items() if n),
        )
        return CommitCall(
            rid,
            self.done_key(rid, tid),
            self.staged_at(rid, tid).key,
            args,
            tuple(forget),
            msgs,
            tuple(entries),
        )

    def commit(self, *, pipe_extra: Any = None, **call: Any) -> Committed | None:
        """Atomically record one finished task (`commit_call`'s arguments): the run's
        outstanding count and the staged children to send, or None if it had already
        committed. `pipe_extra` adds commands to the same round trip."""
        return self.run_commits([self.commit_call(**call)], pipe_extra=pipe_extra)[0]

    def _commit_script_call(self, rid: str, calls: Sequence[CommitCall]) -> list[Any]:
        """KEYS and ARGV of one commit script call for `calls`, all of run `rid`."""
        # without a run the run's keys are not touched: any key of the calls' slot stands in
        norun = calls[0].done_key
        keys: list[Any] = [
            self.counters_key(rid) if rid else norun,
            self.run_key(rid) if rid else norun,
            self.ks.run_outbox(rid) if self.cluster else self.outbox_key,
            self._active(rid) if rid else norun,
            self.pending_key(rid) if rid else norun,
            self.ledger_key(rid) if rid else norun,
            self._storing(rid) if rid else norun,
        ]
        if rid:  # the run's done set and staged hash, shared by every commit
            keys += (calls[0].done_key, calls[0].staging)
        else:
            for c in calls:
                keys += (c.done_key, c.staging)
        argv = commit_argv(
            rid,
            f"{time.time():.3f}",
            self.ttl,
            self.ks.uniq_prefix(rid),
            [(c.args, c.entries) for c in calls],
        )
        return [len(keys), *keys, *argv]

    def run_commits(
        self,
        calls: Sequence[CommitCall],
        pipe_pre: Any = None,
        pipe_extra: Any = None,
        replies: list[Any] | None = None,
    ) -> list[Committed | None]:
        """Send commit calls (`commit_call`) in one round trip: one script call per
        run, so a batch's counters, EXPIREs and `last` are written once, summed over its
        pages, and each task id still commits at most once. `pipe_pre` adds commands before
        them, `pipe_extra` after; `replies` gets the pipeline's replies, errors included (a
        cluster pipeline writes what the masters that answer take while it raises). EVALSHA straight into the pipeline: a registered `Script`
        would make redis-py send SCRIPT EXISTS in a round trip of its own first."""
        groups: dict[str, list[int]] = {}
        for n, c in enumerate(calls):
            groups.setdefault(c.rid, []).append(n)
        pipe = self.r.pipeline(transaction=False)
        if pipe_pre is not None:
            pipe_pre(pipe)
        first = len(pipe)  # commands queued so far (a cluster pipeline keeps no command_stack)
        sha = self._commit.sha
        script_calls = [
            self._commit_script_call(rid, [calls[n] for n in idx]) for rid, idx in groups.items()
        ]
        for sc in script_calls:
            pipe.execute_command("EVALSHA", sha, *sc)  # `evalsha` is refused in cluster pipelines
        forget = [k for c in calls for k in c.forget]
        if forget and self.cluster:  # one UNLINK per key: a cluster pipeline keeps to one slot
            for k in forget:
                pipe.unlink(k)
        elif forget:
            pipe.unlink(*forget)
        if pipe_extra is not None:
            pipe_extra(pipe)
        res = pipe.execute(raise_on_error=False)
        if replies is not None:
            replies += res
        out: list[Committed | None] = [None] * len(calls)
        ended: list[str] = []  # on a cluster: runs the scripts completed, to drop from active
        error: Exception | None = None
        for g, (idx, sc) in enumerate(zip(groups.values(), script_calls, strict=True)):
            r = res[first + g]
            if isinstance(r, redis.exceptions.NoScriptError):  # a restarted or flushed server
                # EVAL caches it on the node of the run's slot alone (SCRIPT LOAD goes to
                # every master of a cluster, failing while any of them is down)
                r = self.r.eval(as_str(self._commit.script), *sc)
            elif isinstance(r, Exception):
                error = error or r
                continue
            for n, got in zip(idx, _committed(r, [calls[n] for n in idx]), strict=True):
                out[n] = got
                if self.cluster and calls[n].rid and got is not None and got.outstanding <= 0:
                    ended.append(calls[n].rid)
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
        self.replicated([sc[1] for sc in script_calls])  # before anything is sent or acked
        if ended:  # idempotent; lost with the process, `active_runs` moves the run later
            self._ended_on_cluster(ended)
        return out

    def replicated(self, keys: Sequence[str]) -> None:
        """The durability rule of every acknowledgement (`CHAINCRAWL_REDIS_WAIT_REPLICAS`):
        return once that many replicas hold every write made so far to the masters of `keys`
        (a commit, a park, a retry's counters, or the earlier delivery's commit a duplicate
        found), else raise `NotReplicated`, so the message is requeued, not acknowledged."""
        if self.s.redis_wait_replicas > 0:
            wait_replicas(self.r, keys, self.s.redis_wait_replicas, self.s.redis_wait_timeout)

    def home_key(self, rid: str, tid: str) -> str:
        """A key on the slot a task's state lives on (its run's, or its own without a run):
        what `replicated` waits on for that task."""
        return self.run_key(rid) if rid else self.done_key("", tid)

    def count_retry(self, rid: str, step: str, pipe: Any) -> None:
        if rid:
            pipe.hincrby(self.counters_key(rid), f"{step}:retried", 1)
            pipe.hincrby(self.counters_key(rid), "retried", 1)
