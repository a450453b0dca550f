"""Field history in the JSONL store: what compaction drops of the tracked fields is kept.

A type's lines already hold every write until they are compacted (and for ever in append
mode). Before compaction drops a key's older lines, it appends their tracked fields'
values to the type's history file, one record a dropped line:

    <root>/<type>/.history     {"k": [key values], "v": version, "e": entry, "f": {field: value}}

The records are appended and fsynced before the compaction's commit point; a compaction cut
short by a crash leaves records of lines still in the parts, which count once (an observation
is identified by its key, field and version). A reader (`history`) joins the history file
with the lines of the key still stored and collapses the observations into versions
(sinks.history). Writing costs nothing: only compaction, which reads the lines anyway, writes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from external_interface.storage.sinks.history import (
    Observation,
    Version,
    key_text,
    observe,
    versions,
)
from external_interface.storage.sinks.jsonl.read import (
    DUMPS_OPTS,
    Line,
    default_root,
    open_snapshot,
)
from external_interface.storage.sinks.jsonl.store import TypeStore, type_dir

HISTORY = ".history"


class HistoryWriter:
    """Appends the tracked values of dropped lines during one compaction."""

    def __init__(self, store: TypeStore, key_fields: Sequence[str], track: Sequence[str]) -> None:
        self.store, self.key_fields, self.track = store, list(key_fields), list(track)
        self._buf = bytearray()
        self._fd: int | None = None

    def dropped(self, line: Line, item: dict[str, Any]) -> None:
        values = {}
        for o in observe(item, self.track, line.version, line.entry):
            values[o.field] = o.value
        if not values:
            return
        rec = {
            "k": [item.get(k) for k in self.key_fields],
            "v": line.version,
            "e": line.entry,
            "f": values,
        }
        self._buf += orjson.dumps(rec, option=DUMPS_OPTS) + b"\n"
        if len(self._buf) >= 1 << 20:
            self._flush()

    def _flush(self) -> None:
        if not self._buf:
            return
        if self._fd is None:
            path = self.store.dir / HISTORY
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        view = memoryview(bytes(self._buf))
        while view:
            view = view[os.write(self._fd, view) :]
        self._buf.clear()

    def finish(self) -> None:
        """Everything written and fsynced: call before the compaction's commit point."""
        self._flush()
        if self._fd is not None:
            if self.store.fsync:
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None


def _matches(values: Iterable[Any], key: Sequence[str]) -> bool:
    return [key_text(v) for v in values] == list(key)


def history(
    item_type: str,
    key: Sequence[Any],
    fields: Sequence[str] = (),
    root: Path | str | None = None,
) -> list[Version]:
    """The versions of one key's tracked fields: `fields`, and every field the history file
    recorded. A key is matched as text (`key_text`), so `5` finds the number 5."""
    want = [key_text(k) for k in key]
    obs: list[Observation] = []
    recorded: list[str] = []
    path = type_dir(root or default_root(), item_type) / HISTORY
    snap = open_snapshot(item_type, root)  # under the type's lock: the history file is whole
    if snap is None:
        return []
    with snap:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        for raw in data.splitlines():
            try:
                rec = orjson.loads(raw)
            except orjson.JSONDecodeError:  # a compaction cut short mid-record
                continue
            if not _matches(rec["k"], want):
                continue
            for f, v in rec["f"].items():
                obs.append(Observation(f, v, int(rec["v"]), rec.get("e") or ""))
                if f not in recorded:
                    recorded.append(f)
        track = list(dict.fromkeys([*fields, *recorded]))
        for line in snap.lines():
            item = line.item()
            if _matches((item.get(k) for k in snap.key), want):
                obs += observe(item, track, line.version, line.entry)
    return versions(tuple(key), obs)
