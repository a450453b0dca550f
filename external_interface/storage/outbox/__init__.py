"""The outbox drainer: moves committed items from the Redis stream `{prefix}:outbox` to the
sinks, acknowledging an entry only once every sink of its type stored it, so that a drainer
that dies loses nothing and two that race count an entry once.

How it batches, claims, retries, dead-letters and trims: docs/storage.md. Modules: `entries`
(keys, the producer side, an entry as read, acknowledging a batch), `drainer` (the `Drainer`),
`listeners` (the hooks that hear of stored entries), `status` (`backlog`, `requeue_dead`,
`outbox_streams`), `cluster` (the `ClusterDrainer`: on a Redis Cluster each run's own stream),
`__main__` (the process).
"""

from __future__ import annotations

from external_interface.storage.outbox.cluster import ClusterDrainer, drainer_class
from external_interface.storage.outbox.drainer import Drainer
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
from external_interface.storage.outbox.listeners import (
    EntriesHook,
    EntriesRefused,
    RunsHook,
    StoredHook,
    on_runs_stored,
    on_stored,
    on_stored_entries,
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
    "EntriesHook",
    "EntriesRefused",
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
    "on_stored_entries",
    "outbox_entry_fields",
    "outbox_streams",
    "requeue_dead",
    "stream_key",
    "xadd_entry",
]
