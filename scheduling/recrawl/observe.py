"""The observer: every stored item of a watched type is a visit of its key.

It runs where items are known to be stored: the outbox drainer's `on_stored` hooks (the worker
registers `Observer.hook`), after every sink confirmed them. For each watched set of the item
type it marks the items' watched values in the set's dedup store (`recrawl:<watch>`), which
says for each key whether its value changed since its last visit, and records the visits in
the set's history (history.py), which plans each key's next visit. A hook is called at least
once: a repeated batch finds its values unchanged and its keys just visited, and counts nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
import redis

from external_interface.dedup import RedisDedup, Status
from scheduling.recrawl.history import History, Observed
from scheduling.recrawl.watch import Watch
from utils.clock import Clock
from utils.keyspace import Keyspace
from utils.redis import as_str
from utils.slots import lost_now, reason

log = logging.getLogger("chaincrawl.recrawl")


def dedup_for(client: Any, prefix: str, watch: Watch) -> RedisDedup:
    """The dedup store judging a watched set's values (one namespace per watch)."""
    return RedisDedup(f"recrawl:{watch.name}", client, prefix=prefix)


class WatchStores:
    """A watched set's dedup store and history, built once (a dedup store reads its layout on
    first use: a few round trips a process, not a batch)."""

    def __init__(self, client: Any, prefix: str, watch: Watch) -> None:
        self.r = client
        self.watch = watch
        self.dedup = dedup_for(client, prefix, watch)
        self.history = History(client, prefix, watch)
        self.lock = threading.Lock()
        self.skipped = 0  # batches not observed since the watch's keys were seen lost

    def observe(self, items: Sequence[Mapping[str, Any]], now: float) -> Observed:
        """Visits of the watch's keys: the items' values marked in its dedup store (which
        judges each changed or not), then recorded in its history. Items without the key
        are ignored.

        While the watch's keys are on a lost slot range (docs/cluster.md) the batch is not
        observed (its visits are not counted: a change among them is seen at the key's next
        visit, its plan stays as it was), with one warning line when the first batch is
        skipped and one when a batch is observed again: raising would make the drainer hold
        back the items of every run of this type, whatever their slots."""
        w = self.watch
        keyed = [(k, it) for it in items if (k := w.key_of(it)) is not None]
        if not keyed:
            return Observed()
        try:
            seen = self.dedup.mark_many([k for k, _ in keyed], [w.value_of(it) for _, it in keyed])
            out = self.history.observe(
                ((k, s.status is Status.CHANGED) for (k, _), s in zip(keyed, seen, strict=True)),
                now,
            )
        except redis.RedisError as exc:
            ranges = lost_now(self.r, exc)
            if not ranges:
                raise
            with self.lock:
                self.skipped += 1
                first = self.skipped == 1
            if first:
                log.warning(
                    "re-crawl watch %s: %s; its stored items are not observed meanwhile "
                    "(one line when they are again)",
                    w.name,
                    reason(ranges),
                )
            return Observed()
        if self.skipped:
            with self.lock:
                n, self.skipped = self.skipped, 0
            if n:
                log.warning("re-crawl watch %s: observed again (%d batch(es) skipped)", w.name, n)
        return out


def observe_items(
    client: Any, prefix: str, watch: Watch, items: Sequence[Mapping[str, Any]], now: float
) -> Observed:
    """`WatchStores.observe` for one batch (a caller observing often keeps a WatchStores)."""
    return WatchStores(client, prefix, watch).observe(items, now)


class Observer:
    """The drainer hook: which item types are watched is read from the state store (written
    by each watch's trigger tick) and kept for `refresh` seconds."""

    def __init__(
        self,
        client: Any,
        prefix: str,
        clock: Clock,
        refresh: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.r, self.prefix, self.clock, self.refresh = client, prefix, clock, refresh
        self._monotonic = monotonic
        self._key = Keyspace(prefix).recrawl_watches
        self._by_type: dict[str, list[WatchStores]] = {}
        self._read_at: float | None = None

    def watches(self) -> dict[str, list[WatchStores]]:
        """The watched sets by item type, read again every `refresh` seconds (a set whose
        settings did not change keeps its stores)."""
        now = self._monotonic()
        if self._read_at is None or now - self._read_at >= self.refresh:
            known = {ws.watch: ws for group in self._by_type.values() for ws in group}
            by_type: dict[str, list[WatchStores]] = {}
            try:
                watched = self.r.hgetall(self._key)
            except redis.RedisError as exc:
                if not lost_now(self.r, exc):
                    raise
                # the key is on a lost slot range: the last map, for now (raising would make
                # the drainer hold back the items of every run, whatever their slots)
                self._read_at = now
                return self._by_type
            for raw in watched.values():
                w = Watch.from_dict(orjson.loads(as_str(raw)))
                ws = known.get(w) or WatchStores(self.r, self.prefix, w)
                by_type.setdefault(w.item_type, []).append(ws)
            self._by_type, self._read_at = by_type, now
        return self._by_type

    def hook(self, item_type: str, items: list[dict[str, Any]]) -> None:
        watched = self.watches().get(item_type)
        if not watched:
            return
        now = self.clock.now()
        for ws in watched:
            ws.observe(items, now)
