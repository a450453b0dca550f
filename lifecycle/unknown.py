"""A task this worker does not know: dead-lettered and failed, so its run ends, never dropped.

An endpoint added (or a route changed) after the workers started is known to a fresh client
but not to them. Celery's consumer logs `Received unregistered task` and drops the message
(`task_unknown`; worker.py hands it here), and a batch entry may name one too
(lifecycle/batch.py). Dropped, the task would stay in its run's ledger, the sweeper would
re-send it every few seconds and the run would never end. Instead, in one round trip: the
task commits as `failed` (its run's `outstanding` drops, so the run ends), its dead letter
says which task and what to do ("restart the workers so they load ..."; `deadletter replay`
after the restart runs it), the task id is marked unknown (the sweeper leaves it alone) and
counted (`metrics:broker` `unknown_tasks`, and the task's `failed:NotRegistered`) once the
commit answers that it committed: a redelivery (a batch's, a re-send's) writes the same dead
letter again and counts nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from broker.workers import TaskSets
from config import Settings
from ledger.commits import answered
from ledger.publish import send_kid
from ledger.state import RunState
from lifecycle.endpoints import queue_for
from monitor.deadletter import DeadLetter, DeadLetterStore
from monitor.metrics import TaskMetrics
from utils.wire import RUN, STEP, TaskEnvelope

log = logging.getLogger("chaincrawl.task")

ERROR_TYPE = "NotRegistered"


def fix_hint(task: str) -> str:
    return f"restart the workers so they load {task} (./control.sh restart), then replay it"


def entry_of(headers: Mapping[str, Any], body: Any) -> dict[str, Any]:
    """A protocol-2 message's task as a `Kid.encode()`-form dict (what a batch entry is):
    id and task from the headers, params and meta from the body's args. What cannot be read
    is left empty (the task still fails, without its run if its meta is unreadable)."""
    args: Any = ()
    if isinstance(body, list | tuple) and body:
        args = body[0]
    params = args[0] if isinstance(args, list | tuple) and args else {}
    meta = args[1] if isinstance(args, list | tuple) and len(args) > 1 else {}
    env = {"id": headers.get("id"), "task": headers.get("task"), "params": params, "meta": meta}
    return TaskEnvelope.from_dict(env).to_dict()


def dead_letter_unknown(
    state: RunState, s: Settings, e: Mapping[str, Any], worker: str = "", app: Any = None
) -> None:
    """Fail, dead-letter, mark and count a task (`Kid.encode()` form) no task of this worker
    is registered under. `app`: to send the children the run's cap released to it."""
    meta = dict(e.get("meta") or {})
    rid, step, tid = str(meta.get(RUN, "")), str(meta.get(STEP, "")), str(e.get("id", ""))
    task = str(e.get("task"))
    who = f"worker {worker}" if worker else "this worker"
    dl = DeadLetter(
        id=tid,
        task=task,
        params=e.get("params") if isinstance(e.get("params"), dict) else {},  # type: ignore[arg-type]
        meta=meta,
        error_type=ERROR_TYPE,
        error=f"{who} does not know task {task!r}: {fix_hint(task)}",
        traceback="",
        retries=0,
    )
    dls = DeadLetterStore(state.r, s)
    sets = TaskSets(state.r, s)
    metrics = TaskMetrics()
    metrics.outcome("started")
    metrics.outcome("failed", ERROR_TYPE)

    def extra(pipe: Any) -> None:  # written again by a redelivery: the same
        dls.add(dl, pipe)
        sets.mark_unknown([tid], pipe, count=False)

    def count() -> None:  # once a task: after the commit answered that it committed
        pipe = state.r.pipeline(transaction=False)
        sets.count_unknown(1, pipe)
        metrics.flush(pipe, task, task.split(".", 1)[0], s)
        pipe.execute()

    call = state.commit_call(rid=rid, tid=tid, step=step, outcome="failed")
    replies: list[Any] = []
    try:
        res = state.run_commits([call], pipe_extra=extra, replies=replies)[0]
    except Exception:
        got = answered(replies, [call])
        if got is not None and got[0] is not None:  # committed, an extra failed: counted now
            try:
                count()
            except Exception as exc:
                log.warning("counting unknown task %s failed: %s", tid, exc)
        raise
    if res is not None:
        count()
    log.error(
        "%s does not know task %r (task id %s, run %s): dead-lettered; %s",
        who,
        task,
        tid,
        rid or "-",
        fix_hint(task),
    )
    if res is not None and res.staged and app is not None:  # the run's cap released these
        for kid in state.staged_kids(rid, tid):
            send_kid(app, kid, queue_for)
        state.clear_kids(rid, tid)
