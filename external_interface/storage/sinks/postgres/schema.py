"""The postgres sink's schema: made and migrated by the sink itself, recorded in a version table.

    chaincrawl_schema         component -> version: `sink` (the shared tables), `type:<item type>`
    chaincrawl_types          item type -> its table, key fields, history and search fields
    items_<type>              key columns (text) + `doc` (the item, JSONB) + bookkeeping:
                              `_version` (outbox entry), `_entry`, `_run`, `_step`, `_task`,
                              `_fetched_at`, `_created_at`, `_updated_at`; `_search` (tsvector,
                              GIN) when the type names search fields
    items_<type>__history     observations of the tracked fields: key, field, value (JSONB),
                              version, valid_from, entry
    items_<type>__versions    a view: the history as versions (valid_from, valid_to)

Every change runs in one transaction holding an advisory lock of the schema, so any number of
processes may start at once. A migration is a numbered step of a component (`SINK_STEPS`,
`TYPE_STEPS`): the version table says which ran; a later release appends steps. The search
column follows the type's declared fields: when they change, it is rebuilt (generated from
`doc`, so nothing is rewritten by hand).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

try:
    from psycopg import sql
    from psycopg.types.json import Jsonb
except ImportError:  # the `postgres` extra is not installed: building the sink says so
    sql = Jsonb = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from psycopg import Cursor

VERSION_TABLE = "chaincrawl_schema"
TYPES_TABLE = "chaincrawl_types"
RESERVED = frozenset(
    (
        "doc",
        "_version",
        "_entry",
        "_run",
        "_step",
        "_task",
        "_fetched_at",
        "_created_at",
        "_updated_at",
        "_search",
    )
)
MAX_IDENT = 63  # PostgreSQL's identifier length


@dataclass(frozen=True)
class Table:
    """One item type's tables as the sink uses them."""

    schema: str
    name: str
    key_fields: tuple[str, ...]
    track: tuple[str, ...]
    search: tuple[str, ...]

    @property
    def items(self) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(self.name))

    @property
    def history(self) -> sql.Composed:
        return sql.SQL("{}.{}").format(
            sql.Identifier(self.schema), sql.Identifier(self.name + "__history")
        )

    @property
    def versions(self) -> sql.Composed:
        return sql.SQL("{}.{}").format(
            sql.Identifier(self.schema), sql.Identifier(self.name + "__versions")
        )

    @property
    def keys(self) -> sql.Composed:
        return sql.SQL(", ").join(sql.Identifier(k) for k in self.key_fields)


def table_name(item_type: str, prefix: str, taken: Callable[[str], bool] | None = None) -> str:
    """`demo.post` -> `items_demo_post`; a long name, or one another type has, gets a hash."""
    base = prefix + re.sub(r"[^a-z0-9_]", "_", item_type.lower())
    digest = hashlib.blake2b(item_type.encode(), digest_size=4).hexdigest()
    limit = MAX_IDENT - len("__versions")
    if len(base) > limit or (taken is not None and taken(base)):
        base = f"{base[: limit - 9]}_{digest}"
    return base


def _ident(schema: str, name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


def lock(cur: Cursor[Any], schema: str) -> None:
    """Serialise schema changes across processes for the rest of the transaction."""
    cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"chaincrawl.sink.{schema}",))


def _version(cur: Cursor[Any], schema: str, component: str) -> int:
    cur.execute(
        sql.SQL("SELECT version FROM {} WHERE component = %s").format(
            _ident(schema, VERSION_TABLE)
        ),
        (component,),
    )
    row = cur.fetchone()
    return int(row[0]) if row else 0


def _set_version(cur: Cursor[Any], schema: str, component: str, version: int) -> None:
    cur.execute(
        sql.SQL(
            "INSERT INTO {} (component, version) VALUES (%s, %s) ON CONFLICT (component) "
            "DO UPDATE SET version = EXCLUDED.version, migrated_at = now()"
        ).format(_ident(schema, VERSION_TABLE)),
        (component, version),
    )


# --- the shared tables ---------------------------------------------------------------------


def _sink_v1(cur: Cursor[Any], schema: str) -> None:
    cur.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (item_type text PRIMARY KEY, "
            "table_name text UNIQUE NOT NULL, key_fields jsonb NOT NULL, "
            "history_fields jsonb NOT NULL DEFAULT '[]', search_fields jsonb NOT NULL "
            "DEFAULT '[]', text_search text NOT NULL DEFAULT '', "
            "created_at timestamptz NOT NULL DEFAULT now(), "
            "updated_at timestamptz NOT NULL DEFAULT now())"
        ).format(_ident(schema, TYPES_TABLE))
    )


SINK_STEPS: list[Callable[[Cursor[Any], str], None]] = [_sink_v1]


def migrate_sink(cur: Cursor[Any], schema: str) -> None:
    """The schema, the version table and the shared tables, up to the last step."""
    cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    lock(cur, schema)
    cur.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (component text PRIMARY KEY, version int NOT NULL, "
            "migrated_at timestamptz NOT NULL DEFAULT now())"
        ).format(_ident(schema, VERSION_TABLE))
    )
    have = _version(cur, schema, "sink")
    for n, step in enumerate(SINK_STEPS[have:], have + 1):
        step(cur, schema)
        _set_version(cur, schema, "sink", n)


# --- one item type's tables ----------------------------------------------------------------


def _type_v1(cur: Cursor[Any], t: Table) -> None:
    keys = [sql.SQL("{} text NOT NULL").format(sql.Identifier(k)) for k in t.key_fields]
    cur.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ({}, doc jsonb NOT NULL, _version bigint NOT NULL, "
            "_entry text NOT NULL DEFAULT '', _run text NOT NULL DEFAULT '', "
            "_step text NOT NULL DEFAULT '', _task text NOT NULL DEFAULT '', "
            "_fetched_at timestamptz NOT NULL, _created_at timestamptz NOT NULL DEFAULT now(), "
            "_updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY ({}))"
        ).format(t.items, sql.SQL(", ").join(keys), t.keys)
    )
    cur.execute(
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (_run)").format(
            sql.Identifier(t.name + "__run"), t.items
        )
    )
    cur.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ({}, field text NOT NULL, value jsonb, "
            "version bigint NOT NULL, valid_from timestamptz NOT NULL, "
            "entry text NOT NULL DEFAULT '', PRIMARY KEY ({}, field, version))"
        ).format(t.history, sql.SQL(", ").join(keys), t.keys)
    )
    # versions: consecutive observations of one value collapse; each lasts until the next
    cur.execute(
        sql.SQL(
            "CREATE OR REPLACE VIEW {versions} AS SELECT {keys}, field, value, valid_from, "
            "lead(valid_from) OVER (PARTITION BY {keys}, field ORDER BY version) AS valid_to, "
            "entry, version FROM (SELECT h.*, lag(value) OVER (PARTITION BY {keys}, field "
            "ORDER BY version) AS prev, row_number() OVER (PARTITION BY {keys}, field "
            "ORDER BY version) AS n FROM {history} h) o WHERE n = 1 OR prev IS DISTINCT FROM value"
        ).format(versions=t.versions, keys=t.keys, history=t.history)
    )


TYPE_STEPS: list[Callable[[Cursor[Any], Table], None]] = [_type_v1]


def _search_expr(fields: Sequence[str], config: str) -> sql.Composed:
    parts = [
        sql.SQL("coalesce(doc #>> {}, '')").format(sql.Literal("{" + ",".join(f.split(".")) + "}"))
        for f in fields
    ]
    return sql.SQL("to_tsvector({}::regconfig, {})").format(
        sql.Literal(config), sql.SQL(" || ' ' || ").join(parts)
    )


def _sync_search(cur: Cursor[Any], t: Table, config: str, had: bool) -> None:
    """(Re)build the generated search column and its GIN index for `t.search`."""
    index = sql.Identifier(t.name + "__search")
    if had:
        cur.execute(sql.SQL("DROP INDEX IF EXISTS {}.{}").format(sql.Identifier(t.schema), index))
        cur.execute(sql.SQL("ALTER TABLE {} DROP COLUMN IF EXISTS _search").format(t.items))
    if t.search:
        cur.execute(
            sql.SQL(
                "ALTER TABLE {} ADD COLUMN _search tsvector GENERATED ALWAYS AS ({}) STORED"
            ).format(t.items, _search_expr(t.search, config))
        )
        cur.execute(sql.SQL("CREATE INDEX {} ON {} USING gin (_search)").format(index, t.items))


def ensure_type(
    cur: Cursor[Any],
    schema: str,
    prefix: str,
    item_type: str,
    key_fields: Sequence[str],
    track: Sequence[str],
    search: Sequence[str],
    text_search: str,
) -> Table:
    """The type's tables, made or migrated to match its declaration (in the caller's
    transaction). A type whose key fields changed is refused: its rows could not be found."""
    lock(cur, schema)
    types = _ident(schema, TYPES_TABLE)
    cur.execute(
        sql.SQL(
            "SELECT table_name, key_fields, history_fields, search_fields, text_search "
            "FROM {} WHERE item_type = %s"
        ).format(types),
        (item_type,),
    )
    row = cur.fetchone()
    if row is None:

        def taken(name: str) -> bool:
            cur.execute(sql.SQL("SELECT 1 FROM {} WHERE table_name = %s").format(types), (name,))
            return cur.fetchone() is not None

        name = table_name(item_type, prefix, taken)
        cur.execute(
            sql.SQL(
                "INSERT INTO {} (item_type, table_name, key_fields) VALUES (%s, %s, %s)"
            ).format(types),
            (item_type, name, Jsonb(list(key_fields))),
        )
        row = (name, list(key_fields), [], [], "")
    name, have_keys, _have_track, have_search, have_ts = row
    if list(have_keys) != list(key_fields):
        raise KeyFieldsChanged(
            f"item type {item_type!r} is stored by key {have_keys} in table {name}, now its key "
            f"is {list(key_fields)}: move its rows to a new type (or drop the table)"
        )
    t = Table(schema, name, tuple(key_fields), tuple(track), tuple(search))
    component = f"type:{item_type}"
    have = _version(cur, schema, component)
    for n, step in enumerate(TYPE_STEPS[have:], have + 1):
        step(cur, t)
        _set_version(cur, schema, component, n)
    wanted_ts = text_search if search else ""
    if list(have_search) != list(search) or have_ts != wanted_ts:
        _sync_search(cur, t, text_search, had=bool(have_search))
    cur.execute(
        sql.SQL(
            "UPDATE {} SET history_fields = %s, search_fields = %s, text_search = %s, "
            "updated_at = now() WHERE item_type = %s"
        ).format(types),
        (Jsonb(list(track)), Jsonb(list(search)), wanted_ts, item_type),
    )
    return t


def registered(cur: Cursor[Any], schema: str, item_type: str) -> Table | None:
    """The type's tables as the sink made them (readers: the CLI), or None."""
    cur.execute("SELECT to_regclass(%s)", (sql.Identifier(schema, TYPES_TABLE).as_string(cur),))
    found = cur.fetchone()
    if not found or found[0] is None:
        return None
    cur.execute(
        sql.SQL(
            "SELECT table_name, key_fields, history_fields, search_fields FROM {} "
            "WHERE item_type = %s"
        ).format(_ident(schema, TYPES_TABLE)),
        (item_type,),
    )
    row = cur.fetchone()
    if row is None:
        return None
    name, keys, track, search = row
    return Table(schema, name, tuple(keys), tuple(track), tuple(search))


def types(cur: Cursor[Any], schema: str) -> list[str]:
    cur.execute("SELECT to_regclass(%s)", (sql.Identifier(schema, TYPES_TABLE).as_string(cur),))
    found = cur.fetchone()
    if not found or found[0] is None:
        return []
    cur.execute(
        sql.SQL("SELECT item_type FROM {} ORDER BY item_type").format(_ident(schema, TYPES_TABLE))
    )
    return [r[0] for r in cur.fetchall()]


class KeyFieldsChanged(Exception):
    """A type's key fields differ from the ones its table was made with."""
