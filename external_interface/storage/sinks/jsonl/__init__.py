"""The JSON Lines sink, the embedded default: one file of items per type, taken away as is.

    var/items/demo.post/demo.post.jsonl      {"post_id": "p1", "title": ...}   one item a line
    var/items/demo.post/demo.post.2.jsonl    the next part, once the first is full
    var/items/demo.post/.journal             bookkeeping (which outbox entry wrote which lines)

Modules: `store` (the write path: a type's folder, its journal, crash repair, and `JsonlWriter`,
exactly once per outbox entry), `sink` (`JsonlSink`: the writer with its settings, compaction
and history: latest version per key or append mode), `compact` (dropping older versions),
`read` (snapshots, `read_items`, `iter_records`).
"""

from __future__ import annotations

from external_interface.storage.sinks.jsonl.read import (
    Line,
    Snapshot,
    default_root,
    item_types,
    iter_records,
    latest_lines,
    open_snapshot,
    read_items,
    type_dir,
    type_files,
)
from external_interface.storage.sinks.jsonl.sink import MODES, JsonlSink

__all__ = [
    "MODES",
    "JsonlSink",
    "Line",
    "Snapshot",
    "default_root",
    "item_types",
    "iter_records",
    "latest_lines",
    "open_snapshot",
    "read_items",
    "type_dir",
    "type_files",
]
