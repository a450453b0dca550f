"""Who hears of stored entries: the drainer calls these lists' hooks once every sink of an
item type confirmed a batch. Kept apart from the drainer so that a hook's module (lifecycle
hooks, the re-crawl observer, the worker's compaction) depends on the contract, not on the
drainer's loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from external_interface.storage.outbox.entries import OutboxEntry

StoredHook = Callable[[str, list[dict[str, Any]]], None]
on_stored: list[StoredHook] = []  # called with (item_type, items) after all sinks confirmed
EntriesHook = Callable[[str, list[OutboxEntry]], None]
# called with (item_type, entries) after the `on_stored` hooks, for hooks that need each
# entry's run and task (lifecycle/hooks.py, `after_store`); EntriesRefused sets some apart
on_stored_entries: list[EntriesHook] = []


class EntriesRefused(Exception):
    """An entries hook refuses some entries: `dead` ones for good (to the dead letters with the
    reason), `again` ones for now (written and hooked again later); the others of the batch are
    acknowledged. Any other exception retries the whole batch."""

    def __init__(self, dead: Mapping[str, str], again: Iterable[str] = ()) -> None:
        super().__init__(f"{len(dead)} entries refused by a hook, {len(set(again))} for now")
        self.dead = dict(dead)  # entry id -> why
        self.again = set(again)


RunsHook = Callable[[list[str]], None]
# called with the run ids whose `stored`/`store_failed` counters a batch moved, once they
# are written: the worker compacts the runs this completed (ledger/compaction.py `compact`)
on_runs_stored: list[RunsHook] = []
