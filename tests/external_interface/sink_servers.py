"""A local HTTP API for the sink tests: fails on demand, records bodies, upserts by key.

Runs an aiohttp server on 127.0.0.1 in a thread of its own, so the synchronous sink (requests)
and the drainer can talk to it from the test thread.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
from aiohttp import web

from utils.servers import free_port


class RecordingApi:
    """POST /items: the first `fail_first` requests (and all while `down`) get `status`."""

    def __init__(self, fail_first: int = 0, status: int = 503) -> None:
        self.fail_first = fail_first
        self.status = status
        self.down = False
        self.port = free_port()
        self.attempts = 0
        self.bodies: list[dict[str, Any]] = []  # accepted bodies, in order
        self.headers: list[dict[str, str]] = []
        self.store: dict[tuple[str, bytes], dict[str, Any]] = {}  # (type, key) -> item
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/items"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        with self._lock:
            self.attempts += 1
            if self.down or self.attempts <= self.fail_first:
                return web.Response(status=self.status, text="unavailable")
            data = orjson.loads(body)
            self.bodies.append(data)
            self.headers.append(dict(request.headers))
            for item in data["items"]:
                key = orjson.dumps([item[k] for k in data["key_fields"]])
                self.store[(data["type"], key)] = item
        return web.json_response({"ok": True, "n": len(data["items"])})

    def start(self) -> RecordingApi:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_post("/items", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            loop.run_until_complete(site.start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="recording-api", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("recording API did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._thread = None

    def items(self, item_type: str) -> list[dict[str, Any]]:
        with self._lock:
            return [v for (t, _), v in self.store.items() if t == item_type]

    def __enter__(self) -> RecordingApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
