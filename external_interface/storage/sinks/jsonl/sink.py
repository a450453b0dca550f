"""`JsonlSink`: writes each item type to its own files, once per outbox entry, and keeps the
latest version per key (or every write, in append mode).

Exactly once per outbox entry, although a file cannot upsert: a writer of a type (every thread
and process) holds the type's flock, reads the journal records it has not seen (`refresh`),
skips every entry already committed, appends the rest and commits them with one journal
record (store.py). The drainer acknowledges an entry only after `write` returned, so:

- a crash before the commit record: the lines are cut off by the next writer and the
  redelivered entry is written whole, once;
- a crash after the commit record but before the acknowledgement: the redelivered entry (or
  the one a second drainer claimed) is found committed and skipped.

Memory stays bounded by the drainer's *horizon* (`horizon`): entries older than the oldest entry
still in the stream can never be delivered again, so their ids are forgotten.

Latest version per key: a write appends, so a key stored again (the next run, an update within a
run) has two lines until the type is compacted. `settle()`, which the drainer calls whenever the
outbox is empty, compacts every type written since its last compaction once no write has
come for `compact_after` seconds; compacting never takes more than a tenth of the time. Readers
(`read_items`, `control.sh items`) always see one version per key. In append mode
(`CHAINCRAWL_JSONL_MODE=append`) the files keep every write and nothing is compacted.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from config import Settings
from external_interface.storage.sinks.base import (
    Origin,
    PermanentSinkError,
    Policies,
    SinkError,
    entry_version,
    key_values,
    safe_name,
)
from external_interface.storage.sinks.history import Version
from external_interface.storage.sinks.jsonl.compact import compact
from external_interface.storage.sinks.jsonl.history import history
from external_interface.storage.sinks.jsonl.read import DUMPS_OPTS
from external_interface.storage.sinks.jsonl.store import Group, TypeStore
from settings.storage import get_storage_settings

log = logging.getLogger("external_interface.storage.sinks.jsonl")

MODES = ("latest", "append")
DUTY = 0.1  # the largest share of the time compaction may take


class JsonlSink:
    """JSON Lines files per item type, idempotent per outbox entry (module docstring)."""

    name = "jsonl"

    def __init__(
        self,
        root: Path | str,
        *,
        max_bytes: int = 64 * 1024 * 1024,
        max_age: float = 3600.0,
        fsync: bool = True,
        mode: str = "latest",
        compact_after: float = 1.0,
        policies: Policies | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"jsonl mode {mode!r}: expected one of {', '.join(MODES)}")
        if max_bytes <= 0:
            raise ValueError(f"jsonl max_bytes must be positive, got {max_bytes}")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.fsync = fsync
        self.mode = mode
        self.compact_after = compact_after
        self.policies = policies or Policies()
        self._stores: dict[str, TypeStore] = {}
        self._stores_lock = threading.Lock()
        self._horizon: int | None = None  # entry version below which nothing is redelivered
        self._next_compact: dict[str, float] = {}

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

    # --- Sink ------------------------------------------------------------------------------

    def write(
        self,
        item_type: str,
        key_fields: list[str],
        items: list[dict[str, Any]],
        *,
        origins: Sequence[Origin] | None = None,
    ) -> None:
        if not items:
            return
        origins = list(origins) if origins is not None else [Origin()] * len(items)
        if len(origins) != len(items):
            raise ValueError("origins and items differ in length")
        for item in items:  # data errors before any I/O
            key_values(item, key_fields)
        st = self._store(item_type)
        try:
            with st.locked():
                st.refresh()
                todo = [i for i, o in enumerate(origins) if not o.entry or o.entry not in st.done]
                if not todo:
                    return
                now = time.time()
                lines = self._encode(items, todo)
                groups = _groups(origins, todo, time.time_ns())
                st.append(lines, groups, list(key_fields), now=now)
                st.done.update(origins[i].entry for i in todo if origins[i].entry)
        except OSError as e:  # disk full, permissions: the items wait in the outbox
            raise SinkError(f"jsonl {item_type}: {e}", self.name) from e

    def horizon(self, min_entry: str) -> None:
        """Entries older than `min_entry` will never be delivered again: forget their ids."""
        version = entry_version(min_entry)
        if self._horizon is not None and version <= self._horizon:
            return
        self._horizon = version
        for st in self._all_stores():
            with st.lock:
                st.forget_before(version)

    def settle(self) -> None:
        """The outbox is empty for now: compact what was written (module docstring)."""
        if self.mode != "latest":
            return
        for st in self._all_stores():
            if time.monotonic() < self._next_compact.get(st.name, 0.0):
                continue
            try:
                self._compact(st, quiet_for=self.compact_after)
            except OSError as e:
                log.warning("jsonl %s: compaction failed (%s); it is tried again later", st.name, e)
                self._next_compact[st.name] = time.monotonic() + 10.0

    def compact(self, item_type: str) -> int:
        """Compact one type now, whatever the mode; -> lines dropped."""
        return self._compact(self._store(item_type), quiet_for=0.0)

    def close(self) -> None:
        return None

    def history(self, item_type: str, key: Sequence[Any]) -> list[Version]:
        """The versions of the type's tracked fields for one key (`control.sh items --history`)."""
        return history(item_type, key, self.policies.for_type(item_type).track, self.root)

    # --- internals -------------------------------------------------------------------------

    def _compact(self, st: TypeStore, quiet_for: float) -> int:
        started = time.monotonic()
        with st.locked():
            st.refresh()
            if not st.dirty:
                return 0
            if quiet_for and time.time() - os.stat(st.journal).st_mtime < quiet_for:
                return 0  # still being written: wait for a quiet moment
            dropped = compact(st, self.max_bytes, self.policies.for_type(st.item_type).track)
        took = time.monotonic() - started
        self._next_compact[st.name] = time.monotonic() + took * (1 - DUTY) / DUTY
        if dropped:
            log.info(
                "jsonl %s: compacted, %d older version(s) dropped in %.2fs", st.name, dropped, took
            )
        return dropped

    def _store(self, item_type: str) -> TypeStore:
        name = safe_name(item_type)
        with self._stores_lock:
            st = self._stores.get(name)
            if st is None:
                st = TypeStore(
                    self.root,
                    item_type,
                    fsync=self.fsync,
                    horizon=self._horizon,
                    max_bytes=self.max_bytes,
                    max_age=self.max_age,
                )
                self._stores[name] = st
            return st

    def _all_stores(self) -> list[TypeStore]:
        with self._stores_lock:
            return list(self._stores.values())

    def _encode(self, items: list[dict[str, Any]], todo: list[int]) -> list[bytes]:
        try:
            return [orjson.dumps(items[i], option=DUMPS_OPTS) + b"\n" for i in todo]
        except TypeError as e:
            raise PermanentSinkError(f"jsonl: item is not JSON-serialisable: {e}", self.name) from e


def _groups(origins: list[Origin], todo: list[int], now_ns: int) -> list[Group]:
    """The journal's description of the lines written: consecutive lines of one origin."""
    groups: list[Group] = []
    last: Origin | None = None
    for i in todo:
        o = origins[i]
        if groups and o == last:
            groups[-1][4] += 1
            continue
        version = o.version if o.version is not None else now_ns
        groups.append([version, o.entry, o.run, o.step, 1])
        last = o
    return groups
