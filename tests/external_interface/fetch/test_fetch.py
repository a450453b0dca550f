"""The fetch layer against a real local HTTP server; every test runs against the four
fetchers (urllib3, the default, requests, the impersonating one and pycurl's): same contract,
same typed errors."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from exceptions import (
    ConnectError,
    FetchTimeout,
    ParseError,
    ResponseTooLarge,
    TooManyRedirects,
    UndecodableText,
)
from external_interface.fetch import (
    CurlFetcher,
    Fetcher,
    FetchRequest,
    ImpersonateFetcher,
    RequestsFetcher,
    Response,
    Urllib3Fetcher,
    decode_counting,
)
from tests.external_interface.fetch.servers import Echo, serving
from utils.servers import free_port


@pytest.fixture(params=["urllib3", "requests", "impersonate", "pycurl"])
def fetcher(request: pytest.FixtureRequest) -> Fetcher:
    if request.param == "pycurl":
        pytest.importorskip("pycurl", reason="pycurl cannot be imported (requirements/runtime.txt)")
        return CurlFetcher(max_redirects=5)
    if request.param == "requests":
        return RequestsFetcher(max_redirects=5)
    if request.param == "impersonate":
        return ImpersonateFetcher(max_redirects=5)
    return Urllib3Fetcher(max_redirects=5)


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    with serving(Echo) as url:
        yield url


def test_whole_request_deadline_holds_against_a_dripping_server(site, fetcher) -> None:
    start = time.monotonic()
    with pytest.raises(FetchTimeout):
        # each byte arrives within the read timeout, so only the whole-request deadline stops it
        fetcher.fetch(FetchRequest("GET", f"{site.url}/drip?n=100&every=0.2", timeout=1.0))
    assert time.monotonic() - start < 10  # the whole drip takes 20 s


def test_response_size_limit(site, fetcher) -> None:
    with pytest.raises(ResponseTooLarge):
        fetcher.fetch(FetchRequest("GET", f"{site.url}/big?n=200000", max_bytes=100_000))
    ok = fetcher.fetch(FetchRequest("GET", f"{site.url}/big?n=1000", max_bytes=100_000))
    assert len(ok.content) == 1000


def test_meta_charset_decoding(site, fetcher) -> None:
    r = fetcher.fetch(FetchRequest("GET", f"{site.url}/gbk"))
    assert r.encoding == "gb18030"
    assert r.css("p.t::text").get() == "中文标题"


def test_mislabelled_text_is_replaced_and_reported_never_silently(site, fetcher) -> None:
    r = fetcher.fetch(FetchRequest("GET", f"{site.url}/mislabelled"))
    heard: list[int] = []
    r.on_undecodable = lambda resp, n: heard.append(n)
    assert r.encoding == "utf-8" and r.undecodable == 2
    assert r.css("p.t::text").get() == "caf\ufffd cr\ufffdme"
    assert heard == [2]  # once: the text is decoded once
    strict = fetcher.fetch(FetchRequest("GET", f"{site.url}/mislabelled"))
    strict.decode_errors = "strict"
    with pytest.raises(UndecodableText, match="2 bytes are not valid utf-8"):
        strict.css("p.t")  # the selector reads the text


@pytest.mark.parametrize(
    ("body", "declared", "encoding", "text"),
    [
        ("\ufeffhé".encode(), None, "utf-8", "hé"),  # a BOM wins, and is not text
        ("hé".encode("utf-16"), "iso-8859-1", "utf-16-le", "hé"),
        ("hé".encode("cp1252"), "latin-1", "cp1252", "hé"),  # labels resolved as browsers do
        ("中文".encode("gb18030"), "gb2312", "gb18030", "中文"),
        (b'<?xml version="1.0" encoding="iso-8859-1"?><a>\xe9</a>', None, "cp1252",
         '<?xml version="1.0" encoding="iso-8859-1"?><a>é</a>'),
        ("hé".encode(), "no-such-charset", "utf-8", "hé"),
    ],
)  # fmt: skip
def test_charset_detection_is_w3lib_s(body: bytes, declared, encoding: str, text: str) -> None:
    r = Response("u", 200, {}, body, 0.0, declared)
    assert (r.encoding, r.text, r.undecodable) == (encoding, text, 0)


def test_decode_counting_counts_each_replaced_byte() -> None:
    assert decode_counting(b"ok", "utf-8") == ("ok", 0)
    assert decode_counting(b"a\xff\xfeb\xe9", "utf-8") == ("a\ufffd\ufffdb\ufffd", 3)
    assert decode_counting(b"\xe2\x82", "utf-8") == ("\ufffd", 2)  # a truncated sequence
    assert decode_counting(b"x\xff", "utf-8") == ("x\ufffd", 1)  # a new count per call


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


def test_connections_are_reused(site, fetcher) -> None:
    if isinstance(fetcher, RequestsFetcher):  # one pooled session per thread
        s1 = fetcher.session()
        fetcher.fetch(FetchRequest("GET", f"{site.url}/detail/x"))
        assert fetcher.session() is s1
        return
    if isinstance(
        fetcher, ImpersonateFetcher | CurlFetcher
    ):  # one handle reused, and its connection
        for _ in range(3):
            fetcher.fetch(FetchRequest("GET", f"{site.url}/detail/x"))
        assert fetcher.connections == 1
        return
    for _ in range(3):  # one PoolManager for the process: one connection for three requests
        fetcher.fetch(FetchRequest("GET", f"{site.url}/detail/x"))
    pool = fetcher.pm.connection_from_url(site.url)
    assert pool.num_connections == 1 and pool.num_requests == 3


def test_params_headers_and_cookies_are_sent(echo, fetcher) -> None:
    r = fetcher.fetch(FetchRequest(
        "GET", f"{echo}/echo?a=1", params={"b": "x y", "c": ["1", "2"]},
        headers={"X-Test": "yes", "User-Agent": "ua/1"}, cookies={"sid": "s1", "k": "v"},
    ))  # fmt: skip
    seen = r.json()
    assert r.status == 200 and seen["method"] == "GET"
    assert seen["path"] == "/echo?a=1&b=x+y&c=1&c=2"
    assert seen["headers"]["x-test"] == "yes" and seen["headers"]["user-agent"] == "ua/1"
    assert seen["headers"]["cookie"] == "sid=s1; k=v"
    assert "gzip" in seen["headers"]["accept-encoding"]


def test_json_and_form_bodies(echo, fetcher) -> None:
    r = fetcher.fetch(FetchRequest("POST", f"{echo}/echo", json={"a": [1, "é"]}))
    seen = r.json()
    assert seen["method"] == "POST" and json.loads(seen["body"].encode("latin-1")) == {
        "a": [1, "é"]
    }
    assert seen["headers"]["content-type"] == "application/json"
    r = fetcher.fetch(FetchRequest("POST", f"{echo}/echo", data={"u": "a b", "p": "&"}))
    seen = r.json()
    assert seen["body"] == "u=a+b&p=%26"
    assert seen["headers"]["content-type"] == "application/x-www-form-urlencoded"


def test_redirects_are_followed_with_history_and_cookies_not_kept(echo, fetcher) -> None:
    r = fetcher.fetch(FetchRequest("GET", f"{echo}/hop/3"))
    assert r.status == 200 and r.url == f"{echo}/echo"
    assert r.history == [f"{echo}/hop/3", f"{echo}/hop/2", f"{echo}/hop/1"]
    # a cookie set on the way is sent on within the chain (as a browser does), never kept
    assert r.json()["headers"]["cookie"] == "stored=never"
    again = fetcher.fetch(FetchRequest("GET", f"{echo}/echo"))
    assert "cookie" not in again.json()["headers"]
    with pytest.raises(TooManyRedirects):  # max_redirects=5
        fetcher.fetch(FetchRequest("GET", f"{echo}/hop/7"))
    r = fetcher.fetch(FetchRequest("GET", f"{echo}/hop/1", allow_redirects=False))
    assert r.status == 302 and r.headers["location"] == "/echo" and r.history == []


def test_error_statuses_are_responses(echo, fetcher) -> None:
    r = fetcher.fetch(FetchRequest("GET", f"{echo}/echo", headers={"X-Status": "503"}))
    assert r.status == 503  # typed errors for statuses are Context's job


def test_proxy_with_credentials_in_its_url(echo, fetcher) -> None:
    port = echo.rsplit(":", 1)[1]
    r = fetcher.fetch(FetchRequest(
        "GET", "http://example.invalid/x?q=1", proxy=f"http://us%40er:p%3Ass@127.0.0.1:{port}",
    ))  # fmt: skip
    seen = r.json()
    assert seen["path"] == "http://example.invalid/x?q=1"  # sent to the proxy, absolute URI
    import base64

    assert (
        seen["headers"]["proxy-authorization"]
        == "Basic " + base64.b64encode(b"us@er:p:ss").decode()
    )


def test_slow_headers_hit_the_read_timeout(site, fetcher) -> None:
    with pytest.raises(FetchTimeout):
        fetcher.fetch(FetchRequest("GET", f"{site.url}/slow?s=3", timeout=0.5))


def test_the_size_limit_holds_on_streamed_and_decoded_bodies(echo, fetcher) -> None:
    # no Content-Length: only the count of what is read stops it
    with pytest.raises(ResponseTooLarge):
        fetcher.fetch(FetchRequest("GET", f"{echo}/chunked?n=300000", max_bytes=100_000))
    # 300 KB of text in a few hundred gzipped bytes: the limit counts the decoded body
    with pytest.raises(ResponseTooLarge):
        fetcher.fetch(FetchRequest("GET", f"{echo}/gzip?n=300000", max_bytes=100_000))
    start = time.monotonic()
    with pytest.raises(ResponseTooLarge):  # refused on the header, not after a 5 s wait
        fetcher.fetch(FetchRequest("GET", f"{echo}/declared", max_bytes=100_000))
    assert time.monotonic() - start < 4
    ok = fetcher.fetch(FetchRequest("GET", f"{echo}/gzip?n=50000", max_bytes=100_000))
    assert ok.content == b"a" * 50000
    assert len(fetcher.fetch(FetchRequest("GET", f"{echo}/chunked?n=50000")).content) == 50000


def test_the_content_type_s_charset_decodes_the_text(echo, fetcher) -> None:
    r = fetcher.fetch(FetchRequest("GET", f"{echo}/charset"))
    assert r.encoding == "gb18030" and r.text == "<p>中文标题</p>" and r.undecodable == 0


def test_the_environment_s_proxy_is_never_used(
    echo, fetcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.setenv(name, dead)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    r = fetcher.fetch(FetchRequest("GET", f"{echo}/echo"))
    assert r.status == 200 and r.json()["path"] == "/echo"  # direct, not an absolute URI
