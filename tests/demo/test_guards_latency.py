"""The demo's latency is a response time counted from arrival, not a sleep before the work.

Benchmarks divide by the 16 / latency bound, so a server that slept first and worked after
charged every crawler for the page server's own CPU (a "250 ms" server answered in 254-256 ms
on a slow machine). These run the real middleware in aiohttp's in-process test server, with a
handler whose work takes a known time.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from demo.config import DemoConfig
from demo.server import build_app

pytestmark = pytest.mark.integration

DESKTOP_UA = "Mozilla/5.0 (X11; Linux x86_64) probe"


def _timed(
    config: DemoConfig, work_s: float, path: str, ua: str = DESKTOP_UA, n: int = 1
) -> list[tuple[int, float]]:
    """(status, seconds) of `n` GETs of `path`, one after the other, on one app whose /pc/slow
    handler works `work_s`."""

    async def slow(request: web.Request) -> web.Response:
        time.sleep(work_s)  # blocking on purpose: the server's own CPU, not a wait
        return web.Response(text="<html>ok</html>", content_type="text/html")

    async def main() -> list[tuple[int, float]]:
        app = build_app(config)
        app.router.add_get("/pc/slow", slow, name="pc.slow")
        out = []
        async with TestClient(TestServer(app)) as client:
            await client.get("/healthz")  # connect and warm up outside the timing
            for _ in range(n):
                t0 = time.monotonic()
                resp = await client.get(path, headers={"User-Agent": ua})
                await resp.read()
                out.append((resp.status, time.monotonic() - t0))
        return out

    return asyncio.run(main())


def test_handler_work_runs_inside_the_latency() -> None:
    [(status, took)] = _timed(DemoConfig(size="tiny", latency_ms=3000), 1.5, "/pc/slow")
    assert status == 200
    assert 3 <= took < 4.2  # 3 s from arrival, not 3 + 1.5


def test_work_longer_than_the_latency_is_not_slept_on_top() -> None:
    [(status, took)] = _timed(DemoConfig(size="tiny", latency_ms=1000), 2.5, "/pc/slow")
    assert status == 200
    assert 2.5 <= took < 3.4  # the handler's 2.5 s, with nothing of the 1 s added


def test_a_rejection_waits_out_the_latency_too() -> None:
    cfg = DemoConfig(size="tiny", latency_ms=200, features=["ua_check"])
    [(status, took)] = _timed(cfg, 0.0, "/pc/slow", ua="curl/8")
    assert status == 403
    assert took >= 0.2  # a check's answer is no faster than a page's (as before)


def test_the_rate_limit_still_answers_at_once() -> None:
    cfg = DemoConfig(size="tiny", latency_ms=3000, features=["rate_limit"],
                     rate_limit_requests=1, rate_limit_window_s=60)  # fmt: skip
    (first, took1), (second, took2) = _timed(cfg, 0.0, "/pc/slow", n=2)
    assert first == 200 and took1 >= 3
    assert second == 429 and took2 < 2  # limited before the latency, as documented
