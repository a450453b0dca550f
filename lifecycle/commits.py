"""A finished page's outputs and their commit.

The outputs (`outbox_entries`, `children`): outbox entries for the items, and the child tasks
its chain step dispatches (follow-ups of the same step, then each child step's fan-out from the
items), deduplicated across runs where the step asks (`skip_seen_hours`).

The commit (`Committer`): one round trip for a page, or for all the pages of a batch message,
then one publish of their children and their dedup marks. A page adds its commit to the batch
it runs in (found through the runtime's greenlet/thread-local), so a batch's pages commit in
one pipeline and publish their children in another. While a run is in its tail the process's
pending task metrics go in the same pipeline as the commit that may complete the run, so a
finished run's metrics are complete.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, NoReturn

import orjson
import redis
from celery.exceptions import Reject

from ledger.model import Chain, fan_out
from ledger.state import CommitCall, Committed, Kid, RunState, StagedAt
from lifecycle.endpoints import EndpointSpec, Follow, Item
from lifecycle.runtime import Runtime, pause_before_requeue
from monitor.metrics import TaskMetrics, aggregator, unwritten
from utils.logsafe import safe_text
from utils.process import new_id, note_tasks_done
from utils.redis import REPLICAS, NotReplicated, get_redis
from utils.slots import known_lost, lost_for
from utils.wire import DEDUP, OutboxFields, TaskMeta

log = logging.getLogger("chaincrawl.task")


def outbox_entries(
    rid: str, step: str, task: str, stored: list[tuple[Item, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Outbox entries of the stored items, one per item type; `stored` pairs each item with
    its JSON dump (made once per item for these entries and for the children's fan-out)."""
    by_type: dict[type[Item], list[dict[str, Any]]] = {}
    for it, row in stored:
        by_type.setdefault(type(it), []).append(row)
    return [
        OutboxFields.of(rid, step, task, cls.item_type, cls.key_fields, rows).encode()
        for cls, rows in by_type.items()
    ]


def children(
    rt: Runtime,
    chain: Chain | None,
    task: str,
    meta: TaskMeta,
    items: list[Item],
    follows: list[Follow],
    dumped: list[dict[str, Any]],
    skipped: dict[str, tuple[str, int]] | None = None,
) -> list[Kid]:
    """The tasks a page dispatches: its follow-ups (same step, next page, up to the step's
    `max_pages`), then each child step's tasks from the items that feed it. `skipped` gets
    step id -> (task, n) of the children dropped as crawled before (`skip_seen_hours`)."""
    kids: list[Kid] = []
    step = meta.step
    node = chain.steps.get(step) if chain else None
    max_pages = node.options.max_pages if node else None
    if follows and (max_pages is None or meta.page < max_pages):
        for f in follows:
            nxt = meta.child(step, meta.page + 1)
            nxt.queue = meta.queue  # a follow-up stays where its step sends it
            kids.append(Kid(step, task, f.params, nxt.to_wire(), new_id()))
    if node is None or not node.children:
        return kids
    pairs = [(it.item_type, row) for it, row in zip(items, dumped, strict=True)]
    for child in node.children:
        cmeta = meta.child(child.id)
        if child.options.priority is not None:
            cmeta.priority = child.options.priority
        if child.options.queue:
            cmeta.queue = child.options.queue
        wire = cmeta.to_wire()
        batch = []
        for params in fan_out(child, pairs):
            uniq = fingerprint(params) if child.options.unique else ""
            batch.append(Kid(child.id, child.task, params, dict(wire), new_id(), uniq))
        if child.options.skip_seen_hours is not None and batch:
            n = len(batch)
            batch = skip_seen(rt, child.task, batch, child.options.skip_seen_hours)
            if skipped is not None and len(batch) < n:
                skipped[child.id] = (child.task, n - len(batch))
        kids.extend(batch)
    return kids


def skip_seen(rt: Runtime, task: str, kids: list[Kid], hours: float) -> list[Kid]:
    """Drop children crawled within `hours` (0: ever); the rest carry their dedup id so they
    mark it once they have committed: a request counts as crawled only after its items were
    durably handed off, so a page that failed is crawled again by the next run
    (tests/integration/test_chain_runs.py::test_skip_seen_dedups_requests_across_runs)."""
    ids = [fingerprint(k.params) for k in kids]
    within = timedelta(hours=hours) if hours > 0 else None
    todo = set(rt.request_dedup(task).filter_new(ids, within=within))
    keep = []
    for k, i in zip(kids, ids, strict=True):
        if i in todo:
            k.meta[DEDUP] = i
            keep.append(k)
    return keep


def fingerprint(params: Mapping[str, Any]) -> str:
    """A parameter set's identity (`unique` steps, `skip_seen_hours`): key order ignored."""
    return hashlib.blake2b(
        orjson.dumps(params, option=orjson.OPT_SORT_KEYS), digest_size=12
    ).hexdigest()


class Committer:
    """The tail every page goes through, alone or with the other pages of its batch message:
    its commit (one round trip for all of them), the children the commits staged (one publish
    pipeline), then the dedup marks of the pages crawled (`skip_seen_hours`: only once their
    items and children were handed off durably).

    A page of its own makes one and `finish`es it at once; a batch makes one for all its
    entries (`current_batch`), and each entry `add`s its commit to it."""

    def __init__(self, rt: Runtime, state: RunState, rid: str, who: str) -> None:
        self.rt, self.state, self.rid, self.who = rt, state, rid, who
        self.calls: list[CommitCall] = []
        self.tasks: list[str] = []  # the task name of each call (its metrics' keys)
        self.after: list[tuple[str, str, str]] = []  # (task name, tid, dedup id) per call
        self.groups: list[tuple[list[bytes], StagedAt]] = []
        self.outstanding = 0

    def add(self, call: CommitCall, task: str = "", dedup: str = "") -> None:
        """A page's commit, sent with the others by `commit`."""
        self.calls.append(call)
        self.tasks.append(task)
        self.after.append((task, call.args.tid, dedup))

    def commit(
        self, pipe_extra: Callable[[Any], None] | None = None, read_back: bool = True
    ) -> list[Committed | None]:
        """Send the commits added so far (in one round trip) and stage their children for
        `publish`. A commit that finds its task committed already (another delivery's) sends
        what that one staged, read back, unless `read_back` is off."""
        calls, self.calls = self.calls, []
        tasks, self.tasks = self.tasks, []
        if not calls:
            if pipe_extra is not None:
                pipe = self.state.r.pipeline(transaction=False)
                pipe_extra(pipe)
                pipe.execute()
            return []
        results = send_commits(self.rt, self.state, self.rid, calls, pipe_extra)
        recounted = False
        for call, res, name in zip(calls, results, tasks, strict=True):
            if res is not None or read_back:
                self.stage(call.args.tid, res)
            if res is None and name and call.args.outcome == "succeeded":
                recount_duplicate(self.rt, name, call.args.n_items)
                recounted = True
        if recounted:  # its `succeeded` may have gone with the commit: no second one shown
            flush_quietly(self.state.r)
        return results

    def stage(self, tid: str, res: Committed | None = None) -> None:
        """The children `tid`'s commit staged (`res`; None: read back, as a redelivered
        committed task does), to go with the next `publish`."""
        at = self.state.staged_at(self.rid, tid)
        staged = res.staged if res is not None else self.state.staged(self.rid, tid)
        if staged:
            self.groups.append((staged, at))
        self.outstanding = max(self.outstanding, res.outstanding if res is not None else 0)

    def absorb(self, other: Committer) -> None:
        """Take over the staged children and dedup marks of a page committed on its own
        inside this batch: they go with the batch's publish."""
        self.groups += other.groups
        self.outstanding = max(self.outstanding, other.outstanding)
        self.after += [a for a in other.after if a[2]]
        other.groups, other.after = [], []

    def publish(self, app: Any, front: Sequence[dict[str, Any]] = ()) -> None:
        """Send the staged children (and `front`, a batch's entries not started). A failure
        requeues the message: its redelivery finds the tasks committed and sends what is still
        staged, where acking it would strand the children
        (tests/base_task/test_send_path.py::test_a_publish_failure_after_the_commit_requeues...)."""
        if not (self.groups or front):
            return
        try:
            self.rt.publisher(app).publish(self.state, self.groups, self.outstanding, front)
        except Exception as exc:
            log.warning(
                "%s: children not sent (%s: %s); message requeued",
                self.who,
                type(exc).__name__,
                safe_text(exc),
            )
            raise Reject(exc, requeue=True) from None
        self.groups = []

    def mark(self) -> None:
        """Remember the pages crawled for `skip_seen_hours` (after their durable hand-off)."""
        marks: dict[str, list[str]] = {}
        for task, _tid, dd in self.after:
            if dd:
                marks.setdefault(task, []).append(dd)
        self.after = []
        for name, ids in marks.items():
            self.rt.request_dedup(name).mark_many(ids, refresh=True)

    def finish(
        self,
        app: Any,
        pipe_extra: Callable[[Any], None] | None = None,
        front: Sequence[dict[str, Any]] = (),
    ) -> list[Committed | None]:
        """Commit, publish, mark: the whole tail."""
        results = self.commit(pipe_extra)
        self.publish(app, front)
        self.mark()
        return results


def recount_duplicate(rt: Runtime, task: str, n_items: int) -> None:
    """A page that ran and whose commit was refused (a copy of a task committed already: two
    deliveries side by side, or a first delivery, which looks up no done set): its metrics,
    counted `succeeded` before the commit, count it a `duplicate` of no items."""
    fix = TaskMetrics()
    fix.counts.update({"succeeded": -1, "duplicate": 1, **({"items": -n_items} if n_items else {})})
    fix.aggregate(task, task.split(".", 1)[0], rt.settings)


def current_batch(rt: Runtime) -> Committer | None:
    """The batch the running page belongs to (None: a message of its own)."""
    return getattr(rt.local, "batch", None)


def set_batch(rt: Runtime, batch: Committer | None) -> None:
    rt.local.batch = batch


TAIL_SYNC_EVERY = 0.25  # seconds between two commits that take the metrics, in a tail's first part
_tail_sync = [0.0]  # monotonic: this process's last such commit


def send_commits(
    rt: Runtime,
    state: RunState,
    rid: str,
    calls: list[CommitCall],
    pipe_extra: Callable[[Any], None] | None = None,
) -> list[Committed | None]:
    """`RunState.run_commits` with the process's metrics: while the run's backlog is shallow
    (its tail, or not seen yet) this process's pending metrics go first in the same pipeline,
    so they are written no later than the commit that may complete the run: in the tail's
    first part (fewer than `tail_backlog`, not fewer than the process's slots) at most one
    commit every TAIL_SYNC_EVERY seconds takes them (each takes all of them: a script call
    of 2 commands a hash, and a commit a page wrote them a page at a time); below the
    slots, every commit."""
    agg = aggregator()
    seen = rt.outstanding_seen(rid)
    tail = rt.load.tail_backlog()
    sync = in_tail = seen is None or seen < tail
    if in_tail and seen is not None and seen >= rt.load.slots:
        now = time.monotonic()
        sync = now - _tail_sync[0] >= TAIL_SYNC_EVERY
        if sync:
            _tail_sync[0] = now
    taken: dict[str, Any] = {}
    sent: list[list[str]] = []  # the keys of each metrics call, first in the pipeline
    replies: list[Any] = []

    def pre(pipe: Any) -> None:
        # sums on a lost slot range (a site's metrics keys) stay pending: in the commit's
        # pipeline they would fail the commit of a run whose own slots are served
        lost = known_lost(state.r)
        keep = (lambda k: lost_for(lost, k) is not None) if lost else None
        taken.update(agg.drain_into(pipe, keep, sent))

    try:
        results = state.run_commits(
            calls, pipe_pre=pre if sync else None, pipe_extra=pipe_extra, replies=replies
        )
    except Exception:
        # the sums the masters took stay written (the commit is tried again, its sums not):
        # kept, they would be added twice; a pipeline that answered nothing keeps them all
        agg.restore(unwritten(taken, sent, replies))
        raise
    done = [res for res in results if res is not None]
    if rid and done:
        rt.note_hold(rid, done[-1].hold)  # read by the script: the next begins need not
        n = max(res.outstanding for res in done)
        rt.note_outstanding(rid, n)
        if n <= 0:  # this commit completed the run: compact it now if its items are stored
            note_tasks_done()  # this process's drainer stores its last items now
            compact_quietly(state, [rid])
        # entering the tail, or completing the run with the sums left pending: write them now
        if ((not in_tail and n < tail) or (n <= 0 and not sync)) and agg.pending():
            try:
                agg.flush(state.r)
            except redis.exceptions.RedisError as exc:
                log.warning("metrics flush failed (kept for the next try): %s", exc)
    return results


def flush_quietly(r: Any) -> None:
    """The process's pending metrics written now (a duplicate's recount: the `succeeded` it
    undoes may have gone with its commit, and a reader right after the run would count it),
    logged instead of raised: the flush thread tries again."""
    try:
        aggregator().flush(r)
    except redis.exceptions.RedisError as exc:
        log.warning("metrics flush failed (kept for the next try): %s", exc)


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


def requeue_unreplicated(rt: Runtime, task: str, exc: NotReplicated) -> NoReturn:
    """A message whose state change too few replicas confirmed (`RunState.replicated`):
    requeued, not acknowledged, and quietly: counted (`unreplicated`, the exporter's
    `chaincrawl_task_unreplicated_total`), one warning line for the whole outage
    (`utils.redis.REPLICAS`; one more when replicas confirm again) and no traceback (Celery's
    own line for the Reject is held back by `utils.outage.OutageFilter`)."""
    s = rt.settings
    metrics = TaskMetrics()
    metrics.counts["unreplicated"] += 1
    aggregator().start(get_redis(s.redis_url), s.metrics_flush_interval)
    metrics.aggregate(task, task.split(".", 1)[0], s)
    if REPLICAS.refused():
        log.warning(
            "%s: state change not confirmed by %d replica(s) within %.1fs (%s); messages are "
            "requeued, not acknowledged, until replicas confirm again (one line when they do)",
            task,
            s.redis_wait_replicas,
            s.redis_wait_timeout,
            safe_text(exc),
        )
    pause_before_requeue()
    raise Reject(exc, requeue=True) from None
