"""What the impersonating fetcher (and pycurl's) shares with the default beyond the contract
tests (test_fetch.py runs those on it): proxy failures, the HTTP cache, the fetch slots."""

from __future__ import annotations

from pathlib import Path

import pytest

from exceptions import ProxyError
from external_interface.fetch import (
    CachingFetcher,
    CurlFetcher,
    FetcherSet,
    FetchRequest,
    ImpersonateFetcher,
    LimitedFetcher,
    RequestsFetcher,
    Urllib3Fetcher,
    default_fetcher,
)
from external_interface.fetch.cache import HttpCache
from external_interface.fetch.curl import installed
from tests.testsite.server import TestSite
from utils.servers import free_port

# the pycurl fetcher where its extra is installed
CURL = pytest.param(CurlFetcher, marks=pytest.mark.skipif(not installed(), reason="no pycurl"))


@pytest.mark.parametrize("fetcher", [Urllib3Fetcher, RequestsFetcher, ImpersonateFetcher, CURL])
def test_a_proxy_that_refuses_is_the_proxy_s_failure(site: TestSite, fetcher: type) -> None:
    with pytest.raises(ProxyError, match="proxy failed"):
        fetcher().fetch(FetchRequest("GET", f"{site.url}/detail/x",
                                     proxy=f"http://u:secret@127.0.0.1:{free_port()}"))  # fmt: skip


@pytest.mark.parametrize("fetcher", [ImpersonateFetcher, CURL])
def test_no_credentials_in_a_proxy_error(site: TestSite, fetcher: type) -> None:
    with pytest.raises(ProxyError) as err:
        fetcher().fetch(FetchRequest("GET", f"{site.url}/detail/x",
                                   proxy=f"http://u:secret@127.0.0.1:{free_port()}"))  # fmt: skip
    assert "secret" not in str(err.value)


def test_the_http_cache_and_the_slots_wrap_the_impersonating_fetcher(
    site: TestSite, tmp_path: Path
) -> None:
    f = default_fetcher(kind="impersonate", slots=2, cache=HttpCache(tmp_path))
    assert isinstance(f, CachingFetcher) and isinstance(f.inner, LimitedFetcher)
    fetchers = f.inner.inner
    assert isinstance(fetchers, FetcherSet)
    first = f.fetch(FetchRequest("GET", f"{site.url}/detail/x"))
    again = f.fetch(FetchRequest("GET", f"{site.url}/detail/x"))
    assert not first.from_cache and again.from_cache and again.content == first.content
    imp = fetchers.get()
    assert isinstance(imp, ImpersonateFetcher) and imp.connections == 1  # one request went out
