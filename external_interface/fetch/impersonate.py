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

import threading
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urljoin

import certifi
import urllib3
from curl_cffi.const import CurlECode, CurlHttpVersion, CurlInfo, CurlOpt
from curl_cffi.curl import Curl, CurlError
from curl_cffi.requests.impersonate import BrowserType

from exceptions import (
    ConnectError,
    FetchTimeout,
    ProxyError,
    ResponseTooLarge,
    TooManyRedirects,
    TransportError,
    TruncatedResponse,
)
from external_interface.fetch.base import FetchRequest
from external_interface.fetch.body import encode_body, full_url, short_error
from external_interface.fetch.profiles import (
    Identity,
    Profile,
    browser_headers,
    header_lines,
    identity_for,
    target_for,
)
from external_interface.fetch.response import Response, header_charset
from utils.greenlets import gevent_patched

TARGETS: tuple[str, ...] = tuple(b.value for b in BrowserType)
_REDIRECTS = frozenset((301, 302, 303, 307, 308))
THREADPOOL_SIZE = 64  # gevent: transfers in flight at once (fetch slots bound them first)


class ImpersonateFetcher:
    """The `Fetcher` that sends as a browser (module docstring). `profile` is the default
    browser (`chrome`, `firefox`, `safari`, `edge`, optionally `/desktop|/mobile|/app`); a
    request's own `FetchRequest.profile` (the endpoint's or the site's) overrides it."""

    name = "impersonate"

    def __init__(self, max_redirects: int = 10, ca_bundle: str = "", profile: str = "") -> None:
        self.max_redirects = max_redirects
        self.cacert = ca_bundle or certifi.where()
        self.profile = Profile.parse(profile) if profile else Profile()
        self._idle: list[Curl] = []  # handles not in use; list.pop/append are atomic
        self._profiles: dict[str, Profile] = {}
        self.connections = 0  # connections opened, for tests and the benchmark
        self._threadpool_sized = False
        self._lock = threading.Lock()

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
        c = self._idle.pop() if self._idle else Curl(cacert=self.cacert)
        reader = _Reader(req, req.allow_redirects)
        ok = False
        try:
            c.impersonate(target, default_headers=False)
            _setopts(c, req, url, body, header_lines(headers), cookie, encoding, self)
            c.setopt(CurlOpt.WRITEFUNCTION, reader.body)
            c.setopt(CurlOpt.HEADERFUNCTION, reader.header)
            self._perform(c, req)
            status = int(c.getinfo(CurlInfo.RESPONSE_CODE))  # type: ignore[arg-type]
            final = _text(c.getinfo(CurlInfo.EFFECTIVE_URL)) or url
            self.connections += int(c.getinfo(CurlInfo.NUM_CONNECTS))  # type: ignore[arg-type]
            ok = True
        finally:
            c.reset()
            if ok:
                self._idle.append(c)
            else:
                c.close()  # a failed transfer's connection is not trusted again
        head = urllib3.HTTPHeaderDict(reader.final_headers())
        return Response(
            url=final,
            status=status,
            headers=head,
            content=b"".join(reader.chunks),
            elapsed=time.monotonic() - start,
            declared_encoding=header_charset(head.get("content-type", "")),
            history=reader.history(url),
        )

    def _perform(self, c: Curl, req: FetchRequest) -> None:
        try:
            if gevent_patched():
                self._hub_threadpool().apply(c.perform)
            else:
                c.perform()
        except CurlError as exc:
            raise _map_error(exc, req, self.max_redirects) from None

    def _hub_threadpool(self) -> Any:
        """gevent's thread pool of this hub, grown once to carry the transfers in flight."""
        import gevent  # only ever imported on a gevent worker, which has it loaded already

        pool = gevent.get_hub().threadpool
        if not self._threadpool_sized:
            with self._lock:
                pool.maxsize = max(pool.maxsize, THREADPOOL_SIZE)
                self._threadpool_sized = True
        return pool


def _setopts(
    c: Curl,
    req: FetchRequest,
    url: str,
    body: bytes | None,
    headers: list[bytes],
    cookie: str,
    encoding: str,
    f: ImpersonateFetcher,
) -> None:
    left_ms = max(1, int(req.timeout * 1000))
    c.setopt(CurlOpt.URL, url.encode())
    c.setopt(CurlOpt.HTTP_VERSION, CurlHttpVersion.V2TLS)  # h2 over TLS, 1.1 on plain http
    c.setopt(CurlOpt.HTTPHEADER, headers)
    c.setopt(CurlOpt.ACCEPT_ENCODING, encoding.encode())  # decoded as the header asks
    c.setopt(CurlOpt.TIMEOUT_MS, left_ms)  # the whole transfer: the request's deadline
    c.setopt(CurlOpt.CONNECTTIMEOUT_MS, max(1, min(left_ms, int(req.connect_timeout * 1000))))
    c.setopt(CurlOpt.NOSIGNAL, 1)
    c.setopt(CurlOpt.FOLLOWLOCATION, 1 if req.allow_redirects else 0)
    c.setopt(CurlOpt.MAXREDIRS, f.max_redirects)
    c.setopt(CurlOpt.CAINFO, f.cacert)
    c.setopt(CurlOpt.SUPPRESS_CONNECT_HEADERS, 1)  # a proxy's CONNECT answer is not the page
    c.setopt(CurlOpt.COOKIEFILE, b"")  # the cookie engine: a redirect's Set-Cookie goes on
    c.setopt(CurlOpt.COOKIELIST, b"ALL")  # ... within this request only
    if cookie:
        c.setopt(CurlOpt.COOKIE, cookie.encode())
    if req.proxy:
        c.setopt(CurlOpt.PROXY, req.proxy.encode())
    method = req.method.upper()
    if method == "HEAD":
        c.setopt(CurlOpt.NOBODY, 1)
    elif body is not None or method == "POST":
        c.setopt(CurlOpt.POSTFIELDS, body or b"")
        c.setopt(CurlOpt.POSTFIELDSIZE, len(body or b""))
        if method != "POST":
            c.setopt(CurlOpt.CUSTOMREQUEST, method.encode())
    elif method != "GET":
        c.setopt(CurlOpt.CUSTOMREQUEST, method.encode())


class _Reader:
    """libcurl's callbacks for one request: each hop's status and headers, the final body,
    the size limit (a declared length refused before the body, a streamed one as it grows)."""

    def __init__(self, req: FetchRequest, following: bool) -> None:
        self.req = req
        self.following = following
        self.hops: list[tuple[int, list[tuple[str, str]]]] = []
        self.chunks: list[bytes] = []
        self.size = 0

    def header(self, line: bytes) -> int:
        text = line.decode("latin-1").rstrip("\r\n")
        if text.startswith("HTTP/"):
            parts = text.split(" ", 2)
            status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            self.hops.append((status, []))
            self.chunks, self.size = [], 0  # a redirect's body is not the page's
        elif not text:
            self._check_declared()
        elif self.hops and ":" in text:
            name, _, value = text.partition(":")
            self.hops[-1][1].append((name.strip(), value.strip()))
        return len(line)

    def _check_declared(self) -> None:
        if not self.hops:
            return
        status, head = self.hops[-1]
        if self._redirected(status, head) or status < 200:
            return
        declared = next((v for k, v in head if k.lower() == "content-length"), "")
        if declared.isdigit() and int(declared) > self.req.max_bytes:
            raise ResponseTooLarge(
                f"{self.req.url} declares {declared} bytes > limit {self.req.max_bytes}"
            )

    def _redirected(self, status: int, head: Iterable[tuple[str, str]]) -> bool:
        return (
            self.following
            and status in _REDIRECTS
            and any(k.lower() == "location" for k, _ in head)
        )

    def body(self, chunk: bytes) -> int:
        self.size += len(chunk)
        if self.size > self.req.max_bytes:
            raise ResponseTooLarge(f"{self.req.url} body exceeds limit {self.req.max_bytes} bytes")
        self.chunks.append(chunk)
        return len(chunk)

    def final_headers(self) -> list[tuple[str, str]]:
        finals = [head for status, head in self.hops if status >= 200]
        return finals[-1] if finals else []

    def history(self, url: str) -> list[str]:
        """The URLs that redirected, in order (the last hop is the answer)."""
        out, cur = [], url
        for status, head in [h for h in self.hops if h[0] >= 200][:-1]:
            location = next((v for k, v in head if k.lower() == "location"), None)
            if not self._redirected(status, head) or location is None:
                break
            out.append(cur)
            cur = urljoin(cur, location)
        return out


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")


_E = CurlECode
_TIMEOUTS = {_E.OPERATION_TIMEDOUT}
_CONNECT = {_E.COULDNT_CONNECT, _E.COULDNT_RESOLVE_HOST, _E.SSL_CONNECT_ERROR, _E.GOT_NOTHING,
            _E.PEER_FAILED_VERIFICATION, _E.SSL_CERTPROBLEM, _E.SSL_CACERT_BADFILE,
            _E.SEND_ERROR, _E.RECV_ERROR}  # fmt: skip
_TRUNCATED = {_E.PARTIAL_FILE, _E.HTTP2, _E.HTTP2_STREAM, _E.BAD_CONTENT_ENCODING}


def _map_error(exc: CurlError, req: FetchRequest, max_redirects: int) -> Exception:
    """libcurl's error codes as the fetch layer's typed errors, as `Urllib3Fetcher` maps
    urllib3's: a failure reaching or through the proxy is the proxy's."""
    code = exc.code
    text = short_error(exc)
    if code == _E.TOO_MANY_REDIRECTS:
        return TooManyRedirects(f"more than {max_redirects} redirects from {req.url}")
    if code in _TIMEOUTS:
        return FetchTimeout(f"{req.url} not answered within {req.timeout:.1f}s")
    if code in (_E.COULDNT_RESOLVE_PROXY, _E.PROXY) or (
        req.proxy and code in (_E.COULDNT_CONNECT, _E.RECV_ERROR) and "proxy" in text.lower()
    ):
        return ProxyError(f"proxy failed for {req.url}: {text}")
    if req.proxy and code == _E.COULDNT_CONNECT:
        return ProxyError(f"proxy failed for {req.url}: {text}")
    if code in _TRUNCATED:
        return TruncatedResponse(f"body of {req.url} ended early ({text})")
    if code in _CONNECT:
        return ConnectError(f"connection failed for {req.url}: {text}")
    return TransportError(f"request failed for {req.url}: {text}")
