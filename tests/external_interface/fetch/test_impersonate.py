"""What the impersonating fetcher shares with the default beyond the contract tests
(test_fetch.py runs those on it): proxy failures, the HTTP cache, the fetch slots."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from exceptions import ProxyError
from external_interface.fetch import (
    CachingFetcher,
    FetcherSet,
    FetchRequest,
    ImpersonateFetcher,
    LimitedFetcher,
    RequestsFetcher,
    Urllib3Fetcher,
    default_fetcher,
)
from external_interface.fetch.cache import HttpCache
from tests.testsite.server import TestSite
from utils.servers import free_port


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    s = TestSite()
    s.start()
    yield s
    s.stop()


@pytest.mark.parametrize("fetcher", [Urllib3Fetcher, RequestsFetcher, ImpersonateFetcher])
def test_a_proxy_that_refuses_is_the_proxy_s_failure(site: TestSite, fetcher: type) -> None:
    with pytest.raises(ProxyError, match="proxy failed"):
        fetcher().fetch(FetchRequest("GET", f"{site.url}/detail/x",
                                     proxy=f"http://u:secret@127.0.0.1:{free_port()}"))  # fmt: skip


def test_no_credentials_in_a_proxy_error(site: TestSite) -> None:
    with pytest.raises(ProxyError) as err:
        ImpersonateFetcher().fetch(FetchRequest("GET", f"{site.url}/detail/x",
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
