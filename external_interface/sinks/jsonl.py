"""JSON Lines sink: the embedded default, one directory per item type, rotating files.

Layout: `<root>/<type>/<seq>-<UTC created>.jsonl`,
e.g. `var/items/demo.post/000003-20250101T120000Z.jsonl`.
A write appends one line per item followed by one *commit line*, in a single `write()`, then
fsyncs:

    {"entry": "1700000000000-0", "run": "r1", "step": "feed", "task": "demo.h5.feed",
     "at": 1700000000.1, "key": [42], "item": {...}}
    {"commit": ["1700000000000-0"], "n": 1, "at": 1700000000.1}

Exactly once per outbox entry, although a file cannot upsert:
- The commit line lists the entry ids of the lines before it. A write returns (and the drainer
  acks the entry) only after the commit line is fsynced; lines after the last commit line are a
  torn write from a crash. They are ignored by readers and truncated by the next writer.
- Before appending, the writer (holding an flock on `<type>/.lock`, so writers in every process
  and thread take turns) reads the commit lines it has not seen yet and skips every entry already
  committed. A redelivered entry (crash after fsync but before XACK, or a second drainer that
  claimed it) is therefore written once.
- Memory and start-up cost stay bounded by the drainer's *horizon*: entries older than the
  oldest entry still in the stream can never be delivered again, so their ids are forgotten and
  files last modified before the horizon (minus `clock_skew`) are not read at all.
Readers (`read_items`) keep the latest version of each key: the highest entry id, so an old
entry that is written late (claimed after an outage) never hides a newer one.
"""

from __future__ import annotations

import calendar
import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from external_interface.storage import (
    Origin,
    PermanentSinkError,
    SinkError,
    entry_version,
    env_float,
    env_int,
    env_str,
    key_values,
    safe_name,
)

if TYPE_CHECKING:
    from config import Settings

log = logging.getLogger(__name__)

_COMMIT_PREFIX = b'{"commit":'
_DUMPS_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


@dataclass
class _TypeState:
    """What this process knows about one type's directory (guarded by `lock` + the flock)."""

    dir: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    committed: set[str] = field(default_factory=set)
    offsets: dict[str, int] = field(default_factory=dict)  # file -> end of last commit line


def _seq(path: Path) -> int:
    try:
        return int(path.name.split("-", 1)[0])
    except ValueError:
        return -1


def _created(path: Path) -> float:
    try:
        stamp = path.stem.split("-", 1)[1]
        return float(calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%SZ")))
    except (IndexError, ValueError):
        return path.stat().st_mtime


def _files(directory: Path) -> list[Path]:
    return sorted((p for p in directory.glob("*.jsonl") if _seq(p) >= 0), key=_seq)


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


class JsonlSink:
    """Append-only JSON Lines files per item type, idempotent per outbox entry."""

    name = "jsonl"

    def __init__(
        self,
        root: Path | str,
        *,
        max_bytes: int = 64 * 1024 * 1024,
        max_age: float = 3600.0,
        fsync: bool = True,
        clock_skew: float = 300.0,
    ) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.fsync = fsync
        self.clock_skew = clock_skew
        self._states: dict[str, _TypeState] = {}
        self._states_lock = threading.Lock()
        self._horizon: int | None = None  # entry version below which nothing is redelivered

    @classmethod
    def from_settings(cls, settings: Settings) -> JsonlSink:
        return cls(
            env_str("CHAINCRAWL_JSONL_DIR") or Path(settings.var_dir) / "items",
            max_bytes=env_int("CHAINCRAWL_JSONL_MAX_BYTES", 64 * 1024 * 1024),
            max_age=env_float("CHAINCRAWL_JSONL_MAX_AGE", 3600.0),
            fsync=env_str("CHAINCRAWL_JSONL_FSYNC", "1") not in ("0", "false", "no"),
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
        keys = [key_values(item, key_fields) for item in items]  # data errors before any I/O
        st = self._state(item_type)
        try:
            with st.lock, _flock(st.dir / ".lock"):
                newest = self._refresh(st)
                todo = [
                    i for i, o in enumerate(origins) if not o.entry or o.entry not in st.committed
                ]
                if not todo:
                    return
                now = time.time()
                data = self._encode(items, keys, origins, todo, now)
                if newest is None or self._should_rotate(newest, now):
                    newest = self._new_file(st, newest, now)
                end = self._append(newest, data)
                st.offsets[newest.name] = end
                st.committed.update(origins[i].entry for i in todo if origins[i].entry)
        except OSError as e:  # disk full, permissions: the items wait in the outbox
            raise SinkError(f"jsonl {item_type}: {e}", self.name) from e

    def horizon(self, min_entry: str) -> None:
        """Entries older than `min_entry` will never be delivered again: forget their ids."""
        version = entry_version(min_entry)
        if self._horizon is not None and version <= self._horizon:
            return
        self._horizon = version
        with self._states_lock:
            states = list(self._states.values())
        for st in states:
            with st.lock:
                st.committed = {e for e in st.committed if entry_version(e) >= version}

    def close(self) -> None:
        return None

    # --- internals -------------------------------------------------------------------------

    def _state(self, item_type: str) -> _TypeState:
        name = safe_name(item_type)
        with self._states_lock:
            st = self._states.get(name)
            if st is None:
                st = _TypeState(self.root / name)
                st.dir.mkdir(parents=True, exist_ok=True)
                self._states[name] = st
            return st

    def _refresh(self, st: _TypeState) -> Path | None:
        """Learn commits made since we last looked (by anyone); cut a torn tail. -> newest file."""
        files = _files(st.dir)
        newest = files[-1] if files else None
        min_mtime = None
        if self._horizon is not None:
            min_mtime = self._horizon / 1e9 - self.clock_skew  # version is ms * 1e6
        for path in files:
            size = path.stat().st_size
            seen = st.offsets.get(path.name)
            old = min_mtime is not None and path.stat().st_mtime < min_mtime
            if seen is None and path is not newest and old:
                continue  # written before the horizon: holds nothing redeliverable
            if seen is not None and seen >= size:
                continue
            self._scan(st, path, seen or 0)
        if newest is not None:
            good = st.offsets.get(newest.name, 0)
            if newest.stat().st_size > good:
                log.warning("jsonl: cutting a torn write from %s at byte %d", newest, good)
                with open(newest, "r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
        return newest

    def _scan(self, st: _TypeState, path: Path, offset: int) -> None:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
        pos, good = 0, offset
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                break
            line = data[pos:nl]
            pos = nl + 1
            if line.startswith(_COMMIT_PREFIX):
                try:
                    ids = orjson.loads(line)["commit"]
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    break  # garbage: what follows is not trusted
                st.committed.update(e for e in ids if e)
                good = offset + pos
        st.offsets[path.name] = good

    def _encode(
        self,
        items: list[dict[str, Any]],
        keys: list[tuple[Any, ...]],
        origins: list[Origin],
        todo: list[int],
        now: float,
    ) -> bytes:
        lines = []
        try:
            for i in todo:
                o = origins[i]
                rec = {
                    "entry": o.entry or None,
                    "run": o.run,
                    "step": o.step,
                    "task": o.task,
                    "at": now,
                    "key": list(keys[i]),
                    "item": items[i],
                }
                lines.append(orjson.dumps(rec, option=_DUMPS_OPTS))
        except TypeError as e:
            raise PermanentSinkError(f"jsonl: item is not JSON-serialisable: {e}", self.name) from e
        entries = list(dict.fromkeys(origins[i].entry for i in todo if origins[i].entry))
        lines.append(orjson.dumps({"commit": entries, "n": len(todo), "at": now}))
        return b"\n".join(lines) + b"\n"

    def _should_rotate(self, path: Path, now: float) -> bool:
        return path.stat().st_size >= self.max_bytes or now - _created(path) >= self.max_age

    def _new_file(self, st: _TypeState, newest: Path | None, now: float) -> Path:
        seq = _seq(newest) + 1 if newest is not None else 1
        path = st.dir / f"{seq:06d}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(fd)
        if self.fsync:
            dfd = os.open(st.dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        st.offsets[path.name] = 0
        return path

    def _append(self, path: Path, data: bytes) -> int:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if self.fsync:
                os.fsync(fd)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)


# --- reading -----------------------------------------------------------------------------


def default_root() -> Path:
    from config import get_settings

    return Path(env_str("CHAINCRAWL_JSONL_DIR") or Path(get_settings().var_dir) / "items")


def iter_records(item_type: str, root: Path | str | None = None) -> Iterator[dict[str, Any]]:
    """Every committed line record of a type, oldest file first (torn tails skipped)."""
    directory = Path(root or default_root()) / safe_name(item_type)
    if not directory.is_dir():
        return
    for path in _files(directory):
        block: list[dict[str, Any]] = []
        for line in path.read_bytes().split(b"\n"):
            if not line:
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                break
            if "commit" in rec:
                yield from block
                block = []
            else:
                block.append(rec)


def record_version(rec: dict[str, Any]) -> int:
    """Entry id order (commit order in Redis); direct writes fall back to their write time."""
    return entry_version(rec["entry"]) if rec.get("entry") else int(rec["at"] * 1e9)


def read_items(item_type: str, root: Path | str | None = None) -> list[dict[str, Any]]:
    """The latest version of every item of a type, one per unique key, oldest first."""
    latest: dict[bytes, tuple[int, dict[str, Any]]] = {}
    for rec in iter_records(item_type, root):
        k = orjson.dumps(rec["key"], option=_DUMPS_OPTS)
        v = record_version(rec)
        if k not in latest or v >= latest[k][0]:
            latest[k] = (v, rec["item"])
    return [item for _, item in sorted(latest.values(), key=lambda p: p[0])]
