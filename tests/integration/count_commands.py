"""A pytest plugin that counts the Redis commands each test's crawl costs, by key family:

    .venv/bin/python -m pytest -p tests.integration.count_commands -m extended -q -s \
        'tests/integration/test_demo_all_features.py::test_demo_chain_with_every_feature_on_through_rotating_proxies[demo_social]'

A `MONITOR` connection to the test's Redis (`CHAINCRAWL_REDIS_URL`) counts every command the
server runs, a script's own included (as `INFO commandstats` does), while the test runs; the
pages are the demo site's requests (`DemoServer.stats()["total"]`, the last read). One line a
test: commands a page in all, and those on the site's cookie/device pools and proxy channel
(`pool:`, `:proxy`+`{demo}`), on the global proxy pool (`{proxy}`), and the rest (broker,
ledger, commits, outbox). MONITOR slows the server: use the counts, never the times.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from demo.testing import DemoServer

_last: dict[str, Any] = {}
_stats = DemoServer.stats


def _recording_stats(self: DemoServer, *a: Any, **kw: Any) -> dict[str, Any]:
    out = _stats(self, *a, **kw)
    if "total" in out:
        _last["total"] = out["total"]
    return out


DemoServer.stats = _recording_stats  # type: ignore[method-assign]


def family(command: str) -> str:
    """The key family of one MONITOR line's command."""
    if ":site:{" in command and (":pool:" in command or "}:proxy" in command):
        return "site pools"
    if "{proxy}" in command:
        return "global proxy pool"
    return "rest"


def name(command: str) -> str:
    """The command's name; a script call's with its operation (`evalsha:checkout`,
    `evalsha:release:use`: the lease engine's first arguments)."""
    words = command.split(" ")
    head = words[0].lower()
    if head not in ("evalsha", "eval") or len(words) < 4 or not words[2].strip("'\"").isdigit():
        return head
    at = 3 + int(words[2].strip("'\""))
    args = [w.strip("'\"") for w in words[at : at + 4]]
    op = args[0] if args else ""
    if op == "release" and len(args) > 3:
        op += ":" + args[3]
    return f"{head}:{op}"


class Counting(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.by: Counter[str] = Counter()
        self.names: Counter[str] = Counter()
        self._mon: Any = None
        self.ready = threading.Event()

    def run(self) -> None:
        with self.client.monitor() as mon:
            self._mon = mon
            self.ready.set()
            try:
                while True:
                    cmd = mon.next_command()
                    text = str(cmd["command"])
                    fam = family(text)
                    self.by[fam] += 1
                    self.names[f"{fam}/{name(text)}"] += 1
            except (redis.ConnectionError, OSError, ValueError, AttributeError):
                return

    def stop(self) -> None:
        if self._mon is not None:
            self._mon.connection.disconnect()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    url = os.environ.get("CHAINCRAWL_REDIS_URL")
    if not url:
        yield
        return
    mon = Counting(url)
    mon.start()
    mon.ready.wait(5)
    _last.clear()
    yield
    mon.stop()
    pages = int(_last.get("total") or 0)
    total = sum(mon.by.values())
    line = f"\n[commands] {item.name}: {pages} pages, {total} commands"
    if pages:
        line += f", {total / pages:.1f} a page: " + ", ".join(
            f"{k} {v / pages:.1f}" for k, v in sorted(mon.by.items())
        )
        top = [(k, v / pages) for k, v in mon.names.most_common(40)]
        line += "\n[commands] top: " + ", ".join(f"{k} {v:.2f}" for k, v in top)
    print(line)
    with open(os.environ.get("COUNT_COMMANDS_OUT", "/dev/null"), "a") as fh:
        fh.write(line + "\n")
