"""Run records and exact completion counters in Redis.

Keys (prefix `cc` by default; `{rid}` is literal, the run's hash tag: a run's keys share one
Redis Cluster slot, so each script below runs on one node; names from utils/keyspace.py):
    run:{rid}            hash  chain, status (running|done|cancelled), created, finished,
                               priority, def, cancelled (time) and cancel_reason once cancelled,
                               paused (time) and pause_reason while paused; resend_mark and
                               resends_stalled: the sweeper's re-sends since the last commit;
                               compacted (time)
    run:{rid}:counters   hash  outstanding, dispatched, succeeded, failed, retried, items, stored,
                               skipped (robots.txt), skipped_seen, skipped_unique (children
                               not sent), and per step `{step}:{counter}`
    run:{rid}:done       set   task ids that have committed (makes commit idempotent)
    run:{rid}:uniq:<step> set  parameter fingerprints of `unique` steps
    run:{rid}:pending    list  children waiting behind the run's cap (backpressure), and
                               every task of a paused run (`pause`)
    run:{rid}:parked     set   task ids parked since the last resume (parked once each)
    run:{rid}:ledger     hash  tid -> message of every task sent and not yet committed, so
                               chains.sweeper can re-send what the broker lost;
                               `last` in the run hash is the time of the last commit
    run:{rid}:staged     hash  tid -> ids of the children a committed task still has to send
                               (space-separated; their messages are in the ledger)
    run:{rid}:kids:<name> list child messages a client stages (trigger, resume); without a
                               run, `kids:{norun}:<tid>` holds a task's child messages
    run:{rid}:deliv:<tid>:<n>  deliveries of attempt n (the poison cap)
    runs:active          set   run ids not yet done
    runs:storing         set   run ids whose tasks are done but whose items wait in the
                               outbox (shown `storing`; dropped by the readers once stored;
                               on a cluster every run that ends is added, by the committer
                               or the cancel, and a cancelled one kept while its items wait)
    runs:recent          zset  run ids by start time, the newest RECENT_KEEP (`control.sh runs`)
    outbox               stream items handed off for storage (drained by external_interface.storage.outbox);
                               on a cluster the run's own `run:{rid}:outbox` (drained by the
                               outbox's ClusterDrainer, deleted when the run is compacted)

A task's whole result is committed in one Lua script (a batch's tasks in one call): its items go
to the outbox, its children are written to the ledger and staged by id in `run:{rid}:staged`,
the counters move, and
`outstanding` drops by one. The script runs at most once per task id (the `done` set), so a redelivered or
duplicated message can neither store items twice nor count twice. Children are sent after the
commit and their staged entry deleted; a redelivered task that finds itself committed only
re-sends what is still staged and not yet committed (`staged`).
Its tasks are finished exactly when `outstanding` reaches zero, whatever the number of workers;
the run is shown `done` only once the outbox has stored every item its tasks produced
(`stored + store_failed >= items`), `storing` until then (`run_status`).

Compaction (`compact`): once a run is complete and its items are stored, its per-task
bookkeeping (`done`, `uniq:*`, `parked`, `pending`) is dropped and `compacted` set in its
hash; the hash and counters stay for `CHAINCRAWL_RUN_RETENTION`, so progress and
`control.sh runs RID` still show it. A task of a compacted run counts as committed (begin and
commit both read the flag). A task's delivery counter (`run:{rid}:deliv:<tid>:<n>`) goes with its
commit or retry, so a finished page leaves nothing of its own behind.

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
one slot and stages waiting children for the committing task to send, in the same
script, so the broker never holds more than the cap of one run's tasks. While nothing waits and
the cap has room, children are staged directly (the usual case: no hop through
`pending`, 2.5 fewer Redis calls per page); once some wait, new ones queue behind them.
"""

from __future__ import annotations

from ledger.commits import Commits
from ledger.compaction import Compaction
from ledger.control import Control
from ledger.records import (
    COUNTERS,
    DELIV_TTL,
    RECENT_KEEP,
    RUN_TTL,
    Begun,
    Cancelled,
    CommitCall,
    Committed,
    Kid,
    Paused,
    Resumed,
    StagedAt,
    drop_staged,
    items_settled,
    run_status,
    stalled_resends,
    step_counters,
)


class RunState(Commits, Control, Compaction):
    """All run bookkeeping against one Redis; cheap to build, thread-safe. The facade of the
    ledger's concerns: keys (ledger/keys.py), runs (runs.py), commits (commits.py), cancel and
    pause (control.py), compaction (compaction.py)."""


__all__ = [
    "COUNTERS",
    "DELIV_TTL",
    "RECENT_KEEP",
    "RUN_TTL",
    "Begun",
    "Cancelled",
    "CommitCall",
    "Committed",
    "Kid",
    "Paused",
    "Resumed",
    "RunState",
    "StagedAt",
    "drop_staged",
    "items_settled",
    "run_status",
    "stalled_resends",
    "step_counters",
]
