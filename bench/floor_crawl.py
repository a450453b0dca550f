"""The no-framework floor: the same crawl with urllib3 keep-alive and parsel, nothing else.

    .venv/bin/python -m bench.floor_crawl [--threads N]    # a peer process (bench.peer_protocol)

What any crawler in Python must spend on a page: one keep-alive GET (urllib3), the body decoded
by its declared charset, a parsel Selector, the 3 fields, links and next link of
`bench.workload`, each URL once (a set), one JSON line per item appended to a file. One thread
by default: no scheduler, no retry, no hand-off; `--threads N` runs N threads on one queue
with a pool of N connections (the GIL makes it dearer per page on most machines).
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import urllib3
from parsel import Selector

from bench.peer_protocol import Clock, serve
from bench.workload import RULES, parse


def _charset(ctype: str) -> str:
    return ctype.split("charset=", 1)[1].split(";")[0].strip() if "charset=" in ctype else "utf-8"


class Floor:
    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self.http = urllib3.PoolManager(maxsize=threads, retries=False)

    def page(self, url: str, kind: str) -> tuple[bytes, list[tuple[str, str]]]:
        """One page: (its item as a JSON line, the (url, kind) pairs it links to)."""
        r = self.http.request("GET", url, redirect=False)
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}")
        text = r.data.decode(_charset(r.headers.get("Content-Type", "")), "replace")
        fields, links, nxt = parse(kind, Selector(text=text))
        rule = RULES[kind]
        kids = [(urljoin(url, h), rule.link_kind or "") for h in links]
        if nxt:
            kids.append((urljoin(url, nxt), kind))
        return json.dumps({"url": url, "kind": kind, **fields}).encode() + b"\n", kids

    def crawl(self, req: dict[str, Any]) -> dict[str, Any]:
        with tempfile.NamedTemporaryFile(prefix="bench-floor-", suffix=".jsonl") as out:
            clock = Clock()
            n = self._one(req, out) if self.threads <= 1 else self._many(req, out)
            out.flush()
            res = clock.result(items=n, handled=n)
        return res

    def _one(self, req: dict[str, Any], out: Any) -> int:
        todo, seen, n = deque([(req["url"], req["kind"])]), {req["url"]}, 0
        while todo:
            line, kids = self.page(*todo.popleft())
            out.write(line)
            n += 1
            for kid in kids:
                if kid[0] not in seen:
                    seen.add(kid[0])
                    todo.append(kid)
        return n

    def _many(self, req: dict[str, Any], out: Any) -> int:
        todo: queue.Queue[tuple[str, str]] = queue.Queue()
        todo.put((req["url"], req["kind"]))
        seen, lock, done, errors = {req["url"]}, threading.Lock(), [0], []

        def work() -> None:
            while True:
                url, kind = todo.get()
                if not url:
                    return
                try:
                    line, kids = self.page(url, kind)
                    with lock:
                        out.write(line)
                        done[0] += 1
                        for kid in kids:
                            if kid[0] not in seen:
                                seen.add(kid[0])
                                todo.put(kid)
                except Exception as exc:
                    errors.append(exc)
                finally:
                    todo.task_done()

        pool = [threading.Thread(target=work, daemon=True) for _ in range(self.threads)]
        for t in pool:
            t.start()
        todo.join()
        for _ in pool:
            todo.put(("", ""))
        if errors:
            raise errors[0]
        return done[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    serve(Floor(a.threads).crawl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
