"""Write throughput of each sink on the demo chain's items, as the outbox drainer writes them.

    flock /work/locks/bench.lock .venv/bin/python -m bench.sink_bench
    .venv/bin/python -m bench.sink_bench --users 100 --repeat 3 --sinks jsonl,postgres

The items are the ones a `demo_social` run stores (users, posts, comments of the demo platform's
dataset, with the fields of `sites/demo/items.py`), cut into outbox entries of `--entry` items
(14: what a batch's commit makes on the demo chain) and handed to each sink's `write` in
batches of `--batch` items of one type with their origins, as the drainer does. Each sink
stores them into a store of its own, three times: `insert` (new keys), `update` (new entries,
the same keys, every post's and comment's likes changed: versions recorded for the history
fields) and `redeliver` (the update's entries again: a redelivery, which must change nothing).
Repeats alternate the sinks, so each pair of numbers shares the machine's moment.

Servers: the postgres sink writes to a PostgreSQL of its own (initdb in a temp dir, durable:
fsync and synchronous commit on), the mongo sink to nx-27017 (the MongoDB wire-protocol server
on SQLite the tests use: not a MongoDB), jsonl to a temp dir with fsync on (the defaults).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from demo.data import Dataset
from external_interface.storage.sinks.base import Origin, Policies, Sink
from external_interface.storage.sinks.jsonl import JsonlSink
from sites.demo.items import Comment, Post, User
from utils.pgserver import PostgresServer, available
from utils.servers import free_port, wait_for_port

TYPES = (User, Post, Comment)


def demo_items(users: int) -> dict[str, list[dict[str, Any]]]:
    """The items a demo_social run stores, by type, as their Item classes dump them."""
    ds = Dataset(users=users)
    out: dict[str, list[dict[str, Any]]] = {t.item_type: [] for t in TYPES}
    for i in range(1, ds.users + 1):
        u = ds.user(f"u{i}")
        assert u is not None
        out[User.item_type].append(User.from_api(u.to_dict()).model_dump(mode="json"))
    for i in range(1, ds.total_posts + 1):
        p = ds.post(f"p{i}")
        assert p is not None
        out[Post.item_type].append(
            Post.from_api(ds.with_author(p, full=True)).model_dump(mode="json")
        )
    for i in range(1, ds.total_comments + 1):
        c = ds.comment(f"c{i}")
        assert c is not None
        out[Comment.item_type].append(Comment.from_api(c.to_dict()).model_dump(mode="json"))
    return out


def policies() -> Policies:
    p = Policies()
    for t in TYPES:
        p.set(t.item_type, track=t.history_fields, search=t.search_fields)
    return p


def batches(
    items: dict[str, list[dict[str, Any]]], entry: int, batch: int, ms: int
) -> Iterator[tuple[str, list[str], list[dict[str, Any]], list[Origin]]]:
    """(type, key fields, items, origins) as the drainer writes them; entry ids from `ms`."""
    seq = 0
    for t in TYPES:
        rows = items[t.item_type]
        origins = []
        for i in range(len(rows)):
            if i % entry == 0:
                seq += 1
            origins.append(Origin(f"{ms}-{seq}", "bench", "step", "demo.bench"))
        for start in range(0, len(rows), batch):
            yield (
                t.item_type,
                list(t.key_fields),
                rows[start : start + batch],
                origins[start : start + batch],
            )


def changed(items: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {
        t: [{**i, "likes": i["likes"] + 1} if "likes" in i else i for i in rows]
        for t, rows in items.items()
    }


def timed(
    sink: Sink, work: list[tuple[str, list[str], list[dict[str, Any]], list[Origin]]]
) -> float:
    t0 = time.perf_counter()
    for item_type, keys, rows, origins in work:
        sink.write(item_type, keys, rows, origins=origins)
    return time.perf_counter() - t0


class Nx:
    """nx-27017 on a free port in a temp dir."""

    def __init__(self) -> None:
        exe = Path(sys.executable).parent / "nx-27017"
        found = str(exe) if exe.exists() else shutil.which("nx-27017")
        if not found:
            raise RuntimeError("nx-27017 is not installed (the test extras)")
        self.dir = Path(tempfile.mkdtemp(prefix="cc-nx-"))
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                found,
                "--data-dir",
                str(self.dir),
                "--host",
                "127.0.0.1",
                "-p",
                str(self.port),
                "--log-file",
                str(self.dir / "nx.log"),
                "--pid-file",
                str(self.dir / "nx.pid"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, timeout=20)

    @property
    def url(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        shutil.rmtree(self.dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.sink_bench", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--users", type=int, default=100, help="demo users (x5 posts, x25 comments)")
    ap.add_argument("--sinks", default="jsonl,mongo,postgres")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--entry", type=int, default=14, help="items per outbox entry")
    ap.add_argument("--batch", type=int, default=500, help="items per sink write (OUTBOX_BATCH)")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.sinks.split(",") if n.strip()]
    items = demo_items(a.users)
    total = sum(len(v) for v in items.values())
    insert = list(batches(items, a.entry, a.batch, 1_700_000_000_000))
    update = list(batches(changed(items), a.entry, a.batch, 1_700_000_060_000))
    servers: dict[str, Any] = {}
    makers: dict[str, Callable[[int], Sink]] = {}
    if "jsonl" in names:
        root = Path(tempfile.mkdtemp(prefix="cc-jsonl-"))
        servers["jsonl"] = root
        makers["jsonl"] = lambda i: JsonlSink(root / f"r{i}", policies=policies())
    if "mongo" in names:
        from external_interface.storage.sinks.mongo import MongoSink

        nx = servers["mongo"] = Nx()
        makers["mongo"] = lambda i: MongoSink(nx.url, f"bench{i}", policies=policies())
    if "postgres" in names:
        why = available()
        if why:
            print(f"postgres: skipped ({why})")
            names.remove("postgres")
        else:
            import psycopg

            from external_interface.storage.sinks.postgres import PostgresSink

            pg = servers["postgres"] = PostgresServer(durable=True).start()

            def make_pg(i: int) -> Sink:
                with psycopg.connect(pg.admin_url, autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "bench{i}"')
                return PostgresSink(pg.url.rsplit("/", 1)[0] + f"/bench{i}", policies=policies())

            makers["postgres"] = make_pg
    results: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    try:
        run = 0
        for _ in range(a.repeat):
            for name in names:  # interleaved: each repeat's sinks share the machine's moment
                run += 1
                sink = makers[name](run)
                try:
                    for phase, work in (
                        ("insert", insert),
                        ("update", update),
                        ("redeliver", update),
                    ):
                        results[name].setdefault(phase, []).append(total / timed(sink, work))
                finally:
                    sink.close()
    finally:
        for name, srv in servers.items():
            if name == "jsonl":
                shutil.rmtree(srv, ignore_errors=True)
            else:
                srv.close()
    print(
        f"{total} items ({len(items['demo.user'])} users, {len(items['demo.post'])} posts, "
        f"{len(items['demo.comment'])} comments), entries of {a.entry}, writes of {a.batch}, "
        f"median of {a.repeat}"
    )
    print(f"{'sink':10} {'insert items/s':>16} {'update items/s':>16} {'redeliver items/s':>18}")
    for name in names:
        r = results[name]
        print(
            f"{name:10} "
            + " ".join(
                f"{statistics.median(r[ph]):>16,.0f}" + (" " if ph == "redeliver" else "")
                for ph in ("insert", "update", "redeliver")
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
