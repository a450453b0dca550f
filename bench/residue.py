"""What a crawled page leaves behind in Redis once its run is complete and stored.

    .venv/bin/python -m bench.residue                  # 10,000 pages on the bench site
    .venv/bin/python -m bench.residue --pages 2000 --json

Crawls the bench site (`bench/site`, the `bench_pc` chain of `bench.chaincrawl_bench`: every
step `unique`) on one real worker against a private Redis, waits until the run is complete, its
items stored and the run compacted to its summary (ledger/compaction.py `compact`), then sums
`MEMORY USAGE` (exact: `SAMPLES 0`) over the keys, grouped by kind (ids replaced by `{rid}`,
`{tid}`), less what the same keys held before the run. Prints bytes per crawled page: in total,
and per kind. Dedup records (`skip_seen_hours`) are kept on purpose and reported apart; the
bench chain has none.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaincrawl_bench import ChaincrawlBench

_TID = re.compile(r"[0-9a-f]{32}")
DEDUP_KINDS = ("dedup:",)  # kept across runs on purpose (docs/dedup.md)


def kind(key: str, prefix: str, rid: str) -> str:
    """A key's kind: its name with the run id, task ids and trailing numbers replaced."""
    k = key.removeprefix(prefix + ":") if key.startswith(prefix + ":") else f"(other) {key}"
    k = k.replace("{" + rid + "}", "{rid}").replace(rid, "{rid}") if rid else k
    k = _TID.sub("{tid}", k)
    return re.sub(r":\d+$", ":{n}", k)


def usage(client: Any) -> dict[str, int]:
    """Every key's exact memory usage in bytes."""
    out: dict[str, int] = {}
    for raw in client.scan_iter(count=1000):
        n = client.memory_usage(raw, samples=0)
        if n is not None:
            out[raw.decode(errors="replace")] = int(n)
    return out


def residue(before: dict[str, int], after: dict[str, int], prefix: str, rid: str) -> dict:
    """Bytes by kind that the run added (keys gone or shrunk count as negative)."""
    kinds: dict[str, dict[str, int]] = {}
    for key in set(before) | set(after):
        delta = after.get(key, 0) - before.get(key, 0)
        if not delta:
            continue
        k = kinds.setdefault(kind(key, prefix, rid), {"keys": 0, "bytes": 0})
        k["keys"] += key in after
        k["bytes"] += delta
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]["bytes"]))


def measure(pages: int = 10_000, concurrency: int = 16, timeout: float | None = None) -> dict:
    """Crawl about `pages` pages and return what they left behind (see the module docstring)."""
    from bench.workload import site_for_pages
    from demo.testing import DemoServer

    users, posts, comments = site_for_pages(pages)
    with (
        DemoServer(users=users, posts_per_user=posts, comments_per_post=comments) as demo,
        ChaincrawlBench() as b,
    ):
        b.flush()
        b.start_workers(1, "gevent", concurrency)
        b._client()
        import redis

        from ledger.state import RunState

        r = redis.Redis.from_url(b.redis.url)
        time.sleep(1.5)  # the worker's own keys (owner heartbeat, metrics) settle first
        before = usage(r)
        seeds = [{"url": demo.url_for("/pc/feed?page=1"), "kind": "feed"}]
        wall, progress = b.run_chain(seeds, timeout or 120 + pages / 20)
        state = RunState(r)
        deadline = time.monotonic() + 30
        while "compacted" not in state.info(progress.run_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        compacted = "compacted" in state.info(progress.run_id)
        time.sleep(2.5)  # a metrics flush interval and the drainer's last round
        after = usage(r)
        kinds = residue(before, after, b.key_prefix, progress.run_id)
        crawled = progress.totals["succeeded"]
        total = sum(k["bytes"] for k in kinds.values())
        dedup = sum(v["bytes"] for k, v in kinds.items() if k.startswith(DEDUP_KINDS))
        return {
            "pages": crawled,
            "items": progress.totals["stored"],
            "wall_s": round(wall, 1),
            "compacted": compacted,
            "bytes": total,
            "bytes_per_page": round((total - dedup) / crawled, 2) if crawled else None,
            "dedup_bytes_per_page": round(dedup / crawled, 2) if crawled else None,
            "kinds": kinds,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=10_000, help="about this many pages")
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    a = ap.parse_args(argv)
    out = measure(a.pages, a.concurrency)
    if a.json:
        print(json.dumps(out))
        return 0
    n = out["pages"] or 1
    print(
        f"{out['pages']} pages, {out['items']} items stored in {out['wall_s']}s; "
        f"run compacted: {out['compacted']}"
    )
    print(f"{'kind':<44} {'keys':>6} {'bytes':>10} {'bytes/page':>11}")
    for k, v in out["kinds"].items():
        print(f"{k:<44} {v['keys']:>6} {v['bytes']:>10} {v['bytes'] / n:>11.2f}")
    print(
        f"left in Redis per crawled page after completion: {out['bytes_per_page']} bytes "
        f"(dedup records aside: {out['dedup_bytes_per_page']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
