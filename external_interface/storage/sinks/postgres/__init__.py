"""The PostgreSQL sink, the full store: a table per item type (key columns and the item as
JSONB), field history as versioned rows, full-text search.

Modules: `schema` (tables, the version table and migrations, made by the sink itself), `sink`
(`PostgresSink`: upserts, history, search, reading). psycopg and psycopg_pool (the `postgres`
extra) are needed only when the sink is built.
"""

from __future__ import annotations

from external_interface.storage.sinks.postgres.sink import PostgresSink

__all__ = ["PostgresSink"]
