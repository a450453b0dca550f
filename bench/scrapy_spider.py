"""The Scrapy baseline: the crawl of `bench.workload` by a Scrapy spider, in a peer process.

    .venv/bin/python -m bench.scrapy_spider --config broad-lean    # a peer (bench.peer_protocol)

Per page: `bench.workload.parse` on the response (3 CSS fields, links, next link), one item per
page to a JSON-lines feed (the durable hand-off on Scrapy's side), links followed with
`response.follow` through Scrapy's scheduler and its fingerprint dupefilter. The process keeps
its Twisted reactor running between crawls (`CrawlerRunner`): a crawl is timed from the
`runner.crawl()` call (the crawler built, its spider opened) to its deferred firing (spider
closed, feed written), on a warm interpreter.

Every configuration runs with the concurrency under test (`CONCURRENT_REQUESTS` =
`CONCURRENT_REQUESTS_PER_DOMAIN` = N: the site is one domain), no download delay, and the feed;
`CONFIGS` holds the candidates for "Scrapy at its best" on this kind of crawl, from Scrapy's
documentation (the settings reference and its "Broad Crawls" page), each on top of the one
before. `BEST` is the one with the lowest CPU per page when they were measured side by side
(`python -m bench.compare --scenarios cpu --scrapy-configs all`, docs/performance.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import scrapy

from bench.callgrind import callgrind
from bench.peer_protocol import Clock, serve
from bench.workload import RULES, parse

ASYNCIO = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"  # Scrapy's default
EPOLL = "twisted.internet.epollreactor.EPollReactor"

# "Broad Crawls": lower the log level, no cookies, no retries, no redirects, a shorter download
# timeout, a larger reactor thread pool (DNS), the downloader-aware priority queue, and crawling
# in breadth-first order (DEPTH_PRIORITY with FIFO queues).
_BROAD = {
    "LOG_LEVEL": "INFO",
    "CONCURRENT_ITEMS": 16,
    "COOKIES_ENABLED": False,
    "RETRY_ENABLED": False,
    "REDIRECT_ENABLED": False,
    "DOWNLOAD_TIMEOUT": 15,
    "REACTOR_THREADPOOL_MAXSIZE": 20,
    "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.DownloaderAwarePriorityQueue",
    "DEPTH_PRIORITY": 1,
    "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
    "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
}
# Everything this crawl does not use switched off: the telnet console, memory usage, periodic
# log stats and the stats collector, and the middlewares that have nothing to do here.
_OFF = "scrapy.downloadermiddlewares."
_LEAN = {
    **_BROAD,
    "TELNETCONSOLE_ENABLED": False,
    "MEMUSAGE_ENABLED": False,
    "LOGSTATS_INTERVAL": 0,
    "STATS_CLASS": "scrapy.statscollectors.DummyStatsCollector",
    "EXTENSIONS": {
        "scrapy.extensions.telnet.TelnetConsole": None,
        "scrapy.extensions.memusage.MemoryUsage": None,
        "scrapy.extensions.logstats.LogStats": None,
        "scrapy.extensions.corestats.CoreStats": None,
    },
    "DOWNLOADER_MIDDLEWARES": {
        f"{_OFF}robotstxt.RobotsTxtMiddleware": None,
        f"{_OFF}httpauth.HttpAuthMiddleware": None,
        f"{_OFF}redirect.MetaRefreshMiddleware": None,
        f"{_OFF}httpproxy.HttpProxyMiddleware": None,
        f"{_OFF}stats.DownloaderStats": None,
    },
    "SPIDER_MIDDLEWARES": {
        "scrapy.spidermiddlewares.referer.RefererMiddleware": None,
        "scrapy.spidermiddlewares.urllength.UrlLengthMiddleware": None,
    },
}
CONFIGS: dict[str, dict[str, Any]] = {
    # Scrapy as shipped: DEBUG log (a line per request and per item), cookies, telnet,
    # memory usage, stats, CONCURRENT_ITEMS=100
    "defaults": {},
    "info": {"LOG_LEVEL": "INFO"},
    # CONCURRENT_ITEMS: items processed in parallel per response (100 starts 100 tasks each)
    "items16": {"LOG_LEVEL": "INFO", "CONCURRENT_ITEMS": 16},
    "broad": _BROAD,
    "broad-lean": _LEAN,
    # the reactor: Twisted's own epoll reactor instead of the asyncio one
    "broad-lean-epoll": {**_LEAN, "TWISTED_REACTOR": EPOLL},
}
BEST = "broad-lean"


def settings(config: str, concurrency: int, feed: str) -> dict[str, Any]:
    if config not in CONFIGS:
        raise ValueError(f"unknown Scrapy configuration {config!r}; known: {', '.join(CONFIGS)}")
    return {
        "CONCURRENT_REQUESTS": concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": concurrency,
        "DOWNLOAD_DELAY": 0,
        "ROBOTSTXT_OBEY": False,
        "TWISTED_REACTOR": ASYNCIO,
        **CONFIGS[config],
        "FEEDS": {feed: {"format": "jsonlines", "overwrite": True}},
    }


class BenchSpider(scrapy.Spider):
    name = "bench"

    def __init__(self, url: str = "", kind: str = "", **kw: Any) -> None:
        super().__init__(**kw)
        self.seed, self.kind, self.handled = url, kind, 0

    async def start(self):  # Scrapy >= 2.13
        yield scrapy.Request(self.seed, self.parse_page, cb_kwargs={"kind": self.kind})

    def parse_page(self, response: Any, kind: str):
        self.handled += 1
        fields, links, nxt = parse(kind, response)
        yield {"url": response.url, "kind": kind, **fields}
        rule = RULES[kind]
        for href in links:
            yield response.follow(href, self.parse_page, cb_kwargs={"kind": rule.link_kind})
        if nxt:
            yield response.follow(nxt, self.parse_page, cb_kwargs={"kind": kind})


def run(config: str) -> None:
    """Serve crawl requests with one reactor for the process's life. The imports are here: the
    configuration's reactor must be installed before anything imports Twisted's reactor."""
    from scrapy.utils.log import configure_logging
    from scrapy.utils.reactor import install_reactor

    reactor_path = settings(config, 1, "-")["TWISTED_REACTOR"]
    install_reactor(reactor_path)
    from scrapy.crawler import Crawler, CrawlerRunner
    from twisted.internet import reactor as installed
    from twisted.internet import threads

    reactor: Any = installed  # the configured reactor; the hints describe a generic one

    configure_logging({"LOG_LEVEL": CONFIGS[config].get("LOG_LEVEL", "DEBUG")})
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    runner = CrawlerRunner()
    tmp = tempfile.mkdtemp(prefix="bench-scrapy-")

    def start(req: dict[str, Any]) -> Any:
        feed = os.path.join(tmp, "items.jsonl")
        callgrind("-i", "on")  # under `bench.instructions` only: count the crawl alone
        callgrind("-z")
        clock = Clock()
        crawler = Crawler(BenchSpider, settings(config, int(req["concurrency"]), feed))
        d = runner.crawl(crawler, url=req["url"], kind=req["kind"])

        def done(_: Any) -> dict[str, Any]:
            callgrind("-d")
            callgrind("-i", "off")
            with open(feed, "rb") as fh:
                items = sum(1 for _ in fh)
            spider: Any = crawler.spider  # a BenchSpider
            return clock.result(items=items, handled=spider.handled, config=config)

        return d.addCallback(done)

    def loop() -> None:
        try:
            serve(lambda req: threads.blockingCallFromThread(reactor, start, req))
        finally:
            reactor.callFromThread(reactor.stop)

    threading.Thread(target=loop, daemon=True).start()
    reactor.run(installSignalHandlers=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=BEST, choices=list(CONFIGS))
    run(ap.parse_args(argv).config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
