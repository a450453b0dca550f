"""What an idle fleet asks of Redis: commands a second, by command, with N workers up and no
work, on a redis-server of this script's own (state and broker on one server, as the embedded
default runs them).

    .venv/bin/python -m bench.idle_commands                # 1 gevent worker, 30 s
    .venv/bin/python -m bench.idle_commands --workers 2 --seconds 60
    .venv/bin/python -m bench.idle_commands --monitor      # and by command and key

Counted with `INFO commandstats` (a script's own commands included) after the workers have
settled (`--settle` seconds past ready), so start-up is left out. `--monitor` also counts the
same window through MONITOR by command and key (ids and numbers in keys folded: one line per
kind of key), which names who sends what. Each worker's warm shutdown (SIGTERM to exit, as
`control.sh stop` does it) is timed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import tempfile
import threading
import time
from collections import Counter
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


# a key segment of hex digits with at least one digit (a pid, an owner's random part), or a
# long hex or decimal run anywhere
_ID = re.compile(r"(?<=[:@])[0-9a-f]*\d[0-9a-f]*(?=$|[:@])|[0-9a-f]{12,}|\d{6,}")
_PLAIN = re.compile(r"[A-Za-z0-9_:.|<>@-]+")


def monitor_line(command: str) -> str:
    """A MONITOR line's command and first argument (its key, mostly), ids folded to <id>:
    `SET idle:q:owner_alive:<id> ...` for every owner's heartbeat alike. A subcommand stays with
    its command (`CLIENT UNBLOCK`, `XINFO STREAM`); an argument that is not a plain key (a
    payload, a script's body) is left out."""
    parts = command.split()
    if not parts:
        return ""
    head = parts[0].upper()
    if head in {"CLIENT", "XINFO", "CONFIG", "SCRIPT", "INFO"} and len(parts) > 1:
        head = f"{head} {parts[1].upper()}"
        parts = parts[1:]
    elif head in {"EVALSHA", "EVAL"} and len(parts) > 3:  # sha, numkeys, first key
        parts = [parts[0], parts[3]]
    elif head in {"XREAD", "XREADGROUP"} and "STREAMS" in (u := [x.upper() for x in parts]):
        parts = [parts[0], *parts[u.index("STREAMS") + 1 :]]
    arg = parts[1] if len(parts) > 1 else ""
    arg = _ID.sub("<id>", arg)
    return f"{head} {arg}" if arg and _PLAIN.fullmatch(arg) and len(arg) <= 80 else head


class Monitor:
    """Counts MONITOR lines by `monitor_line` from a thread until `stop()`."""

    def __init__(self, client: Any) -> None:
        self.counts: Counter[str] = Counter()
        self._mon = client.monitor()
        self._mon.__enter__()
        self._stop = threading.Event()
        self.error = ""  # why the count ended before `stop()`, if it did
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for cmd in self._mon.listen():
                if self._stop.is_set():
                    return
                self.counts[monitor_line(str(cmd.get("command", "")))] += 1
        except Exception as exc:  # the connection closed under us at stop: done
            if not self._stop.is_set():  # else the count is short: said in the output
                self.error = f"{type(exc).__name__}: {exc}"
            return

    def stop(self) -> Counter[str]:
        self._stop.set()
        with contextlib.suppress(Exception):  # the server may be gone already
            self._mon.__exit__(None, None, None)
        self._thread.join(5)
        return self.counts


def measure(
    workers: int, seconds: float, settle: float, pool: str = "gevent", monitor: bool = False
) -> dict[str, Any]:
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
            # no socket timeout (redis-py's default is 5 s): an idle fleet can be quiet longer
            quiet = redis.Redis.from_url(server.url, socket_timeout=None)
            mon = Monitor(quiet) if monitor else None
            client.config_resetstat()
            time.sleep(seconds)
            calls = commandstats(client)
            lines = mon.stop() if mon is not None else Counter()
            monitor_error = mon.error if mon is not None else ""
            calls.pop("monitor", None)
        finally:
            stop_s = []
            for w in started:
                t0 = time.monotonic()
                w.stop()
                stop_s.append(time.monotonic() - t0)
    total = sum(calls.values())
    return {
        "workers": workers,
        "seconds": seconds,
        "total": total,
        "per_s": total / seconds,
        "by_command": dict(sorted(calls.items(), key=lambda kv: -kv[1])),
        "by_key": dict(lines.most_common()),
        "stop_s": stop_s,
        "monitor_error": monitor_error,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle_commands", description=__doc__)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--settle", type=float, default=20.0, help="seconds past ready, not counted")
    p.add_argument("--monitor", action="store_true", help="also by command and key (MONITOR)")
    a = p.parse_args(argv)
    r = measure(a.workers, a.seconds, a.settle, monitor=a.monitor)
    print(
        f"{r['workers']} idle worker(s), {r['seconds']:.0f} s: {r['total']} commands, "
        f"{r['per_s']:.2f}/s ({r['per_s'] / r['workers']:.2f}/s a worker)"
    )
    for cmd, n in r["by_command"].items():
        print(f"  {cmd:<20} {n:>6}  {n / r['seconds']:.2f}/s")
    if r["by_key"]:
        print("by command and key (MONITOR):")
        if r["monitor_error"]:
            print(f"  (MONITOR ended early: {r['monitor_error']})")
        for line, n in r["by_key"].items():
            print(f"  {n / r['seconds']:5.2f}/s  {line}")
    print("warm shutdown: " + ", ".join(f"{t:.1f} s" for t in r["stop_s"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
