"""`CurlFetcher`: the fetch contract on libcurl through pycurl, the least CPU per request.

libcurl reads the answer, parses its head and decodes its body in C, where urllib3 and
http.client do it in Python: a fifth to a third of `Urllib3Fetcher`'s CPU per request on the
benchmark's pages (docs/performance.md, "Fetch clients"). It is the default fetcher
(`CHAINCRAWL_FETCHER=pycurl`); `CHAINCRAWL_FETCHER=urllib3` (or a site's
`CHAINCRAWL_FETCHER_<SITE>`, an endpoint's `fetcher=`) chooses the pure-Python one. pycurl is a
runtime dependency; where it cannot be imported (a broken install, a platform without its
wheel), choosing it is a ConfigError at the worker's start that gives the import error and the
two ways out, and the other fetchers work as ever.

It speaks HTTP/1.1 on http and https alike, as the urllib3 and requests fetchers do (libcurl
would offer HTTP/2 over TLS): the same requests, headers and connection use whichever fetcher
is the default. Only the impersonating fetcher speaks a browser's HTTP/2.

The contract is `Urllib3Fetcher`'s, set by `libcurl.py` as for `ImpersonateFetcher` (the
same library through curl_cffi): the whole-request deadline, the size limit, proxies with
credentials, the request's cookies and nothing kept, redirects with their history, charset
detection by `Response` and the same typed errors; the headers are the default fetcher's
(`chaincrawl/VERSION` unless one is lent, `Accept-Encoding: gzip, deflate`).

One easy handle per request in flight, reused: the connection (keep-alive) and libcurl's
parsed state stay warm, and so do its options: after a GET without body or cookie the handle
is not reset, and the next request sets only the options whose value differs (the URL and
the cookie list's erasure each time; the deadline, size limit, proxy, headers and redirects
when they change); a request with a method, body or cookie of its own has its handle reset
after it, as every handle was before. Threads (and a process without gevent) run the transfer on the
calling thread, libcurl releasing the GIL. On the gevent pool the transfers of a hub go
through one `CurlMulti` whose sockets and timer the hub's loop watches (`curl_gevent.py`):
no thread hand-off, and the multi's connection cache shared by every handle.
"""

from __future__ import annotations

import time
from typing import Any

from exceptions import ConfigError
from external_interface.fetch import libcurl
from external_interface.fetch.base import FetchRequest
from external_interface.fetch.libcurl import Handles, HubThreadpool, Transfer
from external_interface.fetch.response import (
    Response,
    default_user_agent,
    encode_body,
    full_url,
    short_error,
)
from utils.process import gevent_patched

try:  # a runtime dependency; its absence is said when the fetcher is chosen
    import pycurl

    _IMPORT_ERROR = ""
except ImportError as exc:  # pragma: no cover - exercised by test_curl's subprocess
    pycurl = None
    _IMPORT_ERROR = f" ({exc})"

MISSING = (
    f"the pycurl fetcher needs pycurl, which cannot be imported{_IMPORT_ERROR}: "
    "reinstall the dependencies (./control.sh setup, or pip install -r requirements/runtime.txt), "
    "or choose another fetcher (CHAINCRAWL_FETCHER=urllib3 for every request)"
)


# libcurl's HTTP_VERSION option and CURL_HTTP_VERSION_1_1, as plain ints (set after each reset)
HTTP_VERSION = int(pycurl.HTTP_VERSION) if pycurl is not None else 0
HTTP_1_1 = int(pycurl.CURL_HTTP_VERSION_1_1) if pycurl is not None else 0


def installed() -> bool:
    return pycurl is not None


class CurlFetcher:
    """The `Fetcher` on pycurl (module docstring). `gevent="multi"` drives a gevent worker's
    transfers from the hub's loop; `"threadpool"` runs each in the hub's thread pool, as
    `ImpersonateFetcher` does (measured against each other by bench.fetch_clients)."""

    name = "pycurl"

    def __init__(self, max_redirects: int = 10, ca_bundle: str = "", gevent: str = "multi") -> None:
        if pycurl is None:
            raise ConfigError(MISSING)
        if gevent not in ("multi", "threadpool"):
            raise ValueError(f"gevent must be 'multi' or 'threadpool', got {gevent!r}")
        self.max_redirects = max_redirects
        self.cacert = libcurl.cacert(ca_bundle)
        self.gevent = gevent
        self.base_headers = {
            "user-agent": ("User-Agent", default_user_agent()),
            "accept": ("Accept", "*/*"),
        }
        self.handles = Handles(pycurl.Curl, keep=_keep)
        self.connections = 0  # connections opened, for tests and the benchmark
        self._threadpool = HubThreadpool()

    def fetch(self, req: FetchRequest) -> Response:
        start = time.monotonic()
        url = full_url(req.url, req.params)
        body, content_type = encode_body(req.data, req.json)
        given = dict(self.base_headers)
        cookies, encoding = [], "gzip, deflate"
        for k, v in (req.headers or {}).items():
            low = k.lower()
            if low == "cookie":
                cookies.append(v)
            elif low == "accept-encoding":
                encoding = v
            else:
                given[low] = (k, v)
        if content_type and "content-type" not in given:
            given["content-type"] = ("Content-Type", content_type)
        if body is not None:
            given.setdefault("expect", ("Expect", ""))  # no 100-continue round trip
        lines = [
            f"{k}: {v}".encode("latin-1") if v else f"{k}:".encode() for k, v in given.values()
        ]
        if req.cookies:
            cookies += [f"{k}={v}" for k, v in req.cookies.items()]
        t = Transfer(req, 0, url, body, lines, "; ".join(cookies), encoding)  # 0: abort
        status, final = self.handles.lend(lambda c: self._send(c, t))
        return t.response(final or url, status, start)

    def _send(self, c: Any, t: Transfer) -> tuple[int, str]:
        """One transfer on handle `c`: its status and the last hop's URL."""
        held: dict[int, Any] | None = getattr(c, "held", None)
        if held is None:  # a new handle, or one reset after its last request
            held = c.held = {}
            libcurl.settle(c.setopt, self.max_redirects, self.cacert)
            c.setopt(HTTP_VERSION, HTTP_1_1)  # as the other fetchers, https too (docstring)
        libcurl.configure_kept(c.setopt, t, held)
        if not libcurl.plain(t):
            c.held = None  # its method, body or cookie stay on it: reset after this one
        c.setopt(libcurl.WRITEFUNCTION, t.body)
        c.setopt(libcurl.HEADERFUNCTION, t.lines.append)  # None: every byte taken
        self._perform(c, t)
        self.connections += c.getinfo(pycurl.NUM_CONNECTS)
        return c.getinfo(pycurl.RESPONSE_CODE), c.getinfo(pycurl.EFFECTIVE_URL)

    def _perform(self, c: Any, t: Transfer) -> None:
        try:
            if not gevent_patched():
                c.perform()
            elif self.gevent == "multi":
                hub_multi().perform(c)
            else:
                self._threadpool.run(c.perform)
        except pycurl.error as exc:
            code, text = exc.args[0], short_error(exc.args[-1])
            raise t.error or libcurl.map_error(code, text, t.req, self.max_redirects) from None


def _keep(c: Any) -> bool:
    """Whether handle `c` goes back with its options (they are all in `c.held`): a handle
    whose request set a method, body or cookie is reset, and sets everything next time."""
    return getattr(c, "held", None) is not None


def hub_multi() -> Any:
    """This hub's CurlMulti driver, made on first use."""
    from external_interface.fetch.curl_gevent import for_hub

    return for_hub()
