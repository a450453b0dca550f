"""Integration: each front end's paging walks to exactly the promised counts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from parsel import Selector

from demo.testing import DemoServer
from tests.demo.crawl import Crawl, crawl_app, crawl_h5, crawl_pc

pytestmark = pytest.mark.integration

# Odd page sizes so every list spans several pages and the last one is partial.
PAGED: dict[str, Any] = dict(
    size="small", pc_feed_page_size=7, pc_user_page_size=2, pc_comments_page_size=2,
    h5_feed_page_size=6, h5_statuses_page_size=3, h5_comments_page_size=4,
)  # fmt: skip


@pytest.fixture(scope="module")
def paged() -> Iterator[DemoServer]:
    with DemoServer(**PAGED) as server:
        yield server


def _check(crawl_result: Crawl, expected: dict, front: str) -> None:
    assert len(crawl_result.users) == expected["users"]
    assert len(crawl_result.posts) == expected["posts"]
    assert len(crawl_result.comments) == expected["comments"]
    assert len(crawl_result.feed_entries) == expected["feed_entries"]
    assert len(set(crawl_result.feed_entries)) == expected["feed_entries"]
    assert sum(crawl_result.requests.values()) == expected[front]["requests"]


def test_pc_walk(paged: DemoServer, http: requests.Session) -> None:
    paged.reset()
    result = crawl_pc(http, paged.url)
    exp = paged.expected()
    _check(result, exp, "pc")
    assert result.requests["feed"] == exp["pc"]["feed_pages"] == 3
    assert result.requests["user"] == exp["pc"]["user_pages"]
    assert result.requests["comments"] == exp["pc"]["comment_pages"]
    stats = paged.stats()
    assert stats["by_endpoint"]["pc.comments"] == exp["pc"]["comment_pages"]
    assert stats["by_front"]["pc"] == exp["pc"]["requests"]


def test_h5_walk(paged: DemoServer, http: requests.Session) -> None:
    result = crawl_h5(http, paged.url)
    exp = paged.expected()
    _check(result, exp, "h5")
    assert result.requests["feed"] == exp["h5"]["feed_pages"] == 4
    assert result.requests["statuses"] == exp["h5"]["status_pages"]
    assert result.requests["comments"] == exp["h5"]["comment_pages"]


@pytest.mark.parametrize("size", [3, 20, 500])
def test_app_walk(paged: DemoServer, http: requests.Session, size: int) -> None:
    result = crawl_app(http, paged.url, size)
    exp = paged.expected(app_page_size=size)
    _check(result, exp, "app")
    assert result.requests["comments"] == exp["app"]["comment_pages"]


def test_fronts_agree_on_data(paged: DemoServer, http: requests.Session) -> None:
    feed_h5 = http.get(paged.url + "/h5/api/feed").json()["data"]["list"]
    feed_app = http.get(paged.url + "/app/api/feed", params={"size": 6}).json()["data"]["list"]
    assert feed_h5 == feed_app
    pc = Selector(http.get(paged.url + "/pc/feed").text)
    assert pc.css(".feed-item::attr(data-pid)").getall()[:6] == [e["id"] for e in feed_h5]
    detail = http.get(paged.url + "/app/api/detail", params={"post_id": "p7"}).json()["data"]
    assert detail == http.get(paged.url + "/h5/api/post/p7").json()["data"]
    page = Selector(http.get(paged.url + "/pc/post/p7").text)
    assert "\n".join(page.css(".post-content p::text").getall()) == detail["content"]
    assert page.css("h1.title::text").get() == detail["title"]


def test_empty_comment_lists_are_one_page(http: requests.Session) -> None:
    with DemoServer(users=3, posts_per_user=2, comments_per_post=0) as server:
        exp = server.expected()
        for crawl in (crawl_pc, crawl_h5):
            result = crawl(http, server.url)
            assert result.comments == set() and len(result.posts) == 6
            assert result.requests["comments"] == 6
        result = crawl_app(http, server.url, 20)
        assert sum(result.requests.values()) == exp["app"]["requests"]


def test_charsets(tiny_server: DemoServer, http: requests.Session) -> None:
    user = http.get(tiny_server.url + "/pc/user/u1")
    assert user.headers["Content-Type"] == "text/html; charset=gbk"
    assert b'<meta charset="gbk">' in user.content
    name = Selector(user.text).css("h1.name::text").get()
    assert name == http.get(tiny_server.url + "/h5/api/user/u1").json()["data"]["name"]
    for path in ("/pc/feed", "/pc/post/p1", "/pc/post/p1/comments"):
        r = http.get(tiny_server.url + path)
        assert r.headers["Content-Type"] == "text/html; charset=utf-8"
        assert b'<meta charset="utf-8">' in r.content
    r = http.get(tiny_server.url + "/h5/api/feed")
    assert r.headers["Content-Type"] == "application/json; charset=utf-8"


def test_not_found_and_bad_requests(tiny_server: DemoServer, http: requests.Session) -> None:
    base = tiny_server.url
    for path in ("/pc/user/u999", "/pc/post/p999", "/pc/feed?page=2", "/pc/nope"):
        r = http.get(base + path)
        assert r.status_code == 404 and "text/html" in r.headers["Content-Type"]
        assert Selector(r.text).css(".error::attr(data-error)").get() == "not_found"
    r = http.get(base + "/h5/api/user/u999")
    assert r.status_code == 404 and r.json() == {**r.json(), "error": "not_found", "ok": 0}
    r = http.get(base + "/app/api/detail", params={"post_id": "p0"})
    assert r.status_code == 404 and r.json()["error"] == "not_found" and r.json()["code"] == 404
    assert http.get(base + "/app/api/detail").json()["error"] == "bad_request"
    assert http.get(base + "/app/api/feed?page=0").status_code == 400
    assert http.get(base + "/h5/api/feed?cursor=garbage").status_code == 400
    other = http.get(base + "/h5/api/user/u1/statuses").json()["data"]
    assert other["next_cursor"] is None  # 3 posts, page size 10
    page_past_end = http.get(base + "/app/api/feed", params={"page": 9}).json()["data"]
    assert page_past_end["list"] == [] and page_past_end["has_more"] is False
