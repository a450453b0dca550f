"""The development HTTP cache: keys, what is stored, expiry, torn files; then the fetch layer
against a local site, where a second run sends no request."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import Settings
from external_interface.fetch import (
    CachingFetcher,
    CurlFetcher,
    FetcherSet,
    FetchRequest,
    LimitedFetcher,
    Urllib3Fetcher,
    default_fetcher,
)
from external_interface.fetch.cache import CachedResponse, HttpCache, storable
from tests.polite_site import PoliteSite


def test_key_is_method_canonical_url_and_chosen_headers(tmp_path: Path) -> None:
    c = HttpCache(tmp_path)
    k = c.key("GET", "https://example.com/a?b=2&a=1#frag")
    assert k == c.key("get", "https://example.com/a?a=1&b=2")
    assert k == c.key("GET", "https://example.com/a", params={"b": 2, "a": 1, "none": None})
    assert k != c.key("GET", "https://example.com/a?a=1&b=3")
    # cookies, user agents and signatures rotate per request: not part of the key
    noisy = {"Cookie": "s=1", "User-Agent": "x", "X-Sign": "abc"}
    assert k == c.key("GET", "https://example.com/a?a=1&b=2", headers=noisy)
    assert k != c.key(
        "GET", "https://example.com/a?a=1&b=2", headers={"ACCEPT": "application/json"}
    )
    assert c.key("POST", "https://example.com/a") is None
    narrow = HttpCache(tmp_path, headers=["X-Api-Version"])
    assert narrow.key("GET", "https://e.com/", headers={"x-api-version": "2"}) != narrow.key(
        "GET", "https://e.com/", headers={"x-api-version": "3"}
    )


def test_what_is_stored() -> None:
    assert storable(200) and storable(301) and storable(404) and storable(410)
    assert not storable(429) and not storable(500) and not storable(503)


def test_round_trip_expiry_and_torn_files(tmp_path: Path) -> None:
    c = HttpCache(tmp_path)
    key = c.key("GET", "https://example.com/x")
    assert key is not None and c.get(key) is None
    entry = CachedResponse("https://example.com/y", 200, [("Content-Type", "text/html")],
                           b"<p>hi</p>", ["https://example.com/x"])  # fmt: skip
    c.put(key, entry, {"method": "GET", "url": "https://example.com/x"})
    got = c.get(key)
    assert got is not None
    assert (got.url, got.status, got.headers, got.content, got.history) == (
        "https://example.com/y", 200, [("Content-Type", "text/html")], b"<p>hi</p>",
        ["https://example.com/x"],
    )  # fmt: skip
    meta = tmp_path / key[:2] / f"{key}.json"
    body = tmp_path / key[:2] / f"{key}.body"
    assert meta.is_file() and body.is_file()
    assert [p.name for p in meta.parent.iterdir() if p.name.startswith(".tmp")] == []

    short = HttpCache(tmp_path, ttl=60)
    assert short.get(key) is not None
    old = got.stored - 120
    meta.write_bytes(meta.read_bytes().replace(repr(got.stored).encode(), repr(old).encode()))
    assert short.get(key) is None  # older than its TTL
    assert c.get(key) is not None  # forever without one

    body.write_bytes(b"<p>other write</p>")
    assert c.get(key) is None  # a body that does not match its metadata
    body.unlink()
    assert c.get(key) is None


def test_from_settings_is_none_when_unset(tmp_path: Path) -> None:
    assert HttpCache.from_settings(Settings(http_cache="")) is None
    c = HttpCache.from_settings(
        Settings(http_cache=str(tmp_path), http_cache_ttl=5, http_cache_headers="Accept, X-A")
    )
    assert c is not None and c.root == tmp_path and c.ttl == 5 and c.headers == ("accept", "x-a")


def test_default_fetcher_wraps_only_when_a_cache_is_given(tmp_path: Path) -> None:
    plain = default_fetcher()  # unset: nothing in the page path but the fetchers by name
    assert isinstance(plain, FetcherSet) and isinstance(plain.get(), CurlFetcher)
    named = default_fetcher(kind="urllib3")
    assert isinstance(named, FetcherSet) and isinstance(named.get(), Urllib3Fetcher)
    f = default_fetcher(slots=4, cache=HttpCache(tmp_path))
    assert isinstance(f, CachingFetcher) and isinstance(f.inner, LimitedFetcher)


@pytest.mark.integration
def test_a_second_run_sends_no_request(tmp_path: Path, polite_site: PoliteSite) -> None:
    base = polite_site.url
    cache = HttpCache(tmp_path / "http")

    def run() -> list:
        f = default_fetcher(cache=cache)  # as a fresh worker would build it
        return [
            f.fetch(FetchRequest("GET", f"{base}/page/1", params={"q": "x"})),
            f.fetch(FetchRequest("GET", f"{base}/redirect")),
            f.fetch(FetchRequest("GET", f"{base}/status/404")),
            f.fetch(FetchRequest("GET", f"{base}/status/503")),
            f.fetch(FetchRequest("POST", f"{base}/status/200")),
        ]

    polite_site.reset()
    first = run()
    assert not any(r.from_cache for r in first)
    sent = len(polite_site.hits)
    assert sent == 6  # the redirect is two requests
    second = run()
    assert [r.from_cache for r in second] == [True, True, True, False, False]
    assert len(polite_site.hits) == sent + 2  # only the 503 and the POST went out again
    for a, b in zip(first[:3], second[:3], strict=True):
        assert (a.url, a.status, a.content, a.history, a.text) == (
            b.url, b.status, b.content, b.history, b.text
        )  # fmt: skip
        assert b.headers["content-type"] == a.headers["Content-Type"]  # case-insensitive
        assert b.elapsed == 0.0
    assert second[1].url == f"{base}/page/1" and second[1].history == [f"{base}/redirect"]
    cached = default_fetcher(cache=cache)
    assert isinstance(cached, CachingFetcher)
    assert cached.lookup(FetchRequest("GET", f"{base}/page/1?q=x")) is not None
    assert cached.lookup(FetchRequest("GET", f"{base}/page/2")) is None
    assert cached.lookup(FetchRequest("POST", f"{base}/status/200")) is None
    assert len(polite_site.hits) == sent + 2  # a lookup never sends
    assert second[0].css("h1::text").get() == "/page/1"
    assert len(list((tmp_path / "http").rglob("*.body"))) == 3
