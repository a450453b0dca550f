"""The request pipeline around every handler: stats, anti-crawl checks, latency, soft failures.

One middleware, so the order of checks is visible in one place (README "Anti-crawl"):
rate limit -> latency -> user agent -> sign -> device -> login -> handler -> soft failure.

The latency is the response time, counted from the request's arrival: the checks and the
handler run inside it and only the rest is slept. Sleeping first and working after put the
server's own work on top of every response (3-6 ms at 16 in flight on a slow machine), so a
"250 ms" server answered in 254-256 ms and benchmarks measured against the 16/0.25 s bound
were charged for the page server's CPU.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from demo import signing
from demo.misc import peer_ip
from demo.params import Reject
from demo.responses import error_response, front_of, login_wall
from demo.state import DemoState, state_of

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

FRONTS = ("pc", "h5", "app", "js")
COMMENT_ROUTES = frozenset({"pc.comments", "h5.comments", "app.comments"})
NO_SOFT_FAIL_ROUTES = frozenset({"app.device_register"})
APP_UA = re.compile(r"DemoApp/\d+(?:\.\d+)*")
ERROR_CODES = {500: "internal_error", 502: "bad_gateway", 503: "service_unavailable"}


def is_exempt(path: str) -> bool:
    """Readiness and admin endpoints bypass every check and are not counted."""
    return path == "/healthz" or path.startswith("/admin/")


def ua_ok(front: str, ua: str) -> bool:
    if front in ("pc", "js"):  # the JavaScript site is a desktop site too
        return "Mozilla/" in ua and "Mobile" not in ua
    if front == "h5":
        return "Mobile" in ua
    return APP_UA.search(ua) is not None


@web.middleware
async def pipeline(request: web.Request, handler: Handler) -> web.StreamResponse:
    if is_exempt(request.path):
        return await handler(request)
    st = state_of(request)
    ip = peer_ip(request)
    front = front_of(request.path)
    endpoint = request.match_info.route.name or "unmatched"
    st.stats.arrival(ip, front, endpoint, time.time())
    status = 500
    try:
        resp = await _guarded(request, handler, st, ip, front, endpoint)
        status = resp.status
        return resp
    finally:
        st.stats.done(status)


def _reject(
    st: DemoState, request: web.Request, status: int, code: str, msg: str, **kw: Any
) -> web.Response:
    """Count the rejection and answer it in the path's dialect."""
    st.stats.rejections[code] += 1
    return error_response(request, status, code, msg, **kw)


async def _guarded(
    request: web.Request, handler: Handler, st: DemoState, ip: str, front: str, endpoint: str
) -> web.StreamResponse:
    cfg = st.config
    now = time.monotonic()
    if cfg.enabled("rate_limit"):
        verdict, retry = st.limiter.check(ip, now)
        if verdict == "limited":
            return _reject(
                st,
                request,
                429,
                "rate_limited",
                "too many requests, slow down",
                headers={"Retry-After": str(max(1, math.ceil(retry)))},
                retry_after=round(retry, 3),
            )
        if verdict == "banned":
            return _reject(
                st,
                request,
                403,
                "banned",
                f"your IP {ip} is banned for {retry:.0f} s",
                headers={"Retry-After": str(max(1, math.ceil(retry)))},
                retry_after=round(retry, 3),
            )

    delay_ms = cfg.latency_ms
    if cfg.latency_jitter_ms:
        delay_ms += st.latency_rng.uniform(0, cfg.latency_jitter_ms)
    resp, handled = await _checked(request, handler, st, front, endpoint, now)
    if delay_ms > 0:
        left = now + delay_ms / 1000 - time.monotonic()
        if left > 0:
            await asyncio.sleep(left)
    if (
        handled
        and front in FRONTS
        and cfg.enabled("soft_fail")
        and endpoint not in NO_SOFT_FAIL_ROUTES
        and st.soft_fail_rng.random() < cfg.soft_fail_rate
    ):
        return await _soft_fail(request, resp, st)
    return resp


async def _checked(
    request: web.Request, handler: Handler, st: DemoState, front: str, endpoint: str, now: float
) -> tuple[web.StreamResponse, bool]:
    """The checks after the rate limit, then the handler: (response, True if the handler's)."""
    cfg = st.config
    if front in FRONTS and cfg.enabled("ua_check"):
        ua = request.headers.get("User-Agent", "")
        if not ua_ok(front, ua):
            return _reject(
                st, request, 403, "bad_user_agent", f"this client is not allowed: {ua!r}"
            ), False

    if front == "app":
        if cfg.enabled("sign"):
            why = signing.verify(request.query.items(), cfg.sign_key, cfg.sign_skew_s)
            if why is not None:
                return _reject(st, request, 403, "bad_sign", why, detail=why), False
        if cfg.enabled("device") and endpoint != "app.device_register":
            verdict = st.devices.use(request.headers.get("X-Device-Id"), now)
            if verdict == "unknown":
                return _reject(
                    st, request, 403, "unknown_device", "register this device first"
                ), False
            if verdict == "banned":
                return _reject(st, request, 403, "device_banned", "this device is banned"), False

    if (
        endpoint in COMMENT_ROUTES
        and cfg.enabled("login")
        and st.sessions.use(request.cookies.get("session"), now) != "ok"
    ):
        st.stats.rejections["login_required"] += 1
        return login_wall(request), False

    return await _call(request, handler), True


async def _call(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Run the handler, turning Reject and aiohttp's 404/405 into the path's error dialect."""
    try:
        return await handler(request)
    except Reject as r:
        return r.response
    except web.HTTPNotFound:
        return error_response(request, 404, "not_found", f"no such page {request.path}")
    except web.HTTPMethodNotAllowed as e:
        return error_response(request, 405, "method_not_allowed", str(e))


async def _soft_fail(
    request: web.Request, resp: web.StreamResponse, st: DemoState
) -> web.StreamResponse:
    cfg = st.config
    kind = st.soft_fail_rng.choice(cfg.soft_fail_kinds)
    st.stats.soft_fail[kind] += 1
    if kind == "slow":
        await asyncio.sleep(cfg.soft_fail_slow_ms / 1000)
        return resp
    if kind == "error":
        status = st.soft_fail_rng.choice(cfg.soft_fail_statuses)
        code = ERROR_CODES.get(status, "server_error")
        return error_response(request, status, code, "temporary upstream failure, retry later")
    body = resp.body if isinstance(resp, web.Response) else None
    if not isinstance(body, bytes | bytearray) or len(body) < 2:
        return resp
    return await _truncated(request, resp, bytes(body))


async def _truncated(
    request: web.Request, resp: web.StreamResponse, body: bytes
) -> web.StreamResponse:
    """Declare the full Content-Length, send half of the body, then drop the connection."""
    out = web.StreamResponse(status=resp.status, headers=resp.headers)
    out.content_length = len(body)
    await out.prepare(request)
    await out.write(body[: len(body) // 2])
    if request.transport is not None:
        request.transport.close()  # flushes what was written, then closes
    return out
