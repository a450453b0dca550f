"""Dedup that remembers when and what: new / seen-unchanged / seen-changed, and since when.

A store is one namespace (per site and item type). For an id and an optional content value it
answers NEW, UNCHANGED or CHANGED plus the hour the id was first seen, so a chain step can
"skip if seen within 7 days", "re-crawl if older than a day" or "store only if changed".

Marking happens after the item is durably stored, so a crash between the two re-crawls a page
rather than losing it: `check_many` is read-only and
`mark_many` records (and returns what it saw before, so it doubles as check-and-mark). A step
checks (or `filter_new`s), crawls, stores, and marks only the ids whose write was confirmed; a
failed store never marks, so the id comes back as NEW next time.

Layout (Redis): a 104-bit blake2b of the id; 64 bits pick a *cell*, one of B*S, the other 40
are the stored fp. The cell picks a bucket key (B of them) and a sub-bucket in it (S per key).
A bucket is one binary string, handled only by `dedup.lua`:

    [ceil(S/16) x u32 block starts][S x u16 in-block ends][n x 9 B main][u16 k][P x 14 B pending]

A main record is `fp:40 | first-seen hour:16 | content fp:16`, sorted by (sub-bucket, fp), so a
sub-bucket is a contiguous sorted run, located by its block's start plus two in-block ends
and searched by bisection. Bucket and sub-bucket bits are implied by where a record lives, so
only the fp is stored. Lua cannot edit a string in place, so an insert into main would rebuild
(and AOF-log) the whole bucket: new records go to the k used slots of a fixed-size, sorted
pending area instead (one SETRANGE; the string never changes length, so no realloc), which is
merged into main with one SET when full - one rebuild per P inserts. A pending record is
`sub:16 | main record:72 | at:24`, `at` being its place in main (main only moves at a merge).

Arithmetic (defaults: capacity C, 1024 records per bucket at C, headroom 100, 1e-9, P = 16):
  * false "seen": a new id is misreported when a stored record in its cell has its fp; with n
    records that has probability n / (B*S*2^40). The plan picks B*S >= 100*C / (1e-9 * 2^40),
    so the rate stays <= 1e-9 up to 100*C records. C = 10M: B = 9766, S = 94, log2(B*S) =
    19.8 implied bits + 40 stored = 59.8 bits; 1e9 records -> 9.9e-10. (1e9 / 1e-9 = 2^59.8.)
  * bytes per record at C: 9 (record) + 438 / 1024 (directory 24 + 188, pending 2 + 16*14) +
    ~95 / 1024 (Redis key, dict entry, object header) = ~9.52. Implied bits are cheap in the
    directory (2 bytes per sub-bucket: 0.2 B/record buys 6.6 bits) and dear as keys (~95 bytes
    each: 0.09 B/record buys 13.3 bits only with 1024 records per key).
  * time: hours since a per-namespace epoch in 16 bits: 7.48 years, then it saturates.
  * content: 16 bits, 0 meaning "none recorded"; a change slips through with p = 1/65535.
  * past capacity: B and S are fixed at creation. Buckets get longer (fewer bytes per record,
    slower inserts) and the false-seen rate grows linearly, n/(B*S*2^40): 1e-9 at 100*C.

Collisions, honestly: two ids with the same cell and fp are one record. The second reads as
seen (UNCHANGED, or CHANGED if its content fp differs) with the first's first-seen hour, and
marking it updates that shared record. `Layout(fp_bits=...)` narrows the fp to show it.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import math
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol

import orjson
import redis
from redis.crc import key_slot

try:
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - hiredis is a dependency; this is only a fallback
    _pack_command = None

from exceptions import ConfigError
from monitor.metrics import aggregator
from utils.lua import load_lua
from utils.redis import is_cluster
from utils.registry import Registry

log = logging.getLogger(__name__)

Id = str | bytes | int
Value = Any  # bytes / str are hashed as is; anything else as sorted-key JSON (orjson)

REC_BYTES = 9  # main record: fp 40 | hour 16 | content 16
PENDING_BYTES = 14  # pending record: sub-bucket 16 | fp 40 | hour 16 | content 16 | at 24
FP_BITS = 40  # stored id fingerprint width (the record field); Layout.fp_bits may use fewer
HOUR_MAX = 0xFFFF
MAX_SUBS = 4096  # sub-buckets per key: uint16 on the wire, one Lua unpack at a merge
LAYOUT_VERSION = 1  # bump when the bucket format changes
BLOCK = 16  # sub-buckets per directory block (uint32 start, then uint16 in-block ends)
SCRIPT = load_lua(__file__, "dedup.lua")
_OP = struct.Struct(">BH")  # one result: status, first-seen hour (since the namespace epoch)
_ONE_OP = struct.Struct(">QH")  # a bucket's only op: sub-bucket << 40 | fp, content fp


class Status(enum.IntEnum):
    NEW = 0
    UNCHANGED = 1
    CHANGED = 2


_STATUSES = (Status.NEW, Status.UNCHANGED, Status.CHANGED)


class Seen(NamedTuple):
    """One answer: the status and, unless NEW, the first-seen hour (hours since 1970, UTC)."""

    status: Status
    first_seen_hour: int | None = None

    @property
    def first_seen(self) -> datetime | None:
        if self.first_seen_hour is None:
            return None
        return datetime.fromtimestamp(self.first_seen_hour * 3600, tz=UTC)

    def age(self, now: float | None = None) -> timedelta | None:
        """Time since first seen, at hour resolution (the start of the first-seen hour)."""
        if self.first_seen_hour is None:
            return None
        now = time.time() if now is None else now
        return timedelta(hours=int(now // 3600) - self.first_seen_hour)


_NEW = Seen(Status.NEW)
_Call = tuple[list[str], list[bytes], list[list[int]]]  # bucket keys, their ops, op positions


class Dedup(Protocol):
    """What a chain step needs; `RedisDedup` is the default, `MemoryDedup` the in-process twin."""

    def check_many(self, ids: Sequence[Id], values: Sequence[Value] | None = None) -> list[Seen]:
        """Read-only: what each id is now."""
        ...

    def mark_many(
        self, ids: Sequence[Id], values: Sequence[Value] | None = None, *, refresh: bool = False
    ) -> list[Seen]:
        """Record the ids (call after the items are durably stored); returns the prior state."""
        ...

    def filter_new(
        self,
        ids: Sequence[Id],
        values: Sequence[Value] | None = None,
        *,
        within: timedelta | None = None,
        changed: bool = True,
    ) -> list[Id]:
        """Read-only: the ids to (re)process (see `DedupBase.filter_new`)."""
        ...


# --- shared behaviour -----------------------------------------------------------------------


def id_bytes(x: Id) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, int):
        return str(x).encode()
    raise TypeError(f"dedup ids are str, bytes or int, not {type(x).__name__}")


def value_bytes(value: Value) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def content_fp(value: Value) -> int:
    """16-bit content fingerprint, 1..65535; 0 is reserved for "no value given"."""
    if value is None:
        return 0
    return 1 + int.from_bytes(hashlib.blake2b(value_bytes(value), digest_size=4).digest()) % 0xFFFF


class DedupBase:
    """Single-item and filtering helpers on top of the two batch methods."""

    clock: Callable[[], float]

    def check_many(self, ids: Sequence[Id], values: Sequence[Value] | None = None) -> list[Seen]:
        raise NotImplementedError

    def mark_many(
        self, ids: Sequence[Id], values: Sequence[Value] | None = None, *, refresh: bool = False
    ) -> list[Seen]:
        raise NotImplementedError

    def check_and_mark_many(
        self, ids: Sequence[Id], values: Sequence[Value] | None = None, *, refresh: bool = False
    ) -> list[Seen]:
        """Alias of `mark_many`, which is atomic check-and-mark per bucket."""
        return self.mark_many(ids, values, refresh=refresh)

    def check(self, id: Id, value: Value = None) -> Seen:
        return self.check_many([id], [value])[0]

    def mark(self, id: Id, value: Value = None, *, refresh: bool = False) -> Seen:
        return self.mark_many([id], [value], refresh=refresh)[0]

    def filter_new(
        self,
        ids: Sequence[Id],
        values: Sequence[Value] | None = None,
        *,
        within: timedelta | None = None,
        changed: bool = True,
    ) -> list[Id]:
        """The ids a step should (re)process, in order. Read-only: mark after storing.

        Keeps NEW ids; CHANGED ones if `changed`; and any other seen id first seen `within`
        or longer ago ("skip if seen within 7 days"). Ages are whole hours. With `mark_many(...,
        refresh=True)` the clock restarts at each mark, which makes `within` a re-crawl period.
        """
        now_h = int(self.clock() // 3600)
        keep: list[Id] = []
        for x, seen in zip(ids, self.check_many(ids, values), strict=True):
            st = seen.status
            if (
                st is Status.NEW
                or (st is Status.CHANGED and changed)
                or (
                    within is not None
                    and seen.first_seen_hour is not None
                    and timedelta(hours=now_h - seen.first_seen_hour) >= within
                )
            ):
                keep.append(x)
        return keep


def _values(ids: Sequence[Id], values: Sequence[Value] | None) -> Sequence[Value]:
    if values is None:
        return [None] * len(ids)
    if len(values) != len(ids):
        raise ValueError(f"{len(ids)} ids but {len(values)} values")
    return values


# --- the Redis layout -----------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """How a namespace hashes into Redis; fixed at creation (stored in the namespace meta key)."""

    buckets: int  # B: Redis string keys
    subs: int  # S: sub-buckets per key (the in-string directory)
    pending: int = 16  # P: insert slots per key, merged into the sorted run when full
    fp_bits: int = FP_BITS  # stored id-fingerprint bits (<= 40; fewer only to demo collisions)
    epoch_hour: int | None = None  # hours since 1970 of first-seen hour 0; None = at creation
    version: int = LAYOUT_VERSION

    def __post_init__(self) -> None:
        if self.buckets < 1 or not 1 <= self.subs <= MAX_SUBS:
            raise ConfigError(f"dedup layout needs buckets >= 1 and 1 <= subs <= {MAX_SUBS}")
        if not 0 <= self.pending <= 1024:
            raise ConfigError("dedup pending slots must be 0..1024")
        if self.version != LAYOUT_VERSION:
            raise ConfigError(f"dedup layout version {self.version} is not {LAYOUT_VERSION}")
        if not 1 <= self.fp_bits <= FP_BITS:
            raise ConfigError(f"dedup fp_bits must be 1..{FP_BITS}")

    @classmethod
    def plan(
        cls,
        capacity: int,
        *,
        headroom: float = 100.0,
        max_false_seen: float = 1e-9,
        bucket_records: int = 1024,
        pending: int = 16,
    ) -> Layout:
        """B for ~bucket_records per key at `capacity`; S so that B*S*2^40 >= headroom*capacity
        / max_false_seen, i.e. the false-seen rate holds up to headroom*capacity records."""
        if capacity < 1 or bucket_records < 1 or headroom < 1 or not 0 < max_false_seen < 1:
            raise ConfigError("dedup: bad capacity / bucket_records / headroom / max_false_seen")
        cells = math.ceil(headroom * capacity / (max_false_seen * 2**FP_BITS))
        buckets = max(math.ceil(capacity / bucket_records), math.ceil(cells / MAX_SUBS))
        return cls(buckets=buckets, subs=max(1, math.ceil(cells / buckets)), pending=pending)

    @property
    def cells(self) -> int:
        return self.buckets * self.subs

    @property
    def hash_bits(self) -> float:
        """Id-hash bits a match must agree on: log2(B*S) implied + fp_bits stored."""
        return math.log2(self.cells) + self.fp_bits

    def false_seen_rate(self, records: int) -> float:
        """Chance that a lookup of a never-marked id reports it as seen, with `records` stored."""
        return records / (self.cells * 2**self.fp_bits)

    def directory_bytes(self) -> int:
        """Block starts + in-block ends: the bytes before the main records."""
        return 4 * math.ceil(self.subs / BLOCK) + 2 * self.subs

    def fixed_bytes(self) -> int:
        """Bytes of a bucket string besides its 9-byte main records."""
        return self.directory_bytes() + 2 + PENDING_BYTES * self.pending

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: bytes | str) -> Layout:
        return cls(**json.loads(raw))


class Bucket(NamedTuple):
    """One decoded bucket string (for tests and inspection)."""

    coarse: list[int]  # main records before sub-bucket 16*j (block starts)
    counts: list[int]  # main records per sub-bucket (from the in-block ends)
    main: list[tuple[int, int, int]]  # (fp, hour, content fp), sorted by (sub-bucket, fp)
    pending: list[tuple[int, int, int, int, int]]  # (sub-bucket, fp, hour, content fp, at)


def decode_bucket(raw: bytes, lay: Layout) -> Bucket:
    nb = math.ceil(lay.subs / BLOCK)
    d = lay.directory_bytes()
    po = len(raw) - PENDING_BYTES * lay.pending
    (npend,) = struct.unpack(">H", raw[po - 2 : po])
    main = [
        (int.from_bytes(raw[p : p + 5], "big"), *struct.unpack(">HH", raw[p + 5 : p + 9]))
        for p in range(d, po - 2, REC_BYTES)
    ]
    pending = [
        (
            *struct.unpack(">H", raw[p : p + 2]),
            int.from_bytes(raw[p + 2 : p + 7], "big"),
            *struct.unpack(">HH", raw[p + 7 : p + 11]),
            int.from_bytes(raw[p + 11 : p + 14], "big"),
        )
        for p in range(po, po + PENDING_BYTES * npend, PENDING_BYTES)
    ]
    ends = struct.unpack(f">{lay.subs}H", raw[4 * nb : d])
    counts = [e - (ends[s - 1] if s % BLOCK else 0) for s, e in enumerate(ends)]
    return Bucket(list(struct.unpack(f">{nb}I", raw[: 4 * nb])), counts, main, pending)


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
            self.client.script_load(SCRIPT)  # the server lost it (restart, SCRIPT FLUSH)
            failed = self._send(iter([c for c, _ in failed]), head, out, epoch)
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

    def _send(
        self, todo: Iterator[_Call], head: tuple[int, ...], out: list[Seen], epoch: int
    ) -> list[tuple[_Call, Exception]]:
        """Send every call, then read and decode every reply into `out`; return the failures."""
        conns: dict[str, tuple[Any, Any]] = {}  # master -> (pool, connection); "" one Redis

        def connection(keys: list[str]) -> Any:
            name, pool = "", None
            if self.cluster:
                node = self.client.get_node_from_key(keys[0])
                name = node.name
                if name not in conns:
                    pool = self.client.get_redis_connection(node).connection_pool
            elif "" not in conns:
                pool = self.client.connection_pool
            if pool is not None:
                conns[name] = (pool, pool.get_connection())
            return conns[name][1]

        sent: list[tuple[_Call, Any]] = []
        failed: list[tuple[_Call, Exception]] = []
        new, statuses, unpack = tuple.__new__, _STATUSES, _OP.iter_unpack
        try:
            for call in todo:
                keys, args, _ = call
                conn = connection(keys)
                cmd = ("EVALSHA", self._sha, len(keys), *keys, *head, *args)
                if _pack_command is None:
                    conn.send_command(*cmd)
                else:  # skips redis-py's per-argument Python pass
                    conn.send_packed_command([_pack_command(cmd)])
                sent.append((call, conn))
            for call, conn in sent:
                try:
                    reply = conn.read_response(disable_decoding=True)
                except redis.exceptions.ResponseError as e:
                    failed.append((call, e))
                    continue
                for idx, data in zip(call[2], reply, strict=True):
                    for i, (st, hr) in zip(idx, unpack(data), strict=True):
                        if st:
                            out[i] = new(Seen, (statuses[st], epoch + hr))
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


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


# --- in-process twin ------------------------------------------------------------------------


class MemoryDedup(DedupBase):
    """A dict-backed store with the same answers (128-bit keys: no practical collisions).

    For tests and single-process tools; forgets everything on exit. Ignores the Redis options
    so configuration can switch implementations without changing call sites.
    """

    def __init__(
        self, namespace: str = "", *, clock: Callable[[], float] = time.time, **_: object
    ) -> None:
        self.namespace = namespace
        self.clock = clock
        self._data: dict[bytes, tuple[int, int]] = {}  # key -> (first-seen hour, content fp)

    def check_many(self, ids: Sequence[Id], values: Sequence[Value] | None = None) -> list[Seen]:
        return self._run(False, False, ids, values)

    def mark_many(
        self, ids: Sequence[Id], values: Sequence[Value] | None = None, *, refresh: bool = False
    ) -> list[Seen]:
        return self._run(True, refresh, ids, values)

    def _run(
        self, mark: bool, refresh: bool, ids: Sequence[Id], values: Sequence[Value] | None
    ) -> list[Seen]:
        now = int(self.clock() // 3600)
        out = []
        for x, v in zip(ids, _values(ids, values), strict=True):
            k = hashlib.blake2b(id_bytes(x), digest_size=16).digest()
            cfp = content_fp(v)
            old = self._data.get(k)
            if old is None:
                out.append(Seen(Status.NEW))
                if mark:
                    self._data[k] = (now, cfp)
                continue
            hour, scfp = old
            st = Status.UNCHANGED if cfp in (0, scfp) else Status.CHANGED
            out.append(Seen(st, hour))
            if mark:
                self._data[k] = (now if refresh else hour, cfp if st is Status.CHANGED else scfp)
        return out

    def clear(self) -> None:
        self._data.clear()


# --- registry -------------------------------------------------------------------------------

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
