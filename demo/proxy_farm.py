"""Real HTTP forward proxies and a tiny target site, all on 127.0.0.0/8: the proxies the demo
platform's `/proxies` list can name (tests, `bench.redis_cost --features`), and the proxy tests'
stand-in site.

`ForwardProxy` is a small asyncio HTTP/1.1 forward proxy (absolute-URI requests, no CONNECT).
It listens on its own 127.0.0.x address and opens its upstream connections *from* that address
(`local_addr`), so a site sees each proxy as a different client. Options: added latency,
transparency (adds X-Forwarded-For with the client address and Via) and Basic credentials.

`TargetSite` stands in for the demo platform: `/headers` echoes the peer address and headers,
`/proxies?page=N` lists proxies as HTML rows, `/api/proxies` as JSON (a provider API), and
`/site/<name>` is a page that can ban addresses.

`ProxyFarm` runs all of them on one event loop in a daemon thread. Run this module to serve a
few proxies from the command line: `python -m demo.proxy_farm --help`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import threading
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from aiohttp import web

from utils.servers import free_port

T = TypeVar("T")

HOP_BY_HOP = {
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
}

_hosts = itertools.count(2)
_hosts_lock = threading.Lock()


def next_loopback() -> str:
    """A loopback address not handed out before in this process: 127.0.0.2, .3, ... 127.0.1.1 ..."""
    with _hosts_lock:
        n = next(_hosts)
    hi, lo = divmod(n - 2, 253)
    if hi > 255:
        raise RuntimeError("out of loopback addresses")
    return f"127.0.{hi}.{lo + 2}"


def _response(status: int, reason: str, body: bytes = b"", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    ).encode("latin-1") + body


class ForwardProxy:
    """One forward proxy. `url` carries the credentials when `auth` is set."""

    def __init__(
        self,
        host: str,
        port: int = 0,
        *,
        delay: float = 0.0,
        transparent: bool = False,
        auth: tuple[str, str] | None = None,
        upstream_timeout: float = 30.0,
    ) -> None:
        self.host = host
        self.port = port
        self.delay = delay
        self.transparent = transparent
        self.auth = auth
        self.upstream_timeout = upstream_timeout
        self.requests = 0
        self.rejected_auth = 0
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    @property
    def id(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        cred = f"{self.auth[0]}:{self.auth[1]}@" if self.auth else ""
        return f"http://{cred}{self.host}:{self.port}"

    async def start(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Close the port (connections now get refused) and cut open connections."""
        if self._server is not None:
            self._server.close()
            for w in list(self._conns):
                w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            await self._serve_one(reader, writer)
        except (
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
            asyncio.CancelledError,  # the proxy or the farm is shutting down
        ):
            pass
        finally:
            self._conns.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, _version = lines[0].split(" ", 2)
        except ValueError:
            writer.write(_response(400, "Bad Request"))
            return
        headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers.append((name.strip(), value.strip()))
        lower = {n.lower(): v for n, v in headers}
        if method.upper() == "CONNECT":
            writer.write(_response(501, "Not Implemented", b"CONNECT is not supported\n"))
            return
        if self.auth and not self._authorized(lower.get("proxy-authorization", "")):
            self.rejected_auth += 1
            extra = 'Proxy-Authenticate: Basic realm="test"\r\n'
            writer.write(_response(407, "Proxy Authentication Required", extra=extra))
            return
        url = urlsplit(target)
        if url.scheme != "http" or not url.hostname:
            writer.write(_response(400, "Bad Request", b"absolute http:// URI required\n"))
            return
        body = b""
        if lower.get("content-length", "").isdigit():
            body = await reader.readexactly(int(lower["content-length"]))
        self.requests += 1
        if self.delay:
            await asyncio.sleep(self.delay)

        drop = HOP_BY_HOP | {h.strip().lower() for h in lower.get("connection", "").split(",")}
        out = [(n, v) for n, v in headers if n.lower() not in drop]
        if self.transparent:
            peer = writer.get_extra_info("peername")[0]
            xff = lower.get("x-forwarded-for")
            out = [(n, v) for n, v in out if n.lower() != "x-forwarded-for"]
            out.append(("X-Forwarded-For", f"{xff}, {peer}" if xff else peer))
            out.append(("Via", f"1.1 {self.host} (cc-test-proxy)"))
        out.append(("Connection", "close"))
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        request = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in out)

        try:
            up_r, up_w = await asyncio.wait_for(
                asyncio.open_connection(url.hostname, url.port or 80, local_addr=(self.host, 0)),
                self.upstream_timeout,
            )
        except (OSError, TimeoutError):
            writer.write(_response(502, "Bad Gateway", b"upstream unreachable\n"))
            return
        try:
            up_w.write(request.encode("latin-1") + b"\r\n" + body)
            await up_w.drain()
            resp_head = await asyncio.wait_for(up_r.readuntil(b"\r\n\r\n"), self.upstream_timeout)
            writer.write(self._rewrite_response_head(resp_head))
            while chunk := await asyncio.wait_for(up_r.read(65536), self.upstream_timeout):
                writer.write(chunk)
                await writer.drain()
            await writer.drain()
        finally:
            up_w.close()

    def _authorized(self, header: str) -> bool:
        assert self.auth is not None
        scheme, _, value = header.partition(" ")
        want = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
        return scheme.lower() == "basic" and value.strip() == want

    @staticmethod
    def _rewrite_response_head(head: bytes) -> bytes:
        """Tell the client we close after this response (we never keep connections)."""
        lines = head.decode("latin-1").split("\r\n")
        kept = [
            ln
            for ln in lines[1:]
            if ln and ln.split(":", 1)[0].strip().lower() not in ("connection", "keep-alive")
        ]
        return ("\r\n".join([lines[0], *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1")


@dataclass
class TargetSite:
    """The validation/harvest target: records who asked for what."""

    host: str = "127.0.0.1"
    port: int = 0
    listing: list[list[tuple[str, int, str]]] = field(default_factory=list)  # pages of rows
    api_listing: list[object] = field(default_factory=list)  # JSON entries of /api/proxies
    banned: dict[str, set[str]] = field(default_factory=dict)  # site -> banned peer addresses
    hits: Counter = field(default_factory=Counter)  # (path, peer) -> n
    _runner: web.AppRunner | None = None

    def url(self, path: str = "/") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def ban(self, site: str, addr: str) -> None:
        self.banned.setdefault(site, set()).add(addr)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/headers", self._headers)
        app.router.add_get("/proxies", self._proxies)
        app.router.add_get("/site/{name}", self._site)
        app.router.add_get("/api/proxies", self._api)
        return app

    async def start(self) -> TargetSite:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        self.port = self.port or free_port(self.host)
        await web.TCPSite(self._runner, self.host, self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _headers(self, request: web.Request) -> web.Response:
        self.hits[("/headers", request.remote)] += 1
        return web.json_response({"remote_addr": request.remote, "headers": dict(request.headers)})

    async def _proxies(self, request: web.Request) -> web.Response:
        page = int(request.query.get("page", "1"))
        rows = self.listing[page - 1] if 0 < page <= len(self.listing) else []
        body = "".join(
            f'<tr class="proxy"><td class="ip">{ip}</td><td class="port">{port}</td>'
            f'<td class="type">{kind}</td></tr>'
            for ip, port, kind in rows
        )
        html = f"<html><body><table>{body}</table></body></html>"
        return web.Response(text=html, content_type="text/html")

    async def _api(self, request: web.Request) -> web.Response:
        return web.json_response({"data": self.api_listing})

    async def _site(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.hits[(f"/site/{name}", request.remote)] += 1
        if request.remote in self.banned.get(name, ()):
            return web.Response(status=403, text="banned")
        return web.Response(text=f"welcome to {name}")


class ProxyFarm:
    """An event loop in a daemon thread hosting proxies and target sites for the tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="proxy-farm", daemon=True
        )
        self.proxies: list[ForwardProxy] = []
        self.sites: list[TargetSite] = []

    def start(self) -> ProxyFarm:
        self._thread.start()
        return self

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 15.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def add_proxy(self, host: str | None = None, **options: Any) -> ForwardProxy:
        proxy = self.run(ForwardProxy(host or next_loopback(), **options).start())
        self.proxies.append(proxy)
        return proxy

    def stop_proxy(self, proxy: ForwardProxy) -> None:
        self.run(proxy.stop())
        if proxy in self.proxies:
            self.proxies.remove(proxy)

    def add_site(self, **options: Any) -> TargetSite:
        site = self.run(TargetSite(**options).start())
        self.sites.append(site)
        return site

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        for p in list(self.proxies):
            self.stop_proxy(p)
        for s in self.sites:
            self.run(s.stop())
        self.sites.clear()
        self.run(self._cancel_pending())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    @staticmethod
    async def _cancel_pending() -> None:
        """Cancel handlers still running (a slow proxy mid-sleep) so the loop closes cleanly."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> ProxyFarm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def dead_address() -> tuple[str, int]:
    """A loopback address and port where nothing listens: connections are refused."""
    host = next_loopback()
    return host, free_port(host)


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - manual use
    """Serve proxies until Ctrl-C: by default one healthy, one slow, one transparent and a
    target site; `--healthy N` adds N healthy ones, `--list FILE` writes every proxy's
    `host:port` to FILE (the demo's `--proxies-file`, so its `/proxies` page lists them)."""
    import argparse
    import time
    from pathlib import Path

    ap = argparse.ArgumentParser(prog="python -m demo.proxy_farm")
    ap.add_argument("--healthy", type=int, default=1, help="healthy proxies (1)")
    ap.add_argument("--slow", type=int, default=1, help="proxies adding 3 s (1)")
    ap.add_argument("--transparent", type=int, default=1, help="leaky proxies (1)")
    ap.add_argument("--dead", type=int, default=0, help="listed addresses nothing serves (0)")
    ap.add_argument("--list", type=Path, help="write every proxy's host:port to this file")
    a = ap.parse_args(argv)
    with ProxyFarm() as farm:
        site = farm.add_site()
        rows = [("healthy", farm.add_proxy().id) for _ in range(a.healthy)]
        rows += [("slow", farm.add_proxy(delay=3).id) for _ in range(a.slow)]
        rows += [("transparent", farm.add_proxy(transparent=True).id) for _ in range(a.transparent)]
        rows += [("dead", "{}:{}".format(*dead_address())) for _ in range(a.dead)]
        print(f"target {site.url('/headers')}")
        for name, ident in rows:
            print(f"{name:12} http://{ident}")
        if a.list:
            a.list.parent.mkdir(parents=True, exist_ok=True)
            a.list.write_text("".join(f"{ident}\n" for _, ident in rows))
            print(f"listed in {a.list}")
        print("Ctrl-C to stop", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(1)


if __name__ == "__main__":  # pragma: no cover
    main()
