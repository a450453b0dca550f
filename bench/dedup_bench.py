"""Dedup memory and speed: our sorted binary buckets against a scrapy-redis fingerprint set.

    .venv/bin/python -m bench.dedup_bench                    # 1M and 10M records (~10 minutes)
    .venv/bin/python -m bench.dedup_bench --quick            # 100k, seconds
    .venv/bin/python -m bench.dedup_bench --records 2000000 --set-records 0 --aof

Starts its own redis-server (never the shared one). For each size it loads the records in big
batches (the fast bulk path) and reports used_memory delta / records (our connections closed
and SLOWLOG off first, so neither query buffers nor logged script arguments count). Then it
times check-and-mark from one client: batches of `--batch` ids, half already stored and half
new, each batch one round trip, `--repeat` times with fresh ids (best and median reported: the
host may be shared). The baseline is scrapy-redis's RFPDupeFilter: SADD of 40-character SHA1
hex fingerprints, loaded with multi-member SADDs and timed as `--batch` single SADDs per
pipeline.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from external_interface.dedup import RedisDedup, Status
from utils.servers import RedisServer

LOAD_BATCH = 100_000


def item_id(i: int) -> str:
    return f"https://shop.example.com/item/{i}"


def item_value(i: int) -> str:
    return f"price={i % 997};stock={i % 13}"


@dataclass
class Timing:
    """Wall time, and CPU seconds of this process and of redis-server, over a phase."""

    wall: float = 0.0
    client_cpu: float = 0.0
    server_cpu: float = 0.0


@dataclass
class Row:
    scheme: str
    records: int
    bytes_per_record: float
    load_per_s: float
    ops: int
    cams: list[Timing] = field(default_factory=list)  # one per repeat of check-and-mark
    check_per_s: float | None = None
    aof_per_op: float | None = None
    false_seen: int = 0

    @property
    def best(self) -> Timing:
        return min(self.cams, key=lambda t: t.wall)

    @property
    def median_per_s(self) -> float:
        return self.ops / statistics.median(t.wall for t in self.cams)


def server_cpu(r: redis.Redis) -> float:
    c = r.info("cpu")
    return float(c["used_cpu_user"]) + float(c["used_cpu_sys"])


@contextlib.contextmanager
def timed(r: redis.Redis) -> Iterator[Timing]:
    t = Timing()
    s0, c0, w0 = server_cpu(r), time.process_time(), time.perf_counter()
    yield t
    t.wall = time.perf_counter() - w0
    t.client_cpu = time.process_time() - c0
    t.server_cpu = server_cpu(r) - s0


def used_memory(r: redis.Redis) -> int:
    """used_memory without our own connections' buffers (a bulk load leaves a big query buffer)."""
    r.connection_pool.disconnect()
    return int(r.info("memory")["used_memory"])


def aof_size(r: redis.Redis) -> int | None:
    info = r.info("persistence")
    return int(info["aof_current_size"]) if info.get("aof_enabled") else None


def wait_aof_rewrite(r: redis.Redis) -> None:
    while r.info("persistence").get("aof_rewrite_in_progress"):
        time.sleep(0.2)


def probe_ids(n: int, ops: int, rep: int) -> tuple[list[int], list[bool]]:
    """`ops` item numbers, alternating stored (< n) and new (never used before)."""
    rnd = random.Random(n * 1000 + rep)
    nums, stored = [], []
    for j in range(ops):
        old = j % 2 == 0
        nums.append(rnd.randrange(n) if old else n + (rep + 1) * 10_000_000 + j)
        stored.append(old)
    return nums, stored


def time_check_and_mark(
    r: redis.Redis, row: Row, repeat: int, run: Callable[[list[int], list[bool]], int]
) -> None:
    """Time `run` (which returns its wrong answers) on fresh probe ids, `repeat` times."""
    a0 = aof_size(r)
    for rep in range(repeat):
        nums, stored = probe_ids(row.records, row.ops, rep)
        with timed(r) as t:
            row.false_seen += run(nums, stored)
        row.cams.append(t)
    a1 = aof_size(r)
    if a0 is not None and a1 is not None:
        row.aof_per_op = (a1 - a0) / (row.ops * repeat)


def bench_ours(r: redis.Redis, n: int, a: argparse.Namespace) -> Row:
    r.flushall()
    wait_aof_rewrite(r)
    dd = RedisDedup(
        "bench:item",
        r,
        prefix="bench",
        capacity=n,
        bucket_records=a.bucket_records,
        pending=a.pending,
    )
    lay = dd.layout
    m0 = used_memory(r)
    t = time.perf_counter()
    for lo in range(0, n, LOAD_BATCH):
        batch = range(lo, min(n, lo + LOAD_BATCH))
        dd.mark_many([item_id(i) for i in batch], [item_value(i) for i in batch])
    load = time.perf_counter() - t
    row = Row("chaincrawl dedup", n, (used_memory(r) - m0) / n, n / load, a.ops)
    print(
        f"  ours   n={n:>11,}  layout B={lay.buckets} S={lay.subs} P={lay.pending} "
        f"({lay.hash_bits:.1f} hash bits, false-seen {lay.false_seen_rate(10**9):.1e} at 1e9)"
    )
    key = dd.bucket_key(0)
    print(f"         MEMORY USAGE {key} = {r.memory_usage(key)} for {r.strlen(key)} bytes")

    nums, _ = probe_ids(n, a.ops, 99)  # read-only: a set of ids of its own
    ids, vals = [item_id(i) for i in nums], [item_value(i) for i in nums]
    t = time.perf_counter()
    for lo in range(0, a.ops, a.batch):
        dd.check_many(ids[lo : lo + a.batch], vals[lo : lo + a.batch])
    row.check_per_s = a.ops / (time.perf_counter() - t)

    def run(nums: list[int], stored: list[bool]) -> int:
        ids, vals = [item_id(i) for i in nums], [item_value(i) for i in nums]
        wrong = 0
        for lo in range(0, len(ids), a.batch):
            res = dd.mark_many(ids[lo : lo + a.batch], vals[lo : lo + a.batch])
            for seen, old in zip(res, stored[lo : lo + a.batch], strict=True):
                wrong += (seen.status is not Status.NEW) != old
        return wrong

    time_check_and_mark(r, row, a.repeat, run)
    return row


def sha1_hex(i: int) -> str:
    return hashlib.sha1(item_id(i).encode()).hexdigest()


def bench_set(r: redis.Redis, n: int, a: argparse.Namespace) -> Row:
    r.flushall()
    wait_aof_rewrite(r)
    key = "bench:dupefilter"
    m0 = used_memory(r)
    t = time.perf_counter()
    for lo in range(0, n, LOAD_BATCH):
        pipe = r.pipeline(transaction=False)
        for j in range(lo, min(n, lo + LOAD_BATCH), 10_000):
            pipe.sadd(key, *[sha1_hex(i) for i in range(j, min(n, lo + LOAD_BATCH, j + 10_000))])
        pipe.execute()
    load = time.perf_counter() - t
    row = Row("scrapy-redis SHA1 set", n, (used_memory(r) - m0) / n, n / load, a.ops)

    def run(nums: list[int], stored: list[bool]) -> int:
        wrong = 0
        for lo in range(0, len(nums), a.batch):
            pipe = r.pipeline(transaction=False)
            for i in nums[lo : lo + a.batch]:
                pipe.sadd(key, sha1_hex(i))
            for added, old in zip(pipe.execute(), stored[lo : lo + a.batch], strict=True):
                wrong += (added == 0) != old
        return wrong

    time_check_and_mark(r, row, a.repeat, run)
    return row


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[Row]) -> None:
    head = (
        f"{'scheme':<22}{'records':>12}{'bytes/rec':>10}{'load rec/s':>11}"
        f"{'c+m/s best':>11}{'median':>9}{'redis us':>9}{'client us':>10}{'check/s':>9}"
        f"{'AOF B/op':>9}{'false':>6}"
    )
    print("\n" + head + "\n" + "-" * len(head))
    for w in rows:
        b = w.best
        print(
            f"{w.scheme:<22}{w.records:>12,}{w.bytes_per_record:>10.2f}{w.load_per_s:>11,.0f}"
            f"{w.ops / b.wall:>11,.0f}{w.median_per_s:>9,.0f}{b.server_cpu / w.ops * 1e6:>9.1f}"
            f"{b.client_cpu / w.ops * 1e6:>10.1f}{fmt(w.check_per_s, ',.0f'):>9}"
            f"{fmt(w.aof_per_op, ',.0f'):>9}{w.false_seen:>6}"
        )
    ours = {w.records: w for w in rows if w.scheme.startswith("chaincrawl")}
    for w in rows:
        o = ours.get(w.records)
        if o is not None and w is not o:
            print(
                f"ratio at {w.records:,}: the set uses {w.bytes_per_record / o.bytes_per_record:.1f}x"
                f" the memory; ours does {w.best.wall / o.best.wall:.2f}x its check+mark/s"
            )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", default="1000000,10000000", help="comma-separated sizes")
    ap.add_argument("--set-records", default=None, help="sizes for the set (default: --records)")
    ap.add_argument("--quick", action="store_true", help="100k records, 50k ops")
    ap.add_argument("--ops", type=int, default=200_000, help="timed check+mark ops per repeat")
    ap.add_argument("--repeat", type=int, default=3, help="timed check+mark repeats")
    ap.add_argument("--batch", type=int, default=1000, help="ids per round trip")
    ap.add_argument("--bucket-records", type=int, default=1024, help="records per key at n")
    ap.add_argument("--pending", type=int, default=16, help="pending slots per bucket")
    ap.add_argument("--aof", action="store_true", help="appendonly on: report AOF bytes per op")
    a = ap.parse_args(argv)
    if a.quick:
        a.records, a.ops = "100000", 50_000
    sizes = [int(x) for x in a.records.split(",") if x]
    set_sizes = sizes if a.set_records is None else [int(x) for x in a.set_records.split(",") if x]
    set_sizes = [x for x in set_sizes if x > 0]

    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="dedup-bench-") as tmp,
        RedisServer(tmp, appendonly=a.aof) as srv,
    ):
        r = redis.Redis.from_url(srv.url, socket_timeout=600)  # FLUSHALL of 10M takes a while
        # long scripts would land in SLOWLOG (argv copies: ~0.5 MB) and blur the delta
        r.config_set("slowlog-log-slower-than", -1)
        r.config_set("auto-aof-rewrite-percentage", 0)  # a rewrite would reset the AOF size
        mem = r.info("memory")["mem_allocator"]
        print(f"redis-server {r.info('server')['redis_version']} ({mem}) on {srv.url}")
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        for n in sizes:
            rows.append(bench_ours(r, n, a))
            print_table(rows[-1:])
        for n in set_sizes:
            rows.append(bench_set(r, n, a))
            print_table(rows[-1:])
        r.flushall()
    rows.sort(key=lambda w: (w.records, not w.scheme.startswith("chaincrawl")))
    print_table(rows)
    print(
        f"c+m: check-and-mark, batches of {a.batch} ids, half stored, half new; best and median"
        f" of {a.repeat}.\n'redis us' / 'client us': CPU microseconds per op of redis-server /"
        " of this process in the best\nrepeat (robust to other load on the host). 'false':"
        f" wrong answers. Load average after: {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
