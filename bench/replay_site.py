"""A cheap stand-in for the demo server: the demo's pc pages, recorded once, replayed from memory.

    with ReplayServer.record(users=95, posts_per_user=10, comments_per_post=5) as site:
        site.url, site.stats()["total"], site.cpu()

Why: the demo server (aiohttp, Python) costs about 0.3 ms CPU per page. At the 600-900 pages/s
of two workers on a 2-core machine that is a quarter of a core taken from the crawler, so the
`scale` ratio measured the CPU the page server left over. This server answers a request with a
dict lookup and one `transport.write` on a bare `asyncio.Protocol` (HTTP/1.1, keep-alive).

`record()` starts a DemoServer without latency, walks it as the crawlers do (`bench.workload`
rules from the seeds the benchmarks use, each href resolved with `urljoin(response.url, href)`
as both crawlers do) and keeps every response: status, Content-Type, body, byte for byte
(Date and Server are dropped, Content-Length is recomputed). The demo server is then stopped
and the replay runs in a process of its own (`python -m bench.replay_site serve`), so its CPU
is measured apart (`cpu()`). A fixed `latency_ms` delays every response (`loop.call_later`), as
the demo's `latency_ms` does.

The admin side is the demo's: `GET /healthz`, `GET /admin/stats[?timestamps=1]` (`total`,
`by_status`, `distinct` targets answered, arrival times per client IP under `recent.by_ip`),
`POST /admin/reset`; not counted.
A request for anything that was not recorded gets a 404 and is counted in `unknown` (first
paths in `unknown_paths`): a crawler that asks for other URLs than the recording shows up.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo.testing import DemoServer, ServerProcess  # after the path fix-up above

ROOT = Path(__file__).resolve().parent.parent
# the crawl's seed and the warm-up run's seed (chaincrawl_bench.crawl, plain_celery.crawl)
SEEDS: tuple[tuple[str, str], ...] = (("/pc/feed?page=1", "feed"), ("/pc/user/u1", "user"))
PC_UA = "Mozilla/5.0 (X11; Linux x86_64) chaincrawl-bench-recorder"
DROPPED = frozenset(
    {"date", "server", "content-length", "connection", "keep-alive", "transfer-encoding"}
)
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found"}


@dataclass(frozen=True)
class Page:
    status: int
    headers: tuple[tuple[str, str], ...]  # as sent, hop-by-hop, Date and Server left out
    body: bytes

    def wire(self, close: bool = False) -> bytes:
        """The whole HTTP/1.1 response."""
        reason = REASONS.get(self.status, "Status")
        head = [f"HTTP/1.1 {self.status} {reason}"]
        head += [f"{k}: {v}" for k, v in self.headers]
        head.append(f"Content-Length: {len(self.body)}")
        if close:
            head.append("Connection: close")
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + self.body


def target_of(url: str) -> str:
    """The request target a client sends for `url` (origin form: path and query)."""
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _charset(headers: Iterable[tuple[str, str]]) -> str:
    for k, v in headers:
        if k.lower() == "content-type" and "charset=" in v:
            return v.split("charset=", 1)[1].split(";")[0].strip()
    return "utf-8"


def walk(base: str, seeds: Iterable[tuple[str, str]] = SEEDS, threads: int = 8) -> dict[str, Page]:
    """Fetch every page the benchmark crawl requests, breadth first: {request target: Page}."""
    import urllib3
    from parsel import Selector

    from bench.workload import RULES, parse

    http = urllib3.PoolManager(maxsize=threads, retries=False)

    def fetch(url: str, kind: str) -> tuple[str, Page, list[tuple[str, str]]]:
        r = http.request("GET", url, headers={"User-Agent": PC_UA}, redirect=False)
        headers = tuple((k, v) for k, v in r.headers.items() if k.lower() not in DROPPED)
        page = Page(r.status, headers, r.data)
        kids: list[tuple[str, str]] = []
        if r.status == 200:
            text = r.data.decode(_charset(headers), "replace")
            _, links, nxt = parse(kind, Selector(text=text))
            rule = RULES[kind]
            kids = [(urljoin(url, h), rule.link_kind or "") for h in links]
            if nxt:
                kids.append((urljoin(url, nxt), kind))
        return url, page, kids

    pages: dict[str, Page] = {}
    seen: set[str] = set()
    level = []
    for path, kind in seeds:
        url = urljoin(base, path)
        if url not in seen:
            seen.add(url)
            level.append((url, kind))
    with ThreadPoolExecutor(threads) as pool:
        while level:
            nxt_level = []
            for url, page, kids in pool.map(lambda uk: fetch(*uk), level):
                pages[target_of(url)] = page
                for kid in kids:
                    if kid[0] not in seen:
                        seen.add(kid[0])
                        nxt_level.append(kid)
            level = nxt_level
    http.clear()
    return pages


# --- the server process --------------------------------------------------------------------


class _Site:
    """What every connection shares: responses by target, counters, arrival times."""

    def __init__(self, pages: dict[str, Page], latency_ms: float) -> None:
        self.pages = {t.encode("latin-1"): p for t, p in pages.items()}
        self.responses = {t: p.wire() for t, p in self.pages.items()}
        self.latency = latency_ms / 1000
        self.reset()

    def reset(self) -> None:
        self.since = time.time()
        self.cpu0 = time.process_time()
        self.total = 0
        self.connections = 0
        self.unknown = 0
        self.unknown_paths: list[str] = []
        self.served: set[bytes] = set()  # distinct targets: a page fetched twice shows here
        self.by_status: dict[str, int] = {}
        # emptied in place: open keep-alive connections hold their IP's list
        for times in getattr(self, "arrivals", {}).values():
            times.clear()
        self.arrivals: dict[str, list[float]] = getattr(self, "arrivals", {})

    def stats(self, timestamps: bool) -> dict[str, Any]:
        recent = {
            ip: {"count": len(ts), **({"timestamps": ts} if timestamps else {})}
            for ip, ts in self.arrivals.items()
            if ts
        }
        return {
            "since": self.since,
            "now": time.time(),
            "total": self.total,
            "connections": self.connections,  # opened since the reset: keep-alive shows here
            "by_status": dict(self.by_status),
            "unknown": self.unknown,
            "unknown_paths": self.unknown_paths,
            "distinct": len(self.served),
            "cpu_s": time.process_time() - self.cpu0,  # own view; psutil from outside agrees
            "recent": {"by_ip": recent},
        }

    def respond(self, method: bytes, target: bytes, arrivals: list[float], close: bool) -> bytes:
        if target.startswith((b"/admin/", b"/healthz")):
            return self.admin(method, target, close)
        self.total += 1
        arrivals.append(time.time())
        resp = self.responses.get(target) if method == b"GET" else None
        if resp is None:
            self.unknown += 1
            if len(self.unknown_paths) < 20:
                self.unknown_paths.append(f"{method.decode('latin-1')} {target.decode('latin-1')}")
            self.by_status["404"] = self.by_status.get("404", 0) + 1
            return _plain(404, b"404 not recorded by bench.replay_site\n", close)
        self.served.add(target)
        status = str(self.pages[target].status)
        self.by_status[status] = self.by_status.get(status, 0) + 1
        return self.pages[target].wire(close=True) if close else resp

    def admin(self, method: bytes, target: bytes, close: bool) -> bytes:
        path, _, query = target.partition(b"?")
        if path == b"/healthz":
            return _plain(200, b"ok\n", close)
        if path == b"/admin/stats":
            body = json.dumps(self.stats(b"timestamps=1" in query)).encode()
            return _plain(200, body, close, "application/json")
        if path == b"/admin/reset" and method == b"POST":
            self.reset()
            return _plain(200, b'{"ok": true}', close, "application/json")
        return _plain(404, b"unknown admin path\n", close)


def _plain(
    status: int, body: bytes, close: bool, ctype: str = "text/plain; charset=utf-8"
) -> bytes:
    return Page(status, (("Content-Type", ctype),), body).wire(close)


class _Conn(asyncio.Protocol):
    """One keep-alive connection: requests parsed from the buffer, answered in order."""

    def __init__(self, site: _Site) -> None:
        self.site = site
        self.buf = b""
        self.pending: deque[tuple[bytes, bool]] = deque()
        self.transport: asyncio.Transport | None = None
        self.arrivals: list[float] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.site.connections += 1
        peer = transport.get_extra_info("peername")
        ip = peer[0] if peer else "?"
        self.arrivals = self.site.arrivals.setdefault(ip, [])

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end]
            line, _, rest = head.partition(b"\r\n")
            parts = line.split(b" ")
            if len(parts) != 3:
                self._send(_plain(400, b"bad request line\n", True), True)
                buf = b""
                break
            method, target, version = parts
            rest = rest.lower()
            length = 0
            if b"content-length:" in rest:
                length = int(rest.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
            if len(buf) < end + 4 + length:
                break  # the body is still coming
            buf = buf[end + 4 + length :]
            conn = b""
            if b"connection:" in rest:
                conn = rest.split(b"connection:", 1)[1].split(b"\r\n", 1)[0].strip()
            close = conn == b"close" or (version == b"HTTP/1.0" and conn != b"keep-alive")
            self._send(self.site.respond(method, target, self.arrivals, close), close)
            if close:
                buf = b""
                break
        self.buf = buf

    def _send(self, resp: bytes, close: bool) -> None:
        if not self.site.latency:
            self._write(resp, close)
            return
        # every timer has the same delay, so each takes the oldest response: order is kept
        self.pending.append((resp, close))
        asyncio.get_running_loop().call_later(self.site.latency, self._flush_one)

    def _flush_one(self) -> None:
        if self.pending:
            self._write(*self.pending.popleft())

    def _write(self, resp: bytes, close: bool) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        t.write(resp)
        if close:
            t.close()


async def _serve(pages: dict[str, Page], host: str, port: int, latency_ms: float) -> None:
    import signal

    site = _Site(pages, latency_ms)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Conn(site), host, port, backlog=4096, reuse_address=True
    )
    addr = server.sockets[0].getsockname()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"replay server ready at http://{addr[0]}:{addr[1]} ({len(pages)} pages, "
        f"latency {latency_ms:g} ms)",
        flush=True,
    )
    async with server:
        await stop.wait()


# --- the handle in the calling process -----------------------------------------------------


class ReplayServer(ServerProcess):
    """Start/stop a replay server process; `.url`, `.url_for`, `.stats()`, `.reset()`, `.cpu()`,
    `.config` (the recorded site's DemoConfig, with this server's latency), as DemoServer."""

    def __init__(
        self,
        pages: dict[str, Page],
        *,
        latency_ms: float = 0.0,
        config: Any = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 20.0,
    ) -> None:
        self.pages = pages
        self.latency_ms = latency_ms
        self.config = config.model_copy(update={"latency_ms": latency_ms}) if config else None
        self.host = host
        self.port = 0
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp: Path | None = None

    @classmethod
    def record(
        cls, *, threads: int = 8, seeds: Iterable[tuple[str, str]] = SEEDS, **demo_overrides: Any
    ) -> ReplayServer:
        """Walk a DemoServer of these settings (`latency_ms` goes to the replay, the recording
        runs without), stop it, return the (unstarted) replay of what it served."""
        latency = float(demo_overrides.pop("latency_ms", 0.0))
        with DemoServer(**{**demo_overrides, "latency_ms": 0}) as demo:
            pages = walk(demo.url, seeds, threads)
            config = demo.config
        return cls(pages, latency_ms=latency, config=config)

    def start(self) -> ReplayServer:
        if self.proc is not None:
            return self
        self._tmp = Path(tempfile.mkdtemp(prefix="replay-site-"))
        atexit.register(self.stop)
        data = self._tmp / "pages.pickle"
        plain = {t: (p.status, p.headers, p.body) for t, p in self.pages.items()}
        data.write_bytes(pickle.dumps(plain, protocol=pickle.HIGHEST_PROTOCOL))
        log = self._tmp / "server.log"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.replay_site",
                    "serve",
                    "--data",
                    str(data),
                    "--host",
                    self.host,
                    "--latency-ms",
                    str(self.latency_ms),
                ],
                cwd=ROOT,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            text = self.log()
            if " ready at http://" in text:
                self.port = int(text.split(" ready at http://", 1)[1].split()[0].rsplit(":", 1)[1])
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        text = self.log()
        self.stop()
        raise RuntimeError(f"replay server did not become ready; its log:\n{text[-4000:]}")

    def stats(self, window: float | None = None, timestamps: bool = False) -> dict[str, Any]:
        """Counters since the last reset (`window` is accepted for DemoServer's signature)."""
        return self._admin("GET", "/admin/stats" + ("?timestamps=1" if timestamps else ""))

    def cpu(self) -> float:
        """User+system CPU seconds of the server process so far (as the benchmark counts)."""
        from bench.chaincrawl_bench import proc_cpu

        return proc_cpu(self.proc.pid) if self.proc is not None else 0.0

    def __repr__(self) -> str:
        state = "running" if self.proc is not None else "stopped"
        return f"<ReplayServer {self.url} {len(self.pages)} pages {state}>"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="replay of the demo pc pages (see module docstring)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve a recording (as ReplayServer.start runs it)")
    s.add_argument(
        "--data", type=Path, required=True, help="pickle of {target: (status, headers, body)}"
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--latency-ms", type=float, default=0.0)
    a = ap.parse_args(argv)
    pages = {t: Page(*v) for t, v in pickle.loads(a.data.read_bytes()).items()}
    asyncio.run(_serve(pages, a.host, a.port, a.latency_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
