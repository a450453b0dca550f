"""The batch task: several pages in one broker message (`ledger.publish.Publisher.plan`).

Each entry runs as the task it names, with its own task id: its own begin and commit (exactly
once per id), its own retry (a message of its own, same id) and its own dead letter. The
entries' begins go in one round trip, their commits in one, their children in one publish
pipeline (one `Committer`, lifecycle/commits.py, the tail a page of its own goes through too).
Each entry runs as its endpoint's `SiteTask.run_page` with Celery's request pushed for it
(`Task.push_request`: its own id, 0 retries, the batch's delivery info), so its retry and its
task events are those of a message of its own. Under gevent the entries run side by side,
each holding a page slot; elsewhere one after the other. A batch hands the pages it has not started to new messages when it runs past
its budget or its run reaches its tail.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery import Task, shared_task
from celery.app.task import Context as RequestContext
from celery.exceptions import Reject, Retry

from config import Settings
from ledger.publish import BATCH_TASK
from ledger.state import Begun
from lifecycle import runtime
from lifecycle.commits import Committer, requeue_unreplicated, set_batch
from lifecycle.endpoints import EndpointSpec, get_endpoint
from lifecycle.lost import (
    LOST,
    STATE_STORE_ERRORS,
    lost_for_message,
    park_seconds,
    uncount_delivery,
)
from lifecycle.unknown import dead_letter_unknown
from utils.logsafe import safe_text, task_argsrepr
from utils.process import RankedSlots
from utils.redis import NotReplicated, get_redis
from utils.registry import UnknownNameError
from utils.slots import SlotsLost
from utils.wire import RETRY_BASE, RUN

log = logging.getLogger("chaincrawl.task")

Entry = tuple[tuple[EndpointSpec, dict[str, Any]], Begun]


@shared_task(
    name=BATCH_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    typing=False,
    max_retries=None,
)
def run_batch(self: Task, entries: list[dict[str, Any]]) -> str:
    """Several pages in one message (see the module docstring)."""
    try:
        return _run_batch(self, entries)
    except NotReplicated as exc:  # its replicas did not confirm: not acked, quietly
        _uncount_batch(self, entries)
        requeue_unreplicated(runtime.current(), BATCH_TASK, exc)
    except STATE_STORE_ERRORS as exc:
        tasks = [(str(e.get("task", "")), e.get("meta")) for e in entries]
        ranges = lost_for_message(get_redis(runtime.current().settings.redis_url), exc, tasks)
        wait = park_seconds(runtime.current().settings)  # under the visibility timeout
        if ranges and LOST.surplus(self.request.id or "", countdown=wait):
            return "parked already"  # its parked copy is out (lifecycle/lost.py)
        if ranges:  # a slot range no node serves: parked quietly (lifecycle/lost.py)
            LOST.parked_one(BATCH_TASK, ranges, wait)
            raise self.retry(countdown=wait, max_retries=None, exc=SlotsLost(ranges)) from None
        _uncount_batch(self, entries)
        log.warning("%s: state store unreachable (%s); message requeued", BATCH_TASK, exc)
        runtime.pause_before_requeue()
        raise Reject(exc, requeue=True) from None


def _batch_key(state: Any, btask: Task, entries: list[dict[str, Any]]) -> str:
    """The batch message's delivery counter (`begin_many`: on its run's slot)."""
    rids = [str((e.get("meta") or {}).get(RUN, "")) for e in entries]
    return str(state.batch_deliveries_key(rids, btask.request.id or ""))


def _uncount_batch(btask: Task, entries: list[dict[str, Any]]) -> None:
    """A requeue the state store caused is not a delivery of the batch (lifecycle/lost.py)."""
    state = runtime.current().state()
    runs = {str((e.get("meta") or {}).get(RUN, "")) for e in entries}
    rid = runs.pop() if len(runs) == 1 else ""
    uncount_delivery(state, rid, btask.request.id or "", 0)


def _run_batch(btask: Task, entries: list[dict[str, Any]]) -> str:
    rt = runtime.current()
    settings = rt.settings
    state = rt.state()
    todo: list[tuple[EndpointSpec, dict[str, Any]]] = []
    for e in entries:
        try:
            todo.append((get_endpoint(e["task"]), e))
        except UnknownNameError:
            dead_letter_unknown(state, settings, e, btask.request.hostname or "", btask.app)
    # the broker's flag, as for a message of its own: a first delivery writes no counter and
    # looks up no done set (lifecycle/page.py); runs whose hold this process read within a
    # second are not read again
    info = btask.request.delivery_info
    redelivered = bool(info.get("redelivered")) if info else None
    rids = sorted({e["meta"].get(RUN, "") for _, e in todo} - {""})
    known = {r: h for r in rids if (h := rt.known_hold(r)) is not None}
    begun, deliveries = state.begin_many(
        [(e["meta"].get(RUN, ""), e["id"], 0) for _, e in todo],
        batch_id=btask.request.id or "",
        redelivered=redelivered,
        known=known,
    )
    for (_, e), b in zip(todo, begun, strict=True):
        r = e["meta"].get(RUN, "")
        if r and r not in known:
            rt.note_hold(r, b.hold)
            known[r] = b.hold
    # A redelivered batch (its worker died, or it was requeued) runs entry by entry: each
    # entry counts its own delivery as it starts and commits at once, so a poison entry is
    # charged alone and the work done before a death is kept.
    careful = deliveries > 1
    run = Committer(rt, state, next((e["meta"].get(RUN, "") for _, e in todo), ""), BATCH_TASK)
    req = btask.request
    events = settings.task_events
    set_batch(rt, None if careful else run)
    budget, t_batch = batch_budget(settings), time.monotonic()
    rid = run.rid
    slots = rt.page_slots()  # gevent: every entry holds a page slot while it runs
    side_by_side = slots is not None and not careful

    def hand_out(k: int) -> str:
        """Why entry k should go to a message of its own instead of running here ("": run)."""
        if not k:
            return ""
        # Slow pages: hand the entries not started to a new message rather than run towards
        # the visibility timeout (a restore would run the batch twice).
        if time.monotonic() - t_batch > budget:
            return f"over its {budget:.0f}s budget"
        # A batch no longer worth its one-slot-at-a-time pages: hand them out too (a batch
        # whose pages run side by side has none waiting behind each other).
        if not side_by_side and rt.unbatch(rid):
            return "in its run's tail"
        return ""

    def one(spec: EndpointSpec, e: dict[str, Any], b: Begun) -> None:
        if careful:
            b = state.begin(e["meta"].get(RUN, ""), e["id"], int(e["meta"].get(RETRY_BASE, 0)))
            b = b._replace(deliveries=b.deliveries + 1)  # + the first, as for a single message
        task = _resolved(spec.task)  # the endpoint's SiteTask
        params, meta = e["params"], e["meta"]
        _push_request(
            task,
            {
                "id": e["id"],
                "root_id": e["id"],
                "parent_id": None,
                "correlation_id": e["id"],
                "args": [params, meta],
                "kwargs": {},
                "retries": 0,
                "called_directly": False,
                "is_eager": False,
                "hostname": req.hostname,
                "delivery_info": req.delivery_info,
                "reply_to": None,
                "ignore_result": True,
            },
        )
        t0 = time.monotonic()
        try:
            if events:
                _entry_event(
                    task,
                    "task-received",
                    name=spec.name,
                    retries=0,
                    args=task_argsrepr(params, meta),
                    kwargs="{}",
                )
                _entry_event(task, "task-started")
            result = task.run_page(params, meta, begun=b)
            if events:
                _entry_event(task, "task-succeeded", result=result, runtime=time.monotonic() - t0)
        except Retry as exc:  # already sent as its own message, same id
            if events:
                _entry_event(task, "task-retried", exception=safe_text(exc))
        except Reject:
            raise
        except STATE_STORE_ERRORS:  # the batch requeued or parked whole
            raise
        except Exception as exc:  # as for a single message: logged, not committed
            log.exception("%s[%s] raised inside %s", spec.name, e["id"], BATCH_TASK)
            if events:
                _entry_event(task, "task-failed", exception=safe_text(exc))
        finally:
            task.pop_request()

    entries_b = list(zip(todo, begun, strict=True))
    try:
        if side_by_side:
            assert slots is not None
            rest, why = _side_by_side(rt, slots, run, entries_b, hand_out, one)
        else:  # one after the other (threads, prefork, or a redelivered batch)
            rest, why = [], ""
            for k, ((spec, e), b) in enumerate(entries_b):
                why = hand_out(k)
                if why:
                    rest = [x for _, x in todo[k:]]
                    break
                with rt.holding(e["meta"]):
                    one(spec, e, b)
    finally:
        set_batch(rt, None)
    if rest:
        log.info(
            "%s %s: %d of %d pages handed to new messages", BATCH_TASK, why, len(rest), len(entries)
        )
    bkey = _batch_key(state, btask, [e for _, e in todo])  # the batch's delivery counter
    drop = (lambda p: p.unlink(bkey)) if redelivered is not False else None  # none if uncounted
    run.finish(btask.app, pipe_extra=drop, front=rest)  # goes with its commits
    if rest:
        return f"{len(entries) - len(rest)} pages, {len(rest)} re-queued"
    return f"{len(entries)} pages"


def _side_by_side(
    rt: runtime.Runtime,
    sem: RankedSlots,
    run: Committer,
    entries: list[Entry],
    hand_out: Callable[[int], str],
    one: Callable[[EndpointSpec, dict[str, Any], Begun], None],
) -> tuple[list[dict[str, Any]], str]:
    """Run a batch's entries in greenlets of their own, each holding a page slot (gevent): at
    100 ms latency and 256 slots a batch run one page after the other was worth only two
    pages per message, and each message costs ~3 ms of CPU on a slow machine. An entry that
    gets its slot past the batch's budget is handed out instead (returned, in order, with
    why). Errors that must requeue the message (Reject, Redis unreachable) are raised once
    every entry has finished: nothing is committed before the batch's one commit anyway."""
    import gevent  # only ever reached on the gevent pool
    from gevent.event import Event

    left: dict[int, dict[str, Any]] = {}
    whys: list[str] = []
    errors: list[BaseException] = []
    running = [len(entries)]
    done = Event()  # set by the last entry to finish: the batch wakes once, not once an entry

    def entry(k: int, spec: EndpointSpec, e: dict[str, Any], b: Begun) -> None:
        try:
            set_batch(rt, run)  # greenlet-local under gevent: each entry defers to the batch
            with sem.slot(rt.page_rank(e["meta"])):
                why = hand_out(k)
                if why:
                    left[k] = e
                    whys.append(why)
                    return
                one(spec, e, b)
        except BaseException as exc:
            errors.append(exc)
        finally:
            running[0] -= 1
            if not running[0]:
                done.set()

    greenlets = [gevent.spawn(entry, k, spec, e, b) for k, ((spec, e), b) in enumerate(entries)]
    try:
        if greenlets:
            done.wait()
    except BaseException:  # the batch itself is being killed (cold shutdown): its entries too
        gevent.killall(greenlets)
        raise
    if errors:
        raise errors[0]
    return [left[k] for k in sorted(left)], (whys[0] if whys else "")


def _resolved(task: Any) -> Any:
    """The task object behind `shared_task`'s proxy, looked up once per entry: every attribute
    read through the proxy (`request`, `spec`, `name`, `app`...: a dozen a page) looks the
    task up in the current app again."""
    real = getattr(task, "_get_current_object", None)
    return real() if real is not None else task


# what Celery's request context takes for its own (`Context._get_custom_headers`)
_CELERY_KEYS = frozenset(
    {*RequestContext.__dict__, "lang", "task", "argsrepr", "kwargsrepr", "compression"}
)


def _push_request(task: Any, fields: dict[str, Any]) -> None:
    """`task.push_request(**fields)` without its per-call cost: Celery's `Context()` rebuilds
    the set of its ~60 own names on every call to find custom headers (a third of a page's
    request context). The context pushed is the same: the current request's fields, then
    `fields`, custom headers only for names that are not Celery's."""
    merged = {**task.request.__dict__, **fields}
    if "timelimit" in merged:  # Context.update derives the two limits from it
        task.push_request(**fields)
        return
    ctx = RequestContext.__new__(RequestContext)
    ctx.__dict__.update(merged)
    if ctx.headers is None:
        ctx.headers = {k: v for k, v in merged.items() if k not in _CELERY_KEYS} or None
    task.request_stack.push(ctx)


def batch_budget(s: Settings) -> float:
    """Seconds a batch may run before it hands its remaining pages to new messages: well under
    the visibility timeout (a batch running past it would be restored and run twice) and short
    enough that a worker's death loses little (a batch commits its pages at its end)."""
    return max(1.0, min(30.0, 0.25 * s.visibility_timeout))


def _entry_event(task: Task, type_: str, **fields: Any) -> None:
    """Task events for one entry of a batch, in its own id, so Flower lists every page."""
    try:
        task.send_event(type_, **fields)
    except Exception as exc:  # monitoring never fails a page
        log.debug("event %s not sent: %s", type_, exc)
