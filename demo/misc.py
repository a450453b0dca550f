"""Endpoints outside the three front ends: login, proxy tools, admin and readiness."""

from __future__ import annotations

import time
from html import escape
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from demo import captcha
from demo.auth import new_token
from demo.paging import page_count
from demo.params import bad_request, int_param, not_found
from demo.responses import html_response, json_response, layout, pager
from demo.state import state_of

routes = web.RouteTableDef()


def peer_ip(request: web.Request) -> str:
    """The connection's source address; forwarding headers are deliberately ignored."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return str(peer[0]) if peer else "unknown"


@routes.get("/", name="index")
async def index(request: web.Request) -> web.Response:
    main = (
        '<ul class="fronts">\n'
        '<li><a href="/pc/feed">pc: HTML site</a></li>\n'
        '<li><a href="/h5/api/feed">h5: mobile JSON API (cursor paging)</a></li>\n'
        '<li><a href="/app/api/feed">app: app JSON API (page/size paging)</a></li>\n'
        '<li><a href="/js/feed">js: pages filled in by JavaScript (render them)</a></li>\n'
        '<li><a href="/proxies">free proxy list</a></li>\n</ul>'
    )
    return html_response(layout("DemoNews", "page-index", main))


@routes.get("/healthz", name="healthz")
async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@routes.get("/headers", name="headers")
async def headers(request: web.Request) -> web.Response:
    return json_response(
        {
            "remote_addr": peer_ip(request),
            "method": request.method,
            "path": request.path_qs,
            "headers": {str(k): v for k, v in request.headers.items()},
        }
    )


# --- proxy list -----------------------------------------------------------------------------
def _proxy_entries(request: web.Request) -> list[tuple[str, str, str]]:
    """(host, port, type) from config `proxies` then `proxies_file` (re-read each time)."""
    cfg = state_of(request).config
    lines = list(cfg.proxies)
    if cfg.proxies_file:
        try:
            text = Path(cfg.proxies_file).read_text(encoding="utf-8")
        except OSError:
            text = ""
        lines += [ln.strip() for ln in text.splitlines()]
    out = []
    for line in lines:
        if not line or line.startswith("#"):
            continue
        parts = urlsplit(line if "://" in line else f"http://{line}")
        if parts.hostname and parts.port:
            out.append((parts.hostname, str(parts.port), parts.scheme))
    return out


@routes.get("/proxies", name="proxies")
async def proxies(request: web.Request) -> web.Response:
    entries = _proxy_entries(request)
    size = state_of(request).config.proxies_page_size
    pages = page_count(len(entries), size)
    page = int_param(request, "page", 1)
    if page > pages:
        raise not_found(request, f"proxy list page {page} (there are {pages})")
    rows = "\n".join(
        f'<tr class="proxy"><td class="ip">{escape(host)}</td><td class="port">{port}</td>'
        f'<td class="type">{escape(kind)}</td><td class="country">本地 Local</td>'
        f'<td class="checked">{(i * 7) % 59 + 1} 分钟前</td></tr>'
        for i, (host, port, kind) in enumerate(entries[(page - 1) * size : page * size])
    )
    main = (
        "<h1>免费代理IP列表 Free proxy list</h1>\n"
        f'<table class="proxy-list" data-page="{page}" data-total-pages="{pages}" '
        f'data-total="{len(entries)}">\n<thead><tr><th>IP</th><th>端口</th><th>类型</th>'
        "<th>位置</th><th>验证时间</th></tr></thead>\n"
        f"<tbody>\n{rows}\n</tbody>\n</table>\n{pager('/proxies?page=', page, pages)}"
    )
    return html_response(layout("免费代理", "page-proxies", main))


# --- login ----------------------------------------------------------------------------------
@routes.get("/login/captcha", name="login.captcha")
async def login_captcha(request: web.Request) -> web.Response:
    st = state_of(request)
    cid, answer = st.captchas.issue(time.monotonic())
    st.stats.events["captchas_issued"] += 1
    return json_response(
        {
            "captcha_id": cid,
            "format": "ascii-5x7",
            "length": len(answer),
            "width": len(answer) * (captcha.GLYPH_WIDTH + captcha.GAP) - captcha.GAP,
            "height": captcha.GLYPH_HEIGHT,
            "image": captcha.render(answer),
            "expires_in": st.config.captcha_ttl_s,
        }
    )


@routes.post("/login", name="login")
async def login(request: web.Request) -> web.Response:
    st = state_of(request)
    if request.content_type == "application/json":
        try:
            form = dict(await request.json())
        except ValueError:
            form = {}
    else:
        form = dict(await request.post())
    fields = {k: str(form.get(k, "")) for k in ("username", "password", "captcha_id")}
    answer = str(form.get("captcha_answer", ""))
    if not all(fields.values()) or not answer:
        raise bad_request(
            request, "form fields username, password, captcha_id, captcha_answer required"
        )
    if not st.captchas.check(fields["captcha_id"], answer, time.monotonic()):
        st.stats.events["login_bad_captcha"] += 1
        return json_response({"error": "bad_captcha", "message": "wrong or expired captcha"}, 403)
    if st.config.accounts.get(fields["username"]) != fields["password"]:
        st.stats.events["login_bad_credentials"] += 1
        return json_response({"error": "bad_credentials", "message": "wrong user or password"}, 403)
    token = new_token()
    st.sessions.add(token, fields["username"])
    st.stats.events["logins"] += 1
    resp = json_response({"ok": True, "username": fields["username"]})
    resp.set_cookie("session", token, path="/", httponly=True, samesite="Lax")
    return resp


# --- admin ----------------------------------------------------------------------------------
@routes.get("/admin/stats", name="admin.stats")
async def admin_stats(request: web.Request) -> web.Response:
    st = state_of(request)
    window = request.query.get("window")
    try:
        window_s = float(window) if window else None
    except ValueError:
        raise bad_request(request, "window must be a number of seconds") from None
    snap = st.stats.snapshot(window_s, request.query.get("timestamps", "") in ("1", "true"))
    now = time.monotonic()
    snap["bans"] = {
        "ip_bans_total": st.limiter.bans_total,
        "ip_banned_now": st.limiter.banned_now(now),
        "device_bans_total": st.devices.bans_total,
        "session_bans_total": st.sessions.bans_total,
    }
    snap["devices"] = st.devices.summary()
    snap["sessions"] = {
        k: v for k, v in st.sessions.summary().items() if k not in ("ids", "banned_ids")
    }
    snap["logins"] = {
        "captchas_issued": st.stats.events["captchas_issued"],
        "ok": st.stats.events["logins"],
        "bad_captcha": st.stats.events["login_bad_captcha"],
        "bad_credentials": st.stats.events["login_bad_credentials"],
    }
    snap["features"] = sorted(st.config.features)
    return json_response(snap)


@routes.post("/admin/reset", name="admin.reset")
async def admin_reset(request: web.Request) -> web.Response:
    state_of(request).reset()
    return json_response({"ok": True})


@routes.get("/admin/clock", name="admin.clock")
async def admin_clock(request: web.Request) -> web.Response:
    st = state_of(request)
    return json_response({"now": st.clock.now(), "mode": st.clock.mode})


@routes.post("/admin/clock", name="admin.clock.set")
async def admin_clock_set(request: web.Request) -> web.Response:
    """`{"now": t}` sets the simulated time, `{"advance": s}` moves it (manual clock only)."""
    st = state_of(request)
    try:
        body = dict(await request.json())
        if "now" in body:
            now = st.clock.set(float(body["now"]))
        elif "advance" in body:
            now = st.clock.advance(float(body["advance"]))
        else:
            raise ValueError('give {"now": seconds} or {"advance": seconds}')
    except (ValueError, TypeError) as e:  # admin paths bypass the guards: answer, not raise
        return bad_request(request, str(e)).response
    return json_response({"now": now, "mode": st.clock.mode})


@routes.get("/admin/changes", name="admin.changes")
async def admin_changes(request: web.Request) -> web.Response:
    """The change events of a post up to now (`?post=p3&since=t`): the truth a test compares with."""
    st = state_of(request)
    if st.changes is None:
        return not_found(request, "change generator (start the server with changes on)").response
    pid = request.query.get("post", "")
    n = st.data.post_number_of(pid)
    if n is None:
        return not_found(request, f"post {pid}").response
    try:
        since = float(request.query.get("since", st.config.change_start))
    except ValueError:
        return bad_request(request, "since must be a number of seconds").response
    now = st.clock.now()
    klass = st.changes.class_of(n)
    return json_response(
        {
            "post": pid,
            "now": now,
            "per_day": klass.per_day,
            "events": st.changes.events(n, since, now),
        }
    )


@routes.get("/admin/config", name="admin.config")
async def admin_config(request: web.Request) -> web.Response:
    st = state_of(request)
    return json_response(
        {"config": st.config.model_dump(mode="json"), "expected": st.config.expected_counts()}
    )
