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

History: for tracked fields (`TypePolicy.track`, dotted paths allowed) a change appends
`{field, old, new, at, entry}` to `_history` (newest `history_limit` kept). The batch reads the
current documents first, and each update's filter pins the `_rev` it read: if another writer got
in between, the upsert turns into a duplicate-key error and that item is re-read and retried,
so no change is recorded twice or against the wrong old value. The whole array is `$set`
rather than `$push`ed: it works on every server speaking the wire protocol (nx-27017 stores
`$push`ed sub-documents as strings), and the `_rev` lock already serialises writers.
"""

from __future__ import annotations

import logging
import re
import threading
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
_MISSING = object()
_SCALARS = (str, int, float, datetime)  # bool is an int


@dataclass
class _Pending:
    key: tuple[Any, ...]
    doc: dict[str, Any]
    origin: Origin
    version: int | None


def collection_name(item_type: str, prefix: str = "") -> str:
    return prefix + re.sub(r"[^A-Za-z0-9_]", "_", item_type)


def _get(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return _MISSING
        doc = doc[part]
    return doc


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
            proj["_history"] = 1
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
        if ex is not None and policy.track:
            changes = []
            for path in policy.track:
                new = _get(p.doc, path)
                old = _get(ex, path)
                if new is _MISSING or new == old:
                    continue
                changes.append(
                    {
                        "field": path,
                        "old": None if old is _MISSING else old,
                        "new": new,
                        "at": now,
                        "entry": p.origin.entry,
                    }
                )
            if changes:
                history = list(ex.get("_history") or []) + changes
                fields["_history"] = history[-policy.history_limit :]
        query: dict[str, Any] = dict(zip(skeys, p.key, strict=True))
        query["_rev"] = rev if rev is not None else {"$exists": False}
        return UpdateOne(query, {"$set": fields, "$setOnInsert": {"_created_at": now}}, upsert=True)

    def _classify(self, coll: str, errors: list[dict[str, Any]]) -> SinkError:
        first = errors[0]
        msg = f"mongo {coll}: {len(errors)} write error(s), first: {first.get('code')}"
        msg += f" {first.get('errmsg')}"
        if any(err.get("code") in TRANSIENT_CODES for err in errors):
            return SinkError(msg, self.name)
        return PermanentSinkError(msg, self.name)
