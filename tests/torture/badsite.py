"""A small aiohttp server of bad pages for the torture suite: malformed HTML and JSON, broken
encodings, oversized and compressed-bomb bodies, redirect loops, hostile field names.

Runs on its own event loop in a daemon thread of the test process, so tests read its hit
counters directly. Every route counts its hits under a key given in the docstring of `app()`.
"""

from __future__ import annotations

import gzip
import random
from collections import Counter

from aiohttp import web
from aiohttp.typedefs import Handler

from tests.threaded_site import ThreadedSite

GBK_TITLE = "中文标题"
HOSTILE_ATTRS = {
    "$where": "function() { return true }",
    "a.b": 1,
    "$set": {"pwned": True},
    "x\x00y": "nul in a key",
    "nested": {"$gt": "", "deep.er": {"$ne": None}},
    "ok": "plain",
}
HOSTILE_TAGS = [{"$inc": {"n": 1}}, "a.b", "$where"]


def _html(body: str) -> str:
    return f"<html><head><title>t</title></head><body>{body}</body></html>"


class BadSite(ThreadedSite):
    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        super().__init__()
        self.bomb = gzip.compress(b"\0" * (20 * 1024 * 1024), compresslevel=9)

    def app(self) -> web.Application:
        """Routes; hits are counted under the path (without query)."""
        app = web.Application(middlewares=[self._count])
        r = app.router
        r.add_get("/html/ok", self._fixed(_html('<p class="t">fine</p>')))
        r.add_get("/html/broken", self.html_broken)
        r.add_get("/html/missing", self._fixed(_html('<p class="other">x</p>')))
        r.add_get("/html/binary", self.html_binary)
        r.add_get("/html/empty", self._fixed(""))
        r.add_get("/json/ok", self.json_ok)
        r.add_get("/json/{name}", self.json_bad)
        r.add_get("/enc/{name}", self.encodings)
        r.add_get("/big", self.big)
        r.add_get("/big-chunked", self.big_chunked)
        r.add_get("/gzip-bomb", self.gzip_bomb)
        r.add_get("/redirect-loop", self.redirect_loop)
        r.add_get("/redirect-chain/{n}", self.redirect_chain)
        r.add_get("/crash/{token}", self.crash)
        r.add_get("/hit/{token}", self._fixed("ok"))
        r.add_get("/hostile", self.hostile)
        return app

    @web.middleware
    async def _count(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.hits[request.path] += 1
        return await handler(request)

    def _fixed(self, html: str) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            return self._text(html)

        return handler

    async def json_ok(self, req: web.Request) -> web.Response:
        return web.json_response({"value": "fine"})

    @staticmethod
    def _text(html: str, charset: str = "utf-8") -> web.Response:
        return web.Response(
            body=html.encode(charset), headers={"Content-Type": f"text/html; charset={charset}"}
        )

    async def html_broken(self, req: web.Request) -> web.Response:
        # unclosed and stray tags, a NUL, control bytes, an unterminated comment at the end
        body = (
            b"<html><body><div><p class='t'>broken but readable<div></span></b></td>"
            b"<<<>>> <p class=t2 <b>\x00\x01\x02 <table><tr><td>cell</div><!-- never closed"
        )
        return web.Response(body=body, headers={"Content-Type": "text/html; charset=utf-8"})

    async def html_binary(self, req: web.Request) -> web.Response:
        body = random.Random(7).randbytes(50_000)
        return web.Response(body=body, headers={"Content-Type": "text/html"})

    async def json_bad(self, req: web.Request) -> web.Response:
        bodies = {
            "truncated": b'{"value": "cut sh',
            "notjson": _html("<p>an error page instead of JSON</p>").encode(),
            "badutf8": b'{"value": "\xff\xfe\xfa"}',
            "deep": b"[" * 100_000 + b"]" * 100_000,
            "array": b"[1, 2, 3]",
            "nan": b'{"value": NaN}',
            "empty": b"",
        }
        body = bodies.get(req.match_info["name"])
        if body is None:
            raise web.HTTPNotFound()
        return web.Response(body=body, headers={"Content-Type": "application/json"})

    async def encodings(self, req: web.Request) -> web.Response:
        name = req.match_info["name"]
        p = '<p class="t">{}</p>'
        if name == "bad-utf8":  # declared utf-8, latin-1 and garbage bytes inside
            body = b'<html><body><p class="t">caf\xe9 \xff\xfe ok</p></body></html>'
            ctype = "text/html; charset=utf-8"
        elif name == "bogus-charset":  # a label no codec knows
            body = _html(p.format("plain ascii")).encode()
            ctype = "text/html; charset=x-no-such-charset"
        elif name == "gbk-as-utf8":  # GBK bytes declared as utf-8
            body = _html(p.format(GBK_TITLE)).encode("gbk")
            ctype = "text/html; charset=utf-8"
        elif name == "gbk-meta":  # no header charset; the meta tag says gbk
            body = (
                f'<html><head><meta charset="gbk"></head><body>{p.format(GBK_TITLE)}</body></html>'
            ).encode("gbk")
            ctype = "text/html"
        elif name == "utf16":  # UTF-16 with a BOM and no label anywhere
            body = _html(p.format("wide")).encode("utf-16")
            ctype = "text/html"
        else:
            raise web.HTTPNotFound()
        return web.Response(body=body, headers={"Content-Type": ctype})

    async def big(self, req: web.Request) -> web.Response:
        n = int(req.query.get("n", str(2 * 1024 * 1024)))
        return web.Response(body=b"a" * n, content_type="text/html")

    async def big_chunked(self, req: web.Request) -> web.StreamResponse:
        """No Content-Length: the limit must hold while reading."""
        n = int(req.query.get("n", str(4 * 1024 * 1024)))
        resp = web.StreamResponse(headers={"Content-Type": "text/html"})
        resp.enable_chunked_encoding()
        await resp.prepare(req)
        chunk = b"b" * 65536
        sent = 0
        try:
            while sent < n:
                await resp.write(chunk)
                sent += len(chunk)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client stopped reading at its limit
        return resp

    async def gzip_bomb(self, req: web.Request) -> web.Response:
        """~20 KB on the wire, 20 MB once decompressed."""
        return web.Response(
            body=self.bomb,
            headers={"Content-Type": "text/html", "Content-Encoding": "gzip"},
        )

    async def redirect_loop(self, req: web.Request) -> web.Response:
        raise web.HTTPFound("/redirect-loop")

    async def redirect_chain(self, req: web.Request) -> web.Response:
        n = int(req.match_info["n"])
        if n <= 0:
            return self._text(_html('<p class="t">end of chain</p>'))
        raise web.HTTPFound(f"/redirect-chain/{n - 1}")

    async def crash(self, req: web.Request) -> web.Response:
        return self._text(_html("<ul></ul>"))  # no li.row: the parser divides by zero

    async def hostile(self, req: web.Request) -> web.Response:
        hid = req.query.get("hid", "h")
        return web.json_response({"hid": hid, "attrs": HOSTILE_ATTRS, "tags": HOSTILE_TAGS})
