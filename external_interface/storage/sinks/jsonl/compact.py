"""Compaction: rewrite a type's parts with the latest version of each key and nothing else.

Two passes over the committed lines (memory: one small tuple per key and one byte per line, not
the items): the first finds each key's winner (the highest version; the later line on a tie),
the second copies the winners, in their order, into new part files beside the old ones. The new journal is renamed
into place first (the commit point), then the new parts (store.py tells how a crash in between
is completed).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import orjson

from external_interface.storage.sinks.jsonl.history import HistoryWriter
from external_interface.storage.sinks.jsonl.read import Snapshot, key_of
from external_interface.storage.sinks.jsonl.store import (
    TMP_PREFIX,
    Group,
    Part,
    TypeStore,
    fsync_dir,
    part_name,
)


class _PartWriter:
    """New part files under temporary names, each within `max_bytes` (a longer line alone)."""

    def __init__(self, store: TypeStore, max_bytes: int, now: float) -> None:
        self.store, self.max_bytes, self.now = store, max_bytes, now
        self.files: list[tuple[Path, Part]] = []
        self._f: BinaryIO | None = None
        self._size = 0

    def add(self, data: bytes) -> None:
        if self._f is None or (self._size > 0 and self._size + len(data) > self.max_bytes):
            self._close()
            index = len(self.files)
            tmp = self.store.dir / f"{TMP_PREFIX}{index + 1}"
            self._f = f = open(tmp, "wb")  # noqa: SIM115 - closed in _close
            ino = os.fstat(f.fileno()).st_ino
            self.files.append((tmp, Part(part_name(self.store.name, index), ino, 0, self.now)))
            self._size = 0
        self._f.write(data)
        self._size += len(data)
        self.files[-1][1].end = self._size

    def _close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            f.flush()
            if self.store.fsync:
                os.fsync(f.fileno())
            f.close()

    def finish(self) -> list[Part]:
        self._close()
        return [part for _, part in self.files]

    def abort(self) -> None:
        self._close()
        for tmp, _ in self.files:
            tmp.unlink(missing_ok=True)


def compact(store: TypeStore, max_bytes: int, track: Sequence[str] = ()) -> int:
    """Keep the latest version of each key; -> lines dropped. The caller holds the type's
    lock and has refreshed `store` (the writer's view, whose `done` the new journal keeps).
    The `track`ed fields of the dropped lines go to the type's history file first (history.py)."""
    view = TypeStore(store.root, store.item_type, fsync=store.fsync, collect=True)
    view.refresh()  # under the caller's lock: the same files, with every line's group
    with Snapshot(view) as snap:
        best: dict[bytes, tuple[int, int]] = {}
        total = 0
        for line in snap.lines():
            total += 1
            k = key_of(orjson.loads(line.raw), snap.key, line.raw)
            seen = best.get(k)
            if seen is None or line.version >= seen[0]:
                best[k] = (line.version, line.seq)
        if len(best) == total:
            store.append_record({"clean": 1})
            store.dirty = False
            return 0
        writer = _PartWriter(store, max_bytes, time.time())
        kept_history = HistoryWriter(store, snap.key, track) if track else None
        groups: list[Group] = []
        keep = bytearray(total)  # one byte a line: the second pass parses nothing
        for _, seq in best.values():
            keep[seq] = 1
        try:
            for line in snap.lines():
                if not keep[line.seq]:
                    if kept_history is not None:
                        kept_history.dropped(line, orjson.loads(line.raw))
                    continue
                writer.add(line.raw + b"\n")
                head = [line.version, line.entry, line.run, line.step]
                if groups and groups[-1][:4] == head:
                    groups[-1][4] += 1
                else:
                    groups.append([*head, 1])
            parts = writer.finish()
            if kept_history is not None:
                kept_history.finish()  # before the commit point
        except BaseException:
            writer.abort()
            raise
    old = len(store.parts)
    store.key = snap.key
    store.write_base(parts, groups)  # the commit point
    for tmp, part in writer.files:
        os.replace(tmp, store.path(part))
    for index in range(len(parts), old):
        (store.dir / part_name(store.name, index)).unlink(missing_ok=True)
    if store.fsync:
        fsync_dir(store.dir)
    return total - len(best)
