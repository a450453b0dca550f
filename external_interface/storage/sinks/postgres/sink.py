"""`PostgresSink`: the full store. A table per item type, upserts by key, field history as
versioned rows, full-text search over the fields a type names.

Exactly once: every row carries `_version`, its outbox entry's version; the upsert changes a
row only when the incoming version is newer (`ON CONFLICT ... WHERE _version < EXCLUDED`), so a
redelivered entry changes nothing and an entry stored late never overwrites newer data.

History: for the type's tracked fields (`Item.history_fields`), each chunk's transaction locks
the stored rows of its keys (`FOR UPDATE`, keys in order), and records an observation (key,
field, value, version, valid_from) for each value that differs from the one before it; an
observation is keyed by (key, field, version), so recording it twice changes nothing. The
`__versions` view (and `history()`) collapse them into intervals (sinks.history).

Errors: a connection that fails, a pool with no connection within the timeout, a deadlock or a
table dropped under the sink are `SinkError`s (the drainer backs off, the items wait in the
outbox); data PostgreSQL refuses (`DataError`: a number out of range, ...) is a
`PermanentSinkError` (dead letter). NUL characters, which PostgreSQL text cannot hold, are
stored as U+2400 (as key sanitising does for MongoDB). The connection string is a secret: it
is never logged, and error texts are redacted.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from exceptions import ConfigError
from external_interface.storage.sinks.base import (
    SANITIZE_MAP,
    Origin,
    PermanentSinkError,
    Policies,
    SinkError,
    key_values,
)
from external_interface.storage.sinks.history import (
    MISSING,
    Observation,
    Version,
    field_value,
    key_text,
    version_of,
    version_time,
    versions,
)
from external_interface.storage.sinks.postgres import schema
from external_interface.storage.sinks.postgres.schema import RESERVED, KeyFieldsChanged, Table, sql
from settings.storage import get_storage_settings
from utils.logsafe import redact

if TYPE_CHECKING:
    from psycopg import Connection, Cursor

    from config import Settings

log = logging.getLogger("external_interface.storage.sinks.postgres")

NUL = "\x00"
_SCALARS = (str, int, float, datetime)  # bool is an int


@dataclass
class _Row:
    key: tuple[str, ...]
    doc: dict[str, Any]
    json: str
    version: int
    origin: Origin


def _no_nul(value: Any) -> Any:
    """`value` with NUL in every string (keys too) replaced: PostgreSQL text cannot hold it."""
    if isinstance(value, str):
        return value.replace(NUL, SANITIZE_MAP[NUL])
    if isinstance(value, dict):
        return {_no_nul(str(k)): _no_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nul(v) for v in value]
    return value


class PostgresSink:
    """Upserts into a table per item type; history and search (module docstring)."""

    name = "postgres"

    def __init__(
        self,
        url: str,
        *,
        policies: Policies | None = None,
        schema_name: str = "public",
        table_prefix: str = "items_",
        pool_size: int = 4,
        timeout: float = 5.0,
        batch: int = 1000,
        text_search: str = "simple",
    ) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool, PoolTimeout
        except ImportError as e:  # optional dependency
            raise ConfigError(
                "the postgres sink needs psycopg: pip install -r requirements/postgres.txt"
            ) from e
        if not url:
            raise ConfigError("the postgres sink needs CHAINCRAWL_POSTGRES_URL")
        self._psycopg = psycopg
        self._pool_timeout = PoolTimeout
        self.policies = policies or Policies()
        self.schema = schema_name
        self.table_prefix = table_prefix
        self.timeout = timeout
        self.batch = max(1, batch)
        self.text_search = text_search
        # No connection is made here: the pool opens on first use, so an outage at start-up
        # is a SinkError on write (retried by the drainer), not a crash.
        self.pool = ConnectionPool(
            url,
            min_size=0,
            max_size=pool_size,
            timeout=timeout,
            open=False,
            name="chaincrawl-postgres",
            check=ConnectionPool.check_connection,
            # give up reconnecting in the background after `timeout`: its backoff would
            # otherwise grow to minutes during an outage; the drainer's next write asks again
            reconnect_timeout=timeout,
            kwargs={
                "connect_timeout": max(1, math.ceil(timeout)),
                "application_name": "chaincrawl",
            },
        )
        self._opened = False
        self._migrated = False
        self._tables: dict[str, tuple[tuple[Any, ...], Table]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, policies: Policies | None = None) -> PostgresSink:
        ss = get_storage_settings()
        return cls(
            ss.postgres_url,
            policies=policies,
            schema_name=ss.postgres_schema,
            table_prefix=ss.postgres_table_prefix,
            pool_size=ss.postgres_pool,
            timeout=ss.postgres_timeout,
            batch=ss.postgres_batch,
            text_search=ss.postgres_text_search,
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
        rows = self._rows(item_type, key_fields, items, origins)  # data errors before any I/O
        policy = self.policies.for_type(item_type)
        with self._errors(item_type), self._conn() as conn:
            t = self._table(conn, item_type, key_fields, policy.track, policy.search)
            for start in range(0, len(rows), self.batch):
                with conn.transaction(), conn.cursor() as cur:
                    self._write_chunk(cur, t, rows[start : start + self.batch])

    def close(self) -> None:
        with self._lock:
            if self._opened:
                self.pool.close()
                self._opened = False

    # --- reading (control.sh items --search / --history) -----------------------------------

    def search(self, item_type: str, query: str, limit: int = 20) -> list[dict[str, Any]]:
        """Items whose search fields match `query` (web search syntax: words, "a phrase",
        -word, or), best first; each is the stored item."""
        with self._errors(item_type), self._conn() as conn, conn.cursor() as cur:
            t = self._registered(cur, item_type)
            if not t.search:
                raise ConfigError(
                    f"item type {item_type!r} names no search fields (Item.search_fields, "
                    "CHAINCRAWL_SEARCH_FIELDS)"
                )
            cur.execute(
                sql.SQL(
                    "SELECT doc FROM {items}, websearch_to_tsquery({cfg}::regconfig, %s) q "
                    "WHERE _search @@ q ORDER BY ts_rank(_search, q) DESC, {keys} LIMIT %s"
                ).format(
                    items=t.items, cfg=sql.Literal(self._ts_config(cur, item_type)), keys=t.keys
                ),
                (query, limit),
            )
            return [row[0] for row in cur.fetchall()]

    def history(self, item_type: str, key: Sequence[Any]) -> list[Version]:
        """The versions of the type's tracked fields for one key, per field, oldest first."""
        with self._errors(item_type), self._conn() as conn, conn.cursor() as cur:
            t = self._registered(cur, item_type)
            if len(key) != len(t.key_fields):
                raise ConfigError(f"{item_type}: its key is {list(t.key_fields)}, got {list(key)}")
            where = sql.SQL(" AND ").join(
                sql.SQL("{} = %s").format(sql.Identifier(k)) for k in t.key_fields
            )
            cur.execute(
                sql.SQL(
                    "SELECT field, value, version, entry FROM {} WHERE {} ORDER BY version"
                ).format(t.history, where),
                [key_text(k) for k in key],
            )
            obs = [Observation(f, v, int(ver), e) for f, v, ver, e in cur.fetchall()]
        return versions(tuple(key), obs)

    def count(self, item_type: str, run: str | None = None) -> int:
        """Rows of a type (of one run: the rows whose latest write that run made)."""
        with self._errors(item_type), self._conn() as conn, conn.cursor() as cur:
            t = self._registered(cur, item_type)
            q = sql.SQL("SELECT count(*) FROM {}").format(t.items)
            if run is not None:
                q = q + sql.SQL(" WHERE _run = %s")
            cur.execute(q, (run,) if run is not None else ())
            row = cur.fetchone()
            return int(row[0]) if row else 0

    def item_types(self) -> list[str]:
        with self._errors("*"), self._conn() as conn, conn.cursor() as cur:
            return schema.types(cur, self.schema)

    # --- internals -------------------------------------------------------------------------

    @contextmanager
    def _conn(self) -> Iterator[Connection[Any]]:
        with self._lock:
            if not self._opened:
                self.pool.open(wait=False)
                self._opened = True
        with self.pool.connection() as conn:
            yield conn

    @contextmanager
    def _errors(self, item_type: str) -> Iterator[None]:
        """psycopg's errors as the sink's (module docstring); texts redacted."""
        errors = self._psycopg.errors
        try:
            yield
        except KeyFieldsChanged as e:  # configuration: the items wait until it is fixed
            raise SinkError(f"postgres {item_type}: {e}", self.name) from e
        except self._pool_timeout as e:
            msg = f"postgres {item_type}: no connection within {self.timeout:g}s ({e})"
            raise SinkError(redact(msg), self.name) from e
        except (errors.UndefinedTable, errors.UndefinedColumn) as e:
            with self._lock:  # dropped under us: made again by the next write
                self._tables.pop(item_type, None)
                self._migrated = False
            raise SinkError(redact(f"postgres {item_type}: {e}"), self.name) from e
        except errors.DataError as e:
            raise PermanentSinkError(redact(f"postgres {item_type}: {e}"), self.name) from e
        except self._psycopg.Error as e:
            msg = f"postgres {item_type}: {type(e).__name__}: {e}"
            raise SinkError(redact(msg), self.name) from e

    def _rows(
        self,
        item_type: str,
        key_fields: list[str],
        items: list[dict[str, Any]],
        origins: list[Origin],
    ) -> list[_Row]:
        clash = RESERVED.intersection(key_fields)
        if clash:
            raise PermanentSinkError(
                f"postgres {item_type}: key field(s) {sorted(clash)} are names the sink uses",
                self.name,
            )
        rows = []
        for item, origin in zip(items, origins, strict=True):
            values = key_values(item, key_fields)
            if not all(isinstance(v, _SCALARS) for v in values):
                raise PermanentSinkError(f"key values must be scalars, got {values!r}", self.name)
            try:
                data = orjson.dumps(item, option=orjson.OPT_NON_STR_KEYS)
            except TypeError as e:
                raise PermanentSinkError(f"postgres {item_type}: {e}", self.name) from e
            key = tuple(key_text(v) for v in values)
            if b"\\u0000" in data or any(NUL in k for k in key):
                item = _no_nul(item)
                data = orjson.dumps(item, option=orjson.OPT_NON_STR_KEYS)
                key = tuple(k.replace(NUL, SANITIZE_MAP[NUL]) for k in key)
            rows.append(_Row(key, item, data.decode(), version_of(origin), origin))
        return rows

    def _table(
        self,
        conn: Connection[Any],
        item_type: str,
        key_fields: Sequence[str],
        track: Sequence[str],
        search: Sequence[str],
    ) -> Table:
        """The type's tables, made or migrated once per process (and again when the type's
        declaration changes)."""
        want = (tuple(key_fields), tuple(track), tuple(search), self.text_search)
        known = self._tables.get(item_type)
        if known is not None and known[0] == want:
            return known[1]
        with conn.transaction(), conn.cursor() as cur:
            if not self._migrated:
                schema.migrate_sink(cur, self.schema)
            t = schema.ensure_type(
                cur,
                self.schema,
                self.table_prefix,
                item_type,
                key_fields,
                track,
                search,
                self.text_search,
            )
        with self._lock:
            self._migrated = True
            self._tables[item_type] = (want, t)
        return t

    def _registered(self, cur: Cursor[Any], item_type: str) -> Table:
        t = schema.registered(cur, self.schema, item_type)
        if t is None:
            raise ConfigError(f"the postgres store holds no item type {item_type!r}")
        return t

    def _ts_config(self, cur: Cursor[Any], item_type: str) -> str:
        cur.execute(
            sql.SQL("SELECT text_search FROM {}.{} WHERE item_type = %s").format(
                sql.Identifier(self.schema), sql.Identifier(schema.TYPES_TABLE)
            ),
            (item_type,),
        )
        row = cur.fetchone()
        return str(row[0]) if row and row[0] else self.text_search

    def _write_chunk(self, cur: Cursor[Any], t: Table, chunk: list[_Row]) -> None:
        chunk = sorted(chunk, key=lambda r: (r.key, r.version))  # lock order: no deadlocks
        latest: dict[tuple[str, ...], _Row] = {}
        for r in chunk:
            latest[r.key] = r  # the highest version of each key (the later row on a tie)
        if t.track:
            self._record_history(cur, t, chunk, list(latest))
        cols = sql.SQL(", ").join(
            [
                *(sql.Identifier(k) for k in t.key_fields),
                *map(
                    sql.Identifier,
                    ("doc", "_version", "_entry", "_run", "_step", "_task", "_fetched_at"),
                ),
            ]
        )
        marks = sql.SQL(", ").join(
            [sql.Placeholder()] * len(t.key_fields)
            + [sql.SQL("%s::jsonb")]
            + [sql.Placeholder()] * 6
        )
        upsert = sql.SQL(
            "INSERT INTO {items} AS t ({cols}) VALUES ({marks}) ON CONFLICT ({keys}) DO UPDATE "
            "SET doc = EXCLUDED.doc, _version = EXCLUDED._version, _entry = EXCLUDED._entry, "
            "_run = EXCLUDED._run, _step = EXCLUDED._step, _task = EXCLUDED._task, "
            "_fetched_at = EXCLUDED._fetched_at, _updated_at = now() "
            "WHERE t._version < EXCLUDED._version"
        ).format(items=t.items, cols=cols, marks=marks, keys=t.keys)
        cur.executemany(
            upsert,
            [
                (
                    *r.key,
                    r.json,
                    r.version,
                    r.origin.entry,
                    r.origin.run,
                    r.origin.step,
                    r.origin.task,
                    version_time(r.version),
                )
                for r in latest.values()
            ],
        )

    def _record_history(
        self, cur: Cursor[Any], t: Table, chunk: list[_Row], keys: list[tuple[str, ...]]
    ) -> None:
        """Observations of the chunk's tracked values that differ from the value before them
        (module docstring); the stored rows of the keys are locked until the commit."""
        n = len(t.key_fields)
        cur.execute(
            sql.SQL(
                "SELECT {keys}, _version, _entry, doc FROM {items} WHERE ({keys}) IN "
                "(SELECT * FROM unnest({arrays})) ORDER BY {keys} FOR UPDATE"
            ).format(
                keys=t.keys,
                items=t.items,
                arrays=sql.SQL(", ").join([sql.SQL("%s::text[]")] * n),
            ),
            [[k[i] for k in keys] for i in range(n)],
        )
        stored = {tuple(row[:n]): (int(row[n]), row[n + 1], row[n + 2]) for row in cur.fetchall()}
        out: list[tuple[Any, ...]] = []

        def add(key: tuple[str, ...], o: Observation) -> None:
            value = orjson.dumps(o.value, option=orjson.OPT_NON_STR_KEYS).decode()
            out.append((*key, o.field, value, o.version, version_time(o.version), o.entry))

        prev: dict[tuple[tuple[str, ...], str], Any] = {}
        for r in chunk:  # in key, then version order
            at_version, at_entry, doc = stored.get(r.key, (None, "", None))
            for f in t.track:
                v = field_value(r.doc, f)
                if v is MISSING:
                    continue
                o = Observation(f, v, r.version, r.origin.entry)
                if at_version is not None and r.version <= at_version:
                    add(r.key, o)  # late or redelivered: its place is found when read
                    continue
                before = prev.get((r.key, f), MISSING)
                if before is MISSING and doc is not None:
                    before = field_value(doc, f)
                    if before is not MISSING and before != v:  # the stored value's own start
                        add(r.key, Observation(f, before, at_version or 0, at_entry))
                if before is MISSING or before != v:
                    add(r.key, o)
                prev[(r.key, f)] = v
        if out:
            cols = sql.SQL(", ").join(
                [
                    *(sql.Identifier(k) for k in t.key_fields),
                    *map(sql.Identifier, ("field", "value", "version", "valid_from", "entry")),
                ]
            )
            marks = sql.SQL(", ").join(
                [sql.Placeholder()] * (n + 1) + [sql.SQL("%s::jsonb")] + [sql.Placeholder()] * 3
            )
            cur.executemany(
                sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT DO NOTHING").format(
                    t.history, cols, marks
                ),
                out,
            )
