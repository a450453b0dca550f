"""The Crawlee for Python baseline: `ParselCrawler` doing the crawl of `bench.workload`.

    var/bench/crawlee-venv/bin/python -m bench.crawlee_crawl     # a peer (bench.peer_protocol)

Runs in its own virtual environment (`bench.crawlee_env`, from requirements/bench-crawlee.txt),
importing only the standard-library modules of `bench` (`workload`, `peer_protocol`).

Per page, as every system does: the page parsed by Crawlee (`context.selector`, parsel), the 3
fields, links and next link of `bench.workload.parse`, one item pushed to the dataset
(`push_data`), links added with `add_requests` (Crawlee's request queue deduplicates by URL).
Configured for this crawl, everything else is Crawlee's default (its HTTP client, session pool,
autoscaled pool with its system snapshots, statistics):
    concurrency_settings  min = desired = max = the concurrency under test: no ramp-up, as the
                          other systems start at full concurrency
    storage_client        MemoryStorageClient: no file per request or item
    configure_logging     False, crawlee loggers at WARNING, and the status message and the
                          periodic statistics line every hour: neither is printed in a crawl
    max_request_retries   0 (the other systems do not retry either; the site never fails)
A new crawler per crawl, built inside the timed span, as Scrapy's crawler is: a crawl is
"start a crawl, wait for it to end". Its request queue and dataset are dropped after the timed
span (Crawlee keeps a process's storages by name, so the next crawl would skip every URL the
last one saw).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crawlee import ConcurrencySettings, Request
from crawlee.crawlers import ParselCrawler, ParselCrawlingContext
from crawlee.statistics import Statistics
from crawlee.storage_clients import MemoryStorageClient

from bench.peer_protocol import Clock, serve
from bench.workload import RULES, parse

QUIET = timedelta(hours=1)


def make_crawler(concurrency: int) -> tuple[ParselCrawler, list[int]]:
    """A crawler of the bench crawl and its page counter."""
    conc = ConcurrencySettings(
        min_concurrency=concurrency, max_concurrency=concurrency, desired_concurrency=concurrency
    )
    crawler = ParselCrawler(
        storage_client=MemoryStorageClient(),
        concurrency_settings=conc,
        configure_logging=False,
        max_request_retries=0,
        status_message_logging_interval=QUIET,
        statistics=Statistics.with_default_state(log_interval=QUIET, periodic_message_logger=None),
    )
    handled = [0]

    @crawler.router.default_handler
    async def page(ctx: ParselCrawlingContext) -> None:
        kind = ctx.request.user_data["kind"]
        fields, links, nxt = parse(kind, ctx.selector)
        url = ctx.request.url
        await ctx.push_data({"url": url, "kind": kind, **fields})
        rule = RULES[kind]
        reqs = [
            Request.from_url(urljoin(url, h), user_data={"kind": rule.link_kind}) for h in links
        ]
        if nxt:
            reqs.append(Request.from_url(urljoin(url, nxt), user_data={"kind": kind}))
        if reqs:
            await ctx.add_requests(reqs)
        handled[0] += 1

    return crawler, handled


async def crawl(req: dict[str, Any]) -> dict[str, Any]:
    clock = Clock()
    crawler, handled = make_crawler(int(req["concurrency"]))
    stats = await crawler.run([Request.from_url(req["url"], user_data={"kind": req["kind"]})])
    data = await crawler.get_data()
    res = clock.result(items=len(data.items), handled=handled[0], failed=stats.requests_failed)
    # the process keeps its storages by name: the next crawl must start from empty ones
    await (await crawler.get_request_manager()).drop()
    await (await crawler.get_dataset()).drop()
    return res


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    for name in ("crawlee", "httpx", "impit"):
        logging.getLogger(name).setLevel(logging.WARNING)
    loop = asyncio.new_event_loop()
    serve(lambda req: loop.run_until_complete(crawl(req)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
