"""The bucket layout of the Redis store, sized from capacity and false-positive rate.

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

import json
import math
import struct
from dataclasses import asdict, dataclass
from typing import NamedTuple

from exceptions import ConfigError

REC_BYTES = 9  # main record: fp 40 | hour 16 | content 16


PENDING_BYTES = 14  # pending record: sub-bucket 16 | fp 40 | hour 16 | content 16 | at 24


FP_BITS = 40  # stored id fingerprint width (the record field); Layout.fp_bits may use fewer


HOUR_MAX = 0xFFFF


MAX_SUBS = 4096  # sub-buckets per key: uint16 on the wire, one Lua unpack at a merge


LAYOUT_VERSION = 1  # bump when the bucket format changes


BLOCK = 16  # sub-buckets per directory block (uint32 start, then uint16 in-block ends)


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
