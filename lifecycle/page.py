"""One page, from its begin to its commit: the lifecycle every endpoint task goes through.

    begin     committed already (send what it staged), cancelled (commit as cancelled), paused
              (park it), delivered too often (PoisonMessage)?
    run       parameters, the shared gate, the endpoint through `Context` (`task._collect`)
    commit    items to the outbox, children staged, counted: `Committer` (lifecycle/commits.py),
              shared with the batch task, which commits its pages together
    or fail   `decide` (lifecycle/policy.py) says retry, wait, skip or fail; `fail_page` does it

`run_page` is what `SiteTask.run_page` runs, for a message of its own and for each entry of
a batch message (lifecycle/batch.py).
"""

from __future__ import annotations

import logging
import time
import traceback
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from celery.exceptions import SoftTimeLimitExceeded

from exceptions import DeadlineExceeded, PoisonMessage, Throttled
from ledger.state import Begun, CommitCall, RunState
from lifecycle import hooks, runtime
from lifecycle.commits import Committer, aggregate, children, current_batch, outbox_entries
from lifecycle.context import Context
from lifecycle.endpoints import EndpointSpec, Follow, Item, Params
from lifecycle.policy import decide
from monitor.deadletter import DeadLetter, DeadLetterStore, keep_capture
from monitor.metrics import TaskMetrics
from scheduling.gate import get_gate
from utils.logsafe import safe_text
from utils.wire import AVOID_KEEP, TaskEnvelope, TaskMeta

log = logging.getLogger("chaincrawl.task")


class PageTask(Protocol):
    """What the lifecycle needs of the endpoint's task (base_task.SiteTask)."""

    name: str
    spec: EndpointSpec

    @property
    def request(self) -> Any: ...  # Celery's request: id, retries

    @property
    def app(self) -> Any: ...

    def _collect(self, ctx: Context, p: Params) -> tuple[list[Item], list[Follow]]: ...

    def retry_later(
        self, params: Any, meta: TaskMeta, countdown: float, exc: Exception
    ) -> Exception: ...


def run_page(
    task: PageTask, params: Any, wire: Mapping[str, Any] | None, begun: Begun | None = None
) -> str:
    """One page: begin, run the endpoint, commit, send the children. Inside a batch (`begun`
    from the batch's one begin round trip) its commit goes with the batch's."""
    spec = task.spec
    rt = runtime.current()
    state = rt.state()
    meta = TaskMeta.from_wire(wire)
    tid = task.request.id or uuid.uuid4().hex
    rid, step = meta.run_id, meta.step
    metrics = TaskMetrics()
    metrics.outcome("started")
    started = time.monotonic()
    rt.load.busy()  # keep the CPU window fresh for batch sizing
    attempt = (task.request.retries or 0) + meta.retry_base
    # a message's own begin counts its delivery only when the broker flags it redelivered
    # (ledger `begin_many`): a first delivery writes no counter, so has none to drop
    info = None if begun is not None else task.request.delivery_info
    redelivered = bool(info.get("redelivered")) if info else None
    if begun is None:
        # the run's hold as this process knows it from the last second (its commits' replies
        # say it): a first attempt's begin, or a wait's, then reads nothing at all; a retry
        # comes back after its backoff, when a pause is what an operator may have done
        # meanwhile: it reads the run
        retried = attempt > meta.waits
        known = rt.known_hold(rid) if rid and not retried else None
        begun = state.begin(rid, tid, attempt, redelivered, known)
        if rid and known is None:
            rt.note_hold(rid, begun.hold)
    elif rid and not (begun.cancelled or begun.paused):
        hold = rt.hold(state, rid)  # cancelled or paused since its batch began?
        if hold:
            begun = begun._replace(cancelled=hold == "cancelled", paused=hold == "paused")
    committed, deliveries, cancelled, paused = begun
    if deliveries > 1:  # its earlier delivery's worker died (or lost its connection)
        metrics.counts["redelivered"] += 1
    # its delivery counter goes with its commit or retry (nothing of a page left behind)
    counted = deliveries > 0 and redelivered is not False
    forget = (state.deliveries_key(rid, tid, attempt),) if counted else ()
    if paused and not (cancelled or committed):
        # back as a new message: its retry number kept, its wait for a resource restarted
        # (a pause is no time spent waiting for a pool: `resource_wait_max`)
        meta.wait_since, meta.retry_base = None, attempt
        msg = TaskEnvelope(tid, task.name, params, meta.to_wire()).encode()
        parked = state.park(rid, tid, msg, attempt, counted=counted)
        if parked:
            state.replicated([state.home_key(rid, tid)])  # parked (or found parked) durably
            outcome = "paused" if parked > 0 else "duplicate"
            metrics.outcome(outcome)
            aggregate(rt, metrics, spec)
            return outcome
    if committed:  # a redelivery of a committed task: send what is still staged
        # the commit it found may be one its replicas never confirmed (its delivery was
        # requeued for that): acknowledged under the same rule as a commit
        state.replicated([state.home_key(rid, tid)])
        metrics.outcome("duplicate")
        aggregate(rt, metrics, spec)
        page = Committer(rt, state, rid, task.name)
        page.stage(tid)
        _deliver(task, page)
        return "duplicate"
    if cancelled:  # its run was cancelled: no fetch, counted as cancelled
        metrics.outcome("cancelled")
        aggregate(rt, metrics, spec)
        call = state.commit_call(rid=rid, tid=tid, step=step, outcome="cancelled", forget=forget)
        _commit_alone(task, state, rid, call)
        return "cancelled"
    # its "started" goes to the process's sums with its outcome's counts, in one hand-over
    # (every ending below writes them: the commit's, a retry's or a failure's)
    ctx: Context | None = None
    gate = get_gate()
    admitted = False
    try:
        if deliveries > rt.settings.max_redeliveries + 1:
            raise PoisonMessage(
                f"{spec.name}: delivered {deliveries} times without finishing "
                f"(cap {rt.settings.max_redeliveries} redeliveries)"
            )
        p = spec.validate_params(params)
        wait = gate.admit(spec.site, spec.name, tid, spec.deadline)
        if wait > 0:
            raise Throttled(f"{spec.name}: over its shared limit", retry_after=wait)
        admitted = True
        ctx = Context(spec, p, meta, rt, metrics)
        items, follows = task._collect(ctx, p)
    except Exception as exc:
        return fail_page(task, exc, params, meta, ctx, state, metrics, started, forget)
    finally:
        if admitted:
            gate.release(spec.site, spec.name, tid)
    dumped = [it.model_dump(mode="json") for it in items]  # once: outbox rows and fan-out
    empty = metrics.counts.get("empty", 0)  # read before aggregate() takes the counts
    stored = [(it, row) for it, row in zip(items, dumped, strict=True) if it.store]
    entries = outbox_entries(rid, step, spec.name, stored)
    chain = rt.chain(state, rid) if rid else None
    seen: dict[str, tuple[str, int]] = {}
    kids = children(rt, chain, spec.name, meta, items, follows, dumped, seen)
    for ktask, n in seen.values():  # the skipped endpoint's metrics count them
        skips = TaskMetrics()
        skips.counts["skipped_seen"] += n
        skips.aggregate(ktask, ktask.split(".", 1)[0], rt.settings)
    metrics.outcome("succeeded")
    metrics.counts["items"] += len(stored)
    metrics.latency(time.monotonic() - started)
    aggregate(rt, metrics, spec)
    call = state.commit_call(
        rid=rid,
        tid=tid,
        step=step,
        outcome="succeeded",
        n_items=len(stored),
        entries=entries,
        kids=kids,
        forget=forget,
        counts={
            **{(sid, "skipped_seen"): n for sid, (_, n) in seen.items()},
            (step, "undecodable"): int(ctx is not None and ctx.report.undecodable > 0),
            (step, "empty"): empty,
        },
    )
    batch = current_batch(rt)
    if batch is not None and not (kids and rt.send_kids_now(rid)):  # with the batch's pages
        batch.add(call, spec.name, meta.dedup_id)
    else:
        page = Committer(rt, state, rid, task.name)
        page.add(call, spec.name, meta.dedup_id)
        page.finish(task.app)
    return f"{len(stored)} items, {len(kids)} follow-ups"


def _deliver(task: PageTask, page: Committer) -> None:
    """Send what a page committed on its own staged: inside a batch, with the batch's."""
    batch = current_batch(page.rt)
    if batch is not None:
        batch.absorb(page)
    else:
        page.publish(task.app)
        page.mark()


def _commit_alone(
    task: PageTask, state: RunState, rid: str, call: CommitCall, pipe_extra: Any = None
) -> None:
    """Commit a page that ended without output (cancelled, skipped, failed) at once, also
    inside a batch (its own pipeline extras go with it), then send what backpressure may have
    released to it."""
    page = Committer(runtime.current(), state, rid, task.name)
    page.add(call, task.name)
    page.commit(pipe_extra, read_back=False)
    _deliver(task, page)


def fail_page(
    task: PageTask,
    exc: Exception,
    params: Any,
    meta: TaskMeta,
    ctx: Context | None,
    state: RunState,
    metrics: TaskMetrics,
    started: float,
    forget: tuple[str, ...] = (),
) -> str:
    """Carry out what `decide` says for a page that raised `exc`: a skip or a final failure
    commits (the failure dead-lettered with it), a wait or a retry raises Celery's `Retry`
    (a message of its own, same task id)."""
    spec, rt = task.spec, runtime.current()
    settings = rt.settings
    if isinstance(exc, SoftTimeLimitExceeded):
        exc = DeadlineExceeded(f"{spec.name}: soft time limit exceeded")
    exc = hooks.page_error(ctx, spec.name, exc, hooks.counting(metrics.counts))
    err = type(exc).__name__
    rid, step, tid = meta.run_id, meta.step, task.request.id or ""
    used = (task.request.retries or 0) + meta.retry_base - meta.waits
    now = time.time()
    decision = decide(exc, used, spec, settings, waiting_since=meta.wait_since, now=now)
    metrics.latency(time.monotonic() - started)

    def flush(pipe: Any) -> None:
        metrics.flush(pipe, spec.name, spec.site, settings)

    if decision.action in ("wait", "retry") and rid and _cancelled(rt, state, rid):
        # its run was cancelled since it began: committed as its next delivery's begin would,
        # not sent again (the countdown, up to RETRY_BACKOFF_MAX, kept the run cancelling)
        metrics.outcome("cancelled")
        call = state.commit_call(rid=rid, tid=tid, step=step, outcome="cancelled", forget=forget)
        _commit_alone(task, state, rid, call, flush)
        return "cancelled"
    if decision.action in ("wait", "retry"):
        if decision.action == "wait":  # a contended pool: no retry spent
            meta.waits += 1
            meta.wait_since = round(meta.wait_since or now, 3)
            metrics.outcome("waited", err)
        else:
            if ctx is not None and ctx.report.failed_leases:  # never reuse what just failed
                avoid = set(meta.avoid) | ctx.report.failed_leases
                meta.avoid = tuple(sorted(avoid)[-AVOID_KEEP:])
            metrics.outcome("retried", err)
        # its metrics to the process's sums like a commit's (written within the flush
        # interval, or with the next commit in a run's tail): a page waiting for a lease
        # comes back again and again, and writing its ~20 fields each time was most of a
        # page's commands in a crawl short of sessions
        aggregate(rt, metrics, spec)
        pipe = state.r.pipeline(transaction=False)
        if decision.action == "retry":
            state.count_retry(rid, step, pipe)
        if forget:  # the next attempt counts its own deliveries
            pipe.unlink(*forget)
        if len(pipe):
            pipe.execute()
        state.replicated([state.home_key(rid, tid)])  # the retry's counters, then its message
        if decision.action == "retry":
            log.info(
                "%s retry %d/%d in %.1fs after %s: %s",
                spec.name,
                used + 1,
                spec.max_retries if spec.max_retries is not None else settings.max_retries,
                decision.countdown,
                err,
                safe_text(exc),
            )
        raise task.retry_later(params, meta, decision.countdown, exc)

    if decision.action == "skip":  # not sent on purpose: no retry, no dead letter
        metrics.outcome("skipped", decision.reason)
        call = state.commit_call(rid=rid, tid=tid, step=step, outcome="skipped", forget=forget)
        _commit_alone(task, state, rid, call, flush)
        log.info("%s skipped (%s): %s", spec.name, decision.reason, safe_text(exc))
        return f"skipped: {decision.reason}"

    # final failure: dead-letter it, count it, let the run move on
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]
    dl = DeadLetter(
        id=tid,
        task=spec.name,
        params=params if isinstance(params, dict) else {"_raw": repr(params)[:500]},
        meta=meta.to_wire(),
        error_type=err,
        error=safe_text(exc),
        traceback=tb,
        retries=used,
        capture=keep_capture(exc, tid or uuid.uuid4().hex, settings.var_dir),
    )
    metrics.outcome("failed", err)
    dls = DeadLetterStore(state.r, settings)

    def extra(pipe: Any) -> None:
        dls.add(dl, pipe)
        flush(pipe)

    call = state.commit_call(rid=rid, tid=tid, step=step, outcome="failed", forget=forget)
    _commit_alone(task, state, rid, call, extra)
    log.warning(
        "%s failed for good after %d retries (%s: %s); dead-lettered as %s",
        spec.name,
        used,
        err,
        safe_text(exc),
        tid,
    )
    return f"failed: {err}"


def _cancelled(rt: runtime.Runtime, state: RunState, rid: str) -> bool:
    """Whether the run was cancelled, for a page about to be retried. Whatever the read
    meets (Redis not answering, which the page may have failed for; a lost slot range) leaves
    it unknown: the retry goes as it did before the look."""
    try:
        return rt.hold(state, rid) == "cancelled"
    except Exception:  # the page's own failure is being handled: never a second one here
        return False
