"""The JSONL store's write path: one item type's folder (its part files, its journal, their
repair) and `JsonlWriter`, which writes each outbox entry's items once.

    <root>/<type>/<type>.jsonl        part 1: the items, one JSON object a line, nothing else
    <root>/<type>/<type>.2.jsonl      part 2, 3, ...: once a part is full (size or age)
    <root>/<type>/.journal            the bookkeeping, JSON lines (below)
    <root>/<type>/.lock               writers and readers of the type take turns on its flock

The journal says what the part files hold; a line of a part file counts only once the journal
says so. Its records:

    {"base": 1, "key": [...], "parts": [[name, inode, end, created], ...],
     "groups": [[version, entry, run, step, n], ...], "done": [entry, ...]}
    {"key": [...], "groups": [...], "parts": [[name, inode, end, created], ...]}
    {"clean": 1}

A *base* record starts a journal (a new type, a compaction, files adopted as they are). A
*commit* record follows every write: `groups` describe the lines it appended, in order (n lines
of one outbox entry, with its version, run and step), `parts` the parts it appended to with
their new committed ends. The groups of all records, in order, describe the lines of all parts,
in order: that is how a reader knows each line's entry, version and run without a byte of
bookkeeping in the user's file. `clean` says a compaction found nothing to drop.

Exactly once per outbox entry, although a file cannot upsert: a writer of a type (every thread
and process) holds the type's flock, reads the journal records it has not seen (`refresh`),
skips every entry already committed, appends the rest and commits them with one journal
record. The drainer acknowledges an entry only after `write` returned, so a redelivered entry
is either cut off with the uncommitted lines (a crash before the commit record) and written
whole, once, or found committed and skipped. Memory stays bounded by the drainer's horizon:
entries older than the oldest entry still in the stream are never delivered again, so their
ids are forgotten.

Crashes: a write appends its lines, fsyncs them, then appends and fsyncs its commit record;
lines past a part's committed end, a part file the journal does not know and a torn last
journal record are the leftovers of a write that never committed, cut or removed by the next
`refresh`. A compaction writes new part files and a new journal beside the old ones, renames the
journal into place (the commit point), then the parts; `refresh` completes the renames a crash
cut short (the journal names the inode each part must have). A part that is missing, replaced or
shorter than the journal says was changed by hand: the journal is rebuilt from the files as
they are (their lines count as the oldest version, run unknown), with a warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from external_interface.storage.sinks.base import (
    Origin,
    PermanentSinkError,
    Policies,
    SinkError,
    entry_version,
    key_values,
    safe_name,
)
from external_interface.storage.sinks.jsonl.legacy import legacy_files, legacy_lines

log = logging.getLogger("external_interface.storage.sinks.jsonl")

JOURNAL = ".journal"
LOCK = ".lock"
TMP_PREFIX = ".tmp-"  # a compaction's new parts and journal before they are renamed into place
DUMPS_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY  # an item as a line
MODES = ("latest", "append")
DUTY = 0.1  # the largest share of the time compaction may take

# [version, entry, run, step, n]: n consecutive lines of one outbox entry (entry "" for writes
# without one: their version is the time they were written, in nanoseconds)
Group = list[Any]


def part_name(type_name: str, index: int) -> str:
    """`demo.post.jsonl`, then `demo.post.2.jsonl`, `demo.post.3.jsonl`, ..."""
    return f"{type_name}.jsonl" if index == 0 else f"{type_name}.{index + 1}.jsonl"


def type_dir(root: Path | str, item_type: str) -> Path:
    return Path(root) / safe_name(item_type)


@dataclass
class Part:
    """A part file as the journal knows it: committed bytes end at `end`."""

    name: str
    ino: int
    end: int
    created: float

    def to_json(self) -> list[Any]:
        return [self.name, self.ino, self.end, self.created]


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dumps(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record) + b"\n"


@dataclass
class TypeStore:
    """What one process knows of a type's folder, as of its last `refresh`.

    Callers hold `locked()` around `refresh` and whatever they do next. A writer keeps one
    per type (`collect=False`: the groups are not kept, only what writing needs); a reader
    makes a fresh one with `collect=True` and reads every record's groups."""

    root: Path
    item_type: str
    fsync: bool = True
    collect: bool = False
    horizon: int | None = None  # entry version below which entries are never delivered again
    max_bytes: int = 64 * 1024 * 1024  # a part's size limit (the sink's)
    max_age: float = 3600.0  # a part's age limit (the sink's)
    name: str = ""
    dir: Path = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock)
    parts: list[Part] = field(default_factory=list)
    done: set[str] = field(default_factory=set)  # entries committed (at or after the horizon)
    key: list[str] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)  # collect=True only
    dirty: bool = False  # commits since the last compaction
    _jino: int | None = None
    _joff: int = 0

    def __post_init__(self) -> None:
        self.name = safe_name(self.item_type)
        self.dir = Path(self.root) / self.name

    @property
    def journal(self) -> Path:
        return self.dir / JOURNAL

    def path(self, part: Part) -> Path:
        return self.dir / part.name

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with self.lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            with _flock(self.dir / LOCK):
                yield

    # --- reading the journal -------------------------------------------------------------

    def refresh(self) -> None:
        """Learn what was committed since the last look (by anyone); repair crash leftovers."""
        try:
            st = os.stat(self.journal)
        except FileNotFoundError:
            self.adopt("")
            return
        full = st.st_ino != self._jino or st.st_size < self._joff
        if full:  # new to us, or replaced by a compaction: read it from the start
            self._jino, self._joff = st.st_ino, 0
            self.parts, self.groups, self.dirty = [], [], False  # `done` is kept: merged
        if st.st_size > self._joff and not self._read_journal():
            self.adopt(f"its journal is unreadable after byte {self._joff}")
            return
        self._repair(full)

    def _read_journal(self) -> bool:
        """Apply the records not read yet; -> False when a whole record is unreadable (the
        journal was damaged: only the last record can be torn by a crash, and it is cut)."""
        with open(self.journal, "rb") as f:
            f.seek(self._joff)
            data = f.read()
        pos = 0
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                break
            try:
                rec = orjson.loads(data[pos:nl])
                self._apply(rec)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                self._joff += pos
                return False
            pos = nl + 1
        self._joff += pos
        if pos < len(data):  # a crash while appending a record: that write never committed
            log.warning("jsonl %s: cutting a torn journal record", self.name)
            with open(self.journal, "r+b") as f:
                f.truncate(self._joff)
                if self.fsync:
                    os.fsync(f.fileno())
        return True

    def _apply(self, rec: dict[str, Any]) -> None:
        if "clean" in rec:
            self.dirty = False
            return
        groups = rec["groups"]
        if "base" in rec:
            self.parts = [Part(*p) for p in rec["parts"]]
            self.groups = list(groups) if self.collect else []
            self._remember(rec["done"])
            self.dirty = False
        else:
            for p in rec["parts"]:
                part = Part(*p)
                known = next((i for i, x in enumerate(self.parts) if x.name == part.name), None)
                if known is None:
                    self.parts.append(part)
                else:
                    self.parts[known] = part
            if self.collect:
                self.groups.extend(groups)
            self._remember(g[1] for g in groups if g[1])
            self.dirty = True
        self.key = list(rec["key"])

    def _remember(self, entries: Any) -> None:
        h = self.horizon
        self.done.update(e for e in entries if h is None or entry_version(e) >= h)

    def forget_before(self, version: int) -> None:
        """Entries older than `version` will never be delivered again (the drainer's horizon)."""
        self.horizon = version
        self.done = {e for e in self.done if entry_version(e) >= version}

    # --- repairs -------------------------------------------------------------------------

    def _repair(self, full: bool) -> None:
        for part in self.parts if full else self.parts[-2:]:
            path = self.path(part)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None
            if (st is None or st.st_ino != part.ino) and self._finish_rename(part):
                st = os.stat(path)
            if st is None or st.st_ino != part.ino:
                self.adopt(f"{part.name} was removed or replaced outside chaincrawl")
                return
            if st.st_size > part.end:
                log.warning("jsonl: cutting an unfinished write from %s at byte %d", path, part.end)
                with open(path, "r+b") as f:
                    f.truncate(part.end)
                    if self.fsync:
                        os.fsync(f.fileno())
            elif st.st_size < part.end:
                self.adopt(f"{part.name} is shorter than what was written to it")
                return
        for stray in self._strays(full):
            log.warning("jsonl: removing %s (left by a write that never committed)", stray)
            stray.unlink(missing_ok=True)

    def _finish_rename(self, part: Part) -> bool:
        """A compaction's journal names `part` with the inode of a new file it had not renamed
        into place yet when it stopped: rename it now."""
        for tmp in self.dir.glob(TMP_PREFIX + "*"):
            with contextlib.suppress(FileNotFoundError):
                if os.stat(tmp).st_ino == part.ino:
                    os.replace(tmp, self.path(part))
                    if self.fsync:
                        fsync_dir(self.dir)
                    return True
        return False

    def _strays(self, full: bool) -> list[Path]:
        """Part files the journal does not know (the next one only, unless `full`), and a
        compaction's leftovers (`full` only)."""
        known = {p.name for p in self.parts}
        nxt = self.dir / part_name(self.name, len(self.parts))
        if not full:
            return [nxt] if nxt.exists() else []
        pattern = re.compile(re.escape(self.name) + r"(\.[0-9]+)?\.jsonl")
        out = legacy_files(self.dir)  # converted already: the journal holds their items
        for path in self.dir.iterdir():
            if path.name.startswith(TMP_PREFIX) or (
                pattern.fullmatch(path.name) and path.name not in known
            ):
                out.append(path)
        return out

    def adopt(self, reason: str) -> None:
        """Make a new journal for the part files as they are (none for a new type), or for the
        earlier layout's files (legacy.py) when a folder without a journal holds them."""
        legacy = [] if reason else legacy_files(self.dir)
        if legacy:
            self._take_over(legacy)
            return
        if reason:
            log.warning(
                "jsonl %s: %s; its journal is rebuilt from the files as they are "
                "(their lines count as the oldest version)",
                self.name,
                reason,
            )
        parts: list[Part] = []
        groups: list[Group] = []
        for i in range(1_000_000):
            path = self.dir / part_name(self.name, i)
            if not path.exists():
                break
            data = path.read_bytes()
            end = data.rfind(b"\n") + 1
            if end < len(data):  # half a line at the end: no one can tell what it was
                with open(path, "r+b") as f:
                    f.truncate(end)
            n = data.count(b"\n", 0, end)
            st = os.stat(path)
            parts.append(Part(path.name, st.st_ino, end, st.st_mtime))
            if n:
                groups.append([0, "", "", "", n])
        self.write_base(parts, groups)

    def _take_over(self, files: list[Path]) -> None:
        log.warning("jsonl %s: converting %d file(s) of the earlier layout", self.name, len(files))
        lines, groups, self.key = legacy_lines(files)
        self.write_base([], [])
        if lines:
            self.append(lines, groups, self.key, now=time.time())
        for path in files:  # only once the journal holds their items
            path.unlink()
        if self.fsync:
            fsync_dir(self.dir)

    # --- writing -------------------------------------------------------------------------

    def write_base(self, parts: list[Part], groups: list[Group]) -> None:
        """Replace the journal by a base record (atomically: a new file renamed into place)."""
        rec = {
            "base": 1,
            "key": self.key,
            "parts": [p.to_json() for p in parts],
            "groups": groups,
            "done": sorted(self.done),
        }
        tmp = self.dir / f"{TMP_PREFIX}journal"
        data = dumps(rec)
        with open(tmp, "wb") as f:
            f.write(data)
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.journal)
        if self.fsync:
            fsync_dir(self.dir)
        self._jino, self._joff = os.stat(self.journal).st_ino, len(data)
        self.parts, self.dirty = parts, False
        self.groups = list(groups) if self.collect else []

    def append_record(self, rec: dict[str, Any]) -> None:
        """Append one record to the journal and fsync it: the commit point of a write."""
        data = dumps(rec)
        fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND)
        try:
            _write_all(fd, data)
            if self.fsync:
                os.fsync(fd)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size != self._joff + len(data):  # someone wrote without the lock: read it all again
            self._jino = None
        else:
            self._joff = size

    def append(
        self,
        lines: list[bytes],
        groups: list[Group],
        key: list[str],
        *,
        now: float,
    ) -> None:
        """Append `lines` (each ending in a newline) after the committed ends, starting a new
        part first when the last one is `max_age` old, and whenever the next line would take
        a part past `max_bytes` (a line larger than that gets a part of its own); then commit."""
        max_bytes, max_age = self.max_bytes, self.max_age
        plan: list[tuple[Part, bytearray]] = []
        last = self.parts[-1] if self.parts else None
        size = 0
        if last is not None and (last.end == 0 or now - last.created < max_age):
            plan.append((last, bytearray()))
            size = last.end
        for line in lines:
            if not plan or (size > 0 and size + len(line) > max_bytes):
                index = len(self.parts) + sum(1 for p, _ in plan if p is not last)
                plan.append((Part(part_name(self.name, index), 0, 0, now), bytearray()))
                size = 0
            plan[-1][1].extend(line)
            size += len(line)
        created_any = False
        for part, data in plan:
            if not data:
                continue
            new = part.ino == 0
            flags = os.O_WRONLY | (os.O_CREAT | os.O_TRUNC if new else os.O_APPEND)
            fd = os.open(self.path(part), flags, 0o644)
            try:
                _write_all(fd, bytes(data))
                if self.fsync:
                    os.fsync(fd)
                st = os.fstat(fd)
            finally:
                os.close(fd)
            part.ino, part.end = st.st_ino, st.st_size
            created_any = created_any or new
        if created_any and self.fsync:
            fsync_dir(self.dir)  # the new parts' names survive a crash before the journal does
        touched = [p for p, data in plan if data]
        self.append_record({"key": key, "groups": groups, "parts": [p.to_json() for p in touched]})
        self.parts += [p for p in touched if p is not last]
        self.key = key
        self.dirty = True
        if self.collect:
            self.groups.extend(groups)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class JsonlWriter:
    """JSON Lines files per item type, each outbox entry's items written once (module
    docstring); a type's files are compacted by `settle` in latest mode (the sink's
    `_rewrite`: a writer alone only appends)."""

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
        """The outbox is empty for now: compact each type written since its last compaction,
        once no write has come for `compact_after` seconds; compacting never takes more than
        a tenth of the time (`DUTY`)."""
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

    def _compact(self, st: TypeStore, quiet_for: float) -> int:
        started = time.monotonic()
        with st.locked():
            st.refresh()
            if not st.dirty:
                return 0
            if quiet_for and time.time() - os.stat(st.journal).st_mtime < quiet_for:
                return 0  # still being written: wait for a quiet moment
            dropped = self._rewrite(st)
        took = time.monotonic() - started
        self._next_compact[st.name] = time.monotonic() + took * (1 - DUTY) / DUTY
        if dropped:
            log.info(
                "jsonl %s: compacted, %d older version(s) dropped in %.2fs", st.name, dropped, took
            )
        return dropped

    def _rewrite(self, st: TypeStore) -> int:
        """Compact a type whose journal is locked and read; -> lines dropped."""
        return 0

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
