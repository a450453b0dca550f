"""Stores by name (`dedups`, `make_dedup`), and the outbox hook that marks stored items."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from external_interface.dedup.base import Dedup, Id, Value
from external_interface.dedup.memory import MemoryDedup
from external_interface.dedup.redis_store import RedisDedup
from utils.registry import Registry

# name -> factory(namespace, **options) -> Dedup
dedups: Registry[Callable[..., Dedup]] = Registry("dedup")
dedups.add("redis", RedisDedup)
dedups.add("memory", MemoryDedup)


def make_dedup(site: str, item_type: str, *, impl: str = "redis", **options: Any) -> Dedup:
    """The store for one site and item type (namespace "site:item_type")."""
    return dedups.get(impl)(f"{site}:{item_type}", **options)


def marking_hook(
    key: Callable[[dict[str, Any]], Id],
    value: Callable[[dict[str, Any]], Value] | None = None,
    *,
    store_for: Callable[[str], Dedup] | None = None,
    refresh: bool = False,
) -> Callable[[str, list[dict[str, Any]]], None]:
    """An outbox `on_stored` hook: mark a type's items once every sink has confirmed them.

    `key(item)` is the dedup id, `value(item)` the content to fingerprint; `store_for(type)`
    picks the store (default: one `RedisDedup` per item type). The drainer calls hooks at
    least once; a repeated mark is harmless (it finds UNCHANGED and changes nothing).
    """
    stores: dict[str, Dedup] = {}

    def hook(item_type: str, items: list[dict[str, Any]]) -> None:
        store = stores.get(item_type)
        if store is None:
            store = stores[item_type] = (store_for or RedisDedup)(item_type)
        ids = [key(it) for it in items]
        store.mark_many(
            ids, None if value is None else [value(it) for it in items], refresh=refresh
        )

    return hook
