"""The pycurl fetcher beyond the contract tests (test_fetch.py runs those on it): https
through a CONNECT proxy with credentials, handle reuse over threads, its gevent driver (one
CurlMulti on the hub's loop, and the thread-pool alternative), HTTP/1.1 over https, and a clear
ConfigError where pycurl cannot be imported."""

from __future__ import annotations

import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from config import ROOT
from demo.guard.cert import make_certificates
from exceptions import ConnectError, ProxyError
from external_interface.fetch import (
    CurlFetcher,
    FetcherSet,
    FetchRequest,
    ImpersonateFetcher,
    LimitedFetcher,
)
from tests.external_interface.fetch.servers import Echo, serving
from tests.external_interface.tinyproxy import Tinyproxy, needs_tinyproxy
from tests.testsite.server import TestSite

pytest.importorskip("pycurl", reason="pycurl cannot be imported (requirements/runtime.txt)")


@pytest.fixture(scope="module")
def tls_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """An https site on 127.0.0.1 with a certificate of a CA made on the spot: (url, ca)."""
    made = make_certificates(tmp_path_factory.mktemp("tls"))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(made.cert, made.key)
    with serving(Echo, ctx) as url:
        yield url, made.ca


@needs_tinyproxy
@pytest.mark.parametrize("kind", [CurlFetcher, ImpersonateFetcher])
def test_https_goes_through_a_connect_tunnel_with_the_proxy_s_credentials(
    tls_site: tuple[str, Path], kind: type
) -> None:
    url, ca = tls_site
    with Tinyproxy("crawler", "s3cret") as proxy:
        f = kind(ca_bundle=str(ca))
        r = f.fetch(FetchRequest("GET", f"{url}/page?x=1", proxy=proxy.url))
        assert r.status == 200 and r.json()["path"] == "/page?x=1"  # in the tunnel
        assert proxy.tunnels() == 1
        bad = proxy.url.replace("s3cret", "wrong")
        with pytest.raises(ProxyError, match="CONNECT tunnel failed") as err:  # refused
            f.fetch(FetchRequest("GET", f"{url}/page", proxy=bad))
        assert "wrong" not in str(err.value)


def test_https_is_http_1_1_as_on_the_other_fetchers(tmp_path: Path) -> None:
    """A server that would take HTTP/2 (ALPN h2 first) still gets HTTP/1.1: the pycurl fetcher
    offers only http/1.1, as urllib3 does (this server speaks HTTP/1 alone, so an h2 choice
    would fail the transfer)."""
    made = make_certificates(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(made.cert, made.key)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with serving(Echo, ctx) as url:
        r = CurlFetcher(ca_bundle=str(made.ca)).fetch(FetchRequest("GET", f"{url}/h1"))
        assert r.status == 200 and r.json()["path"] == "/h1"


def test_an_untrusted_certificate_is_a_connect_error(tls_site: tuple[str, Path]) -> None:
    with pytest.raises(ConnectError):
        CurlFetcher().fetch(FetchRequest("GET", f"{tls_site[0]}/"))  # certifi's CAs only


def test_one_handle_per_request_in_flight_each_reused_with_its_connection(
    site: TestSite,
) -> None:
    f = CurlFetcher()

    def crawl() -> None:
        for _ in range(5):
            assert f.fetch(FetchRequest("GET", f"{site.url}/detail/x")).status == 200

    threads = [threading.Thread(target=crawl) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(f.handles.idle) <= 4 and f.connections <= 4  # 20 requests, at most 4 at once


GEVENT = """
from gevent import monkey; monkey.patch_all()
import sys, time, gevent
from exceptions import FetchTimeout, ProxyError, ResponseTooLarge
from external_interface.fetch import CurlFetcher, FetchRequest, LimitedFetcher
from utils.servers import free_port
url, mode = sys.argv[1], sys.argv[2]
f = CurlFetcher(gevent=mode)
limited = LimitedFetcher(f, 8)
for _ in range(2):  # 8 at a time: 8 handles, 8 connections, reused by the second round
    jobs = [gevent.spawn(limited.fetch, FetchRequest("GET", url + "/slow?s=0.2")) for _ in range(16)]
    gevent.joinall(jobs, raise_error=True)
    assert [j.value.status for j in jobs] == [200] * 16
assert f.connections == 8, f.connections
# the deadline holds for one greenlet while the others go on
t0 = time.monotonic()
drip = gevent.spawn(f.fetch, FetchRequest("GET", url + "/drip?n=100&every=0.2", timeout=1.0))
quick = [gevent.spawn(f.fetch, FetchRequest("GET", url + "/detail/x")) for _ in range(4)]
gevent.joinall([drip, *quick])
assert isinstance(drip.exception, FetchTimeout), drip.exception
assert time.monotonic() - t0 < 10 and all(q.value.status == 200 for q in quick)
try:
    f.fetch(FetchRequest("GET", url + "/big?n=200000", max_bytes=100000))
    raise AssertionError("no ResponseTooLarge")
except ResponseTooLarge:
    pass
try:
    f.fetch(FetchRequest("GET", url + "/detail/x", proxy=f"http://u:p@127.0.0.1:{free_port()}"))
    raise AssertionError("no ProxyError")
except ProxyError:
    pass
r = f.fetch(FetchRequest("GET", url + "/gbk"))
assert r.encoding == "gb18030" and r.css("p.t::text").get() == "中文标题"
# a greenlet killed mid-transfer (or past a gevent.Timeout): its transfer is dropped, the
# handle never reused, and the fetcher goes on
killed = gevent.spawn(f.fetch, FetchRequest("GET", url + "/slow?s=5"))
gevent.sleep(0.3)
killed.kill()
try:
    with gevent.Timeout(0.3):
        f.fetch(FetchRequest("GET", url + "/slow?s=5"))
    raise AssertionError("no gevent.Timeout")
except gevent.Timeout:
    pass
assert f.fetch(FetchRequest("GET", url + "/detail/x")).status == 200
if mode == "multi":
    from external_interface.fetch.curl_gevent import for_hub
    assert not for_hub().waiting, for_hub().waiting
    assert gevent.get_hub()._threadpool is None  # no transfer went through a thread
print("ok")
"""


@pytest.mark.parametrize("mode", ["multi", "threadpool"])
def test_gevent_transfers_on_the_hub_s_loop_or_its_thread_pool(site: TestSite, mode: str) -> None:
    out = subprocess.run([sys.executable, "-c", GEVENT, site.url, mode], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == "ok", out.stderr[-3000:]


NO_PYCURL = """
import sys
sys.modules["pycurl"] = None  # as if the install were broken: `import pycurl` fails
from exceptions import ConfigError
from external_interface.fetch import CurlFetcher, FetcherSet, FetchRequest, choose
from external_interface.fetch.select import default_fetcher
url = sys.argv[1]
for make in (lambda: FetcherSet("pycurl"), CurlFetcher, lambda: choose("pycurl", "shop", "pc")):
    try:
        make()
        raise AssertionError("no ConfigError")
    except ConfigError as exc:
        print(exc)
import os
os.environ["CHAINCRAWL_FETCHER_SHOP"] = "pycurl"
try:
    choose("", "shop", "pc")
except ConfigError as exc:
    print(exc)
try:
    default_fetcher()  # the default is pycurl: the worker's start says so
    raise AssertionError("no ConfigError")
except ConfigError as exc:
    print(exc)
f = default_fetcher(kind="urllib3")  # the named alternative works as ever
assert f.fetch(FetchRequest("GET", url + "/detail/x")).status == 200
print("default ok")
"""


def test_without_pycurl_choosing_it_is_a_config_error_naming_the_ways_out(site: TestSite) -> None:
    out = subprocess.run([sys.executable, "-c", NO_PYCURL, site.url], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "default ok", out.stderr[-3000:]
    want = (
        "the pycurl fetcher needs pycurl, which cannot be imported (import of pycurl halted; "
        "None in sys.modules): reinstall the dependencies (./control.sh setup, or pip install "
        "-r requirements/runtime.txt), or choose another fetcher (CHAINCRAWL_FETCHER=urllib3 "
        "for every request)"
    )
    assert lines[:5] == [
        f"CHAINCRAWL_FETCHER: {want}",
        want,
        f"shop's endpoint fetcher=: {want}",
        f"CHAINCRAWL_FETCHER_SHOP: {want}",
        f"CHAINCRAWL_FETCHER: {want}",
    ]
    assert "Traceback" not in out.stderr


def test_the_set_the_slots_and_the_name_route_to_the_pycurl_fetcher(site: TestSite) -> None:
    fs = FetcherSet("urllib3")
    f = LimitedFetcher(fs, 2)
    assert f.fetch(FetchRequest("GET", f"{site.url}/detail/x", fetcher="pycurl")).status == 200
    curl = fs.get("pycurl")
    assert isinstance(curl, CurlFetcher) and curl.connections == 1
    assert isinstance(FetcherSet("pycurl").get(), CurlFetcher)
