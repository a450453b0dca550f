"""`ImpersonateFetcher`: requests with a browser's TLS handshake, HTTP/2 settings and headers.

Sites that tell a script from a browser look below the headers: the TLS ClientHello of
OpenSSL (urllib3, requests) and the absence of HTTP/2 give them away, and no proxy rotation
fixes that. This fetcher sends through curl_cffi (libcurl built as curl-impersonate), whose
targets reproduce Chrome's, Firefox's and Safari's handshakes and HTTP/2 frames; the headers
come from `profiles.py`, which makes them agree with the user agent (the user agent wins).
HTTP/2 is negotiated over TLS, HTTP/1.1 spoken on plain http, as a browser does.

The contract is `Urllib3Fetcher`'s: a whole-request deadline (libcurl's own transfer
timeout, redirects included), the size limit (held in the body's write callback, and on a
declared Content-Length before any body), proxies with credentials in their URL (CONNECT for
https), the request's cookies and nothing kept between requests (a cookie a redirect sets is
sent on within its chain), redirects with their history, charset detection by `Response`, and
the same typed errors. One libcurl handle per request in flight, reused (its connections
with it); on the gevent pool the transfer runs in the hub's thread pool, as libcurl blocks.
"""

from __future__ import annotations

import time

from curl_cffi.const import CurlHttpVersion, CurlInfo, CurlOpt
from curl_cffi.curl import CURL_WRITEFUNC_ERROR, Curl, CurlError
from curl_cffi.requests.impersonate import BrowserType

from external_interface.fetch.base import FetchRequest
from external_interface.fetch.libcurl import (
    Handles,
    HubThreadpool,
    Transfer,
    cacert,
    configure,
    map_error,
)
from external_interface.fetch.profiles import (
    Identity,
    Profile,
    browser_headers,
    header_lines,
    identity_for,
    target_for,
)
from external_interface.fetch.response import Response, encode_body, full_url, short_error
from utils.process import gevent_patched

TARGETS: tuple[str, ...] = tuple(b.value for b in BrowserType)


class ImpersonateFetcher:
    """The `Fetcher` that sends as a browser (module docstring). `profile` is the default
    browser (`chrome`, `firefox`, `safari`, `edge`, optionally `/desktop|/mobile|/app`); a
    request's own `FetchRequest.profile` (the endpoint's or the site's) overrides it."""

    name = "impersonate"

    def __init__(self, max_redirects: int = 10, ca_bundle: str = "", profile: str = "") -> None:
        self.max_redirects = max_redirects
        self.cacert = cacert(ca_bundle)
        self.profile = Profile.parse(profile) if profile else Profile()
        self.handles = Handles(lambda: Curl(cacert=self.cacert))
        self._profiles: dict[str, Profile] = {}
        self.connections = 0  # connections opened, for tests and the benchmark
        self._threadpool = HubThreadpool()

    def identity(self, req: FetchRequest) -> Identity:
        """Who `req` is sent as: its user agent's browser, else its profile's."""
        ua = next((v for k, v in (req.headers or {}).items() if k.lower() == "user-agent"), None)
        return identity_for(self._profile(req.profile), ua)

    def _profile(self, spec: str) -> Profile:
        if not spec:
            return self.profile
        p = self._profiles.get(spec)
        if p is None:
            p = self._profiles[spec] = Profile.parse(spec)
        return p

    def fetch(self, req: FetchRequest) -> Response:
        start = time.monotonic()
        ident = self.identity(req)
        target = target_for(ident, TARGETS)
        url = full_url(req.url, req.params)
        body, content_type = encode_body(req.data, req.json)
        given = dict(req.headers or {})
        if content_type and not any(k.lower() == "content-type" for k in given):
            given["Content-Type"] = content_type
        headers = browser_headers(ident, req.method, given)
        cookie = "; ".join(
            [v for k, v in given.items() if k.lower() == "cookie"]
            + [f"{k}={v}" for k, v in (req.cookies or {}).items()]
        )
        encoding = next((v for k, v in headers if k.lower() == "accept-encoding"), "gzip")
        t = Transfer(req, CURL_WRITEFUNC_ERROR, url, body, header_lines(headers), cookie, encoding)
        status, final = self.handles.lend(lambda c: self._send(c, t, target))
        return t.response(final or url, status, start)

    def _send(self, c: Curl, t: Transfer, target: str) -> tuple[int, str]:
        """One transfer as browser `target` on handle `c`: its status and the last hop's URL."""
        c.impersonate(target, default_headers=False)
        configure(c.setopt, t, self.max_redirects, self.cacert)
        c.setopt(CurlOpt.HTTP_VERSION, CurlHttpVersion.V2TLS)  # h2 over TLS, 1.1 on http
        c.setopt(CurlOpt.WRITEFUNCTION, t.body)
        c.setopt(CurlOpt.HEADERFUNCTION, t.header)
        self._perform(c, t)
        self.connections += int(c.getinfo(CurlInfo.NUM_CONNECTS))  # type: ignore[arg-type]
        status = int(c.getinfo(CurlInfo.RESPONSE_CODE))  # type: ignore[arg-type]
        return status, _text(c.getinfo(CurlInfo.EFFECTIVE_URL))

    def _perform(self, c: Curl, t: Transfer) -> None:
        try:
            if gevent_patched():
                self._threadpool.run(c.perform)
            else:
                c.perform()
        except CurlError as exc:
            raise t.error or map_error(
                exc.code, short_error(exc), t.req, self.max_redirects
            ) from None


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")
