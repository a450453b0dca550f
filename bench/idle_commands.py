"""What an idle fleet asks of Redis: commands a second, by command, with N workers up and no
work, on a redis-server of this script's own (state and broker on one server, as the embedded
default runs them).

    .venv/bin/python -m bench.idle_commands                # 1 gevent worker, 30 s
    .venv/bin/python -m bench.idle_commands --workers 2 --seconds 60

Counted with `INFO commandstats` (a script's own commands included) after the workers have
settled (`--settle` seconds past ready), so start-up is left out.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench.chaincrawl_bench import Worker
from utils.servers import RedisServer


def commandstats(client: Any) -> dict[str, int]:
    """command -> calls since the last reset (CONFIG RESETSTAT itself left out)."""
    stats = client.info("commandstats")
    out = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    out.pop("config|resetstat", None)  # Redis 7 names the subcommand
    if out.get("config") == 1:  # Redis 6: the reset is the one CONFIG call
        del out["config"]
    return out


def measure(workers: int, seconds: float, settle: float, pool: str = "gevent") -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="idle-") as tmp,
        RedisServer(Path(tmp) / "redis", appendonly=False) as server,
    ):
        env = {
            "CHAINCRAWL_REDIS_URL": server.url,
            "CHAINCRAWL_BROKER_URL": server.url,
            "CHAINCRAWL_KEY_PREFIX": "idle",
        }
        started = [
            Worker(env, Path(tmp) / f"w{i}.log", pool, 16, f"idle{i}", queue="default")
            for i in range(1, workers + 1)
        ]
        try:
            for w in started:
                w.wait_ready()
            time.sleep(settle)
            client = redis.Redis.from_url(server.url)
            client.config_resetstat()
            time.sleep(seconds)
            calls = commandstats(client)
        finally:
            for w in started:
                w.stop()
    total = sum(calls.values())
    return {"workers": workers, "seconds": seconds, "total": total, "per_s": total / seconds,
            "by_command": dict(sorted(calls.items(), key=lambda kv: -kv[1]))}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle_commands", description=__doc__)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--settle", type=float, default=20.0, help="seconds past ready, not counted")
    a = p.parse_args(argv)
    r = measure(a.workers, a.seconds, a.settle)
    print(f"{r['workers']} idle worker(s), {r['seconds']:.0f} s: {r['total']} commands, "
          f"{r['per_s']:.2f}/s ({r['per_s'] / r['workers']:.2f}/s a worker)")  # fmt: skip
    for cmd, n in r["by_command"].items():
        print(f"  {cmd:<20} {n:>6}  {n / r['seconds']:.2f}/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
