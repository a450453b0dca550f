"""Channel-pool throughput: checkout + return pairs per second against a private redis-server.

    .venv/bin/python bench/proxy_bench.py [--threads 1,4,16] [--seconds 3] [--proxies 200]

Starts its own redis-server on a free port (never the shared one), fills the global pool with
fake proxy ids (no network: this measures the pool, not proxies), then runs each thread count
for `--seconds`, every thread looping checkout -> release on one site's channel. Each pair is
two Lua script calls, so the number is bounded by round trips to Redis. It also checks that no
proxy was lent twice at once and that the use counts add up.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from external_interface.resources.proxy.channel import ChannelPool
from external_interface.resources.proxy.models import ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from settings.proxy import ProxySettings
from utils.servers import RedisServer


def run(url: str, site: str, threads: int, seconds: float, n_proxies: int) -> tuple[float, int]:
    settings = ProxySettings(refill_interval=1.0)
    setup = GlobalPool(redis.Redis.from_url(url), "bench", settings)
    for i in range(n_proxies):
        setup.admit(ProxyAddress.parse(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:3128"), 0.1)
        setup.rds.zadd(setup.keys.score, {f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:3128": 8})
    ChannelPool(site, setup).refill(n_proxies)

    counts = [0] * threads
    holders: set[str] = set()
    lock = threading.Lock()
    double = 0
    start = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def worker(n: int) -> None:
        nonlocal double
        ch = ChannelPool(site, GlobalPool(redis.Redis.from_url(url), "bench", settings))
        start.wait()
        done = 0
        while time.perf_counter() < stop_at[0]:
            lease = ch.checkout()
            if lease is None:
                continue
            with lock:
                if lease.id in holders:
                    double += 1
                holders.add(lease.id)
            with lock:
                holders.discard(lease.id)
            ch.release(lease)
            done += 1
        counts[n] = done

    ts = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in ts:
        t.start()
    stop_at[0] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    start.wait()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    total = sum(counts)
    ch = ChannelPool(site, setup)
    uses = sum(u for _, u in ch.idle())
    if double or uses != total or ch.lent():
        raise SystemExit(f"inconsistent: double={double} uses={uses} pairs={total}")
    return total / elapsed, total


def ping_rate(url: str, n: int = 3000) -> float:
    """Round trips per second on one connection: the ceiling for a pair is half of it."""
    r = redis.Redis.from_url(url)
    t0 = time.perf_counter()
    for _ in range(n):
        r.ping()
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,4,16", help="comma-separated thread counts")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--proxies", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, RedisServer(tmp, appendonly=False) as server:
        print(
            f"redis-server on port {server.port}; {args.proxies} proxies; {args.seconds:g}s per run"
        )
        print(f"baseline: {ping_rate(server.url):.0f} PING round trips/s on one connection")
        for i, threads in enumerate(int(x) for x in args.threads.split(",")):
            rate, total = run(server.url, f"bench{i}", threads, args.seconds, args.proxies)
            print(f"threads={threads:3d}  checkout+return pairs/s={rate:9.0f}  (pairs={total})")


if __name__ == "__main__":
    main()
