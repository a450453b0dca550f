"""Sending commits: one round trip for a page, or for all the pages of a batch message.

A page defers its commit to the batch it runs in (`BatchRun`, found through the runtime's
greenlet/thread-local), so a batch's pages commit in one pipeline and publish their children in
another. While a run is in its tail the process's pending task metrics go in the same pipeline
as the commit that may complete the run, so a finished run's metrics are complete.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from ledger.state import CommitCall, Committed, RunState, StagedAt
from lifecycle.endpoints import EndpointSpec
from lifecycle.runtime import Runtime
from monitor.metrics import TaskMetrics, aggregator
from utils.redis import get_redis

log = logging.getLogger("chaincrawl.task")


class BatchRun:
    """The entries of one batch message being run: their commits (sent in one round trip
    after the last entry) and their children (published in one pipeline after that)."""

    def __init__(self) -> None:
        self.calls: list[CommitCall] = []
        self.after: list[tuple[Any, str, str]] = []  # (task, tid, dedup id) per call
        self.groups: list[tuple[list[bytes], StagedAt]] = []
        self.outstanding = 0

    def add(self, staged: list[bytes], at: StagedAt, outstanding: int) -> None:
        if staged:
            self.groups.append((staged, at))
        self.outstanding = max(self.outstanding, outstanding)


def current_batch(rt: Runtime) -> BatchRun | None:
    """The batch the running page belongs to (None: a message of its own)."""
    return getattr(rt.local, "batch", None)


def set_batch(rt: Runtime, batch: BatchRun | None) -> None:
    rt.local.batch = batch


def skip_call(
    state: RunState, rid: str, tid: str, step: str, forget: tuple[str, ...] = ()
) -> CommitCall:
    """The commit of a task whose run was cancelled: no items, no children."""
    calls: list[CommitCall] = []
    state.commit(rid=rid, tid=tid, step=step, outcome="cancelled", n_items=0, entries=(),
                 kids=(), defer=calls, forget=forget)  # fmt: skip
    return calls[0]


def run_commits(
    rt: Runtime, state: RunState, rid: str, calls: list[CommitCall], pipe_extra: Any = None
) -> list[Committed | None]:
    """Commit calls in one round trip. While the run's backlog is shallow (its tail, or not
    seen yet) this process's pending metrics go first in the same pipeline, so they are
    written no later than the commit that may complete the run."""
    agg = aggregator()
    seen = rt.outstanding_seen(rid)
    tail = rt.load.tail_backlog()
    sync = seen is None or seen < tail
    taken: dict[str, Any] = {}

    def pre(pipe: Any) -> None:
        taken.update(agg.drain_into(pipe))

    try:
        results = state.run_commits(calls, pipe_pre=pre if sync else None, pipe_extra=pipe_extra)
    except Exception:
        agg.restore(taken)
        raise
    done = [res for res in results if res is not None]
    if rid and done:
        n = max(res.outstanding for res in done)
        rt.note_outstanding(rid, n)
        if n <= 0:  # this commit completed the run: compact it now if its items are stored
            compact_quietly(state, [rid])
        if not sync and n < tail and agg.pending():  # entering the tail: write the sums now
            try:
                agg.flush(state.r)
            except redis.exceptions.RedisError as exc:
                log.warning("metrics flush failed (kept for the next try): %s", exc)
    return results


def compact_quietly(state: RunState, rids: list[str]) -> None:
    """`RunState.compact_settled`, logged instead of raised: the run is complete either way,
    and the drainer (or the next completion) tries again."""
    try:
        state.compact_settled(rids)
    except redis.exceptions.RedisError as exc:
        log.warning("compacting finished runs %s failed: %s", rids, exc)


def aggregate(rt: Runtime, metrics: TaskMetrics, spec: EndpointSpec) -> None:
    """This task's metrics into the process's sums (written within the flush interval)."""
    s = rt.settings
    aggregator().start(get_redis(s.redis_url), s.metrics_flush_interval)
    metrics.aggregate(spec.name, spec.site, s)
