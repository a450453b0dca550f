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

import re
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


def node_addresses(text: str) -> dict[str, str]:
    """Node id -> host:port in a `CLUSTER NODES` reply, for the nodes it gives an address.

    A node that has been down for a while can be listed as `:0@0` (no address) by a node
    that never learnt it or let it go: another node, or an earlier reply, still names it."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 8 and not f[1].startswith(":"):
            out[f[0]] = f[1].split("@")[0]
    return out


def parse_nodes(text: str, known: dict[str, str] | None = None) -> list[LostRange]:
    """The lost ranges in a `CLUSTER NODES` reply: a master flagged `fail` (or `fail?`) with
    slots, none of whose replicas is up. A node listed without an address is named from
    `known` (node id -> host:port), else by its node id."""
    masters: dict[str, tuple[str, bool, list[str]]] = {}
    replicas: dict[str, list[tuple[str, bool]]] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8:
            continue
        node_id, addr, flags, master_id = f[0], f[1].split("@")[0], f[2].split(","), f[3]
        if addr.startswith(":"):
            addr = (known or {}).get(node_id) or f"node {node_id[:12]}"
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


def _unnamed(ranges: Iterable[LostRange]) -> bool:
    """A node of a lost range still known only by its id (listed without an address)."""
    return any(n.startswith("node ") for r in ranges for n in (r.master, *r.replicas))


class _Cache:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at = 0.0
        self.ranges: list[LostRange] = []
        # node id -> host:port of every node seen with an address: a lost node's name stays
        # the same through a long outage (a node may come to list it as `:0`)
        self.addresses: dict[str, str] = {}


_cache = _Cache()


def _node_addresses(client: Any) -> list[tuple[str, int]]:
    nm = getattr(client, "nodes_manager", None)
    if nm is None:
        return []
    seen: dict[tuple[str, int], None] = {}
    for n in [*nm.nodes_cache.values(), *nm.startup_nodes.values()]:
        seen.setdefault((n.host, int(n.port)), None)
    return list(seen)


def _cluster_nodes(host: str, port: int, kw: dict[str, Any]) -> str | None:
    """One node's `CLUSTER NODES` reply (None if it does not answer)."""
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
        return None
    finally:
        probe.close()
    return raw.decode() if isinstance(raw, bytes) else str(raw)


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
        texts = []
        for host, port in _node_addresses(client):
            text = _cluster_nodes(host, port, kw)
            if text is None:
                continue
            texts.append(text)
            _cache.addresses.update(node_addresses(text))
            ranges = parse_nodes(texts[0], _cache.addresses)
            if not _unnamed(ranges):  # else another node may know the address
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


def known_ranges() -> list[LostRange]:
    """The ranges this process last saw lost, without a command (the cached look)."""
    return _cache.ranges


def lost_node(node: str) -> bool:
    """`node` (host:port) is a master or replica of a range this process last saw lost (no
    command: the cached look). An error from such a node is part of that outage, said once
    by the task that parks a message (lifecycle/lost.py), not an outage of its own."""
    return bool(node) and any(node == r.master or node in r.replicas for r in _cache.ranges)


def lost_for(ranges: Iterable[LostRange], key: str | bytes) -> LostRange | None:
    """The lost range holding `key`'s slot, if any."""
    slot = key_slot(key.encode() if isinstance(key, str) else key)
    return next((r for r in ranges if r.holds(slot)), None)


_SLOT_NAMED = re.compile(r'[Ss]lot "?(\d+)"?')


def concerning(
    ranges: Iterable[LostRange], keys: Iterable[str | bytes], node: str, error: BaseException
) -> list[LostRange]:
    """Of the lost `ranges`, those a state-store `error` met by work whose keys are `keys`
    (a task's run and site) concerns: every range when the cluster refuses every command
    (`CLUSTERDOWN`: no key of the work can be served); else the range of `node` (host:port,
    the node the error came from), of a slot the error names (a slot not covered) and those
    holding a slot of `keys`. [] when none: the error is another outage (a failover of
    another master while a range is lost), not a reason to park the work."""
    ranges = list(ranges)
    if isinstance(error, redis.exceptions.ClusterDownError):
        return ranges
    slots = {key_slot(k.encode() if isinstance(k, str) else k) for k in keys}
    slots |= {int(m) for m in _SLOT_NAMED.findall(str(error))}  # 'Slot "42" not covered'
    return [
        r
        for r in ranges
        if (node and (node == r.master or node in r.replicas)) or any(r.holds(s) for s in slots)
    ]


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
