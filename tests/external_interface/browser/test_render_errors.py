"""What a failed render is, decided by what a retry could change: selectors that cannot parse
fail before the page loads, a selector that never came on a quiet page is final, a page still
loading or whose requests failed is retried, and every timeout names what it waited for."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from exceptions import InvalidSelector, Policy, RenderTimeout, SelectorTimeout, policy_for
from external_interface.browser import BrowserPool, Click, RenderRequest, ScrollToEnd, WaitFor
from tests.external_interface.browser_fixtures import needs_browser
from tests.external_interface.jssite import JsSite

pytestmark = [needs_browser, pytest.mark.integration]


@pytest.fixture(scope="module")
def site() -> Iterator[JsSite]:
    with JsSite() as s:
        yield s


@pytest.mark.parametrize("sel", ["div[", "a:nth-child(2", "li >", "a[title='x]"])
def test_a_malformed_selector_is_refused_while_the_request_is_built(sel: str) -> None:
    with pytest.raises(InvalidSelector, match="selector"):
        RenderRequest("http://127.0.0.1:1/x", wait_for=sel)
    with pytest.raises(InvalidSelector):
        RenderRequest("http://127.0.0.1:1/x", actions=[ScrollToEnd(item=sel)])
    # Playwright's own engines and CSS with brackets inside quotes are the browser's to judge
    RenderRequest("http://127.0.0.1:1/x", wait_for="text=Load more (2)")
    RenderRequest("http://127.0.0.1:1/x", wait_for="button:has-text('More (')")


@pytest.mark.parametrize(
    ("wait_for", "actions", "named"),
    [
        ("##id", [], "wait_for: '##id'"),
        (None, [Click("div:nosuchpseudo")], "click.selector: 'div:nosuchpseudo'"),
        (None, [ScrollToEnd(item="button:has-text('x')")], "scroll_to_end.item"),
    ],
)
def test_a_selector_the_browser_cannot_parse_fails_at_once_before_the_page_loads(
    browser: BrowserPool, site: JsSite, wait_for: str | None, actions: list, named: str
) -> None:
    before = site.hits["/static"]
    t0 = time.monotonic()
    with pytest.raises(InvalidSelector) as err:
        browser.render(RenderRequest(site.url("/static"), wait_for=wait_for, actions=actions,
                                     timeout=20))  # fmt: skip
    assert time.monotonic() - t0 < 15  # not the 20 s deadline
    assert named in str(err.value) and "not a valid" in str(err.value)
    assert policy_for(err.value) is Policy.FAIL
    assert site.hits["/static"] == before  # never navigated
    # the context is fine for the next render
    assert browser.render(RenderRequest(site.url("/static"), wait_for="h1")).response.status == 200


def test_a_selector_that_never_comes_on_a_quiet_page_is_final_and_named(
    browser: BrowserPool, site: JsSite
) -> None:
    with pytest.raises(SelectorTimeout) as err:
        # time enough, on a busy machine too, for the page to load and stay quiet for 1 s
        browser.render(RenderRequest(site.url("/static"), wait_for=".never", timeout=8))
    exc = err.value
    msg = str(exc)
    assert "wait_for '.never'" in msg and "deadline 8.0 s" in msg and "quiet" in msg, msg
    assert isinstance(exc, RenderTimeout) and policy_for(exc) is Policy.FAIL
    assert exc.screenshot and exc.dom and "<h1>static</h1>" in exc.dom
    with pytest.raises(SelectorTimeout, match=r"WaitFor '\.gone' "):
        browser.render(RenderRequest(site.url("/static"), actions=[WaitFor(".gone")], timeout=8))


def test_a_selector_waiting_on_an_answer_still_loading_is_retried(
    browser: BrowserPool, site: JsSite
) -> None:
    with pytest.raises(RenderTimeout) as err:
        browser.render(RenderRequest(site.url("/xhr?api=/api/hang"), wait_for=".late", timeout=3))
    exc = err.value
    assert not isinstance(exc, SelectorTimeout) and policy_for(exc) is Policy.RETRY
    assert (
        "wait_for '.late'" in str(exc) and "still loading" in str(exc) and "/api/hang" in str(exc)
    )
    # the same page answering in time renders
    res = browser.render(RenderRequest(site.url("/xhr?api=/api/slow&ms=300"), wait_for=".late"))
    assert res.response.css(".late::text").get() == "late"


def test_a_selector_missing_because_a_request_failed_is_retried(
    browser: BrowserPool, site: JsSite
) -> None:
    with pytest.raises(RenderTimeout) as err:
        browser.render(RenderRequest(site.url("/xhr?api=/api/fail"), wait_for=".late", timeout=3))
    assert not isinstance(err.value, SelectorTimeout) and policy_for(err.value) is Policy.RETRY
    assert "HTTP 500" in str(err.value) and "/api/fail" in str(err.value)


def test_a_page_that_never_loads_is_retried_and_says_so(browser: BrowserPool, site: JsSite) -> None:
    with pytest.raises(RenderTimeout) as err:
        browser.render(RenderRequest(site.url("/hang"), wait_for=".x", timeout=3))
    assert not isinstance(err.value, SelectorTimeout) and policy_for(err.value) is Policy.RETRY
    assert "loading the page (until 'load')" in str(err.value) and "3.0 s" in str(err.value)
