"""The `app` front end: the native app's JSON API, paged by page/size, plus device registration.

Envelope: {"code": 0, "msg": "success", "data": ...}; lists are
{"list", "page", "size", "total", "has_more"}. `size` is clamped to `app_max_size`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from demo.auth import new_token
from demo.params import bad_request, found, int_param, required
from demo.responses import json_response
from demo.state import state_of

routes = web.RouteTableDef()


def ok(data: Any, **top: Any) -> web.Response:
    return json_response({"code": 0, "msg": "success", **top, "data": data})


def _listing(
    request: web.Request,
    total: int,
    fetch: Callable[[int, int], Sequence[Any]],
    render: Callable[[Any], dict[str, object]],
) -> web.Response:
    cfg = state_of(request).config
    page = int_param(request, "page", 1)
    size = min(int_param(request, "size", cfg.app_default_size), cfg.app_max_size)
    offset = (page - 1) * size
    items = fetch(offset, size) if offset < total else []
    return ok(
        {
            "list": [render(x) for x in items],
            "page": page,
            "size": size,
            "total": total,
            "has_more": offset + len(items) < total,
        }
    )


@routes.get("/app/api/feed", name="app.feed")
async def feed(request: web.Request) -> web.Response:
    st = state_of(request)
    return _listing(request, st.data.users, st.data.feed, st.data.with_author)


@routes.get("/app/api/user_info", name="app.user_info")
async def user_info(request: web.Request) -> web.Response:
    st = state_of(request)
    uid = required(request, "user_id")
    u = found(request, st.data.user(uid), f"user {uid}")
    return ok(u.to_dict())


@routes.get("/app/api/user_statuses", name="app.user_statuses")
async def user_statuses(request: web.Request) -> web.Response:
    st = state_of(request)
    uid = required(request, "user_id")
    u = found(request, st.data.user(uid), f"user {uid}")
    return _listing(
        request,
        u.post_count,
        lambda off, n: st.data.user_posts(uid, off, n),
        lambda p: p.to_summary_dict(),
    )


@routes.get("/app/api/detail", name="app.detail")
async def detail(request: web.Request) -> web.Response:
    st = state_of(request)
    pid = required(request, "post_id")
    p = found(request, st.data.post(pid), f"post {pid}")
    return ok(st.data.with_author(p, full=True))


@routes.get("/app/api/comments", name="app.comments")
async def comments(request: web.Request) -> web.Response:
    st = state_of(request)
    pid = required(request, "post_id")
    p = found(request, st.data.post(pid), f"post {pid}")
    return _listing(
        request,
        p.comments_count,
        lambda off, n: st.data.post_comments(pid, off, n),
        lambda c: c.to_dict(),
    )


@routes.post("/app/api/device/register", name="app.device_register")
async def device_register(request: web.Request) -> web.Response:
    st = state_of(request)
    try:
        body = json.loads(await request.read() or b"null")
    except ValueError:
        body = None
    if not isinstance(body, dict) or not all(
        isinstance(body.get(k), str) and body.get(k) for k in ("model", "os")
    ):
        raise bad_request(request, 'JSON body {"model": str, "os": str} required')
    device_id = new_token("dev-")
    st.devices.add(device_id, f"{body['model']} / {body['os']}")
    st.stats.events["devices_registered"] += 1
    return ok({"device_id": device_id}, device_id=device_id)
