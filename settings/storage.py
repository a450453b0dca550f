"""Settings of the outbox drainer, the sinks and per-type routing (`CHAINCRAWL_*`).

The core storage settings (`SINKS`, `MONGO_URL`, `OUTBOX_BATCH`, ...) are fields of
`config.Settings`; these are the ones only the drainer and the sinks read. An empty variable
counts as unset here, as it always has for these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from settings.base import ChaincrawlSettings


class StorageSettings(ChaincrawlSettings):
    """Routing, outbox claiming and backoff, and each sink's options."""

    model_config = SettingsConfigDict(env_ignore_empty=True)

    # --- routing (external_interface/storage/routing.py) ------------------------------------------
    sink_routes: str = Field(
        "",
        description="Sinks per item type, over SINKS: `demo.post=jsonl,mongo;shop.*=mongo` "
        "(fnmatch patterns; docs/storage.md).",
    )
    track_history: str = Field(
        "",
        description="Fields whose versions the sinks keep (field history; over an item "
        "type's `history_fields`): `demo.post=likes,comments`.",
    )
    search_fields: str = Field(
        "",
        description="Fields the `postgres` sink indexes for full-text search (over an item "
        "type's `search_fields`): `demo.post=title,content`.",
    )

    # --- the drainer (external_interface/storage/outbox) ------------------------------------------
    outbox_claim_idle: float = Field(
        60.0,
        description="Seconds an entry stays pending with a drainer before another one claims "
        "it (the first drainer died); drainers look every quarter of it, up to every "
        "`CLAIM_IDLE` while idle ([storage](storage.md)).",
    )
    outbox_max_backoff: float = Field(
        30.0, description="Longest wait between two attempts to store a batch while a sink is down."
    )

    # --- jsonl ----------------------------------------------------------------------------
    jsonl_dir: Path | None = Field(
        None,
        description="Directory of the JSON Lines sink; empty: `items/` under VAR_DIR.",
        json_schema_extra={"shown_default": "VAR_DIR/items"},
    )
    jsonl_mode: Literal["latest", "append"] = Field(
        "latest",
        description="`latest`: a type's file holds the latest version of each key (older "
        "versions are compacted away once writes pause); `append`: every write stays.",
    )
    jsonl_max_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="A JSONL part file never grows past this size (a longer item gets a part of "
        "its own); the next item starts the next part.",
    )
    jsonl_max_age: float = Field(
        3600.0, description="...and a write starts a new part when the last one is this old (s)."
    )
    jsonl_fsync: bool = Field(
        True, description="fsync each write before the entry is acknowledged (0 for tests only)."
    )

    # --- mongo (the URL is MONGO_URL) -----------------------------------------------------
    mongo_db: str = Field(
        "", description="Database; empty: the one in MONGO_URL, else `chaincrawl`."
    )
    mongo_batch: int = Field(1000, description="Documents per bulk write.")
    mongo_timeout: float = Field(
        5.0, description="Seconds for server selection and connecting (socket: 6x, >= 30 s)."
    )
    mongo_collection_prefix: str = Field(
        "", description="Prefix of every collection name (`demo_post` -> `<prefix>demo_post`)."
    )

    # --- http -----------------------------------------------------------------------------
    http_sink_url: str = Field("", description="URL the `http` sink POSTs batches to.")
    http_sink_token: str = Field("", description="Bearer token of the `http` sink (a secret).")
    http_sink_timeout: float = Field(10.0, description="Seconds per POST.")
    http_sink_retries: int = Field(3, description="Attempts per chunk before the entry waits.")
    http_sink_batch: int = Field(500, description="Items per POST.")

    # --- kafka ----------------------------------------------------------------------------
    kafka_bootstrap: str = Field("", description="Bootstrap servers of the `kafka` sink.")
    kafka_topic_prefix: str = Field(
        "chaincrawl.", description="Topic of an item type: this prefix + the type."
    )
    kafka_timeout: float = Field(10.0, description="Seconds a write waits for acknowledgements.")

    # --- postgres (external_interface/storage/sinks/postgres) ----------------------------
    postgres_url: str = Field(
        "",
        description="Connection string of the `postgres` sink (`postgresql://user:pass@host/db`; "
        "a secret: never logged).",
    )
    postgres_schema: str = Field(
        "public", description="Schema the `postgres` sink's tables live in."
    )
    postgres_table_prefix: str = Field(
        "items_", description="Prefix of each item type's table (`demo.post` -> `items_demo_post`)."
    )
    postgres_pool: int = Field(4, gt=0, description="Largest number of connections per process.")
    postgres_timeout: float = Field(
        5.0, description="Seconds to connect, and to wait for a connection of the pool."
    )
    postgres_batch: int = Field(1000, gt=0, description="Items per statement batch.")
    postgres_text_search: str = Field(
        "simple",
        description="Text search configuration of the search index (`simple`: no stemming, any "
        "language; `english`, ...).",
    )

    def jsonl_root(self, var_dir: Path | str) -> Path:
        """Where the JSON Lines sink writes: JSONL_DIR, else `items/` under the var dir."""
        return Path(self.jsonl_dir) if self.jsonl_dir else Path(var_dir) / "items"


def get_storage_settings() -> StorageSettings:
    """This process's storage settings, read on first use."""
    return StorageSettings.current()


def reset_storage_settings() -> None:
    """Forget the cached settings (tests that change the environment call this)."""
    StorageSettings.forget()
