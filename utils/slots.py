"""Slot ranges a Redis Cluster has lost: a master and every replica of it down, so no node
serves its slots (docs/cluster.md, "A lost slot range").

A failover of one master is not a loss: its replica takes the slots over within the
cluster's node timeout. When the master and its replicas are all flagged failing, the
slots stay unserved until one of them returns. With `cluster-require-full-coverage no` the
other masters go on serving their slots; with the default (`yes`) every node refuses every
command (`CLUSTERDOWN`) until the slots are served again.

`lost_ranges(client)` reads the topology from a node that answers (`CLUSTER NODES`, cached
for a second per process), `SlotsLost` is what a worker or an operator view meets on such a
slot, and `reason` names the slots and the nodes:
`slots 5461-10922 lost: 127.0.0.1:17102 and its replica 127.0.0.1:17105 do not answer`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
from redis.crc import key_slot

CACHE_SECONDS = 1.0
_PROBE_TIMEOUT = 2.0


@dataclass(frozen=True)
class LostRange:
    """Slots `start`-`end` (inclusive), whose master and replicas (host:port) all fail."""

    start: int
    end: int
    master: str
    replicas: tuple[str, ...]

    def holds(self, slot: int) -> bool:
        return self.start <= slot <= self.end

    @property
    def slots(self) -> str:
        return f"{self.start}" if self.start == self.end else f"{self.start}-{self.end}"


class SlotsLost(redis.exceptions.ClusterError):
    """A command met a slot range no node serves. Not a connection error: Redis answers, for
    the other slots, and nothing restarts by waiting a few seconds for it."""

    def __init__(self, ranges: Iterable[LostRange]) -> None:
        self.ranges = tuple(ranges)
        super().__init__(reason(self.ranges))

    def __repr__(self) -> str:  # redis-py's errors print as `server:<name>`: say the reason
        return f"SlotsLost({str(self)!r})"


def reason(ranges: Iterable[LostRange]) -> str:
    """One sentence naming the lost slots and their nodes (grouped per master)."""
    by_master: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for r in ranges:
        by_master.setdefault((r.master, r.replicas), []).append(r.slots)
    parts = []
    for (master, replicas), slots in by_master.items():
        word = "slot" if len(slots) == 1 and "-" not in slots[0] else "slots"
        if not replicas:
            nodes = f"{master} (no replica) does not answer"
        elif len(replicas) == 1:
            nodes = f"{master} and its replica {replicas[0]} do not answer"
        else:
            nodes = f"{master} and its replicas {', '.join(replicas)} do not answer"
        parts.append(f"{word} {','.join(slots)} lost: {nodes}")
    return "; ".join(parts)


def parse_nodes(text: str) -> list[LostRange]:
    """The lost ranges in a `CLUSTER NODES` reply: a master flagged `fail` (or `fail?`) with
    slots, none of whose replicas is up."""
    masters: dict[str, tuple[str, bool, list[str]]] = {}
    replicas: dict[str, list[tuple[str, bool]]] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8:
            continue
        node_id, addr, flags, master_id = f[0], f[1].split("@")[0], f[2].split(","), f[3]
        down = "fail" in flags or "fail?" in flags or "noaddr" in flags
        if "master" in flags:
            masters[node_id] = (addr, down, f[8:])
        elif master_id != "-":
            replicas.setdefault(master_id, []).append((addr, down))
    out = []
    for node_id, (addr, down, slots) in masters.items():
        followers = replicas.get(node_id, [])
        if not down or not slots or any(not d for _, d in followers):
            continue
        names = tuple(sorted(a for a, _ in followers))
        for s in slots:
            if s.startswith("["):  # a slot being migrated: not an assignment
                continue
            lo, _, hi = s.partition("-")
            out.append(LostRange(int(lo), int(hi or lo), addr, names))
    return sorted(out, key=lambda r: r.start)


class _Cache:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at = 0.0
        self.ranges: list[LostRange] = []


_cache = _Cache()


def _node_addresses(client: Any) -> list[tuple[str, int]]:
    nm = getattr(client, "nodes_manager", None)
    if nm is None:
        return []
    seen: dict[tuple[str, int], None] = {}
    for n in [*nm.nodes_cache.values(), *nm.startup_nodes.values()]:
        seen.setdefault((n.host, int(n.port)), None)
    return list(seen)


def lost_ranges(client: Any, fresh: bool = False) -> list[LostRange]:
    """The slot ranges `client`'s cluster has lost now ([] on one Redis, or when no node
    answers: that is an outage of the whole store, not a lost range)."""
    if getattr(client, "nodes_manager", None) is None:
        return []
    now = time.monotonic()
    if not fresh and now - _cache.at < CACHE_SECONDS:
        return _cache.ranges
    with _cache.lock:
        if not fresh and time.monotonic() - _cache.at < CACHE_SECONDS:
            return _cache.ranges
        kw = client.nodes_manager.connection_kwargs
        ranges: list[LostRange] | None = None
        for host, port in _node_addresses(client):
            probe = redis.Redis(
                host=host,
                port=port,
                username=kw.get("username"),
                password=kw.get("password"),
                ssl=bool(kw.get("ssl")),
                socket_timeout=_PROBE_TIMEOUT,
                socket_connect_timeout=_PROBE_TIMEOUT,
            )
            try:
                raw = probe.execute_command("CLUSTER", "NODES")  # raw: "CLUSTER NODES" is parsed
            except (redis.RedisError, OSError):
                continue
            finally:
                probe.close()
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            ranges = parse_nodes(text)
            break
        _cache.ranges, _cache.at = ranges or [], time.monotonic()
        return _cache.ranges


def known_lost(client: Any) -> list[LostRange]:
    """`lost_ranges`, asked only once this process has seen a range lost (its last look
    found one): no command at all while nothing is, for the paths that run all the time
    (a commit's pipeline, the drainer's stream list). Such a process meets the loss as an
    error first (`lost_now` looks then)."""
    if not _cache.ranges:
        return []
    return lost_ranges(client)


def lost_for(ranges: Iterable[LostRange], key: str | bytes) -> LostRange | None:
    """The lost range holding `key`'s slot, if any."""
    slot = key_slot(key.encode() if isinstance(key, str) else key)
    return next((r for r in ranges if r.holds(slot)), None)


def lost_now(client: Any, error: BaseException) -> list[LostRange]:
    """The lost ranges if `error` (a connection error, `CLUSTERDOWN`, a slot not covered)
    comes from a cluster that has lost some: [] for a failover under way or one Redis."""
    if isinstance(error, SlotsLost):
        return list(error.ranges)
    if not isinstance(
        error,
        redis.exceptions.ConnectionError
        | redis.exceptions.TimeoutError
        | redis.exceptions.ClusterError
        | redis.exceptions.RedisClusterException,
    ):
        return []
    ranges = lost_ranges(client)
    if not ranges and not isinstance(error, redis.exceptions.ConnectionError):
        # CLUSTERDOWN or a slot not covered: the cluster says something is lost; a cached
        # "nothing lost" may be from just before (and a requeue would say it with a traceback)
        ranges = lost_ranges(client, fresh=True)
    return ranges
