"""`RedisDedup`, the default store: sorted binary buckets in Redis strings, updated by
`dedup.lua` (the layout: `layout.py`)."""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, cast

import redis
from hiredis import pack_command
from redis.cluster import RedisCluster
from redis.crc import key_slot

from exceptions import ConfigError
from external_interface.dedup.base import (
    _NEW,
    _STATUSES,
    DedupBase,
    Id,
    Seen,
    Value,
    _values,
    id_bytes,
    value_bytes,
)
from external_interface.dedup.layout import (
    FP_BITS,
    HOUR_MAX,
    PENDING_BYTES,
    REC_BYTES,
    Layout,
)
from monitor.metrics import aggregator
from utils.lua import load_lua
from utils.redis import eval_script, is_cluster

log = logging.getLogger(__name__)


SCRIPT = load_lua(__file__, "dedup.lua")


_OP = struct.Struct(">BH")  # one result: status, first-seen hour (since the namespace epoch)


_ONE_OP = struct.Struct(">QH")  # a bucket's only op: sub-bucket << 40 | fp, content fp


_Call = tuple[list[str], list[bytes], list[list[int]]]  # bucket keys, their ops, op positions


class _Script(NamedTuple):
    """What `utils.redis.eval_script` runs: the script's code and its SHA1."""

    script: str
    sha: str


class RedisDedup(DedupBase):
    """The default store: sorted binary buckets in Redis strings, updated by `dedup.lua`.

    Every batch is grouped per bucket client-side and sent as a few EVALSHA calls (at most
    `max_ops_per_call` ops each, so no single script blocks Redis for long) in one pipeline:
    one round trip. Each call is atomic; a batch spanning calls is not (nor needs to be).

    On a Redis Cluster every bucket key hashes to its own slot (the buckets spread over the
    masters): a call holds the buckets of one slot only, and the calls are pipelined per
    master, each on one connection of its own, all written before any reply is read.
    """

    def __init__(
        self,
        namespace: str,
        client: redis.Redis | None = None,
        *,
        prefix: str | None = None,
        capacity: int = 1_000_000,
        headroom: float = 100.0,
        max_false_seen: float = 1e-9,
        bucket_records: int = 1024,
        pending: int = 16,
        layout: Layout | None = None,
        clock: Callable[[], float] = time.time,
        max_ops_per_call: int = 4096,
    ) -> None:
        if client is None or prefix is None:
            from config import get_settings
            from utils.redis import get_redis

            client = client or get_redis()
            prefix = prefix or get_settings().key_prefix
        self.namespace = namespace
        self.client = client
        self.clock = clock
        self.base = f"{prefix}:dedup:{namespace}"
        self.meta_key = f"{self.base}:meta"
        self.stats_key = f"{prefix}:dedupstats:{namespace}"  # monitor.timeseries reads it
        self.max_ops_per_call = max_ops_per_call
        self._explicit = layout
        self._planned = layout or Layout.plan(
            capacity,
            headroom=headroom,
            max_false_seen=max_false_seen,
            bucket_records=bucket_records,
            pending=pending,
        )
        self._layout: Layout | None = None
        self._sha = hashlib.sha1(SCRIPT.encode()).hexdigest()
        self._script = _Script(SCRIPT, self._sha)
        self.cluster = is_cluster(client)

    # -- layout / meta --------------------------------------------------------------------
    @property
    def layout(self) -> Layout:
        """The namespace's layout: the stored one if the namespace exists, else ours (stored)."""
        if self._layout is None:
            want = self._planned
            if want.epoch_hour is None:
                want = replace(want, epoch_hour=int(self.clock() // 3600))
            self.client.set(self.meta_key, want.to_json(), nx=True)
            have = Layout.from_json(self.client.get(self.meta_key) or want.to_json())
            if have != want:
                ex = self._explicit
                if ex is not None and replace(have, epoch_hour=ex.epoch_hour) != ex:
                    raise ConfigError(
                        f"dedup namespace {self.namespace!r} exists with layout {have}, not {ex}"
                    )
                log.debug("dedup %s: using the stored layout %s", self.namespace, have)
            self._layout = have
            self.client.script_load(SCRIPT)
        return self._layout

    def bucket_key(self, bucket: int) -> str:
        return f"{self.base}:{bucket}"

    def locate(self, x: Id) -> tuple[int, int, int]:
        """(bucket, sub-bucket, fp) of an id: 64 hash bits pick the cell, 40 more the fp."""
        lay = self.layout
        d = hashlib.blake2b(id_bytes(x), digest_size=13).digest()
        cell = (int.from_bytes(d[:8], "big") * lay.cells) >> 64
        b, s = divmod(cell, lay.subs)
        return b, s, int.from_bytes(d[8:], "big") & ((1 << lay.fp_bits) - 1)

    # -- the two primitives ---------------------------------------------------------------
    def check_many(self, ids: Sequence[Id], values: Sequence[Value] | None = None) -> list[Seen]:
        return self._run(0, ids, values)

    def mark_many(
        self, ids: Sequence[Id], values: Sequence[Value] | None = None, *, refresh: bool = False
    ) -> list[Seen]:
        seen = self._run(2 if refresh else 1, ids, values)
        # what the marks found, summed per process with the task metrics (the report's
        # change rates): no round trip of its own
        counts = Counter(s.status.name.lower() for s in seen)
        aggregator().add((self.stats_key,), counts)
        return seen

    def _run(self, mode: int, ids: Sequence[Id], values: Sequence[Value] | None) -> list[Seen]:
        n = len(ids)
        if not n:
            return []
        vals = _values(ids, values)
        lay = self.layout
        epoch = lay.epoch_hour or 0
        now = min(max(int(self.clock() // 3600) - epoch, 0), HOUR_MAX)
        out: list[Seen] = [_NEW] * n
        # A bulk batch is grouped whole (most ops per bucket rebuild); a smaller one is cut in
        # up to 8 slices, each sent as soon as it is packed, so Redis runs one while we hash
        # the next and we decode one while it runs the next. Still one round trip: every call
        # is written before the first reply is read.
        step = n if n > 4 * self.max_ops_per_call else max(64, -(-n // 8))
        todo = (c for lo in range(0, n, step) for c in self._pack(ids, vals, lo, min(n, lo + step)))
        head = (mode, now, lay.subs, lay.pending)
        failed = self._send(todo, head, out, epoch)
        if failed and all(isinstance(e, redis.exceptions.NoScriptError) for _, e in failed):
            failed = self._reload([c for c, _ in failed], head, out, epoch)
        if failed:
            raise failed[0][1]
        return out

    def _pack(self, ids: Sequence[Id], vals: Sequence[Value], lo: int, hi: int) -> Iterator[_Call]:
        """EVALSHA calls for ids[lo:hi]: ops grouped per bucket, <= max_ops_per_call per call.

        A bucket's ops are n uint64 (sub-bucket << 40 | fp), sorted, then their n uint16
        content fps: two arrays, so one struct.pack call packs them.
        """
        lay = self.layout
        cells, subs, mask = lay.cells, lay.subs, (1 << lay.fp_bits) - 1
        blake, frm = hashlib.blake2b, int.from_bytes
        sh = len(ids).bit_length()
        imask = (1 << sh) - 1
        # sort key (sub-bucket, fp, position) as one int: duplicates keep the caller's order
        groups: dict[int, list[int]] = {}
        for i in range(lo, hi):
            x = ids[i]
            if type(x) is not bytes:
                x = x.encode() if type(x) is str else id_bytes(x)
            h = frm(blake(x, digest_size=13).digest(), "big")
            b, s = divmod(((h >> FP_BITS) * cells) >> 64, subs)
            k = (((s << FP_BITS) | (h & mask)) << sh) | i
            g = groups.get(b)
            if g is None:
                groups[b] = [k]
            else:
                g.append(k)
        cfps = [
            0
            if v is None
            else 1
            + frm(blake(v.encode() if type(v) is str else value_bytes(v), digest_size=4).digest())
            % 0xFFFF
            for v in vals[lo:hi]
        ]
        keys: list[str] = []
        args: list[bytes] = []
        order: list[list[int]] = []
        nops = 0
        base = self.base + ":"
        one = _ONE_OP.pack
        items: Any = groups.items()
        slot = -1
        if self.cluster:  # a call's buckets on one slot: grouped by it, one call per slot
            items = sorted(items, key=lambda bg: key_slot((base + str(bg[0])).encode()))
        for b, g in items:
            if self.cluster:
                s = key_slot((base + str(b)).encode())
                if keys and s != slot:
                    yield keys, args, order
                    keys, args, order, nops = [], [], [], 0
                slot = s
            n = len(g)
            if n == 1:  # the usual case for small batches in big stores
                k = g[0]
                i = k & imask
                args.append(one(k >> sh, cfps[i - lo]))
                order.append([i])
            else:
                g.sort()
                idx = [k & imask for k in g]
                args.append(
                    struct.pack(f">{n}Q{n}H", *[k >> sh for k in g], *[cfps[i - lo] for i in idx])
                )
                order.append(idx)
            keys.append(base + str(b))
            nops += n
            if nops >= self.max_ops_per_call:
                yield keys, args, order
                keys, args, order, nops = [], [], [], 0
        if keys:
            yield keys, args, order

    def _reload(
        self, calls: list[_Call], head: tuple[int, ...], out: list[Seen], epoch: int
    ) -> list[tuple[_Call, Exception]]:
        """The calls a master lost the script for (a restart, SCRIPT FLUSH): the first of each
        master runs alone by `eval_script` (EVAL there, which caches it on that master alone,
        not SCRIPT LOAD on every master: a round trip each, and an error while any is down),
        the others are sent again as EVALSHA. -> the failures, as `_send`'s."""
        cluster = cast(RedisCluster, self.client)
        done: set[str] = set()
        rest: list[_Call] = []
        for call in calls:
            keys, args, _ = call
            name = cluster.get_node_from_key(keys[0]).name if self.cluster else ""
            if name in done:
                rest.append(call)
                continue
            done.add(name)
            reply = eval_script(self.client, self._script, keys, [*head, *args], NEVER_DECODE=True)
            _decode(call, reply, out, epoch)
        return self._send(iter(rest), head, out, epoch) if rest else []

    def _send(
        self, todo: Iterator[_Call], head: tuple[int, ...], out: list[Seen], epoch: int
    ) -> list[tuple[_Call, Exception]]:
        """Send every call, then read and decode every reply into `out`; return the failures."""
        conns: dict[str, tuple[Any, Any]] = {}  # master -> (pool, connection); "" one Redis

        def connection(keys: list[str]) -> Any:
            name, pool = "", None
            if self.cluster:
                cluster = cast(RedisCluster, self.client)
                node = cluster.get_node_from_key(keys[0])
                name = node.name
                if name not in conns:
                    pool = cluster.get_redis_connection(node).connection_pool
            elif "" not in conns:
                pool = self.client.connection_pool
            if pool is not None:
                conns[name] = (pool, pool.get_connection())
            return conns[name][1]

        sent: list[tuple[_Call, Any]] = []
        failed: list[tuple[_Call, Exception]] = []
        try:
            for call in todo:
                keys, args, _ = call
                conn = connection(keys)
                cmd = ("EVALSHA", self._sha, len(keys), *keys, *head, *args)
                # hiredis skips redis-py's per-argument Python pass (its hint: a 1-tuple)
                conn.send_packed_command([pack_command(cmd)])  # type: ignore[arg-type]
                sent.append((call, conn))
            for call, conn in sent:
                try:
                    reply = conn.read_response(disable_decoding=True)
                except redis.exceptions.ResponseError as e:
                    failed.append((call, e))
                    continue
                _decode(call, reply, out, epoch)
            return failed
        except BaseException:
            for _, conn in conns.values():
                conn.disconnect()  # replies may be pending: never hand this socket to anyone
            raise
        finally:
            for pool, conn in conns.values():
                pool.release(conn)

    # -- housekeeping ---------------------------------------------------------------------
    def _scan_buckets(self) -> list[bytes | str]:
        meta = (self.meta_key, self.meta_key.encode())
        pattern = _glob_escape(self.base) + ":*"
        return [k for k in self.client.scan_iter(match=pattern, count=1000) if k not in meta]

    def stats(self) -> dict[str, int]:
        """Buckets in use, records and bytes of bucket strings (SCAN, then O(1) per bucket)."""
        keys = self._scan_buckets()
        pipe = self.client.pipeline(transaction=False)
        tail = -(2 + PENDING_BYTES * self.layout.pending)  # the pending count
        for k in keys:
            pipe.strlen(k)
            pipe.execute_command("GETRANGE", k, tail, tail + 1, NEVER_DECODE=True)
        got = pipe.execute() if keys else []
        lens, heads = got[::2], got[1::2]
        fixed = self.layout.fixed_bytes()
        return {
            "buckets": len(keys),
            "records": sum((n - fixed) // REC_BYTES for n in lens)
            + sum(int.from_bytes(h, "big") for h in heads),
            "bytes": sum(lens),
        }

    def clear(self) -> None:
        """Forget the namespace entirely (layout included)."""
        keys = [*self._scan_buckets(), self.meta_key]
        for i in range(0, len(keys), 1000):
            self.client.unlink(*keys[i : i + 1000])
        self._layout = None


def _decode(call: _Call, reply: list[bytes], out: list[Seen], epoch: int) -> None:
    """A call's reply (per bucket, its ops' status and first-seen hour) into `out`."""
    new, statuses, unpack = tuple.__new__, _STATUSES, _OP.iter_unpack
    for idx, data in zip(call[2], reply, strict=True):
        for i, (st, hr) in zip(idx, unpack(data), strict=True):
            if st:
                out[i] = new(Seen, (statuses[st], epoch + hr))


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)
