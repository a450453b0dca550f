"""Response builders shared by every front end: JSON, HTML layout, error bodies."""

from __future__ import annotations

from html import escape
from typing import Any

import orjson
from aiohttp import web

SITE_NAME = "DemoNews 演示头条"
HTML_PREFIXES = ("/pc/", "/proxies")


def front_of(path: str) -> str:
    """Which front end a path belongs to: "pc", "h5", "app", "js" or "other"."""
    for front in ("pc", "h5", "app", "js"):
        if path.startswith(f"/{front}/") or path == f"/{front}":
            return front
    return "other"


def wants_html(path: str) -> bool:
    """Errors on these paths are HTML pages; everywhere else they are JSON."""
    if path.startswith("/js/"):
        return not path.startswith(("/js/api/", "/js/static/"))
    return path == "/" or path == "/pc" or path.startswith(HTML_PREFIXES)


def json_response(
    obj: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(obj),
        status=status,
        content_type="application/json",
        charset="utf-8",
        headers=headers,
    )


def html_response(
    html: str, status: int = 200, charset: str = "utf-8", headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=html.encode(charset, "xmlcharrefreplace"),
        status=status,
        content_type="text/html",
        charset=charset,
        headers=headers,
    )


def layout(
    title: str,
    body_class: str,
    main: str,
    charset: str = "utf-8",
    head: str = "",
    body_attrs: str = "",
) -> str:
    """A complete HTML document in the site's chrome; `head` goes at the end of <head>,
    `body_attrs` (e.g. ` data-view="feed"`) into the <body> tag."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="zh-CN">\n<head>\n'
        f'<meta charset="{charset}">\n'
        f"<title>{escape(title)} - {SITE_NAME}</title>\n"
        f"{head}</head>\n"
        f'<body class="{body_class}"{body_attrs}>\n'
        '<header class="site-header"><a class="logo" href="/pc/feed">'
        f"{SITE_NAME}</a>"
        '<nav class="site-nav"><a href="/pc/feed">首页 Home</a> '
        '<a href="/login/captcha">登录 Login</a></nav></header>\n'
        f'<main class="content">\n{main}\n</main>\n'
        '<footer class="site-footer">&copy; 2025 DemoNews &middot; 本站为演示站点</footer>\n'
        "</body>\n</html>\n"
    )


def pager(base: str, page: int, total_pages: int) -> str:
    """Page links: current/total page plus prev/next; `base` ends with "page=" placeholder."""
    parts = [
        '<div class="pager">',
        f'<span class="page-info">第 <span class="current-page">{page}</span> / '
        f'<span class="total-pages">{total_pages}</span> 页</span>',
    ]
    if page > 1:
        parts.append(f'<a class="prev" href="{base}{page - 1}">上一页 Prev</a>')
    if page < total_pages:
        parts.append(f'<a class="next" href="{base}{page + 1}">下一页 Next</a>')
    parts.append("</div>")
    return "\n".join(parts)


def error_page(status: int, code: str, message: str) -> str:
    main = (
        f'<div class="error" id="error" data-error="{code}" data-status="{status}">\n'
        f'<h1>{status} {escape(code)}</h1>\n<p class="message">{escape(message)}</p>\n</div>'
    )
    return layout(f"{status} {code}", f"page-error error-{code}", main)


def error_response(
    request: web.Request,
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> web.Response:
    """An error in the dialect of the path: HTML page for pc, envelope JSON for APIs."""
    path = request.path
    if wants_html(path):
        return html_response(error_page(status, code, message), status, headers=headers)
    body: dict[str, Any] = {"error": code, "message": message, **extra}
    front = front_of(path)
    if front == "h5":
        body["ok"] = 0
    elif front == "app":
        body["code"] = status
    return json_response(body, status, headers=headers)


LOGIN_WALL = layout(
    "请登录 Login required",
    "page-login",
    '<div class="login-wall" id="login-wall" data-error="login_required">\n'
    "<h1>登录后查看评论 Log in to read comments</h1>\n"
    '<p class="hint">Get a captcha from <a href="/login/captcha">/login/captcha</a>, '
    "then post this form.</p>\n"
    '<form class="login-form" action="/login" method="post">\n'
    '<input type="text" name="username" placeholder="用户名">\n'
    '<input type="password" name="password" placeholder="密码">\n'
    '<input type="hidden" name="captcha_id" value="">\n'
    '<input type="text" name="captcha_answer" placeholder="验证码">\n'
    '<button type="submit">登录</button>\n</form>\n</div>',
)


def login_wall(request: web.Request) -> web.Response:
    """pc: a 200 page with a login form (detect it from the body); APIs: 401 JSON."""
    if wants_html(request.path):
        return html_response(LOGIN_WALL, 200)
    return error_response(request, 401, "login_required", "log in to read comments")
