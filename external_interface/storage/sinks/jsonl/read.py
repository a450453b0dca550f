"""Reading the JSONL store: the lines of a type with what the journal knows of each.

A reader takes the type's lock only long enough to read the journal and open the part files;
it then reads the committed bytes of the files it opened. Writers only append past those
bytes, and a compaction writes new files, so what a reader opened stays what it read.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from config import get_settings
from external_interface.storage.sinks.jsonl.store import DUMPS_OPTS, JOURNAL, Group, TypeStore
from external_interface.storage.sinks.jsonl.store import type_dir as _type_dir
from settings.storage import get_storage_settings

_CHUNK = 1 << 20


def default_root() -> Path:
    return get_storage_settings().jsonl_root(get_settings().var_dir)


@dataclass(frozen=True)
class Line:
    """One stored line: the item's bytes and what the journal says of it."""

    raw: bytes  # without the newline
    seq: int  # position in the type's lines, from 0
    version: int
    entry: str
    run: str
    step: str

    def item(self) -> dict[str, Any]:
        return orjson.loads(self.raw)


class Snapshot:
    """A type's committed lines as they were when it was opened (a context manager)."""

    def __init__(self, store: TypeStore) -> None:
        self.key = list(store.key)
        self.clean = not store.dirty  # one line per key: nothing to drop
        self.groups: list[Group] = store.groups
        self.files: list[tuple[Path, int, int]] = []  # path, descriptor, committed end
        for part in store.parts:
            path = store.path(part)
            fd = os.open(path, os.O_RDONLY)
            self.files.append((path, fd, part.end))

    def close(self) -> None:
        for _, fd, _ in self.files:
            os.close(fd)
        self.files = []

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def paths(self) -> list[Path]:
        return [p for p, _, _ in self.files]

    def raw_lines(self) -> Iterator[bytes]:
        """Every committed line, parts in order (re-iterable: each call reads again)."""
        for _, fd, end in self.files:
            pos, rest = 0, b""
            while pos < end:
                chunk = os.pread(fd, min(_CHUNK, end - pos), pos)
                if not chunk:
                    break
                pos += len(chunk)
                pieces = (rest + chunk).split(b"\n")
                rest = pieces.pop()
                yield from pieces
            if rest:
                yield rest

    def lines(self) -> Iterator[Line]:
        """Every committed line with its entry, version, run and step."""
        groups = iter(self.groups)
        left, g = 0, None
        for seq, raw in enumerate(self.raw_lines()):
            while left == 0:
                g = next(groups, None)
                if g is None:  # more lines than the journal describes: should not happen
                    g, left = [0, "", "", "", 1 << 62], 1 << 62
                else:
                    left = int(g[4])
            left -= 1
            assert g is not None
            yield Line(raw, seq, int(g[0]), g[1], g[2], g[3])


def open_snapshot(item_type: str, root: Path | str | None = None) -> Snapshot | None:
    """The type's lines as of now, or None when the store has no such type."""
    store = TypeStore(Path(root or default_root()), item_type, collect=True)
    if not store.dir.is_dir():
        return None
    with store.locked():
        store.refresh()
        return Snapshot(store)


def item_types(root: Path | str | None = None) -> list[str]:
    """The item types the store holds (folder names, which are the types' safe names)."""
    base = Path(root or default_root())
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / JOURNAL).is_file())


def type_dir(item_type: str, root: Path | str | None = None) -> Path:
    return _type_dir(root or default_root(), item_type)


def type_files(item_type: str, root: Path | str | None = None) -> list[Path]:
    """The files holding a type's items, in order (none when it has no items yet)."""
    snap = open_snapshot(item_type, root)
    if snap is None:
        return []
    with snap:
        return [p for p, _, end in snap.files if end > 0]


def key_of(item: dict[str, Any], key_fields: list[str], raw: bytes) -> bytes:
    """A line's identity: its key values; the whole line when a key field is missing."""
    try:
        values = [item[k] for k in key_fields] if key_fields else None
    except KeyError:
        values = None
    data = orjson.dumps(values, option=DUMPS_OPTS) if values is not None else raw
    return hashlib.blake2b(data, digest_size=16).digest()


def latest_lines(snap: Snapshot, run: str | None = None) -> list[tuple[Line, dict[str, Any]]]:
    """The latest version of each key (highest version; the later line on a tie), in the
    order of the lines; with `run`, among the lines that run stored."""
    best: dict[bytes, tuple[Line, dict[str, Any]]] = {}
    for line in snap.lines():
        if run is not None and line.run != run:
            continue
        item = line.item()
        k = key_of(item, snap.key, line.raw)
        seen = best.get(k)
        if seen is None or line.version >= seen[0].version:
            best[k] = (line, item)
    return sorted(best.values(), key=lambda pair: pair[0].seq)


def iter_records(item_type: str, root: Path | str | None = None) -> Iterator[dict[str, Any]]:
    """Every committed line of a type as {"item", "key", "entry", "version", "run", "step"},
    in order (an append-mode store keeps every write; a compacted one, one line per key)."""
    snap = open_snapshot(item_type, root)
    if snap is None:
        return
    with snap:
        for line in snap.lines():
            item = line.item()
            key = [item.get(k) for k in snap.key]
            yield {
                "item": item,
                "key": key,
                "entry": line.entry,
                "version": line.version,
                "run": line.run,
                "step": line.step,
            }


def read_items(
    item_type: str, root: Path | str | None = None, *, run: str | None = None
) -> list[dict[str, Any]]:
    """The latest version of every item of a type, one per key, in stored order."""
    snap = open_snapshot(item_type, root)
    if snap is None:
        return []
    with snap:
        return [item for _, item in latest_lines(snap, run)]
