"""The fetch layer against a real local HTTP server."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from exceptions import (
    ConnectError,
    FetchTimeout,
    ParseError,
    ResponseTooLarge,
    TooManyRedirects,
)
from external_interface.fetch import FetchRequest, RequestsFetcher
from tests.testsite.server import TestSite
from utils.servers import free_port


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    s = TestSite().start()
    yield s
    s.stop()


@pytest.fixture
def fetcher() -> RequestsFetcher:
    return RequestsFetcher(max_redirects=5)


def test_whole_request_deadline_holds_against_a_dripping_server(site, fetcher) -> None:
    start = time.monotonic()
    with pytest.raises(FetchTimeout):
        # each byte arrives within the read timeout, so only the whole-request deadline stops it
        fetcher.fetch(FetchRequest("GET", f"{site.url}/drip?n=100&every=0.1", timeout=1.0))
    assert time.monotonic() - start < 2.5


def test_response_size_limit(site, fetcher) -> None:
    with pytest.raises(ResponseTooLarge):
        fetcher.fetch(FetchRequest("GET", f"{site.url}/big?n=200000", max_bytes=100_000))
    ok = fetcher.fetch(FetchRequest("GET", f"{site.url}/big?n=1000", max_bytes=100_000))
    assert len(ok.content) == 1000


def test_meta_charset_decoding(site, fetcher) -> None:
    r = fetcher.fetch(FetchRequest("GET", f"{site.url}/gbk"))
    assert r.encoding == "gb18030"
    assert r.css("p.t::text").get() == "中文标题"


def test_redirect_loop(site, fetcher) -> None:
    with pytest.raises(TooManyRedirects):
        fetcher.fetch(FetchRequest("GET", f"{site.url}/redirect-loop"))


def test_connection_refused(fetcher) -> None:
    with pytest.raises(ConnectError):
        fetcher.fetch(FetchRequest("GET", f"http://127.0.0.1:{free_port()}/"))


def test_invalid_json_is_a_parse_error(site, fetcher) -> None:
    r = fetcher.fetch(FetchRequest("GET", f"{site.url}/gbk"))
    with pytest.raises(ParseError, match="invalid JSON"):
        r.json()


def test_connections_are_reused_per_thread(site, fetcher) -> None:
    s1 = fetcher.session()
    fetcher.fetch(FetchRequest("GET", f"{site.url}/detail/x"))
    assert fetcher.session() is s1
