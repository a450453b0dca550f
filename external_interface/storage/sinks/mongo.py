"""MongoDB sink: hot storage, one collection per item type, bulk upserts by the unique key.

- Collection: the item type with every character outside `[A-Za-z0-9_]` replaced by `_`
  (`demo.post` -> `demo_post`), after an optional `CHAINCRAWL_MONGO_COLLECTION_PREFIX`.
- A unique index on the type's key fields is created before the first write.
- Field names are sanitised (`sinks.base.sanitize_keys`: leading `$` -> U+FF04 full-width dollar,
  `.` -> U+FF0E full-width stop, NUL -> U+2400), so nothing from page content is ever read as
  an operator or a path.
- Each document carries bookkeeping fields: `_v` (version: the outbox entry id as an integer),
  `_rev` (a write counter used as an optimistic lock), `_entry`, `_run`, `_step`, `_task`,
  `_created_at`, `_updated_at`, and `_history` when the type tracks fields. Item fields with
  these names are rejected (pydantic models cannot declare leading-underscore fields anyway),
  and so are key values that are not scalars (a key is a string, number or date).

Exactly once: the write is an upsert keyed by the unique key, guarded by the version. A
document whose `_v` is already >= the entry's version is left alone, so a redelivered entry
(same version) changes nothing and an old entry arriving late (claimed after an outage) never
overwrites newer data. Within one batch the latest version of each key wins.

History: for tracked fields (`Item.history_fields`, `TypePolicy.track`, dotted paths allowed)
`_history` holds observations `{field, value, at, v, entry}`: the first value of each field, then
each value that differs from the stored one (`at`: the entry's time, `v`: its version; newest
`history_limit` kept per field); `history()` reads them as versions with their intervals
(sinks.history). Documents written before this layout hold `{field, old, new, at, entry}`
changes: they are read (and rewritten on the next change) as observations, the first `old`
at `_created_at`. The batch reads the current documents first, and each update's filter pins
the `_rev` it read: if another writer got in between, the upsert turns into a duplicate-key
error and that item is re-read and retried, so no change is recorded twice or against the
wrong old value. The whole array is `$set` rather than `$push`ed: it works on every server
speaking the wire protocol (nx-27017 stores `$push`ed sub-documents as strings), and the `_rev`
lock already serialises writers.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from exceptions import ConfigError
from external_interface.storage.sinks.base import (
    Origin,
    PermanentSinkError,
    Policies,
    SinkError,
    TypePolicy,
    key_values,
    sanitize_key,
    sanitize_keys,
)
from external_interface.storage.sinks.history import (
    MISSING,
    Observation,
    Version,
    field_value,
    version_time,
    versions,
)
from settings.storage import get_storage_settings

if TYPE_CHECKING:
    import pymongo.collection

    from config import Settings

log = logging.getLogger(__name__)

RESERVED = frozenset(
    (
        "_id",
        "_v",
        "_rev",
        "_entry",
        "_run",
        "_step",
        "_task",
        "_created_at",
        "_updated_at",
        "_history",
    )
)
MAX_ROUNDS = 5  # re-reads after write conflicts before giving up (and retrying later)

# Server error codes that mean "try again later" rather than "this document is bad".
TRANSIENT_CODES = frozenset(
    (6, 7, 8, 50, 89, 91, 112, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436)
)
_SCALARS = (str, int, float, datetime)  # bool is an int


@dataclass
class _Pending:
    key: tuple[Any, ...]
    doc: dict[str, Any]
    origin: Origin
    version: int | None


def collection_name(item_type: str, prefix: str = "") -> str:
    return prefix + re.sub(r"[^A-Za-z0-9_]", "_", item_type)


def _obs(path: str, value: Any, version: int, entry: str) -> dict[str, Any]:
    return {
        "field": path,
        "value": value,
        "at": version_time(version),
        "v": version,
        "entry": entry,
    }


def _legacy(doc: dict[str, Any]) -> bool:
    return any("new" in h and "value" not in h for h in doc.get("_history") or ())


def _observations(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A document's `_history` as observations; the earlier layout's changes converted."""
    out: list[dict[str, Any]] = []
    started: set[str] = set()
    for h in doc.get("_history") or ():
        if "value" in h:
            out.append(dict(h))
            started.add(h["field"])
            continue
        at = h.get("at")
        v = int(at.timestamp() * 1e9) if isinstance(at, datetime) else 0
        if h["field"] not in started:
            created = doc.get("_created_at")
            c = int(created.timestamp() * 1e9) if isinstance(created, datetime) else 0
            out.append(_obs(h["field"], h.get("old"), min(c, v), ""))
            started.add(h["field"])
        out.append(_obs(h["field"], h.get("new"), v, h.get("entry") or ""))
    return out


def _limit(history: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The newest `limit` observations of each field, in order."""
    count: dict[str, int] = {}
    keep = []
    for h in reversed(history):
        n = count[h["field"]] = count.get(h["field"], 0) + 1
        if n <= limit:
            keep.append(h)
    return keep[::-1]


def _typed(text: Any) -> Any:
    """A key value typed on the command line as text: a JSON number stays a number."""
    if isinstance(text, str):
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
        return value if isinstance(value, int | float) else text
    return text


def _kid(values: Sequence[Any]) -> bytes:
    return orjson.dumps(list(values), option=orjson.OPT_NON_STR_KEYS, default=str)


class MongoSink:
    """Bulk upserts into one collection per item type, versioned by outbox entry id."""

    name = "mongo"

    def __init__(
        self,
        url: str,
        database: str | None = None,
        *,
        policies: Policies | None = None,
        batch: int = 1000,
        timeout: float = 5.0,
        collection_prefix: str = "",
    ) -> None:
        import pymongo
        from pymongo.uri_parser import parse_uri

        if not url:
            raise ConfigError("the mongo sink needs MONGO_URL")
        self.url = url
        self.database = database or parse_uri(url).get("database") or "chaincrawl"
        self.policies = policies or Policies()
        self.batch = batch
        self.collection_prefix = collection_prefix
        ms = int(timeout * 1000)
        # No connection is made here: pymongo connects on first use, so an outage at start-up
        # becomes a SinkError on write (retried by the drainer), not a crash.
        self.client: pymongo.MongoClient = pymongo.MongoClient(
            url,
            serverSelectionTimeoutMS=ms,
            connectTimeoutMS=ms,
            socketTimeoutMS=max(ms * 6, 30_000),
            tz_aware=True,
            appname="chaincrawl",
        )
        self.db = self.client[self.database]
        self._indexed: set[tuple[str, tuple[str, ...]]] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, policies: Policies | None = None) -> MongoSink:
        ss = get_storage_settings()
        return cls(
            settings.mongo_url,
            ss.mongo_db or None,
            policies=policies,
            batch=ss.mongo_batch,
            timeout=ss.mongo_timeout,
            collection_prefix=ss.mongo_collection_prefix,
        )

    def collection(self, item_type: str) -> pymongo.collection.Collection:
        return self.db[collection_name(item_type, self.collection_prefix)]

    # --- Sink ------------------------------------------------------------------------------

    def write(
        self,
        item_type: str,
        key_fields: list[str],
        items: list[dict[str, Any]],
        *,
        origins: Sequence[Origin] | None = None,
    ) -> None:
        from pymongo.errors import DocumentTooLarge, InvalidDocument, PyMongoError

        if not items:
            return
        origins = list(origins) if origins is not None else [Origin()] * len(items)
        skeys = [sanitize_key(k) for k in key_fields]
        pending = self._collapse(items, origins, skeys)
        policy = self.policies.for_type(item_type)
        try:
            coll = self._ensure_index(item_type, skeys)
            for start in range(0, len(pending), self.batch):
                self._write_chunk(coll, skeys, pending[start : start + self.batch], policy)
        except (InvalidDocument, DocumentTooLarge) as e:
            raise PermanentSinkError(f"mongo {item_type}: {e}", self.name) from e
        except PyMongoError as e:
            raise SinkError(f"mongo {item_type}: {type(e).__name__}: {e}", self.name) from e

    def close(self) -> None:
        self.client.close()

    # --- internals -------------------------------------------------------------------------

    def _collapse(
        self, items: list[dict[str, Any]], origins: list[Origin], skeys: list[str]
    ) -> list[_Pending]:
        """Sanitise; keep one document per key, the latest version (later position on ties)."""
        latest: dict[bytes, _Pending] = {}
        for item, origin in zip(items, origins, strict=True):
            doc = sanitize_keys(item)
            clash = RESERVED.intersection(doc)
            if clash:
                raise PermanentSinkError(f"item uses reserved field(s) {sorted(clash)}", self.name)
            key = key_values(doc, skeys)
            if not all(isinstance(v, _SCALARS) for v in key):
                raise PermanentSinkError(f"key values must be scalars, got {key!r}", self.name)
            p = _Pending(key, doc, origin, origin.version)
            prev = latest.get(_kid(key))
            if prev is None or (p.version or 0) >= (prev.version or 0):
                latest[_kid(key)] = p
        return list(latest.values())

    def _ensure_index(self, item_type: str, skeys: list[str]) -> pymongo.collection.Collection:
        coll = self.collection(item_type)
        marker = (coll.name, tuple(skeys))
        if marker in self._indexed:
            return coll
        with self._lock:
            if marker not in self._indexed:
                spec = [(k, 1) for k in skeys]
                have = any(
                    list(ix["key"].items()) == spec and ix.get("unique")
                    for ix in coll.list_indexes()
                )
                if not have:
                    coll.create_index(spec, unique=True, name="uniq_" + "_".join(skeys))
                self._indexed.add(marker)
        return coll

    def _fetch(
        self,
        coll: pymongo.collection.Collection,
        skeys: list[str],
        chunk: list[_Pending],
        policy: TypePolicy,
    ) -> dict[bytes, dict[str, Any]]:
        proj = dict.fromkeys([*skeys, "_v", "_rev"], 1)
        if policy.track:
            proj.update(dict.fromkeys([p.split(".")[0] for p in policy.track], 1))
            proj.update(_history=1, _created_at=1, _entry=1)
        if len(skeys) == 1:
            query: dict[str, Any] = {skeys[0]: {"$in": [p.key[0] for p in chunk]}}
        else:
            query = {"$or": [dict(zip(skeys, p.key, strict=True)) for p in chunk]}
        return {_kid([doc.get(k) for k in skeys]): doc for doc in coll.find(query, proj)}

    def _write_chunk(
        self,
        coll: pymongo.collection.Collection,
        skeys: list[str],
        chunk: list[_Pending],
        policy: TypePolicy,
    ) -> None:
        from pymongo.errors import BulkWriteError

        for _ in range(MAX_ROUNDS):
            existing = self._fetch(coll, skeys, chunk, policy)
            now = datetime.now(UTC)
            ops, op_items = [], []
            for p in chunk:
                ex = existing.get(_kid(p.key))
                if ex is not None and p.version is not None:
                    stored = ex.get("_v")
                    if isinstance(stored, int) and stored >= p.version:
                        continue  # this entry (or a newer one) is already stored
                ops.append(self._update(p, ex, skeys, policy, now))
                op_items.append(p)
            if not ops:
                return
            try:
                coll.bulk_write(ops, ordered=False)
                return
            except BulkWriteError as e:
                errors = e.details.get("writeErrors", [])
                other = [err for err in errors if err.get("code") != 11000]
                if other:
                    raise self._classify(coll.name, other) from e
                if e.details.get("writeConcernErrors"):
                    raise SinkError(f"mongo {coll.name}: write concern failed", self.name) from e
                # Someone wrote these keys since we read them: re-read and decide again.
                chunk = [op_items[err["index"]] for err in errors]
        raise SinkError(f"mongo {coll.name}: write conflicts kept recurring", self.name)

    def _update(
        self,
        p: _Pending,
        ex: dict[str, Any] | None,
        skeys: list[str],
        policy: TypePolicy,
        now: datetime,
    ) -> Any:
        from pymongo import UpdateOne

        rev = ex.get("_rev") if ex is not None else None
        fields = dict(p.doc)
        fields["_rev"] = (rev if isinstance(rev, int) else 0) + 1
        fields["_updated_at"] = now
        if p.version is not None:
            fields["_v"] = p.version
        if p.origin.entry or p.origin.run:
            fields.update(
                _entry=p.origin.entry, _run=p.origin.run, _step=p.origin.step, _task=p.origin.task
            )
        if policy.track:
            history = self._observe(p, ex, policy)
            if history is not None:
                fields["_history"] = history
        query: dict[str, Any] = dict(zip(skeys, p.key, strict=True))
        query["_rev"] = rev if rev is not None else {"$exists": False}
        return UpdateOne(query, {"$set": fields, "$setOnInsert": {"_created_at": now}}, upsert=True)

    def _observe(
        self, p: _Pending, ex: dict[str, Any] | None, policy: TypePolicy
    ) -> list[dict[str, Any]] | None:
        """The document's `_history` with this write's observations, or None: no change."""
        history = _observations(ex) if ex is not None else []
        version = p.version if p.version is not None else time.time_ns()
        added = False
        for path in policy.track:
            new = field_value(p.doc, path)
            if new is MISSING:
                continue
            last = next((h for h in reversed(history) if h["field"] == path), None)
            old = field_value(ex, path) if ex is not None else MISSING
            if last is None and ex is not None and old is not MISSING:
                # tracked since the document was stored: its value then starts the history
                at_v = ex.get("_v")
                last = _obs(
                    path, old, at_v if isinstance(at_v, int) else 0, str(ex.get("_entry") or "")
                )
                history.append(last)
                added = True
            if last is not None and last["value"] == new:
                continue
            history.append(_obs(path, new, version, p.origin.entry))
            added = True
        if not added and not (ex is not None and _legacy(ex)):
            return None
        return _limit(history, policy.history_limit)

    def history(self, item_type: str, key: Sequence[Any]) -> list[Version]:
        """The versions of the type's tracked fields for one key (`control.sh items --history`):
        a key given as text also finds a number (`5`)."""
        from pymongo.errors import PyMongoError

        coll = self.collection(item_type)
        try:
            index = next(
                (ix for ix in coll.list_indexes() if ix.get("unique") and ix["name"] != "_id_"),
                None,
            )
            if index is None:
                return []
            skeys = list(index["key"])
            if len(skeys) != len(key):
                raise ConfigError(f"{item_type}: its key is {skeys}, got {list(key)}")
            proj = {"_history": 1, "_created_at": 1}
            doc = coll.find_one(dict(zip(skeys, key, strict=True)), proj)
            if doc is None:
                typed = [_typed(k) for k in key]
                doc = coll.find_one(dict(zip(skeys, typed, strict=True)), proj)
        except PyMongoError as e:
            raise SinkError(f"mongo {item_type}: {type(e).__name__}: {e}", self.name) from e
        if doc is None:
            return []
        obs = [
            Observation(h["field"], h["value"], int(h["v"]), h.get("entry") or "")
            for h in _observations(doc)
        ]
        return versions(tuple(key), obs)

    def _classify(self, coll: str, errors: list[dict[str, Any]]) -> SinkError:
        first = errors[0]
        msg = f"mongo {coll}: {len(errors)} write error(s), first: {first.get('code')}"
        msg += f" {first.get('errmsg')}"
        if any(err.get("code") in TRANSIENT_CODES for err in errors):
            return SinkError(msg, self.name)
        return PermanentSinkError(msg, self.name)
