"""robots.txt: the rules, the fetch outcomes (RFC 9309 as Google applies it), one fetch per
origin for every worker, the opt-outs; against a real Redis and the local polite site."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from config import Settings
from exceptions import (
    ConnectError,
    FetchTimeout,
    NotFound,
    Policy,
    RobotsDisallowed,
    RobotsUnavailable,
    TooManyRedirects,
    policy_for,
)
from external_interface.fetch import Urllib3Fetcher
from external_interface.fetch.robots import RobotsPolicy, fetch_with, origin_of
from tests.polite_site import PoliteSite
from utils.servers import free_port

ROBOTS = """User-agent: *
Disallow: /private/
Allow: /private/open
Crawl-delay: 1.5

User-agent: strictbot
Disallow: /

Sitemap: https://example.com/sitemap.xml
"""


@dataclass
class Answer:
    status: int
    content: bytes


class FakeSite:
    """A fetch function with a programmable robots.txt that counts its calls."""

    def __init__(self, status: int = 200, body: str = ROBOTS, error: Exception | None = None):
        self.status, self.body, self.error = status, body, error
        self.calls: list[str] = []
        self.delay = 0.0
        self._lock = threading.Lock()

    def __call__(self, url: str) -> Answer:
        with self._lock:
            self.calls.append(url)
        if self.delay:
            time.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return Answer(self.status, self.body.encode())


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make_policy(redis_url: str, key_prefix: str):
    client = redis.Redis.from_url(redis_url)

    def make(fetch: Any, clock: Any = time.time, **settings: Any) -> RobotsPolicy:
        s = Settings(redis_url=redis_url, key_prefix=key_prefix, **{"robots": True, **settings})
        return RobotsPolicy(client, fetch, s, clock=clock)

    yield make
    client.close()


def test_disallowed_url_is_a_skip_and_allowed_urls_pass(make_policy) -> None:
    p = make_policy(FakeSite())
    p.check("https://example.com/items/1")
    p.check("https://example.com/private/open/1")  # the longer Allow wins
    with pytest.raises(RobotsDisallowed) as err:
        p.check("https://example.com/private/1", site="demo")
    assert policy_for(err.value) is Policy.SKIP and err.value.reason == "robots"
    assert err.value.url == "https://example.com/private/1"
    assert "https://example.com" in str(err.value) and "chaincrawl" in str(err.value)
    assert p.allowed("https://example.com/items/1")
    assert not p.allowed("https://example.com/private/2")
    # the user agent's product token picks its group
    assert not p.allowed("https://example.com/items/1", "strictbot/2.1 (+https://x.test)")


def test_fetched_once_per_origin_for_every_worker(make_policy) -> None:
    """Two policies (two workers) and 16 threads at once: one fetch; then memory, no Redis."""
    site = FakeSite()
    site.delay = 0.2  # a slow robots.txt: everyone arrives while it is being fetched
    workers = [make_policy(site), make_policy(site)]
    errors: list[BaseException] = []

    def go(i: int) -> None:
        try:
            assert workers[i % 2].allowed(f"https://example.com/items/{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert site.calls == ["https://example.com/robots.txt"]
    workers.append(make_policy(site))  # a worker started later reads Redis
    assert not workers[2].allowed("https://example.com/private/x")
    assert len(site.calls) == 1
    # another origin (port, scheme) is another robots.txt
    workers[0].allowed("https://example.com:8443/a")
    workers[0].allowed("http://example.com/a")
    assert site.calls[1:] == [
        "https://example.com:8443/robots.txt",
        "http://example.com/robots.txt",
    ]


@pytest.mark.parametrize("status", [404, 410, 401, 403])
def test_4xx_means_everything_is_allowed(make_policy, status: int) -> None:
    p = make_policy(FakeSite(status=status))
    assert p.allowed("https://example.com/private/1")


def test_a_fetch_function_that_raises_for_status_is_understood(make_policy) -> None:
    p = make_policy(FakeSite(error=NotFound("HTTP 404", status=404)))
    assert p.allowed("https://example.com/private/1")


@pytest.mark.parametrize(
    "site",
    [FakeSite(status=503), FakeSite(status=500), FakeSite(status=429)],
    ids=["503", "500", "429"],
)  # fmt: skip
def test_unreadable_robots_makes_requests_wait_then_is_fetched_again(make_policy, site) -> None:
    clock = Clock()
    p = make_policy(site, clock, robots_error_ttl=300)
    with pytest.raises(RobotsUnavailable) as err:
        p.check("https://example.com/items/1")
    assert policy_for(err.value) is Policy.WAIT  # re-queued, not skipped, not failed
    assert 299 <= err.value.retry_after <= 300
    assert not p.allowed("https://example.com/items/2")
    assert len(site.calls) == 1  # the error is kept for the error TTL, not fetched per request
    clock.now += 301
    site.status, site.error = 200, None
    assert p.allowed("https://example.com/items/1")
    assert not p.allowed("https://example.com/private/1")
    assert len(site.calls) == 2


@pytest.mark.parametrize(
    "error",
    [ConnectError("connection refused"), FetchTimeout("timed out")],
    ids=["refused", "timeout"],
)
def test_no_answer_waits_seconds_doubling_then_an_answer_resets(make_policy, error) -> None:
    """A site down for a moment (refused, timed out) is asked again within seconds, not after
    the 5xx wait; each failure in a row doubles the wait up to ROBOTS_ERROR_TTL."""
    clock = Clock()
    site = FakeSite(error=error)
    p = make_policy(site, clock, robots_unreachable_ttl=5, robots_error_ttl=30)
    waits = []
    for _ in range(5):
        with pytest.raises(RobotsUnavailable) as err:
            p.check("https://example.com/items/1")
        assert policy_for(err.value) is Policy.WAIT
        assert type(error).__name__ in str(err.value) and "no answer" in str(err.value)
        waits.append(round(err.value.retry_after))
        assert not p.allowed("https://example.com/items/2")  # kept until it expires
        clock.now += err.value.retry_after + 0.01
    assert waits == [5, 10, 20, 30, 30]
    assert len(site.calls) == 5
    assert "5 times in a row" in str(err.value)
    site.error = None  # the site is back: its rules, at once
    assert p.allowed("https://example.com/items/1")
    assert not p.allowed("https://example.com/private/1")
    assert len(site.calls) == 6
    # a failure after an answer starts from the short wait again
    site.error = error
    p.forget("https://example.com/")
    with pytest.raises(RobotsUnavailable) as err:
        p.check("https://example.com/items/1")
    assert round(err.value.retry_after) == 5


def test_a_site_that_answers_again_is_fetched_by_every_worker_within_seconds(
    make_policy,
) -> None:
    """The failure is shared (one fetch for every worker), and so is its short life."""
    clock = Clock()
    site = FakeSite(error=ConnectError("connection refused"))
    a = make_policy(site, clock)  # the defaults: 5 s, ROBOTS_ERROR_TTL 600 s
    b = make_policy(site, clock)
    assert not a.allowed("https://example.com/items/1")
    assert not b.allowed("https://example.com/items/1")
    assert len(site.calls) == 1
    site.error = None
    clock.now += 6
    assert b.allowed("https://example.com/items/1") and a.allowed("https://example.com/items/1")
    assert len(site.calls) == 2


def test_too_many_redirects_means_everything_is_allowed(make_policy) -> None:
    """RFC 9309 2.3.1.2: no robots.txt found after the redirects is an unavailable one."""
    p = make_policy(FakeSite(error=TooManyRedirects("too many redirects")))
    assert p.allowed("https://example.com/private/1")


def test_rules_are_fetched_again_after_their_ttl(make_policy) -> None:
    clock = Clock()
    site = FakeSite()
    p = make_policy(site, clock, robots_ttl=3600)
    assert not p.allowed("https://example.com/private/1")
    clock.now += 3000
    assert not p.allowed("https://example.com/private/1")
    assert len(site.calls) == 1
    site.body = "User-agent: *\nDisallow:\n"
    clock.now += 700
    assert p.allowed("https://example.com/private/1")
    assert len(site.calls) == 2


def test_opt_outs_fetch_nothing(make_policy) -> None:
    site = FakeSite()
    p = make_policy(site, robots_ignore="demo, shop")
    assert p.allowed("https://example.com/private/1", site="demo")
    assert not p.applies("shop") and p.applies("news")
    off = make_policy(site, robots=False)
    assert off.allowed("https://example.com/private/1", site="news")
    assert site.calls == []
    assert not p.allowed("https://example.com/private/1", site="news")


def test_robots_txt_itself_and_other_schemes_are_always_allowed(make_policy) -> None:
    site = FakeSite(body="User-agent: *\nDisallow: /\n")
    p = make_policy(site)
    assert p.allowed("https://example.com/robots.txt")
    assert p.allowed("data:text/plain,hello")
    assert not p.allowed("https://example.com/")


def test_crawl_delay_request_rate_and_sitemaps(make_policy) -> None:
    p = make_policy(FakeSite())
    assert p.crawl_delay("https://example.com/") == 1.5
    assert p.crawl_delay("https://example.com/", "strictbot") is None
    assert p.sitemaps("https://example.com/x") == ["https://example.com/sitemap.xml"]
    q = make_policy(FakeSite(body="User-agent: *\nRequest-rate: 1/4s\n"))
    assert q.crawl_delay("https://other.example/") == 4.0
    assert make_policy(FakeSite(status=404)).crawl_delay("https://x.example/") is None


def test_origin_of() -> None:
    assert origin_of("HTTPS://User:pw@Example.COM:443/a?b") == "https://example.com"
    assert origin_of("http://example.com:8080/") == "http://example.com:8080"
    assert origin_of("http://[::1]:81/x") == "http://[::1]:81"
    assert origin_of("ftp://example.com/") is None
    assert origin_of("http:///nohost") is None


def test_forget_fetches_again(make_policy) -> None:
    site = FakeSite()
    p = make_policy(site)
    p.allowed("https://example.com/a")
    p.forget("https://example.com/b")
    p.allowed("https://example.com/a")
    assert len(site.calls) == 2


@pytest.mark.integration
def test_against_a_local_site(make_policy, polite_site: PoliteSite) -> None:
    """Through the real fetch layer: the site's robots.txt disallows /private/ (fetched once);
    a site whose robots.txt is missing allows everything; one that fails makes requests wait."""
    fetch = fetch_with(Urllib3Fetcher())
    polite_site.reset()
    p = make_policy(fetch)
    base = polite_site.url
    assert p.allowed(f"{base}/page/1")
    assert not p.allowed(f"{base}/private/1")
    assert p.crawl_delay(f"{base}/") == 2.0
    assert p.sitemaps(base) == [f"{base}/sitemap_index.xml"]
    assert polite_site.count("/robots.txt") == 1
    assert polite_site.count("/private/") == 0

    polite_site.robots_status = 404
    try:
        q = make_policy(fetch)
        q.forget(base)  # drop the stored rules: the next check fetches again
        assert q.allowed(f"{base}/private/1")
        polite_site.robots_status = 503
        q.forget(base)
        with pytest.raises(RobotsUnavailable):
            q.check(f"{base}/page/1")
    finally:
        polite_site.robots_status = 200
    with pytest.raises(RobotsUnavailable) as err:  # an origin nobody listens on
        make_policy(fetch_with(Urllib3Fetcher())).check(f"http://127.0.0.1:{free_port()}/x")
    assert err.value.retry_after <= 5  # no answer: asked again within seconds
