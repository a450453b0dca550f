"""Infinite scroll without an end marker: the list is complete only once the page has been
quiet (no new content, no request in flight) for `quiet_ms`; a slow answer is waited for,
one that never comes fails the render instead of passing a partial list as complete."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exceptions import Policy, RenderTimeout, policy_for
from external_interface.browser import BrowserPool, RenderRequest, ScrollToEnd
from tests.external_interface.browser_fixtures import needs_browser
from tests.external_interface.jssite import JsSite

pytestmark = [needs_browser, pytest.mark.integration]


@pytest.fixture(scope="module")
def site() -> Iterator[JsSite]:
    with JsSite() as s:
        yield s


def test_answers_slower_than_the_old_two_seconds_are_waited_for(
    browser: BrowserPool, site: JsSite
) -> None:
    # each batch answers after 2.5 s: "2 s without new content" would stop at the first 4
    res = browser.render(
        RenderRequest(
            site.url("/scroll?batches=3&size=4&ms=2500"),
            wait_for="li.item",
            actions=[ScrollToEnd(item="li.item")],
            timeout=40,
        )
    )
    items = res.response.css("li.item::text").getall()
    assert len(items) == 12 and items[-1] == "b2-3"
    (step,) = res.steps
    assert step["complete"] is True and step["items"] == 12 and step["rounds"] == 3


def test_the_end_is_called_after_the_quiet_period(browser: BrowserPool, site: JsSite) -> None:
    res = browser.render(
        RenderRequest(
            site.url("/scroll?batches=2&size=3"),
            wait_for="li.item",
            actions=[ScrollToEnd(item="li.item", quiet_ms=500)],
            timeout=30,
        )
    )
    (step,) = res.steps
    assert step["complete"] is True and step["items"] == 6 and step["rounds"] == 2


def test_an_answer_that_never_comes_fails_the_render_instead_of_a_partial_list(
    browser: BrowserPool, site: JsSite
) -> None:
    with pytest.raises(RenderTimeout) as err:
        browser.render(
            RenderRequest(
                site.url("/scroll?batches=3&size=3&hang=1"),
                wait_for="li.item",
                actions=[ScrollToEnd(item="li.item", settle_ms=3000)],
                timeout=30,
            )
        )
    msg = str(err.value)
    assert policy_for(err.value) is Policy.RETRY
    assert "settle_ms=3000" in msg and "still loading" in msg and "/api/batch" in msg, msg
    assert err.value.dom and err.value.dom.count('class="item"') == 3  # what it had so far


def test_settle_and_quiet_times_are_checked() -> None:
    with pytest.raises(ValueError, match="quiet_ms"):
        RenderRequest("http://127.0.0.1:1/x", actions=[ScrollToEnd(quiet_ms=-1)])
