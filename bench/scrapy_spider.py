"""The Scrapy baseline: the same crawl as `bench.chaincrawl_bench`, in one Scrapy process.

    .venv/bin/python -m bench.scrapy_spider --base http://127.0.0.1:8700 -c 16 [--json]

Scrapy is a benchmark-only dependency (`.venv/bin/pip install scrapy`; proposed as a `bench`
extra). Usually run by `python -m bench.compare`, which starts the demo server in a process of
its own and this script as a subprocess, so the CPU time measured here (`getrusage(RUSAGE_SELF)`
between `spider_opened` and `spider_closed`) is the crawler's alone.

Work per page is `bench.workload.parse` (3 CSS fields, links, next link), one item per page to a
JSON-lines feed (the "durable hand-off" on Scrapy's side), links followed with
`response.follow` through Scrapy's default scheduler and fingerprint dupefilter.

Settings (everything else is Scrapy's default):
    CONCURRENT_REQUESTS = CONCURRENT_REQUESTS_PER_DOMAIN = N     the concurrency under test
    DOWNLOAD_DELAY = 0, AUTOTHROTTLE_ENABLED = False            no throttling
    ROBOTSTXT_OBEY = False                                      no robots.txt request
    COOKIES_ENABLED = False                                     the demo needs none
    TELNETCONSOLE_ENABLED = False                               no extra listener
    LOG_LEVEL = INFO                                            Scrapy's default DEBUG logs a
                                                                line per request and item; INFO
                                                                is how crawls run in production
    FEEDS = {file: jsonlines}                                   items written to a file
The reactor is Scrapy's default (asyncio); retry, redirect, compression, user-agent, referer,
offsite, depth and stats middlewares stay on as shipped.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import scrapy
from scrapy import signals
from scrapy.crawler import CrawlerProcess

from bench.callgrind import callgrind
from bench.workload import RULES, parse


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class BenchSpider(scrapy.Spider):
    name = "bench"

    def __init__(self, base: str = "http://127.0.0.1:8700", **kw: Any) -> None:
        super().__init__(**kw)
        self.base = base.rstrip("/")
        self.marks: dict[str, float] = {}

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> BenchSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider._opened, signal=signals.spider_opened)
        crawler.signals.connect(spider._closed, signal=signals.spider_closed)
        return spider

    def _opened(self, spider: Any) -> None:
        callgrind("-i", "on")  # under `bench.instructions` only: count from here
        callgrind("-z")
        self.marks["t0"], self.marks["cpu0"] = time.monotonic(), _cpu()

    def _closed(self, spider: Any, reason: str) -> None:
        self.marks["t1"], self.marks["cpu1"] = time.monotonic(), _cpu()
        callgrind("-d")
        callgrind("-i", "off")

    async def start(self):  # Scrapy >= 2.13
        for req in self.start_requests():
            yield req

    def start_requests(self):
        yield scrapy.Request(
            f"{self.base}/pc/feed?page=1", self.parse_page, cb_kwargs={"kind": "feed"}
        )

    def parse_page(self, response: Any, kind: str):
        fields, links, nxt = parse(kind, response)
        yield {"url": response.url, "kind": kind, **fields}
        rule = RULES[kind]
        for href in links:
            yield response.follow(href, self.parse_page, cb_kwargs={"kind": rule.link_kind})
        if nxt:
            yield response.follow(nxt, self.parse_page, cb_kwargs={"kind": kind})


def settings(concurrency: int, feed: str, log_level: str = "INFO") -> dict[str, Any]:
    return {
        "CONCURRENT_REQUESTS": concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": concurrency,
        "DOWNLOAD_DELAY": 0,
        "AUTOTHROTTLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "COOKIES_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": log_level,
        "FEEDS": {feed: {"format": "jsonlines", "overwrite": True}},
    }


def crawl(
    base: str, concurrency: int, log_level: str = "INFO", overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run the crawl in this process; returns pages, items, wall, CPU and peak RSS."""
    with tempfile.TemporaryDirectory(prefix="bench-scrapy-") as tmp:
        feed = os.path.join(tmp, "items.jsonl")
        process = CrawlerProcess({**settings(concurrency, feed, log_level), **(overrides or {})})
        crawler = process.create_crawler(BenchSpider)
        process.crawl(crawler, base=base)
        process.start()
        stats = crawler.stats.get_stats()
        spider = crawler.spider
        with open(feed, "rb") as fh:
            items_on_disk = sum(1 for _ in fh)
    m = spider.marks
    wall = m["t1"] - m["t0"]
    cpu = m["cpu1"] - m["cpu0"]
    pages = int(stats.get("response_received_count", 0))
    return {
        "system": "scrapy",
        "pages": pages,
        "items": int(stats.get("item_scraped_count", 0)),
        "items_on_disk": items_on_disk,
        "errors": int(stats.get("log_count/ERROR", 0)),
        "wall_s": wall,
        "cpu_s": cpu,
        "pages_per_s": pages / wall if wall else 0.0,
        "cpu_ms_per_page": 1000 * cpu / pages if pages else 0.0,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "concurrency": concurrency,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="demo server URL")
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--json", action="store_true", help="print one JSON line (for bench.compare)")
    ap.add_argument("-s", "--set", action="append", default=[], metavar="NAME=VALUE",
                    help="extra Scrapy setting (repeatable), e.g. -s CONCURRENT_ITEMS=16")  # fmt: skip
    a = ap.parse_args(argv)
    overrides = dict(kv.split("=", 1) for kv in a.set)
    res = crawl(a.base, a.concurrency, a.log_level, overrides)
    res["settings"] = overrides
    if a.json:
        print("BENCH_RESULT " + json.dumps(res), flush=True)
    else:
        for k, v in res.items():
            print(f"{k:>16}: {v:.3f}" if isinstance(v, float) else f"{k:>16}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
