"""What the two libcurl fetchers share: the options of one request, the transfer's callbacks
(each hop's headers, the body under the size limit, the history), libcurl's error codes as
the fetch layer's typed errors, and gevent's thread pool for a blocking transfer.

`ImpersonateFetcher` (curl_cffi) and `CurlFetcher` (pycurl) drive different bindings of the
same library: the option, info and error numbers are libcurl's own (curl_cffi's enums carry
them; pycurl's `setopt` takes the same integers), so one `configure` sets either handle
through its `setopt`. The contract is `Urllib3Fetcher`'s (the package's docstring):

- the whole-request deadline is libcurl's transfer timeout, which counts from the first
  hop to the last byte of the answer, redirects included;
- the size limit: a declared Content-Length over it is refused before any body
  (MAXFILESIZE), a streamed body as it grows past it (`Transfer.body`, decoded bytes);
- proxies with credentials in their URL (percent-encoded, decoded by libcurl; CONNECT for
  https), and no proxy from the environment (an empty PROXY disables `http_proxy`);
- the request's cookies, nothing kept between requests (the handle's cookie list is erased
  on each request; a cookie a redirect sets is sent on within its chain, as a browser does).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urljoin

import certifi
import urllib3
from curl_cffi.const import CurlECode, CurlOpt

import exceptions as err
from external_interface.fetch.base import FetchRequest
from external_interface.fetch.response import Response, header_charset

T = TypeVar("T")
REDIRECTS = frozenset((301, 302, 303, 307, 308))
THREADPOOL_SIZE = 64  # gevent: transfers in flight at once (fetch slots bound them first)

# libcurl's option numbers as plain ints: an enum member's lookup costs on every request
_O = CurlOpt
URL, HTTPHEADER, ACCEPT_ENCODING = int(_O.URL), int(_O.HTTPHEADER), int(_O.ACCEPT_ENCODING)
TIMEOUT_MS, CONNECTTIMEOUT_MS = int(_O.TIMEOUT_MS), int(_O.CONNECTTIMEOUT_MS)
NOSIGNAL, FOLLOWLOCATION, MAXREDIRS = int(_O.NOSIGNAL), int(_O.FOLLOWLOCATION), int(_O.MAXREDIRS)
CAINFO, SUPPRESS_CONNECT_HEADERS = int(_O.CAINFO), int(_O.SUPPRESS_CONNECT_HEADERS)
COOKIEFILE, COOKIELIST, COOKIE = int(_O.COOKIEFILE), int(_O.COOKIELIST), int(_O.COOKIE)
PROXY, NOBODY, CUSTOMREQUEST = int(_O.PROXY), int(_O.NOBODY), int(_O.CUSTOMREQUEST)
POSTFIELDS, POSTFIELDSIZE = int(_O.POSTFIELDS), int(_O.POSTFIELDSIZE)
MAXFILESIZE_LARGE = int(_O.MAXFILESIZE_LARGE)
WRITEFUNCTION, HEADERFUNCTION = int(_O.WRITEFUNCTION), int(_O.HEADERFUNCTION)


_UNSET = object()


def cacert(ca_bundle: str) -> str:
    """The CA bundle a handle trusts: the deployment's (CHAINCRAWL_CA_BUNDLE), else certifi's."""
    return ca_bundle or certifi.where()


def request_body(body: Any) -> bytes | None:
    """`encode_body`'s result as libcurl takes it: bytes (text as UTF-8), None for no body."""
    if body is None:
        return None
    return body.encode() if isinstance(body, str) else bytes(body)


def configure(setopt: Callable[..., Any], t: Transfer, max_redirects: int, ca: str) -> None:
    """Set transfer `t`'s options on a freshly reset handle through its `setopt`."""
    settle(setopt, max_redirects, ca)
    configure_kept(setopt, t, {})


def settle(setopt: Callable[..., Any], max_redirects: int, ca: str) -> None:
    """The options every request of a fetcher shares, set once on a new (or reset) handle."""
    setopt(NOSIGNAL, 1)
    setopt(MAXREDIRS, max_redirects)
    setopt(CAINFO, ca.encode())
    setopt(SUPPRESS_CONNECT_HEADERS, 1)  # a proxy's CONNECT answer is not the page
    setopt(COOKIEFILE, b"")  # the cookie engine: a redirect's Set-Cookie goes on


def plain(t: Transfer) -> bool:
    """Whether `t` is a GET without body or cookie: the options it leaves on a handle are
    all in `configure_kept`'s `held`, so the next request can set only what differs."""
    return t.send is None and not t.cookie and t.req.method.upper() == "GET"


def configure_kept(setopt: Callable[..., Any], t: Transfer, held: dict[int, Any]) -> None:
    """Set transfer `t`'s own options on a handle that holds `held` (option -> the value
    last set; empty for a handle just made or reset, whose shared options `settle` set):
    only those whose value differs, and every request's cookie list erased (the engine
    keeps cookies across requests and resets alike). A transfer that is not `plain` sets its
    method, body and cookie besides: its handle must be reset before its next request."""
    req = t.req
    left_ms = max(1, int(req.timeout * 1000))
    for opt, value in (
        (URL, t.url.encode()),
        (HTTPHEADER, t.headers),
        (ACCEPT_ENCODING, t.encoding.encode()),  # decoded as the header asks
        (TIMEOUT_MS, left_ms),  # the whole transfer: the request's deadline
        (CONNECTTIMEOUT_MS, max(1, min(left_ms, int(req.connect_timeout * 1000)))),
        (FOLLOWLOCATION, 1 if req.allow_redirects else 0),
        (MAXFILESIZE_LARGE, req.max_bytes),  # a declared length over it: refused unread
        (PROXY, (req.proxy or "").encode()),  # "": never the environment's proxy
    ):
        if held.get(opt, _UNSET) != value:
            setopt(opt, value)
            held[opt] = value
    setopt(COOKIELIST, b"ALL")  # a redirect's cookies go on within this request only
    if t.cookie:
        setopt(COOKIE, t.cookie.encode())
    method, body = req.method.upper(), t.send
    if method == "HEAD":
        setopt(NOBODY, 1)
    elif body is not None or method == "POST":
        setopt(POSTFIELDSIZE, len(body or b""))
        setopt(POSTFIELDS, body or b"")
        if method != "POST":
            setopt(CUSTOMREQUEST, method.encode())
    elif method != "GET":
        setopt(CUSTOMREQUEST, method.encode())


class Handles:
    """Easy handles not in use, one per request in flight, reused with their connections
    (`make` builds one); a handle whose transfer failed is closed, its connection not
    trusted again. A handle that worked is reset (every option back to libcurl's default)
    unless `keep(handle)` says its options can stay for the next request."""

    def __init__(self, make: Callable[[], Any], keep: Callable[[Any], bool] | None = None) -> None:
        self.make = make
        self.keep = keep  # whether a handle goes back as it is (None: every one reset)
        self.idle: list[Any] = []  # list.pop/append are atomic

    def lend(self, use: Callable[[Any], T]) -> T:
        """`use(handle)` on an idle handle (a new one if none is), then the handle back."""
        c = self.idle.pop() if self.idle else self.make()
        try:
            out = use(c)
        except Exception:
            c.close()  # a failed transfer's connection is not trusted again
            raise
        # an interruption (a killed greenlet, gevent.Timeout) skips both: the transfer may
        # still run in a pool thread, so the handle is dropped untouched, freed when unused
        if self.keep is None or not self.keep(c):
            c.reset()  # every option back to its default; connections and caches kept
        self.idle.append(c)
        return out


class Transfer:
    """One request as libcurl sends it (the URL with its query, the body, the header lines,
    the cookie and Accept-Encoding, which go through their own options), its callbacks and
    what they collected: the raw header lines of every hop, the final body's chunks, and the
    size limit. Over the limit `body` keeps the error for the fetcher to raise and answers
    `abort`, the value its binding reads as "stop" (pycurl: 0; curl_cffi:
    CURL_WRITEFUNC_ERROR)."""

    __slots__ = ("abort", "chunks", "cookie", "encoding", "error", "following", "headers",
                 "lines", "req", "send", "size", "url")  # fmt: skip

    def __init__(
        self, req: FetchRequest, abort: int, url: str, body: Any, headers: list[bytes],
        cookie: str, encoding: str,
    ) -> None:  # fmt: skip
        self.req = req
        self.following = req.allow_redirects
        self.abort = abort
        self.url = url
        self.send = request_body(body)
        self.headers = headers
        self.cookie = cookie
        self.encoding = encoding
        self.lines: list[bytes] = []
        self.chunks: list[bytes] = []
        self.size = 0
        self.error: Exception | None = None

    def header(self, line: bytes) -> int:
        self.lines.append(line)
        return len(line)

    def body(self, chunk: bytes) -> int:
        self.size += len(chunk)
        if self.size > self.req.max_bytes:
            req = self.req
            self.error = err.ResponseTooLarge(f"{req.url} body exceeds limit {req.max_bytes} bytes")
            return self.abort
        self.chunks.append(chunk)
        return len(chunk)

    def hops(self) -> list[tuple[int, list[tuple[str, str]]]]:
        """Each answer's status and headers in order (1xx and redirects included)."""
        out: list[tuple[int, list[tuple[str, str]]]] = []
        for raw in self.lines:
            text = raw.decode("latin-1").rstrip("\r\n")
            if text.startswith("HTTP/"):
                parts = text.split(" ", 2)
                out.append((int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0, []))
            elif out and ":" in text:
                name, _, value = text.partition(":")
                out[-1][1].append((name.strip(), value.strip()))
        return out

    def final(self) -> tuple[list[tuple[str, str]], list[str]]:
        """The answer's headers and the URLs that redirected to it, in order."""
        hops = [h for h in self.hops() if h[0] >= 200]
        history, cur = [], self.url
        for status, head in hops[:-1]:
            location = next((v for k, v in head if k.lower() == "location"), None)
            if not (self.following and status in REDIRECTS) or location is None:
                break
            history.append(cur)
            cur = urljoin(cur, location)
        return (hops[-1][1] if hops else []), history

    def response(self, final: str, status: int, start: float) -> Response:
        """The answer as the fetch layer's Response (`final`: the last hop's URL), charset
        detection left to it."""
        head, history = self.final()
        headers = urllib3.HTTPHeaderDict(head)
        content = b"".join(self.chunks)
        self.chunks = []  # a kept handle's callback holds this transfer until its next one
        return Response(
            url=final,
            status=status,
            headers=headers,
            content=content,
            elapsed=time.monotonic() - start,
            declared_encoding=header_charset(headers.get("content-type", "")),
            history=history,
        )


_E = CurlECode
_TIMEOUTS = {int(_E.OPERATION_TIMEDOUT)}
_CONNECT = {int(c) for c in (
    _E.COULDNT_CONNECT, _E.COULDNT_RESOLVE_HOST, _E.SSL_CONNECT_ERROR, _E.GOT_NOTHING,
    _E.PEER_FAILED_VERIFICATION, _E.SSL_CERTPROBLEM, _E.SSL_CACERT_BADFILE, _E.SEND_ERROR,
    _E.RECV_ERROR)}  # fmt: skip
_TRUNCATED = {int(c) for c in (_E.PARTIAL_FILE, _E.HTTP2, _E.HTTP2_STREAM, _E.BAD_CONTENT_ENCODING)}
_PROXY = {int(_E.COULDNT_RESOLVE_PROXY), int(_E.PROXY)}


def map_error(code: int, text: str, req: FetchRequest, max_redirects: int) -> Exception:
    """libcurl's error code (and its message, without credentials) as the fetch layer's typed
    error, as `Urllib3Fetcher` maps urllib3's: a failure reaching or through the proxy is the
    proxy's."""
    if code == _E.TOO_MANY_REDIRECTS:
        return err.TooManyRedirects(f"more than {max_redirects} redirects from {req.url}")
    if code in _TIMEOUTS:
        return err.FetchTimeout(f"{req.url} not answered within {req.timeout:.1f}s")
    if code == _E.FILESIZE_EXCEEDED:
        return err.ResponseTooLarge(f"{req.url} declares more than the limit {req.max_bytes} bytes")
    if code in _PROXY or (
        req.proxy and code in (_E.COULDNT_CONNECT, _E.RECV_ERROR) and "proxy" in text.lower()
    ):
        return err.ProxyError(f"proxy failed for {req.url}: {text}")
    if req.proxy and code == _E.COULDNT_CONNECT:
        return err.ProxyError(f"proxy failed for {req.url}: {text}")
    if code in _TRUNCATED:
        return err.TruncatedResponse(f"body of {req.url} ended early ({text})")
    if code in _CONNECT:
        return err.ConnectError(f"connection failed for {req.url}: {text}")
    return err.TransportError(f"request failed for {req.url}: {text}")


class HubThreadpool:
    """gevent's thread pool of this hub, grown once to carry the transfers in flight: where a
    blocking libcurl transfer runs on the gevent pool."""

    def __init__(self) -> None:
        self._sized = False
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], Any]) -> Any:
        import gevent  # only ever imported on a gevent worker, which has it loaded already

        pool = gevent.get_hub().threadpool
        if not self._sized:
            with self._lock:
                pool.maxsize = max(pool.maxsize, THREADPOOL_SIZE)
                self._sized = True
        out, error = pool.apply(_outcome, (fn,))
        if error is not None:  # raised here: the pool would print each one as a failure
            raise error
        return out


def _outcome(fn: Callable[[], Any]) -> tuple[Any, Exception | None]:
    try:
        return fn(), None
    except Exception as exc:
        return None, exc
