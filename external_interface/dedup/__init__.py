"""Dedup that remembers when and what: new / seen-unchanged / seen-changed, and since when.

A store is one namespace (per site and item type). For an id and an optional content value it
answers NEW, UNCHANGED or CHANGED plus the hour the id was first seen, so a chain step can
"skip if seen within 7 days", "re-crawl if older than a day" or "store only if changed".

Marking happens after the item is durably stored, so a crash between the two re-crawls a page
rather than losing it: `check_many` is read-only and
`mark_many` records (and returns what it saw before, so it doubles as check-and-mark). A step
checks (or `filter_new`s), crawls, stores, and marks only the ids whose write was confirmed; a
failed store never marks, so the id comes back as NEW next time.

    base.py         the Dedup interface, statuses, id and content fingerprints
    layout.py       the Redis store's bucket layout, sized from capacity and error rate
    redis_store.py  RedisDedup, the default store (dedup.lua)
    memory.py       MemoryDedup, its in-process twin
    factory.py      stores by name (make_dedup) and the outbox marking hook
"""

from external_interface.dedup.base import (
    Dedup,
    DedupBase,
    Seen,
    Status,
    content_fp,
    id_bytes,
    value_bytes,
)
from external_interface.dedup.factory import dedups, make_dedup, marking_hook
from external_interface.dedup.layout import Bucket, Layout, decode_bucket
from external_interface.dedup.memory import MemoryDedup
from external_interface.dedup.redis_store import RedisDedup

__all__ = [
    "Bucket",
    "Dedup",
    "DedupBase",
    "Layout",
    "MemoryDedup",
    "RedisDedup",
    "Seen",
    "Status",
    "content_fp",
    "decode_bucket",
    "dedups",
    "id_bytes",
    "make_dedup",
    "marking_hook",
    "value_bytes",
]
