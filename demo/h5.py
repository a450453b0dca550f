"""The `h5` front end: the mobile site's JSON API, paged by opaque cursors.

Envelope: {"ok": 1, "data": ...}; lists are {"list", "next_cursor", "total"} and the last page
has next_cursor null. Cursors are bound to their list, so they cannot be reused elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from demo.paging import decode_cursor, encode_cursor
from demo.params import bad_request, found
from demo.responses import json_response
from demo.state import state_of

routes = web.RouteTableDef()


def ok(data: Any) -> web.Response:
    return json_response({"ok": 1, "data": data})


def _listing(
    request: web.Request,
    scope: str,
    total: int,
    size: int,
    fetch: Callable[[int, int], Sequence[Any]],
    render: Callable[[Any], dict[str, object]],
) -> web.Response:
    cursor = request.query.get("cursor", "")
    offset = 0
    if cursor:
        try:
            offset = decode_cursor(cursor, scope)
        except ValueError as e:
            raise bad_request(request, f"bad cursor: {e}") from None
    items = fetch(offset, size)
    end = offset + len(items)
    return ok(
        {
            "list": [render(x) for x in items],
            "next_cursor": encode_cursor(scope, end) if end < total else None,
            "total": total,
        }
    )


@routes.get("/h5/api/feed", name="h5.feed")
async def feed(request: web.Request) -> web.Response:
    st = state_of(request)
    return _listing(
        request,
        "feed",
        st.data.users,
        st.config.h5_feed_page_size,
        st.data.feed,
        st.data.with_author,
    )


@routes.get("/h5/api/user/{uid}", name="h5.user")
async def user(request: web.Request) -> web.Response:
    st = state_of(request)
    uid = request.match_info["uid"]
    u = found(request, st.data.user(uid), f"user {uid}")
    return ok(u.to_dict())


@routes.get("/h5/api/user/{uid}/statuses", name="h5.statuses")
async def statuses(request: web.Request) -> web.Response:
    st = state_of(request)
    uid = request.match_info["uid"]
    u = found(request, st.data.user(uid), f"user {uid}")
    return _listing(
        request,
        f"statuses:{uid}",
        u.post_count,
        st.config.h5_statuses_page_size,
        lambda off, n: st.data.user_posts(uid, off, n),
        lambda p: p.to_summary_dict(),
    )


@routes.get("/h5/api/post/{pid}", name="h5.post")
async def post(request: web.Request) -> web.Response:
    st = state_of(request)
    pid = request.match_info["pid"]
    p = found(request, st.data.post(pid), f"post {pid}")
    return ok(st.data.with_author(p, full=True))


@routes.get("/h5/api/post/{pid}/comments", name="h5.comments")
async def comments(request: web.Request) -> web.Response:
    st = state_of(request)
    pid = request.match_info["pid"]
    p = found(request, st.data.post(pid), f"post {pid}")
    return _listing(
        request,
        f"comments:{pid}",
        p.comments_count,
        st.config.h5_comments_page_size,
        lambda off, n: st.data.post_comments(pid, off, n),
        lambda c: c.to_dict(),
    )
