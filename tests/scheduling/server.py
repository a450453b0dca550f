"""A tiny HTTP site that timestamps every request and tracks how many are in flight.

Runs on its own event loop in a thread of the test process, so tests read its records
directly: `hits` (monotonic time, path, tag, n), `max_in_flight` per tag, and `flights` (when
each slow request started and ended, per tag: how many were in flight at any moment).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass

from aiohttp import web

from utils.servers import free_port, wait_for_port


@dataclass(frozen=True)
class Hit:
    t: float  # time.monotonic() when the request arrived
    path: str
    tag: str
    n: int


class SchedSite:
    __test__ = False

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.hits: list[Hit] = []
        self.in_flight: Counter[str] = Counter()
        self.max_in_flight: Counter[str] = Counter()
        self.flights: list[tuple[float, str, int]] = []  # (monotonic time, tag, +1 | -1)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _record(self, req: web.Request) -> Hit:
        hit = Hit(time.monotonic(), req.path, req.query.get("tag", ""), int(req.query.get("n", 0)))
        with self._lock:
            self.hits.append(hit)
        return hit

    def tagged(self, tag: str) -> list[Hit]:
        with self._lock:
            return [h for h in self.hits if h.tag == tag]

    async def ping(self, req: web.Request) -> web.Response:
        self._record(req)
        return web.json_response({"ok": True})

    async def slow(self, req: web.Request) -> web.Response:
        hit = self._record(req)
        with self._lock:
            self.in_flight[hit.tag] += 1
            self.max_in_flight[hit.tag] = max(self.max_in_flight[hit.tag], self.in_flight[hit.tag])
            self.flights.append((hit.t, hit.tag, 1))
        try:
            await asyncio.sleep(float(req.query.get("s", "0.3")))
        finally:
            with self._lock:
                self.in_flight[hit.tag] -= 1
                self.flights.append((time.monotonic(), hit.tag, -1))
        return web.json_response({"ok": True})

    def start(self) -> SchedSite:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            app = web.Application()
            app.router.add_get("/ping", self.ping)
            app.router.add_get("/slow", self.slow)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, daemon=True, name="schedsite")
        self._thread.start()
        ready.wait(10)
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
