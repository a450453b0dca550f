"""The `mix` front end: one site whose page types are static or filled by script, and can
change from one to the other while it runs (for adaptive rendering).

`/mix/feed?page=N` is the pc feed's page (the same entries, `pc_feed_page_size` a page) and
`/mix/post/{pid}` the pc post, each served either as static HTML (the pc front's markup) or
as the js front's empty shell that `/js/static/app.js` fills after load (the same markup once
rendered). Which page types are rendered is `mix_rendered` (default: `post`), changed at run
time by `POST /admin/mix?rendered=feed,post` (empty: none); `GET /admin/mix` tells.
"""

from __future__ import annotations

from aiohttp import web

from demo import jsfront, pc
from demo.params import bad_request
from demo.responses import json_response
from demo.state import state_of

routes = web.RouteTableDef()

PAGE_TYPES = ("feed", "post")


@routes.get("/mix/feed", name="mix.feed")
async def feed(request: web.Request) -> web.StreamResponse:
    st = state_of(request)
    if "feed" not in st.mix_rendered:
        return await pc.feed(request)
    return jsfront.feed_shell(request, st.config.pc_feed_page_size)


@routes.get("/mix/post/{pid}", name="mix.post")
async def post(request: web.Request) -> web.StreamResponse:
    if "post" in state_of(request).mix_rendered:
        return await jsfront.post(request)
    return await pc.post(request)


@routes.get("/admin/mix", name="admin.mix")
async def admin_mix(request: web.Request) -> web.Response:
    return json_response({"rendered": sorted(state_of(request).mix_rendered)})


@routes.post("/admin/mix", name="admin.mix.set")
async def admin_mix_set(request: web.Request) -> web.Response:
    wanted = {p.strip() for p in request.query.get("rendered", "").split(",") if p.strip()}
    unknown = wanted - set(PAGE_TYPES)
    if unknown:
        raise bad_request(request, f"unknown page types {sorted(unknown)}; known: {PAGE_TYPES}")
    st = state_of(request)
    st.mix_rendered = set(wanted)
    return json_response({"rendered": sorted(st.mix_rendered)})
