"""The `pc` front end: server-rendered HTML pages with stable class names for CSS selectors.

User pages are deliberately served in GBK (header and <meta>) so crawlers must decode by
the declared charset instead of assuming UTF-8.
"""

from __future__ import annotations

from html import escape

from aiohttp import web

from demo.data import Comment, Post, User, iso
from demo.paging import page_count
from demo.params import found, int_param, not_found
from demo.responses import html_response, layout, pager
from demo.state import state_of

USER_PAGE_CHARSET = "gbk"

routes = web.RouteTableDef()


def _time(ts: int) -> str:
    shown = iso(ts).replace("T", " ")[:16]
    return f'<time class="created-at" datetime="{iso(ts)}" data-ts="{ts}">{shown}</time>'


def _page_or_404(request: web.Request, total: int, size: int, what: str) -> tuple[int, int]:
    pages = page_count(total, size)
    page = int_param(request, "page", 1)
    if page > pages:
        raise not_found(request, f"{what} page {page} (there are {pages})")
    return page, pages


def _name(user: User | None) -> str:
    return user.name if user else ""


def _feed_item(post: Post, user_name: str) -> str:
    return (
        f'<div class="feed-item" data-uid="{post.user_id}" data-pid="{post.id}">\n'
        f'<h2 class="title"><a class="post-link" href="/pc/post/{post.id}">'
        f"{escape(post.title)}</a></h2>\n"
        f'<div class="meta"><a class="user-link" href="/pc/user/{post.user_id}">'
        f"{escape(user_name)}</a> &middot; {_time(post.created_at)} &middot; "
        f'<span class="likes">{post.likes}</span> 赞 &middot; '
        f'<span class="comments-count">{post.comments_count}</span> 评论</div>\n'
        f'<p class="summary">{escape(post.summary)}</p>\n</div>'
    )


@routes.get("/pc/feed", name="pc.feed")
async def feed(request: web.Request) -> web.Response:
    st = state_of(request)
    size = st.config.pc_feed_page_size
    page, pages = _page_or_404(request, st.data.users, size, "feed")
    posts = st.data.feed((page - 1) * size, size)
    items = "\n".join(_feed_item(p, _name(st.data.user(p.user_id))) for p in posts)
    main = (
        f'<section class="feed" data-page="{page}" data-total-pages="{pages}" '
        f'data-total="{st.data.users}">\n<h1 class="section-title">热门动态 Latest</h1>\n'
        f"{items}\n</section>\n{pager('/pc/feed?page=', page, pages)}"
    )
    return html_response(layout(f"首页 第{page}页", "page-feed", main))


@routes.get("/pc/user/{uid}", name="pc.user")
async def user(request: web.Request) -> web.Response:
    st = state_of(request)
    uid = request.match_info["uid"]
    u = found(request, st.data.user(uid), f"user {uid}")
    size = st.config.pc_user_page_size
    page, pages = _page_or_404(request, u.post_count, size, "user")
    posts = st.data.user_posts(uid, (page - 1) * size, size)
    rows = "\n".join(
        f'<li class="post-item" data-pid="{p.id}"><a class="post-link" href="/pc/post/{p.id}">'
        f"{escape(p.title)}</a> {_time(p.created_at)} "
        f'<span class="likes">{p.likes}</span> 赞</li>'
        for p in posts
    )
    verified = '<span class="verified">认证用户</span>\n' if u.verified else ""
    main = (
        f'<div class="profile" data-uid="{u.id}">\n<h1 class="name">{escape(u.name)}</h1>\n'
        f"{verified}"
        f'<p class="bio">{escape(u.bio)}</p>\n'
        f'<span class="location">{escape(u.location)}</span>\n'
        f'<span class="followers">{u.followers}</span> 粉丝 '
        f'<span class="post-count">{u.post_count}</span> 动态\n</div>\n'
        f'<ul class="post-list" data-page="{page}" data-total-pages="{pages}">\n{rows}\n</ul>\n'
        f"{pager(f'/pc/user/{u.id}?page=', page, pages)}"
    )
    html = layout(f"{u.name} 的主页", "page-user", main, charset=USER_PAGE_CHARSET)
    return html_response(html, charset=USER_PAGE_CHARSET)


@routes.get("/pc/post/{pid}", name="pc.post")
async def post(request: web.Request) -> web.Response:
    st = state_of(request)
    pid = request.match_info["pid"]
    p = found(request, st.data.post(pid), f"post {pid}")
    author = _name(st.data.user(p.user_id))
    paragraphs = "\n".join(f"<p>{escape(par)}</p>" for par in p.content.split("\n"))
    main = (
        f'<article class="post-detail" data-pid="{p.id}" data-uid="{p.user_id}">\n'
        f'<h1 class="title">{escape(p.title)}</h1>\n'
        f'<div class="meta"><a class="user-link" href="/pc/user/{p.user_id}">'
        f"{escape(author)}</a> &middot; {_time(p.created_at)} &middot; "
        f'<span class="likes">{p.likes}</span> 赞 &middot; '
        f'<span class="comments-count">{p.comments_count}</span> 评论</div>\n'
        f'<div class="post-content">\n{paragraphs}\n</div>\n'
        f'<a class="comments-link" href="/pc/post/{p.id}/comments?page=1">'
        f"查看评论 View comments ({p.comments_count})</a>\n</article>"
    )
    return html_response(layout(p.title, "page-post", main))


def _comment_item(c: Comment) -> str:
    return (
        f'<li class="comment" data-cid="{c.id}" data-uid="{c.user_id}">'
        f'<a class="user-link" href="/pc/user/{c.user_id}">{escape(c.user_name)}</a>: '
        f'<span class="text">{escape(c.text)}</span> '
        f'<span class="likes">{c.likes}</span> 赞 {_time(c.created_at)}</li>'
    )


@routes.get("/pc/post/{pid}/comments", name="pc.comments")
async def comments(request: web.Request) -> web.Response:
    st = state_of(request)
    pid = request.match_info["pid"]
    p = found(request, st.data.post(pid), f"post {pid}")
    size = st.config.pc_comments_page_size
    page, pages = _page_or_404(request, p.comments_count, size, "comments")
    items = "\n".join(_comment_item(c) for c in st.data.post_comments(pid, (page - 1) * size, size))
    main = (
        f'<section class="comments" data-pid="{p.id}" data-page="{page}" '
        f'data-total-pages="{pages}" data-total="{p.comments_count}">\n'
        f'<h1 class="title"><a class="post-link" href="/pc/post/{p.id}">'
        f"{escape(p.title)}</a></h1>\n"
        f'<ul class="comment-list">\n{items}\n</ul>\n</section>\n'
        f"{pager(f'/pc/post/{p.id}/comments?page=', page, pages)}"
    )
    return html_response(layout(f"评论 {p.title}", "page-comments", main))
