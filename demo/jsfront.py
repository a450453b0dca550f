"""The `js` front end: pages whose data a script fetches or carries, for browser rendering.

The HTML of `/js/feed`, `/js/more` and `/js/scroll` holds no entries at all: after the `load`
event `/js/static/app.js` fetches them from `/js/api/feed` and writes the same markup as the pc
feed (a list page with a pager, a "load more" button, an infinite scroll). `/js/post/{pid}`
carries its post in an inline `window.__DATA__ = {...}` script that the same file renders.
`/js/hang` never finishes its document, for deadline tests. Same data as every other front
end (demo/data.py), so a rendered crawl has exact counts (README section 4a).
"""

from __future__ import annotations

import asyncio
import contextlib
from html import escape
from pathlib import Path

import orjson
from aiohttp import web

from demo.paging import page_count
from demo.params import found, int_param, not_found
from demo.responses import html_response, json_response, layout
from demo.state import state_of

routes = web.RouteTableDef()

APP_JS = (Path(__file__).resolve().parent / "static" / "app.js").read_bytes()
LOGO_SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="120" height="24">'
    b'<text x="0" y="18" font-size="16">DemoNews</text></svg>'
)
API_MAX_LIMIT = 50
HANG_MAX_S = 600.0  # /js/hang gives up after this long even if the client stays
# Tall entries on the scroll page: a batch overfills the viewport, so only scrolling loads more.
SCROLL_STYLE = "<style>.page-js-scroll .feed-item{min-height:420px}</style>"


def _shell(title: str, view: str, main: str, head: str = "") -> web.Response:
    """A page of the site's chrome whose `main` the script fills in (`data-view` tells it how)."""
    script = f'{head}<script src="/js/static/app.js" defer></script>\n'
    logo = (
        '<img class="site-logo" src="/js/static/logo.svg" alt="DemoNews" width="120" height="24">\n'
    )
    return html_response(
        layout(
            title,
            f"page-js page-js-{view}",
            logo + main,
            head=script,
            body_attrs=f' data-view="{view}"',
        )
    )


@routes.get("/js/static/app.js", name="js.static")
async def app_js(request: web.Request) -> web.Response:
    return web.Response(
        body=APP_JS,
        content_type="application/javascript",
        charset="utf-8",
        headers={"Cache-Control": "max-age=3600"},
    )


@routes.get("/js/static/logo.svg", name="js.logo")
async def logo(request: web.Request) -> web.Response:
    """The one image of the JS pages (a browser that blocks images never asks for it)."""
    return web.Response(body=LOGO_SVG, content_type="image/svg+xml")


@routes.get("/js/api/feed", name="js.api.feed")
async def api_feed(request: web.Request) -> web.Response:
    st = state_of(request)
    offset = int_param(request, "offset", 0, minimum=0)
    limit = min(int_param(request, "limit", st.config.js_batch_size), API_MAX_LIMIT)
    total = st.data.users
    posts = st.data.feed(offset, limit)
    return json_response(
        {
            "list": [st.data.with_author(p) for p in posts],
            "offset": offset,
            "limit": limit,
            "total": total,
            "has_more": offset + len(posts) < total,
        }
    )


@routes.get("/js/feed", name="js.feed")
async def feed(request: web.Request) -> web.Response:
    return feed_shell(request, state_of(request).config.js_feed_page_size)


def feed_shell(request: web.Request, size: int) -> web.Response:
    """The feed page `?page=N` of `size` entries as an empty shell the script fills."""
    st = state_of(request)
    pages = page_count(st.data.users, size)
    page = int_param(request, "page", 1)
    if page > pages:
        raise not_found(request, f"feed page {page} (there are {pages})")
    main = (
        f'<section class="feed" id="feed" data-state="loading" data-page="{page}" '
        f'data-total-pages="{pages}" data-offset="{(page - 1) * size}" data-limit="{size}">\n'
        '<h1 class="section-title">热门动态 Latest</h1>\n'
        '<p class="loading">加载中 Loading…</p>\n</section>'
    )
    return _shell(f"首页 第{page}页", "feed", main)


def _batched(
    request: web.Request, view: str, title: str, below: str, head: str = ""
) -> web.Response:
    """An empty feed the script fills a batch at a time; `below` is what asks for the next."""
    main = (
        '<section class="feed" id="feed" data-state="loading" data-offset="0" '
        f'data-limit="{state_of(request).config.js_batch_size}">\n'
        f'<h1 class="section-title">热门动态 Latest</h1>\n</section>\n{below}'
    )
    return _shell(title, view, main, head=head)


@routes.get("/js/more", name="js.more")
async def more(request: web.Request) -> web.Response:
    button = (
        '<button class="load-more" id="load-more" type="button" hidden>加载更多 Load more</button>'
    )
    return _batched(request, "more", "首页 加载更多", button)


@routes.get("/js/scroll", name="js.scroll")
async def scroll(request: web.Request) -> web.Response:
    sentinel = '<div class="scroll-sentinel" id="sentinel">加载中 Loading…</div>'
    return _batched(request, "scroll", "首页 无限滚动", sentinel, head=SCROLL_STYLE)


def script_json(value: object) -> str:
    """JSON safe inside a <script> element: no `<` (so no `</script>` or `<!--`), and no
    U+2028/U+2029 (line terminators in older JavaScript)."""
    text = orjson.dumps(value).decode()
    for ch, esc in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(ch, esc)
    return text


@routes.get("/js/post/{pid}", name="js.post")
async def post(request: web.Request) -> web.Response:
    st = state_of(request)
    pid = request.match_info["pid"]
    p = found(request, st.data.post(pid), f"post {pid}")
    data = script_json({"post": st.data.with_author(p, full=True)})
    main = (
        f'<article class="post-detail" id="post" data-state="loading">'
        f'<h1 class="title">{escape(p.title)}</h1></article>\n'
        f"<script>window.__DATA__ = {data};</script>"
    )
    return _shell(p.title, "post", main)


@routes.get("/js/hang", name="js.hang")
async def hang(request: web.Request) -> web.StreamResponse:
    """The head and the start of a body, then nothing: the document never finishes loading
    (a space every half second keeps the connection and notices the client leaving)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
    await resp.prepare(request)
    start = layout("加载中 Loading", "page-js page-js-hang", "").split("<main", 1)[0]
    await resp.write(
        (
            start
            + '<main class="content"><p class="loading" id="hang">加载中 Loading… this page never finishes.</p>\n'
        ).encode()
    )
    loop = asyncio.get_running_loop()
    until = loop.time() + HANG_MAX_S
    with contextlib.suppress(ConnectionError, RuntimeError):
        while loop.time() < until:
            await asyncio.sleep(0.5)
            await resp.write(b" ")
    return resp
