"""The `js` front end without a browser: empty shells, the API its script reads, the inline
data of detail pages, the page that never finishes, and the checks that apply to it.
(Rendered in a browser: tests/external_interface/browser/test_render.py.)"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import cast

import orjson
import pytest
import requests
from parsel import Selector

from demo import expected_counts
from demo.jsfront import script_json
from demo.testing import DemoServer
from tests.demo.conftest import DESKTOP_UA, MOBILE_UA

pytestmark = pytest.mark.integration

DATA = re.compile(r"<script>window\.__DATA__ = (.*?);</script>", re.S)


@pytest.fixture(scope="module")
def js_server() -> Iterator[DemoServer]:
    with DemoServer(size="small", js_feed_page_size=7, js_batch_size=3) as server:
        yield server


def test_expected_counts_of_the_js_front() -> None:
    assert expected_counts(20, 5, 5)["js"] == {
        "feed_pages": 1, "batches": 4, "load_more_clicks": 3, "post_pages": 100,
    }  # fmt: skip
    js = expected_counts(20, 5, 5, js_feed_page_size=7, js_batch_size=3)["js"]
    assert js == {"feed_pages": 3, "batches": 7, "load_more_clicks": 6, "post_pages": 100}
    empty = cast(dict[str, int], expected_counts(0, 1, 0)["js"])
    assert empty["batches"] == 1  # an empty feed is still one batch


def test_pages_are_shells_until_their_script_runs(
    js_server: DemoServer, http: requests.Session
) -> None:
    for path, view in (("/js/feed", "feed"), ("/js/more", "more"), ("/js/scroll", "scroll")):
        r = http.get(js_server.url_for(path))
        sel = Selector(r.text)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert sel.css("body::attr(data-view)").get() == view
        assert not sel.css(".feed-item") and sel.css("#feed::attr(data-state)").get() == "loading"
        assert sel.css('script[src="/js/static/app.js"]')
    r = http.get(js_server.url_for("/js/static/app.js"))
    assert (
        r.headers["content-type"].startswith("application/javascript") and b"__DATA__" in r.content
    )
    assert (
        http.get(js_server.url_for("/js/static/logo.svg")).headers["content-type"]
        == "image/svg+xml"
    )


def test_the_api_batches_walk_the_feed_in_order(
    js_server: DemoServer, http: requests.Session
) -> None:
    h5 = http.get(js_server.url_for("/h5/api/feed")).json()["data"]["list"]
    offset, seen, calls = 0, [], 0
    while True:
        body = http.get(js_server.url_for(f"/js/api/feed?offset={offset}&limit=3")).json()
        calls += 1
        assert body["total"] == 20 and body["limit"] == 3 and body["offset"] == offset
        seen += body["list"]
        offset += len(body["list"])
        if not body["has_more"]:
            break
    assert seen == h5 and calls == js_server.expected()["js"]["batches"]
    assert http.get(js_server.url_for("/js/api/feed")).json()["limit"] == 3  # js_batch_size
    assert http.get(js_server.url_for("/js/api/feed?limit=500")).json()["limit"] == 50
    bad = http.get(js_server.url_for("/js/api/feed?offset=-1"))
    assert bad.status_code == 400 and bad.json()["error"] == "bad_request"


def test_feed_pages_and_their_limits(js_server: DemoServer, http: requests.Session) -> None:
    sel = Selector(http.get(js_server.url_for("/js/feed?page=3")).text)
    feed = sel.css("#feed")
    assert (
        feed.css("::attr(data-offset)").get() == "14"
        and feed.css("::attr(data-limit)").get() == "7"
    )
    assert feed.css("::attr(data-total-pages)").get() == "3"
    r = http.get(js_server.url_for("/js/feed?page=4"))
    assert (
        r.status_code == 404
        and Selector(r.text).css("#error::attr(data-error)").get() == "not_found"
    )


def test_detail_pages_carry_their_post_in_an_inline_script(
    js_server: DemoServer, http: requests.Session
) -> None:
    for n in range(1, 101):
        r = http.get(js_server.url_for(f"/js/post/p{n}"))
        m = DATA.search(r.text)
        assert m, r.text[:500]
        assert "<" not in m.group(1) and "&" not in m.group(1)
        api = http.get(js_server.url_for(f"/h5/api/post/p{n}")).json()["data"]
        assert orjson.loads(m.group(1)) == {"post": api}
    r = http.get(js_server.url_for("/js/post/p101"))
    assert r.status_code == 404 and "page-error" in r.text


def test_script_json_cannot_close_its_script() -> None:
    text = script_json({"t": "</script><!-- a & b \u2028"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert orjson.loads(text) == {"t": "</script><!-- a & b \u2028"}


def test_the_hang_page_never_finishes(js_server: DemoServer) -> None:
    t0, got = time.monotonic(), b""
    with requests.get(js_server.url_for("/js/hang"), stream=True, timeout=(2, 2)) as r:
        assert r.status_code == 200
        for chunk in r.iter_content(None):  # spaces trickle in every half second
            got += chunk
            if time.monotonic() - t0 > 3:
                break
        else:
            pytest.fail("the document ended")
    assert b"<!DOCTYPE html>" in got and b'id="hang"' in got and b"</html>" not in got


def test_the_js_front_is_a_desktop_site_and_counted_as_js(http: requests.Session) -> None:
    with DemoServer(size="tiny", features=["ua_check"]) as server:
        assert (
            http.get(server.url_for("/js/feed"), headers={"User-Agent": DESKTOP_UA}).status_code
            == 200
        )
        api = http.get(server.url_for("/js/api/feed"), headers={"User-Agent": MOBILE_UA})
        assert api.status_code == 403 and api.json()["error"] == "bad_user_agent"
        page = http.get(server.url_for("/js/more"), headers={"User-Agent": "curl/8"})
        assert page.status_code == 403 and "error-bad_user_agent" in page.text  # an HTML error
        stats = server.stats()
        assert stats["by_front"] == {"js": 3} and stats["by_endpoint"]["js.api.feed"] == 1
