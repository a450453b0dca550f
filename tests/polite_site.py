"""A local site for the politeness tests: robots.txt, sitemaps, a page that answers 429.

Runs on its own event loop in a thread of the test process (free port, ready before
`start()` returns), so tests read its records directly:

- `/robots.txt`: `robots_body` with `robots_status` (set them per test), after
  `robots_delay` seconds; disallows `/private/` for every agent by default.
- `/sitemap_index.xml` -> `/sitemap-pages.xml` (plain), `/sitemap-more.xml.gz` (a gzip
  file), `/sitemap-enc.xml` (gzip as `Content-Encoding`); `/nested-<n>.xml` is an index
  `n` levels deep; `/loop.xml` lists itself.
- `/page/{n}` and `/private/{n}`: small HTML pages (`?ms=` of latency).
- `/limited`: 200 while at most `limit_rate` requests arrived in the last second, else 429
  with `Retry-After: retry_after` (`?ms=` of latency either way); `arrivals` records
  (monotonic time, requests in flight with this one) of each.
- `/redirect`: 302 to `/page/1`; `/status/{code}`: that status (any method).

`hits` records (monotonic time, path, status) of every request.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from collections import deque
from dataclasses import dataclass

from aiohttp import web

from tests.threaded_site import ThreadedSite

ROBOTS = """User-agent: *
Disallow: /private/
Crawl-delay: 2

User-agent: strictbot
Disallow: /

Sitemap: {base}/sitemap_index.xml
"""
PAGES = 6  # per child sitemap


@dataclass(frozen=True)
class Hit:
    t: float
    path: str
    status: int


def urlset(base: str, paths: list[str], lastmod: str | None = "2024-05-01") -> bytes:
    rows = "".join(
        f"<url><loc>{base}{p}</loc>" + (f"<lastmod>{lastmod}</lastmod>" if lastmod else "")
        + "</url>"
        for p in paths
    )  # fmt: skip
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{rows}</urlset>'
    ).encode()


def sitemapindex(base: str, paths: list[str]) -> bytes:
    rows = "".join(f"<sitemap><loc>{base}{p}</loc></sitemap>" for p in paths)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{rows}</sitemapindex>'
    ).encode()


class PoliteSite(ThreadedSite):
    def __init__(self) -> None:
        super().__init__()
        self.robots_body = ROBOTS.format(base=self.url)
        self.robots_status = 200
        self.robots_delay = 0.0
        self.limit_rate = 5
        self.retry_after = "1"
        self.hits: list[Hit] = []
        self.in_flight = 0
        self.arrivals: list[tuple[float, int]] = []
        self._recent: deque[float] = deque()
        self._lock = threading.Lock()

    def count(self, path_prefix: str, status: int | None = None) -> int:
        with self._lock:
            return sum(
                1
                for h in self.hits
                if h.path.startswith(path_prefix) and (status is None or h.status == status)
            )

    def reset(self) -> None:
        with self._lock:
            self.hits.clear()
            self._recent.clear()
            self.arrivals.clear()

    def _hit(self, req: web.Request, status: int) -> None:
        with self._lock:
            self.hits.append(Hit(time.monotonic(), req.path, status))

    # -- handlers

    async def robots(self, req: web.Request) -> web.Response:
        if self.robots_delay:
            await asyncio.sleep(self.robots_delay)
        self._hit(req, self.robots_status)
        return web.Response(text=self.robots_body, status=self.robots_status)

    async def sitemap(self, req: web.Request) -> web.Response:
        name = req.match_info["name"]
        base = self.url
        headers: dict[str, str] = {}
        if name == "sitemap_index.xml":
            body = sitemapindex(
                base, ["/sitemap-pages.xml", "/sitemap-more.xml.gz", "/sitemap-enc.xml"]
            )
        elif name == "sitemap-pages.xml":
            body = urlset(base, [f"/page/{i}" for i in range(PAGES)])
        elif name == "sitemap-more.xml.gz":
            body = gzip.compress(urlset(base, [f"/page/{i}" for i in range(PAGES, 2 * PAGES)]))
            headers["Content-Type"] = "application/gzip"
        elif name == "sitemap-enc.xml":
            body = gzip.compress(
                urlset(base, [f"/page/{i}" for i in range(2 * PAGES, 3 * PAGES)], lastmod=None)
            )
            headers["Content-Encoding"] = "gzip"
        elif name.startswith("nested-"):
            depth = int(name.removeprefix("nested-").removesuffix(".xml"))
            if depth == 0:
                body = urlset(base, ["/page/deep"])
            else:
                body = sitemapindex(base, [f"/nested-{depth - 1}.xml"])
        elif name == "loop.xml":
            body = sitemapindex(base, ["/loop.xml", "/sitemap-pages.xml"])
        else:
            self._hit(req, 404)
            return web.Response(status=404)
        self._hit(req, 200)
        headers.setdefault("Content-Type", "application/xml")
        return web.Response(body=body, headers=headers)

    async def page(self, req: web.Request) -> web.Response:
        await asyncio.sleep(float(req.query.get("ms", "0")) / 1000)
        self._hit(req, 200)
        return web.Response(text=f"<html><h1>{req.path}</h1></html>", content_type="text/html")

    async def limited(self, req: web.Request) -> web.Response:
        with self._lock:
            now = time.monotonic()
            while self._recent and self._recent[0] < now - 1.0:
                self._recent.popleft()
            self._recent.append(now)
            over = len(self._recent) > self.limit_rate
            self.in_flight += 1
            self.arrivals.append((now, self.in_flight))
        try:
            await asyncio.sleep(float(req.query.get("ms", "0")) / 1000)
        finally:
            with self._lock:
                self.in_flight -= 1
        if over:
            self._hit(req, 429)
            return web.Response(status=429, headers={"Retry-After": self.retry_after})
        self._hit(req, 200)
        return web.json_response({"ok": True})

    async def redirect(self, req: web.Request) -> web.Response:
        self._hit(req, 302)
        raise web.HTTPFound("/page/1")

    async def status(self, req: web.Request) -> web.Response:
        code = int(req.match_info["code"])
        self._hit(req, code)
        return web.Response(status=code, text=f"status {code}")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/robots.txt", self.robots)
        app.router.add_get("/page/{n}", self.page)
        app.router.add_get("/private/{n}", self.page)
        app.router.add_get("/limited", self.limited)
        app.router.add_get("/redirect", self.redirect)
        app.router.add_route("*", "/status/{code}", self.status)
        app.router.add_get("/{name}", self.sitemap)
        return app
