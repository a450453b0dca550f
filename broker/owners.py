"""Who holds each unacknowledged message, so that a dead worker's messages come back in seconds.

kombu's Redis transport gives back a message a worker took and never acknowledged only after
the visibility timeout (`CHAINCRAWL_VISIBILITY_TIMEOUT`, 3600 s by default): it cannot tell a
dead worker's message from a slow one's. A worker killed mid-crawl (OOM, SIGKILL, a lost
machine) left its runs waiting an hour for the pages it held. So every worker process gets an
owner id and a heartbeat key, and its `unacked` entries are tagged with the owner in the same
MULTI as kombu's own bookkeeping, and untagged wherever kombu removes them (ack, reject,
restore). The sweeper (chains/sweeper.py) restores the messages of an owner whose heartbeat
has expired through kombu's own `restore_by_tag`, which is a transaction on `unacked`: a
message is restored once even when kombu's visibility sweep reaches it too.

Keys, in the broker's Redis under the broker's key prefix:
    unacked_owner         hash: delivery tag -> owner id
    owner_alive:{owner}   string, expires `CHAINCRAWL_DEAD_WORKER_AFTER` s after the last beat
    owners                set: every owner that has not shut down cleanly

The `owners` set finds the deaths that leave nothing in `unacked`: a worker killed between
kombu's BRPOP and its bookkeeping takes the popped message with it. The sweeper then
checks every active run's ledger at once instead of waiting for the run to stall.

A worker that is alive but was declared dead (its heartbeat stopped for that long) loses
nothing: its messages run twice, and a task's commit runs once per task id. (Its late ack of
a restored message also removes the `unacked` entry of the worker now holding it, as after
kombu's own restores; should that one die too, the run-ledger sweeper re-sends the task.)

Right after a restart of the broker's Redis no owner is declared dead (every heartbeat may
just have expired while Redis was down) until the heartbeats had time to come back: `ttl`
seconds after the Redis finished loading its data, as this process saw it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps

from broker.kombu_guard import once, require_source
from utils import process
from utils.redis import as_str

kredis: Any = kombu_redis  # its QoS internals, patched here, are not in kombu's type hints

log = logging.getLogger("chaincrawl.owners")

OWNER_HASH = "unacked_owner"
ALIVE = "owner_alive:"
OWNERS = "owners"

_owner: str | None = None  # this process's, once it consumes (worker.py, celeryd_init)
_held: set[Any] = set()  # the delivery tags this process tagged and has not seen removed
_beat: Heartbeat | None = None


# --- tagging: kombu's QoS writes and removes the owner with its own bookkeeping ----------------


def _check() -> None:
    """Fail at import when kombu's QoS no longer does what `append` below repeats."""
    append, remove = kredis.QoS.append, kredis.QoS._remove_from_indices
    require_source(
        [
            (append, "pipe.zadd(self.unacked_index_key"),
            (append, "dumps([message._raw, EX, RK])"),
            (append, "super().append(message, delivery_tag)"),
            (remove, ".hdel(self.unacked_key, delivery_tag)"),
            (kredis.QoS.restore_by_tag, "self._remove_from_indices(tag, pipe)"),
        ]
    )


@once
def apply() -> None:
    """Install the tagging (idempotent). Without an owner set, kombu runs unchanged."""
    _check()
    original_append = kredis.QoS.append
    original_remove = kredis.QoS._remove_from_indices

    def append(self: Any, message: Any, delivery_tag: Any) -> None:
        who = _owner
        if who is None:
            return original_append(self, message, delivery_tag)
        delivery = message.delivery_info
        ex, rk = delivery["exchange"], delivery["routing_key"]
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()}).hset(
                self.unacked_key, delivery_tag, dumps([message._raw, ex, rk])
            ).hset(OWNER_HASH, delivery_tag, who).execute()
            _held.add(delivery_tag)
            virtual.QoS.append(self, message, delivery_tag)
        return None

    def remove(self: Any, delivery_tag: Any, pipe: Any = None) -> Any:
        _held.discard(delivery_tag)
        return original_remove(self, delivery_tag, pipe).hdel(OWNER_HASH, delivery_tag)

    append.__wrapped__ = original_append  # type: ignore[attr-defined]
    remove.__wrapped__ = original_remove  # type: ignore[attr-defined]
    kredis.QoS.append = append
    kredis.QoS._remove_from_indices = remove


# --- the heartbeat -------------------------------------------------------------------------------


REGISTER_EVERY = 15  # beats between two SADDs to `owners` while the heartbeat key stays


def holds() -> bool:
    """Whether this process holds a message it took and has not acknowledged, rejected or
    given back (as far as it saw: a tag another process restored stays counted)."""
    return bool(_held)


class Heartbeat:
    """Keeps `owner_alive:{owner}` alive: set at once (before the first message is taken),
    then every fifth of the TTL from a daemon thread, which ends with the process.

    While the process is idle (no task started since the last beat, no message held
    unacknowledged: `holds()`) the beats come every half of the TTL instead. The key keeps
    its TTL either way, so a dead worker's heartbeat is gone `ttl` seconds after its last
    beat, as before; what a longer gap gives up is slack for a late beat, and a worker taken
    for dead while it holds nothing loses nothing (its next beat registers it again).

    The owner is added to `owners` at the first beat, whenever the beat finds its key gone
    (`SET ... GET` answered nothing: the broker's Redis restarted empty or was flushed, or the
    beats stopped past the TTL), and every `REGISTER_EVERY` beats besides: not every beat."""

    def __init__(self, client: redis.Redis, prefix: str, who: str, ttl: float) -> None:
        self.r, self.key, self.ttl = client, f"{prefix}{ALIVE}{who}", ttl
        self.who, self.owners = who, f"{prefix}{OWNERS}"
        self.every = max(0.2, ttl / 5)
        self.idle_every = max(self.every, ttl / 2)  # while idle (class docstring)
        self._watch = process.Watch()
        self.registered = True
        self.beats = 0
        self.set_get = True  # SET ... GET is understood (Redis 6.2 and later)
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def beat(self) -> None:
        with self._lock:
            self.beats += 1
            try:
                self._send()
            except redis.ResponseError:  # an older server refusing SET ... GET
                if not self.set_get:
                    raise
                self.set_get = False
                self._send()

    def _send(self) -> None:
        register = self.registered and (self.beats - 1) % REGISTER_EVERY == 0
        if not self.set_get:  # no way to see the key gone: every beat, as before
            register = self.registered
        pipe = self.r.pipeline(transaction=False)
        pipe.set(self.key, str(os.getpid()), px=max(1, int(self.ttl * 1000)), get=self.set_get)
        if register:
            pipe.sadd(self.owners, self.who)
        was = pipe.execute()[0]
        if self.registered and not register and was is None:  # the key was gone: again
            self.r.sadd(self.owners, self.who)

    def start(self) -> Heartbeat:
        try:
            self.beat()
        except redis.RedisError as exc:  # the broker is down too: the consumer will wait
            log.warning("owner heartbeat not written: %s", exc)
        threading.Thread(target=self._run, name="owner-heartbeat", daemon=True).start()
        return self

    def next_wait(self) -> float:
        """The wait to the next beat: `every` once a task started since the last beat or a
        message is held, else `idle_every`."""
        if self._watch.worked() or holds():
            return self.every
        return self.idle_every

    def _run(self) -> None:
        while not self._stop.wait(self.next_wait()):
            try:
                self.beat()
            except redis.RedisError as exc:
                log.debug("owner heartbeat skipped: %s", exc)

    def stop(self) -> None:
        self._stop.set()

    def leave(self) -> None:
        """A clean shutdown: out of `owners`, so that the sweeper does not take this exit for
        a death. The beats go on until the process ends: whatever it still runs stays its."""
        with self._lock:
            self.registered = False
            try:
                self.r.srem(self.owners, self.who)
            except redis.RedisError as exc:  # then taken for a death: one early ledger check
                log.debug("owner not unregistered: %s", exc)


def start(client: redis.Redis, prefix: str, ttl: float, hostname: str = "") -> str:
    """Make this process an owner: its unacked messages are tagged from now on (worker.py, at
    `celeryd_init`, before the consumer starts)."""
    global _owner, _beat
    apply()
    who = f"{hostname or socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    if _beat is not None:
        _beat.stop()
    _beat = Heartbeat(client, prefix, who, ttl).start()
    _owner = who
    return who


def owner() -> str | None:
    """This process's owner id (None before `start`, and outside workers)."""
    return _owner


def held_since(client: redis.Redis, prefix: str, who: str) -> dict[str, float]:
    """The delivery tags `who` holds unacknowledged -> when each was taken (kombu's
    `unacked_index`; a tag missing there was acked meanwhile)."""
    tags = held(client, prefix).get(who, [])
    if not tags:
        return {}
    scores = client.zmscore(f"{prefix}unacked_index", tags)
    return {t: s for t, s in zip(tags, scores, strict=True) if s is not None}


def stop() -> None:
    """Stop beating, as a killed worker would (tests)."""
    global _owner, _beat
    if _beat is not None:
        _beat.stop()
    _owner, _beat = None, None


def leave() -> None:
    """This process shuts down cleanly (worker.py, at `worker_shutdown`): its end is no death.
    It stays the owner of what it still holds, and keeps beating until it exits."""
    if _beat is not None:
        _beat.leave()


# --- finding and restoring a dead owner's messages ---------------------------------------------


def held(client: redis.Redis, prefix: str) -> dict[str, list[str]]:
    """owner -> the delivery tags it holds unacknowledged."""
    out: dict[str, list[str]] = {}
    for tag, who in client.hgetall(f"{prefix}{OWNER_HASH}").items():
        out.setdefault(as_str(who), []).append(as_str(tag))
    return out


def dead_owners(client: redis.Redis, prefix: str, owners: Iterable[str]) -> list[str]:
    """Those of `owners` whose heartbeat key is gone."""
    owners = list(owners)
    if not owners:
        return []
    pipe = client.pipeline(transaction=False)
    for who in owners:
        pipe.exists(f"{prefix}{ALIVE}{who}")
    return [who for who, alive in zip(owners, pipe.execute(), strict=True) if not alive]


def registered(client: redis.Redis, prefix: str) -> set[str]:
    """Owners that have not shut down cleanly (alive, or dead and not yet forgotten)."""
    return {as_str(who) for who in client.smembers(f"{prefix}{OWNERS}")}


def forget(client: redis.Redis, prefix: str, owners: Iterable[str]) -> None:
    """Take dead owners out of `owners` once their death has been dealt with."""
    owners = list(owners)
    if owners:
        client.srem(f"{prefix}{OWNERS}", *owners)


_serving_since: dict[str, float] = {}  # a broker Redis's run id -> when first seen serving here


def serving_for(
    client: redis.Redis,
    clock: Callable[[], float] = time.monotonic,
    info: dict[str, Any] | None = None,
) -> float:
    """Seconds the broker's Redis has been serving, as far as this process can tell: its
    uptime, but no more than since this process first saw it (this run id) done loading.
    Uptime alone counts the seconds a restarted Redis spends loading its append-only file,
    when no heartbeat can be written: right after a long load every owner would look dead."""
    if info is None:  # the default sections: server (run id, uptime) and persistence
        info = client.info()
    if int(info.get("loading", 0)):
        return 0.0
    now = clock()
    first = _serving_since.setdefault(str(info.get("run_id", "")), now)
    return min(float(info.get("uptime_in_seconds", 0)), now - first)


def orphans(
    client: redis.Redis,
    prefix: str,
    ttl: float,
    confirm: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    held_out: dict[str, list[str]] | None = None,
    info: dict[str, Any] | None = None,
) -> dict[str, list[str]]:
    """owner -> tags it still holds, for every owner (holding messages or registered) without
    a heartbeat at two looks `confirm` s apart (waited with `sleep`: the sweeper's keeps its
    lock); a dead owner holding nothing maps to []. Nothing while the broker's Redis has been
    serving for less than `ttl` (`serving_for`: heartbeats may just be coming back from a
    restart). `held_out` gets what every owner held at the first look (the sweeper's sign of
    work); `info`, the broker's `INFO` read just before, spares reading it again."""
    if ttl > 0 and serving_for(client, info=info) < ttl:
        return {}
    holding = held(client, prefix)
    if held_out is not None:
        held_out.update(holding)
    dead = dead_owners(client, prefix, set(holding) | registered(client, prefix))
    if not dead:
        return {}
    if confirm > 0:
        sleep(confirm)
    dead = dead_owners(client, prefix, dead)
    now = held(client, prefix)  # what they still hold (kombu may have restored some meanwhile)
    return {who: now.get(who, []) for who in dead}


def restorer(app: Any) -> Callable[[list[str]], int]:
    """`restore(tags)` through a kombu channel of the worker's app -> how many it restored."""
    apply()  # kombu's restore then removes the owner entries with the rest

    def restore(tags: list[str]) -> int:
        with app.connection_for_write() as conn:
            qos = conn.default_channel.qos
            client = conn.default_channel.client
            n = 0
            # newest first, as kombu's own restore: each goes to the end the consumers pop
            # from, so the oldest is taken first again (the channel's client adds the prefix)
            taken = dict(client.zrange(qos.unacked_index_key, 0, -1, withscores=True))
            tags = sorted(tags, key=lambda t: taken.get(t.encode(), 0.0), reverse=True)
            for tag in tags:
                if client.hget(qos.unacked_key, tag) is not None:
                    qos.restore_by_tag(tag)
                    n += 1
                else:  # acked or restored meanwhile: drop the stale owner entry only
                    client.hdel(OWNER_HASH, tag)
            return n

    return restore
