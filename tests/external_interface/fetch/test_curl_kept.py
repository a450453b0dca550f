"""The pycurl fetcher keeps a handle's options between requests and sets only those that
differ: requests of every kind in turn on ONE handle must each go out exactly as on a fresh
handle (nothing of the previous request's method, body, cookie, proxy, limits or redirect
choice carried over)."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from exceptions import ResponseTooLarge
from external_interface.fetch import FetchRequest
from tests.external_interface.fetch.servers import Echo, serving

pycurl = pytest.importorskip("pycurl", reason="pycurl cannot be imported")

from external_interface.fetch import CurlFetcher  # noqa: E402


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    with serving(Echo) as url:
        yield url


def seen(f: CurlFetcher, req: FetchRequest) -> dict:
    r = f.fetch(req)
    assert r.status == 200
    assert len(f.handles.idle) == 1  # one request at a time: always the same handle
    return r.json()


def test_one_handle_sends_each_request_as_a_fresh_one_would(echo: str) -> None:
    f = CurlFetcher(max_redirects=5)
    port = echo.rsplit(":", 1)[1]
    plain = seen(f, FetchRequest("GET", f"{echo}/echo?a=1"))
    assert plain["method"] == "GET" and plain["path"] == "/echo?a=1"
    handle = f.handles.idle[0]
    assert handle.held is not None  # a plain GET: its options stay on the handle

    posted = seen(f, FetchRequest("POST", f"{echo}/echo", data={"u": "1"}))
    assert posted["method"] == "POST" and posted["body"] == "u=1"
    assert f.handles.idle[0] is handle and handle.held is None  # reset after it
    after_post = seen(f, FetchRequest("GET", f"{echo}/echo"))
    assert after_post["method"] == "GET" and not after_post["body"]
    assert "content-type" not in after_post["headers"]

    assert f.fetch(FetchRequest("PUT", f"{echo}/echo", data="x")).status == 501  # not served
    assert seen(f, FetchRequest("GET", f"{echo}/echo"))["method"] == "GET"
    head = f.fetch(FetchRequest("HEAD", f"{echo}/echo"))
    assert head.status == 501 and head.content == b""  # not served; no body read
    assert seen(f, FetchRequest("GET", f"{echo}/echo"))["method"] == "GET"

    with_cookie = seen(f, FetchRequest("GET", f"{echo}/echo", cookies={"sid": "s1"}))
    assert with_cookie["headers"]["cookie"] == "sid=s1"
    assert "cookie" not in seen(f, FetchRequest("GET", f"{echo}/echo"))["headers"]

    via = f"http://us%40er:p@127.0.0.1:{port}"
    proxied = seen(f, FetchRequest("GET", "http://example.invalid/x", proxy=via))
    assert proxied["path"] == "http://example.invalid/x"
    assert (
        proxied["headers"]["proxy-authorization"]
        == "Basic " + base64.b64encode(b"us@er:p").decode()
    )
    direct = seen(f, FetchRequest("GET", f"{echo}/echo"))
    assert direct["path"] == "/echo" and "proxy-authorization" not in direct["headers"]

    custom = seen(f, FetchRequest("GET", f"{echo}/echo", headers={"X-One": "1"}))
    assert custom["headers"]["x-one"] == "1"
    assert "x-one" not in seen(f, FetchRequest("GET", f"{echo}/echo"))["headers"]
    gz = seen(f, FetchRequest("GET", f"{echo}/echo", headers={"Accept-Encoding": "identity"}))
    assert gz["headers"]["accept-encoding"] == "identity"
    assert "gzip" in seen(f, FetchRequest("GET", f"{echo}/echo"))["headers"]["accept-encoding"]


def test_limits_and_redirects_follow_each_request_on_a_kept_handle(echo: str) -> None:
    f = CurlFetcher(max_redirects=5)
    with pytest.raises(ResponseTooLarge):
        f.fetch(FetchRequest("GET", f"{echo}/chunked?n=50000", max_bytes=10_000))
    assert not f.handles.idle  # a failed transfer's handle is closed
    assert len(f.fetch(FetchRequest("GET", f"{echo}/chunked?n=50000")).content) == 50000
    with pytest.raises(ResponseTooLarge):  # the smaller limit set again on the kept handle
        f.fetch(FetchRequest("GET", f"{echo}/chunked?n=50000", max_bytes=10_000))
    assert len(f.fetch(FetchRequest("GET", f"{echo}/chunked?n=50000")).content) == 50000
    stay = f.fetch(FetchRequest("GET", f"{echo}/hop/1", allow_redirects=False))
    assert stay.status == 302 and stay.history == []
    go = f.fetch(FetchRequest("GET", f"{echo}/hop/2"))
    assert go.status == 200 and go.url == f"{echo}/echo" and len(go.history) == 2
    # a cookie a redirect set went on within its chain only, kept handle or not
    assert "cookie" not in f.fetch(FetchRequest("GET", f"{echo}/echo")).json()["headers"]
    assert len(f.handles.idle) == 1
