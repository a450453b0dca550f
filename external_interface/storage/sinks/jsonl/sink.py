"""`JsonlSink`: the JSONL store's writer (store.py: each outbox entry's items written once) with
its settings, its compaction and its history.

Latest version per key: a write appends, so a key stored again (the next run, an update within a
run) has two lines until the type is compacted. `settle()`, which the drainer calls whenever the
outbox is empty, compacts every type written since its last compaction once no write has
come for `compact_after` seconds (compact.py); compacting never takes more than a tenth of the
time. Readers (`read_items`, `control.sh items`) always see one version per key. In append mode
(`CHAINCRAWL_JSONL_MODE=append`) the files keep every write and nothing is compacted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from config import Settings
from external_interface.storage.sinks.base import Policies
from external_interface.storage.sinks.history import Version
from external_interface.storage.sinks.jsonl.compact import compact
from external_interface.storage.sinks.jsonl.history import history
from external_interface.storage.sinks.jsonl.store import MODES, JsonlWriter, TypeStore
from settings.storage import get_storage_settings

__all__ = ["MODES", "JsonlSink"]


class JsonlSink(JsonlWriter):
    """JSON Lines files per item type, idempotent per outbox entry (store.py), one version per
    key in latest mode (module docstring)."""

    @classmethod
    def from_settings(cls, settings: Settings, policies: Policies | None = None) -> JsonlSink:
        ss = get_storage_settings()
        return cls(
            policies=policies,
            root=ss.jsonl_root(settings.var_dir),
            max_bytes=ss.jsonl_max_bytes,
            max_age=ss.jsonl_max_age,
            fsync=ss.jsonl_fsync,
            mode=ss.jsonl_mode,
        )

    def compact(self, item_type: str) -> int:
        """Compact one type now, whatever the mode; -> lines dropped."""
        return self._compact(self._store(item_type), quiet_for=0.0)

    def close(self) -> None:
        return None

    def history(self, item_type: str, key: Sequence[Any]) -> list[Version]:
        """The versions of the type's tracked fields for one key (`control.sh items --history`)."""
        return history(item_type, key, self.policies.for_type(item_type).track, self.root)

    def _rewrite(self, st: TypeStore) -> int:
        return compact(st, self.max_bytes, self.policies.for_type(st.item_type).track)
