"""The outbox drainer: moves committed items from the Redis stream `{prefix}:outbox` to the sinks.

A task's commit script XADDs one entry per item type (a batch's commits of one step and type
share one) — fields built by `outbox_entry_fields`. Drainers read the stream as consumers of the group "sinks" (one drainer
thread per worker process, or `python -m external_interface.storage.outbox`) and, for each batch:

1. group the entries by item type and write every type to all of its sinks (idempotent writes);
2. after *all* of a type's sinks confirmed, call the `on_stored` hooks (dedup marks items there);
3. in one Lua script per batch (`ack.lua`), per entry: `XACK`; only if XACK returned 1 (this
   drainer won the entry), add the item count to `run:{run}:counters` (`{step}:stored` and
   `stored`) and XDEL the entry. Two drainers that both wrote an entry count it exactly once.

Batches flush by size (`outbox_batch`), by time (`outbox_flush_interval` after the first entry
arrived), when the stream goes quiet (`outbox_idle_flush` without a new entry: a run's last items
are stored at once) and on shutdown. An entry is acknowledged only after it is stored, so nothing
is lost when a drainer dies: its entries stay pending and another drainer claims them
(XAUTOCLAIM) once they have been idle for `claim_idle` seconds.

When a drainer holds nothing it *settles* its sinks (`Drainer.settle`, every 0.5 s at most):
a sink with a `settle()` method tidies up between writes (the JSONL sink compacts the types
written since their last compaction).

Sink outages: the failed entries stay pending, the drainer stops reading new ones and retries
with exponential backoff (refreshing its claim so others don't steal them); everything newer
waits in the stream. A sink's last error is kept in `{prefix}:outbox:errors` until it recovers.

Poison entries: when a sink raises `PermanentSinkError` (the data itself is refused), the type's
entries are retried one by one and the ones still refused go to `{prefix}:outbox:dead` with the
error, acknowledged, and counted as `{step}:store_failed` / `store_failed` instead of `stored`.
`requeue_dead()` puts them back.

Trimming: acknowledged entries are deleted (XDEL) by the script that acknowledged them, so the
stream only ever holds entries not yet stored: `XLEN` *is* the backlog, and its first entry is
the oldest one that can still be delivered (the *horizon* the JSONL sink uses to bound its
memory of written entries). XTRIM MINID was the alternative; it needs the group's pending
minimum and last-delivered id to be safe and leaves stored entries around until the next trim.

Modules: `entries` (keys, the producer side, an entry as read), `drainer` (the `Drainer`),
`ack` (acknowledging a batch), `status` (`backlog`, `requeue_dead`, `outbox_streams`:
every stream of a cluster), `cluster` (the
`ClusterDrainer`: on a Redis Cluster each run's own stream is read), `__main__` (the process).
"""

from __future__ import annotations

from external_interface.storage.outbox.cluster import ClusterDrainer, drainer_class
from external_interface.storage.outbox.drainer import (
    Drainer,
    RunsHook,
    StoredHook,
    on_runs_stored,
    on_stored,
)
from external_interface.storage.outbox.entries import (
    GROUP,
    OutboxEntry,
    counters_key,
    dead_key,
    default_consumer,
    errors_key,
    outbox_entry_fields,
    stream_key,
    xadd_entry,
)
from external_interface.storage.outbox.status import (
    OutboxStream,
    backlog,
    cluster_backlog,
    outbox_streams,
    requeue_dead,
)

__all__ = [
    "GROUP",
    "ClusterDrainer",
    "Drainer",
    "OutboxEntry",
    "OutboxStream",
    "RunsHook",
    "StoredHook",
    "backlog",
    "cluster_backlog",
    "counters_key",
    "dead_key",
    "default_consumer",
    "drainer_class",
    "errors_key",
    "on_runs_stored",
    "on_stored",
    "outbox_entry_fields",
    "outbox_streams",
    "requeue_dead",
    "stream_key",
    "xadd_entry",
]
