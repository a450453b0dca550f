"""What one look of the run-ledger sweeper at the Redis broker costs, by broker size.

    .venv/bin/python -m bench.sweep_scan                    # 10k, 100k and 500k messages
    .venv/bin/python -m bench.sweep_scan --sizes 1000000

Why: after a worker's death (or a broker restart) the sweeper checks every active run at once
(chains/sweeper.py), and each check reads the whole broker twice: every queue list and
kombu's `unacked`, parsing each message's task ids. That runs in one worker's sweeper thread,
so its cost is CPU that worker does not spend on pages. Messages are real ones, published by a
Celery app set up as the workers' (priorities, key prefix): single pages and
`chaincrawl.batch` messages of 20, in the ratio given (a deep backlog is mostly batches), plus
a tenth of them in `unacked`. A private redis-server on a free port; nothing else is touched.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import cast

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from celery import Celery

from chains.sweeper import broker_task_ids
from ledger.publish import BATCH_TASK, send_kid
from utils.servers import RedisServer

PREFIX = "bench:q:"


def _app(url: str) -> Celery:
    a = Celery("sweep-scan", set_as_current=False)
    a.conf.update(
        broker_url=url,
        task_serializer="json",
        broker_transport_options={
            "priority_steps": list(range(10)),
            "sep": ":",
            "queue_order_strategy": "priority",
            "global_keyprefix": PREFIX,
        },
    )
    return a


def _kid(rid: str, n: int) -> dict[str, object]:
    return {
        "id": uuid.uuid4().hex,
        "task": "demo.pc.comment",
        "params": {"post_id": f"p{n}"},
        "meta": {"run": rid, "step": "pc.comment", "prio": 5},
    }


def samples(r: redis.Redis, url: str) -> tuple[bytes, bytes]:
    """One single-page message and one batch of 20, as kombu puts them in a queue list."""
    app = _app(url)
    rid = uuid.uuid4().hex[:16]
    send_kid(app, _kid(rid, 0), lambda task: "testsite")
    batch = [_kid(rid, i) for i in range(20)]
    app.send_task(BATCH_TASK, args=(batch,), task_id=uuid.uuid4().hex, priority=4)
    lists = r.scan_iter(match=f"{PREFIX}*", _type="list")
    raws = [m for k in lists for m in cast("list[bytes]", r.lrange(k, 0, -1))]
    r.delete(*r.scan_iter(match=f"{PREFIX}*", _type="list"))
    app.close()
    single = next(m for m in raws if BATCH_TASK.encode() not in m)
    batched = next(m for m in raws if BATCH_TASK.encode() in m)
    return single, batched


def fill(r: redis.Redis, n: int, single: bytes, batched: bytes, batch_share: float) -> int:
    """n messages: a tenth in `unacked`, the rest in a queue list; -> task ids they carry."""
    r.flushdb()
    pipe = r.pipeline(transaction=False)
    pages = 0
    for i in range(n):
        raw = batched if (i % 100) < batch_share * 100 else single
        pages += 20 if raw is batched else 1
        if i % 10 == 0:
            pipe.hset(f"{PREFIX}unacked", f"tag{i}", b"[" + raw + b', "", "demo"]')
        else:
            pipe.lpush(f"{PREFIX}demo:4", raw)
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    return pages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,500000", help="messages in the broker")
    ap.add_argument("--batch-share", type=float, default=0.8, help="share of batch messages")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        srv = RedisServer(Path(d), appendonly=False).start()
        try:
            r = redis.Redis.from_url(srv.url)
            single, batched = samples(r, srv.url)
            print(
                f"message sizes: single page {len(single)} B, batch of 20 {len(batched)} B; "
                f"{a.batch_share:.0%} batches"
            )
            print(
                f"{'messages':>10} {'pages':>10} {'one look s':>11} {'us/message':>11} "
                f"{'us/page':>8}"
            )
            for n in (int(x) for x in a.sizes.split(",")):
                pages = fill(r, n, single, batched, a.batch_share)
                t0 = time.process_time()
                w0 = time.perf_counter()
                ids = broker_task_ids(r, PREFIX, stale_after=3600)
                cpu, wall = time.process_time() - t0, time.perf_counter() - w0
                assert ids, "no ids read"
                print(
                    f"{n:>10,} {pages:>10,} {wall:>11.2f} {cpu * 1e6 / n:>11.1f} "
                    f"{cpu * 1e6 / pages:>8.2f}   (CPU {cpu:.2f} s)"
                )
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
