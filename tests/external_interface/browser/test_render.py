"""Rendering the demo's JavaScript front end: exact counts, captured answers, deadlines,
and the lent proxy, cookies and user agent applied in the browser."""

from __future__ import annotations

import time
from urllib.parse import urljoin

import orjson
import pytest
import requests

from demo import Dataset
from demo.proxy_farm import dead_address
from demo.testing import DemoServer
from exceptions import ConnectError, ProxyError, RenderTimeout
from external_interface.browser import (
    BrowserPool,
    Click,
    LoadMore,
    RenderRequest,
    ScrollToEnd,
    WaitFor,
)
from tests.external_interface.browser_fixtures import (
    JS_BATCH_SIZE,
    JS_FEED_PAGE_SIZE,
    needs_browser,
)
from tests.external_interface.proxy_fixtures import ProxyFactory

pytestmark = [needs_browser, pytest.mark.integration]

READY = ".feed[data-state=ready]"


def feed_pids(demo: DemoServer) -> list[str]:
    cfg = demo.config
    data = Dataset(cfg.seed, cfg.users, cfg.posts_per_user, cfg.comments_per_post)
    return [p.id for p in data.feed(0, cfg.users)]


def test_list_pages_fill_by_script_and_the_pager_walks_them_all(
    browser: BrowserPool, js_demo: DemoServer
) -> None:
    exp = js_demo.expected()["js"]
    pids: list[str]
    url, pids, pages = js_demo.url_for("/js/feed"), [], 0
    while url:
        res = browser.render(RenderRequest(url, wait_for=READY, capture_json=r"/js/api/feed"))
        pages += 1
        items = res.response.css(".feed-item")
        assert len(items) == min(JS_FEED_PAGE_SIZE, 20 - len(pids))
        pids += items.css("::attr(data-pid)").getall()
        (answer,) = res.json_answers()  # the script's own API call, intercepted
        assert [p["id"] for p in answer["list"]] == items.css("::attr(data-pid)").getall()
        nxt = res.response.css(".pager a.next::attr(href)").get()
        url = urljoin(res.response.url, nxt) if nxt else ""
    assert pages == exp["feed_pages"] == 3
    assert pids == feed_pids(js_demo)


def test_the_raw_html_has_no_entries(js_demo: DemoServer) -> None:
    """What a plain fetch sees: the same URL without a browser holds nothing to parse."""
    html = requests.get(js_demo.url_for("/js/feed"), timeout=10).text
    assert 'class="feed-item"' not in html and 'data-state="loading"' in html


def test_load_more_until_the_button_is_gone(browser: BrowserPool, js_demo: DemoServer) -> None:
    exp = js_demo.expected()["js"]
    res = browser.render(
        RenderRequest(
            js_demo.url_for("/js/more"),
            wait_for=".feed-item",
            actions=[LoadMore("button.load-more", item=".feed-item")],
            capture_json=r"/js/api/feed",
        )
    )
    assert res.response.css(".feed-item::attr(data-pid)").getall() == feed_pids(js_demo)
    (step,) = res.steps
    assert step == {"action": "load_more", "clicks": exp["load_more_clicks"], "items": 20,
                    "complete": True}  # fmt: skip
    assert len(res.captured) == exp["batches"] == -(-20 // JS_BATCH_SIZE)
    assert not res.response.css("button.load-more") and res.response.css(".feed-end")


def test_load_more_is_bounded(browser: BrowserPool, js_demo: DemoServer) -> None:
    res = browser.render(
        RenderRequest(
            js_demo.url_for("/js/more"),
            wait_for=".feed-item",
            actions=[LoadMore("button.load-more", item=".feed-item", max_clicks=2)],
        )
    )
    assert len(res.response.css(".feed-item")) == 3 * JS_BATCH_SIZE
    assert res.steps[0]["clicks"] == 2 and res.steps[0]["complete"] is False


@pytest.mark.parametrize("until", [".feed-end", None])
def test_infinite_scroll_to_the_end(
    browser: BrowserPool, js_demo: DemoServer, until: str | None
) -> None:
    res = browser.render(
        RenderRequest(
            js_demo.url_for("/js/scroll"),
            wait_for=".feed-item",
            actions=[ScrollToEnd(item=".feed-item", until=until, settle_ms=3000)],
        )
    )
    assert res.response.css(".feed-item::attr(data-pid)").getall() == feed_pids(js_demo)
    assert res.steps[0]["complete"] is True and res.steps[0]["items"] == 20
    assert res.steps[0]["rounds"] >= js_demo.expected()["js"]["batches"] - 1


def test_without_scrolling_only_the_first_batch_arrives(
    browser: BrowserPool, js_demo: DemoServer
) -> None:
    res = browser.render(RenderRequest(js_demo.url_for("/js/scroll"), wait_for=".feed-item"))
    assert len(res.response.css(".feed-item")) == JS_BATCH_SIZE


def test_detail_page_fields_from_the_inline_script(
    browser: BrowserPool, js_demo: DemoServer
) -> None:
    cfg = js_demo.config
    data = Dataset(cfg.seed, cfg.users, cfg.posts_per_user, cfg.comments_per_post)
    for pid in ("p1", "p37", f"p{cfg.users * cfg.posts_per_user}"):
        post = data.post(pid)
        assert post is not None
        res = browser.render(
            RenderRequest(
                js_demo.url_for(f"/js/post/{pid}"), wait_for=".post-detail[data-state=ready]"
            )
        )
        art = res.response.css("article.post-detail")
        assert art.css("::attr(data-pid)").get() == pid
        assert art.css("h1.title::text").get() == post.title
        assert "\n".join(art.css(".post-content p::text").getall()) == post.content
        assert art.css(".likes::text").get() == str(post.likes)
        assert art.css("time.created-at::attr(data-ts)").get() == str(post.created_at)


def test_click_and_wait_for_actions(browser: BrowserPool, js_demo: DemoServer) -> None:
    res = browser.render(
        RenderRequest(
            js_demo.url_for("/js/more"),
            actions=[
                WaitFor("button.load-more"),
                Click("button.load-more", wait_for=f".feed-item:nth-of-type({2 * JS_BATCH_SIZE})"),
            ],
        )
    )
    assert len(res.response.css(".feed-item")) == 2 * JS_BATCH_SIZE


def test_a_page_that_never_settles_times_out_with_a_screenshot(
    browser: BrowserPool, js_demo: DemoServer
) -> None:
    t0 = time.monotonic()
    with pytest.raises(RenderTimeout) as err:
        browser.render(RenderRequest(js_demo.url_for("/js/hang"), timeout=2.0))
    took = time.monotonic() - t0
    assert 1.9 < took < 2.0 + 8, took  # its deadline, plus taking the capture and closing it
    exc = err.value
    assert exc.screenshot is not None and exc.screenshot.startswith(b"\x89PNG\r\n\x1a\n")
    assert exc.dom is not None and 'id="hang"' in exc.dom
    assert exc.page_url.endswith("/js/hang")
    # the hung page was closed: the next render on the same pool just works
    res = browser.render(
        RenderRequest(js_demo.url_for("/js/post/p2"), wait_for="article[data-state=ready]")
    )
    assert res.response.css("article::attr(data-pid)").get() == "p2"


def test_a_selector_that_never_appears_times_out_with_the_dom(
    browser: BrowserPool, js_demo: DemoServer
) -> None:
    with pytest.raises(RenderTimeout) as err:
        browser.render(
            RenderRequest(js_demo.url_for("/js/feed"), wait_for=".no-such-thing", timeout=2.0)
        )
    assert err.value.screenshot and err.value.dom and 'class="feed-item"' in err.value.dom


def test_an_error_document_is_returned_at_once_without_its_selector_or_actions(
    browser: BrowserPool, js_demo: DemoServer
) -> None:
    t0 = time.monotonic()
    res = browser.render(
        RenderRequest(
            js_demo.url_for("/js/post/p999999"),
            wait_for="article[data-state=ready]",
            actions=[WaitFor(".never")],
            timeout=20,
        )
    )
    assert res.response.status == 404 and res.steps == ()
    assert time.monotonic() - t0 < 10  # not the 20 s the selector would have cost


def test_the_page_times_its_document_as_a_fetch_would(
    browser: BrowserPool, js_demo: DemoServer
) -> None:
    res = browser.render(RenderRequest(js_demo.url_for("/js/feed"), wait_for=READY))
    # the document's own arrival (what providers judge a proxy by), within the whole render
    assert 0 < res.response.elapsed < res.elapsed
    assert res.page().elapsed == res.response.elapsed


def test_images_are_blocked_unless_asked_for(browser: BrowserPool, js_demo: DemoServer) -> None:
    js_demo.reset()
    browser.render(RenderRequest(js_demo.url_for("/js/feed"), wait_for=READY))
    assert js_demo.stats()["by_endpoint"].get("js.logo", 0) == 0
    browser.render(RenderRequest(js_demo.url_for("/js/feed"), wait_for=READY, block=()))
    assert js_demo.stats()["by_endpoint"].get("js.logo", 0) == 1


def _headers_seen(browser: BrowserPool, demo: DemoServer, **lent: object) -> dict:
    res = browser.render(RenderRequest(demo.url_for("/headers"), capture_json=r"/headers$", **lent))  # type: ignore[arg-type]
    (seen,) = res.json_answers()
    return seen


def test_cookies_and_user_agent_reach_the_site(browser: BrowserPool, js_demo: DemoServer) -> None:
    ua = "Mozilla/5.0 (X11; Linux x86_64) ChaincrawlTest/1.0"
    seen = _headers_seen(
        browser, js_demo, cookies={"session": "abc123", "lang": "zh"}, user_agent=ua
    )
    assert seen["headers"]["User-Agent"] == ua
    assert sorted(seen["headers"]["Cookie"].split("; ")) == ["lang=zh", "session=abc123"]
    # another render with other lent cookies sees only its own
    seen = _headers_seen(browser, js_demo, cookies={"session": "other"})
    assert (
        seen["headers"]["Cookie"] == "session=other"
        and "ChaincrawlTest" not in seen["headers"]["User-Agent"]
    )
    # and one without any sends none
    assert "Cookie" not in _headers_seen(browser, js_demo)["headers"]


def test_the_lent_proxy_carries_the_page(
    browser: BrowserPool, js_demo: DemoServer, proxies: ProxyFactory
) -> None:
    plain, authed = proxies.healthy()[0], proxies.with_auth()
    for proxy in (plain, authed):
        before = proxy.requests
        seen = _headers_seen(browser, js_demo, proxy=proxy.url)
        assert seen["remote_addr"] == proxy.host != "127.0.0.1"
        assert proxy.requests == before + 1
    # the JS page and its script's API call both go through the page's proxy
    before = plain.requests
    res = browser.render(
        RenderRequest(js_demo.url_for("/js/feed"), wait_for=READY, proxy=plain.url)
    )
    assert len(res.response.css(".feed-item")) == JS_FEED_PAGE_SIZE
    assert plain.requests == before + 3  # the page, app.js and /js/api/feed (the logo is blocked)


def test_a_dead_proxy_or_site_is_a_rotate_error(browser: BrowserPool, js_demo: DemoServer) -> None:
    host, port = dead_address()
    with pytest.raises(ProxyError):
        browser.render(
            RenderRequest(js_demo.url_for("/js/feed"), proxy=f"http://{host}:{port}", timeout=10)
        )
    with pytest.raises(ConnectError):
        browser.render(RenderRequest(f"http://{host}:{port}/", timeout=10))


def test_status_headers_and_the_dom_of_an_error_page(
    browser: BrowserPool, js_demo: DemoServer
) -> None:
    res = browser.render(RenderRequest(js_demo.url_for("/js/post/p999999")))
    assert (
        res.response.status == 404
        and res.response.css("#error::attr(data-error)").get() == "not_found"
    )
    res = browser.render(RenderRequest(js_demo.url_for("/js/api/feed?limit=2")))
    assert res.response.status == 200 and res.response.headers["content-type"].startswith(
        "application/json"
    )
    body = orjson.loads(res.response.css("pre::text").get() or "{}")
    assert len(body["list"]) == 2
