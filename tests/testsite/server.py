"""The test site: a paged listing, details, paged reviews, and pages that fail on purpose.

Runs in a background thread of the test process (aiohttp on its own loop), so tests can read
its request counters directly.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from aiohttp import web

from tests.threaded_site import ThreadedSite

PAGES = 3  # listing pages
PER_PAGE = 4  # entries per listing page
REVIEW_PAGES = 2
REVIEWS_PER_PAGE = 3


class TestSite(ThreadedSite):
    __test__ = False  # a server, not a test class

    def __init__(self, pages: int = PAGES, per_page: int = PER_PAGE) -> None:
        self.pages, self.per_page = pages, per_page
        self.hits: Counter[str] = Counter()
        self.in_flight = self.max_in_flight = 0  # /flaky requests being answered at once
        self.released: set[str] = set()  # /hold/{key} pages let go (`release`)
        super().__init__()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/list", self.listing)
        app.router.add_get("/detail/{id}", self.detail)
        app.router.add_get("/reviews/{id}", self.reviews)
        app.router.add_get("/flaky/{key}", self.flaky)
        app.router.add_get("/status/{code}", self.status)
        app.router.add_get("/slow", self.slow)
        app.router.add_get("/hold/{key}", self.hold)
        app.router.add_get("/drip", self.drip)
        app.router.add_get("/big", self.big)
        app.router.add_get("/redirect-loop", self.redirect_loop)
        app.router.add_get("/gbk", self.gbk)
        app.router.add_get("/mislabelled", self.mislabelled)
        app.router.add_get("/malformed", self.malformed)
        return app

    async def listing(self, req: web.Request) -> web.Response:
        page = int(req.query.get("page", "1"))
        self.hits[f"list:{page}"] += 1
        per = int(req.query.get("per", self.per_page))
        entries = [{"id": f"e{page}-{i}", "n": i} for i in range(per)]
        nxt = page + 1 if page < self.pages else None
        return web.json_response({"entries": entries, "next": nxt})

    async def detail(self, req: web.Request) -> web.Response:
        eid = req.match_info["id"]
        self.hits[f"detail:{eid}"] += 1
        return web.json_response({"id": eid, "title": f"Title {eid}"})

    async def reviews(self, req: web.Request) -> web.Response:
        eid = req.match_info["id"]
        page = int(req.query.get("page", "1"))
        self.hits[f"reviews:{eid}:{page}"] += 1
        delay = float(req.query.get("delay", "0"))
        if delay:
            await asyncio.sleep(delay)
        rows = [{"id": f"{eid}-r{page}-{i}", "text": "ok"} for i in range(REVIEWS_PER_PAGE)]
        return web.json_response(
            {"reviews": rows, "next": page + 1 if page < REVIEW_PAGES else None}
        )

    async def flaky(self, req: web.Request) -> web.Response:
        key = req.match_info["key"]
        fails = int(req.query.get("fails", "2"))
        self.hits[f"flaky:{key}"] += 1
        delay = float(req.query.get("delay", "0"))
        if delay:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(delay)
            finally:
                self.in_flight -= 1
        if self.hits[f"flaky:{key}"] <= fails:
            return web.Response(status=503, text="try later")
        return web.json_response({"key": key, "value": "finally"})

    async def status(self, req: web.Request) -> web.Response:
        code = int(req.match_info["code"])
        self.hits[f"status:{code}"] += 1
        return web.Response(status=code, text=f"status {code}")

    async def slow(self, req: web.Request) -> web.Response:
        await asyncio.sleep(float(req.query.get("s", "1")))
        return web.json_response({"slow": True})

    def release(self, key: str) -> None:
        """Let /hold/{key} answer: a page that lasts exactly as long as the test needs."""
        self.released.add(key)

    async def hold(self, req: web.Request) -> web.Response:
        """Answers once the test releases the key (or after `s` seconds, 120 by default)."""
        key = req.match_info["key"]
        loop = asyncio.get_running_loop()
        until = loop.time() + float(req.query.get("s", "120"))
        while key not in self.released and loop.time() < until:
            await asyncio.sleep(0.05)
        return web.json_response({"held": key})

    async def drip(self, req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(req)
        for _ in range(int(req.query.get("n", "100"))):
            await resp.write(b"x")
            await asyncio.sleep(float(req.query.get("every", "0.2")))
        return resp

    async def big(self, req: web.Request) -> web.Response:
        return web.Response(body=b"a" * int(req.query.get("n", str(2 * 1024 * 1024))))

    async def redirect_loop(self, req: web.Request) -> web.Response:
        raise web.HTTPFound("/redirect-loop")

    async def gbk(self, req: web.Request) -> web.Response:
        html = (
            '<html><head><meta charset="gbk"></head><body><p class="t">中文标题</p></body></html>'
        )
        return web.Response(body=html.encode("gbk"), content_type="text/html")

    async def malformed(self, req: web.Request) -> web.Response:
        """A 200 whose JSON is broken (the whole body sent: not a truncation)."""
        self.hits["malformed"] += 1
        return web.Response(body=b'{"id": 1, "title": ', content_type="application/json")

    async def mislabelled(self, req: web.Request) -> web.Response:
        """Latin-1 text labelled UTF-8: two bytes (é, è) no UTF-8 decoder accepts."""
        html = '<html><body><p class="t">café crème</p></body></html>'
        return web.Response(body=html.encode("latin-1"),
                            headers={"Content-Type": "text/html; charset=utf-8"})  # fmt: skip
