"""An aiohttp application served from a background thread of the test process, so tests can
read the server's own counters directly. Subclasses provide `app()`."""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from aiohttp import web

from utils.servers import free_port, wait_for_port


class ThreadedSite:
    __test__ = False  # a server, not a test class

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        raise NotImplementedError

    def start(self) -> Self:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._runner = web.AppRunner(self.app(), access_log=None)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            loop.run_until_complete(site.start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, daemon=True, name=type(self).__name__)
        self._thread.start()
        ready.wait(10)
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
