"""Minimal reference crawlers for the three front ends, written from demo/README.md."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import requests
from parsel import Selector


@dataclass
class Crawl:
    requests: Counter[str] = field(default_factory=Counter)
    users: set[str] = field(default_factory=set)
    posts: set[str] = field(default_factory=set)
    comments: set[str] = field(default_factory=set)
    feed_entries: list[str] = field(default_factory=list)


def _get(s: requests.Session, url: str, **kw: object) -> requests.Response:
    r = s.get(url, timeout=10, **kw)  # type: ignore[arg-type]
    r.raise_for_status()
    return r


def crawl_pc(s: requests.Session, base: str) -> Crawl:
    out = Crawl()
    first = Selector(_get(s, f"{base}/pc/feed?page=1").text)
    total_text = first.css(".pager .total-pages::text").get()
    assert total_text is not None
    total = int(total_text)
    pages = [first] + [
        Selector(_get(s, f"{base}/pc/feed?page={n}").text) for n in range(2, total + 1)
    ]
    out.requests["feed"] = total
    for page in pages:
        for item in page.css(".feed-item"):
            out.feed_entries.append(item.attrib["data-pid"])
            href = item.css("a.user-link::attr(href)").get()
            assert href is not None
            out.users.add(href.rsplit("/", 1)[1])
    post_ids: list[str] = []
    for uid in sorted(out.users):
        url: str | None = f"{base}/pc/user/{uid}?page=1"
        while url:
            r = _get(s, url)
            assert r.encoding == "gbk"
            sel = Selector(r.text)
            out.requests["user"] += 1
            assert sel.css(".profile h1.name::text").get()
            post_ids += [
                h.rsplit("/", 1)[1] for h in sel.css(".post-item a.post-link::attr(href)").getall()
            ]
            nxt = sel.css(".pager a.next::attr(href)").get()
            url = base + nxt if nxt else None
    for pid in post_ids:
        sel = Selector(_get(s, f"{base}/pc/post/{pid}").text)
        out.requests["post"] += 1
        detail_pid = sel.css("article.post-detail::attr(data-pid)").get()
        assert detail_pid is not None
        out.posts.add(detail_pid)
        comments_href = sel.css("a.comments-link::attr(href)").get()
        assert comments_href is not None
        url = base + comments_href
        while url:
            sel = Selector(_get(s, url).text)
            assert not sel.css(".login-wall"), "hit the login wall"
            out.requests["comments"] += 1
            out.comments.update(sel.css("li.comment::attr(data-cid)").getall())
            nxt = sel.css(".pager a.next::attr(href)").get()
            url = base + nxt if nxt else None
    return out


def crawl_h5(s: requests.Session, base: str) -> Crawl:
    out = Crawl()

    def walk(path: str, kind: str) -> list[dict]:
        items: list[dict] = []
        cursor = ""
        while True:
            body = _get(s, base + path, params={"cursor": cursor} if cursor else None).json()
            assert body["ok"] == 1
            out.requests[kind] += 1
            items += body["data"]["list"]
            cursor = body["data"]["next_cursor"]
            if cursor is None:
                return items

    for entry in walk("/h5/api/feed", "feed"):
        out.feed_entries.append(entry["id"])
        out.users.add(entry["user"]["id"])
    for uid in sorted(out.users):
        assert _get(s, f"{base}/h5/api/user/{uid}").json()["data"]["id"] == uid
        out.requests["profile"] += 1
        for post in walk(f"/h5/api/user/{uid}/statuses", "statuses"):
            detail = _get(s, f"{base}/h5/api/post/{post['id']}").json()["data"]
            out.requests["detail"] += 1
            out.posts.add(detail["id"])
            out.comments.update(
                c["id"] for c in walk(f"/h5/api/post/{post['id']}/comments", "comments")
            )
    return out


def crawl_app(
    s: requests.Session,
    base: str,
    size: int,
    sign: Callable[[dict[str, object]], dict[str, str]] | None = None,
) -> Crawl:
    """`sign` (optional) turns a params dict into a signed one."""
    out = Crawl()

    def get(path: str, params: dict[str, object]) -> dict:
        body = _get(s, base + path, params=sign(params) if sign else params).json()
        assert body["code"] == 0
        return body["data"]

    def walk(path: str, kind: str, **params: object) -> list[dict]:
        items: list[dict] = []
        page = 1
        while True:
            data = get(path, {**params, "page": page, "size": size})
            out.requests[kind] += 1
            items += data["list"]
            if not data["has_more"]:
                return items
            page += 1

    for entry in walk("/app/api/feed", "feed"):
        out.feed_entries.append(entry["id"])
        out.users.add(entry["user_id"])
    for uid in sorted(out.users):
        assert get("/app/api/user_info", {"user_id": uid})["id"] == uid
        out.requests["profile"] += 1
        for post in walk("/app/api/user_statuses", "statuses", user_id=uid):
            out.posts.add(get("/app/api/detail", {"post_id": post["id"]})["id"])
            out.requests["detail"] += 1
            out.comments.update(
                c["id"] for c in walk("/app/api/comments", "comments", post_id=post["id"])
            )
    return out
