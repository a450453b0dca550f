"""The fetch layer: one-method `Fetcher` interface, a urllib3 default, typed errors.

`Urllib3Fetcher` (the default) and `RequestsFetcher` keep the same contract and raise the same
typed errors; urllib3 directly costs about a third less CPU per request than requests on top
of it (docs/performance.md). `CHAINCRAWL_FETCHER=requests` switches back.

Timeouts are enforced here rather than left to Celery, because Celery's time limits do not
fire under the threads and gevent pools. Every request gets `min(request_timeout, time left
in the task)` as a *whole-request* deadline: the connect and read timeouts bound each socket
operation, and the body is read in chunks with the clock checked between them, so a server
that drips one byte a second cannot hold a worker slot past the deadline. The same loop
enforces the response size limit.
"""

from __future__ import annotations

import codecs
import json as stdjson
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from http.cookiejar import DefaultCookiePolicy
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import urlencode, urljoin, urlsplit, urlunsplit

import orjson
import requests
import requests.adapters
import urllib3
from parsel import Selector
from w3lib.encoding import html_body_declared_encoding, read_bom, resolve_encoding

from exceptions import (
    ConnectError,
    FetchTimeout,
    ParseError,
    ProxyError,
    ResponseTooLarge,
    TooManyRedirects,
    TransportError,
    TruncatedResponse,
    UndecodableText,
)
from external_interface.httpcache import CachedResponse, HttpCache, storable
from utils.ranked_slots import RankedSlots

_CHUNK = 64 * 1024
_T = TypeVar("_T")
_REDIRECTS = frozenset((301, 302, 303, 307, 308))


class lazy(Generic[_T]):
    """Computed once per instance and stored in its `__dict__`, without a lock: Python 3.11's
    `cached_property` holds one RLock per *class* while computing, so every thread's first
    `.css()` on any response queued behind one lxml parse. A race computes twice, harmlessly
    (Python 3.12's `cached_property` behaves the same way)."""

    def __init__(self, func: Callable[[Any], _T]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, inst: Any, owner: type | None = None) -> Any:
        if inst is None:
            return self
        val = inst.__dict__[self.name] = self.func(inst)
        return val


@dataclass
class Response:
    """A fully read response. Bodies stay in the worker: never put them in task messages."""

    url: str
    status: int
    headers: Mapping[str, str]
    content: bytes
    elapsed: float
    declared_encoding: str | None = None
    history: list[str] = field(default_factory=list)
    from_cache: bool = False  # answered by the development HTTP cache (CHAINCRAWL_HTTP_CACHE)
    # bytes the charset cannot decode: "replace" (U+FFFD, reported to `on_undecodable`) or
    # "strict" (`text` raises UndecodableText); set by the endpoint's Context
    decode_errors: str = field(default="replace", repr=False, compare=False)
    on_undecodable: Callable[[Response, int], None] | None = field(
        default=None, repr=False, compare=False
    )

    @lazy
    def encoding(self) -> str:
        """w3lib's detection: a byte order mark, else the header's charset, else an HTML/XML
        meta charset, else UTF-8; labels resolved as browsers do (gb2312 -> gb18030,
        latin-1 -> cp1252), an unknown one taken as UTF-8."""
        bom, _ = read_bom(self.content)
        if bom:
            return bom
        if self.declared_encoding:
            enc = resolve_encoding(self.declared_encoding)
            if enc:
                return enc
        return html_body_declared_encoding(self.content) or "utf-8"

    @lazy
    def undecodable(self) -> int:
        """Bytes of the body its encoding cannot decode (0: clean)."""
        return decode_counting(self.content, self.encoding)[1]

    @lazy
    def text(self) -> str:
        """The body decoded. Bytes the charset cannot decode are replaced with U+FFFD and
        reported (`on_undecodable`: the page's metrics and a warning), or with
        `decode_errors="strict"` raise UndecodableText: never silently."""
        text, n = decode_counting(self.content, self.encoding)
        if n:
            if self.decode_errors == "strict":
                raise UndecodableText(
                    f"{self.url}: {n} bytes are not valid {self.encoding} "
                    f"(declared: {self.declared_encoding or 'none'})"
                )
            if self.on_undecodable is not None:
                self.on_undecodable(self, n)
        return text

    def json(self) -> Any:
        try:
            return orjson.loads(self.content)
        except orjson.JSONDecodeError as exc:
            raise ParseError(f"invalid JSON from {self.url}: {exc}") from None

    @lazy
    def selector(self) -> Selector:
        return Selector(text=self.text)

    def css(self, query: str) -> Any:
        return self.selector.css(query)

    def xpath(self, query: str) -> Any:
        return self.selector.xpath(query)


@dataclass
class FetchRequest:
    method: str
    url: str
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] | None = None
    cookies: Mapping[str, str] | None = None
    data: Any = None
    json: Any = None
    proxy: str | None = None
    timeout: float = 20.0
    connect_timeout: float = 5.0
    max_bytes: int = 10 * 1024 * 1024
    allow_redirects: bool = True
    # never sent: which waiting request takes a freed fetch slot first (a gevent worker's
    # LimitedFetcher; the run's priority, base_task.page_rank)
    rank: int = 0


class Fetcher(Protocol):
    """Send one request, return a fully read Response or raise a FetchError subclass."""

    def fetch(self, req: FetchRequest) -> Response: ...


class RequestsFetcher:
    """Default fetcher: one pooled `requests.Session` per thread (greenlet under gevent)."""

    def __init__(self, max_redirects: int = 10, pool_size: int = 32) -> None:
        self.max_redirects = max_redirects
        self.pool_size = pool_size
        self._local = threading.local()

    def session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = requests.Session()
            s.max_redirects = self.max_redirects
            s.trust_env = False  # never route through a proxy from the environment by accident
            # cookies are lent per request by the cookie provider: a session shared by every
            # task on this thread must not keep one task's Set-Cookie for the next
            s.cookies.set_policy(_NoStore())
            adapter = requests.adapters.HTTPAdapter(
                pool_connections=self.pool_size, pool_maxsize=self.pool_size, max_retries=0
            )
            s.mount("http://", adapter)
            s.mount("https://", adapter)
            self._local.session = s
        return s

    def fetch(self, req: FetchRequest) -> Response:
        start = time.monotonic()
        deadline = start + req.timeout
        read_timeout = max(0.001, req.timeout)
        try:
            resp = self.session().request(
                req.method,
                req.url,
                params=req.params,
                headers=req.headers,
                cookies=req.cookies,
                data=req.data,
                json=req.json,
                proxies={"http": req.proxy, "https": req.proxy} if req.proxy else None,
                timeout=(min(req.connect_timeout, read_timeout), read_timeout),
                allow_redirects=req.allow_redirects,
                stream=True,
            )
        except requests.exceptions.ProxyError as exc:
            raise ProxyError(f"proxy failed for {req.url}: {type(exc).__name__}") from None
        except requests.exceptions.TooManyRedirects:
            raise TooManyRedirects(
                f"more than {self.max_redirects} redirects from {req.url}"
            ) from None
        except requests.exceptions.ConnectTimeout:
            raise FetchTimeout(f"connect timeout for {req.url}") from None
        except requests.exceptions.ReadTimeout:
            raise FetchTimeout(f"read timeout for {req.url}") from None
        except requests.exceptions.ConnectionError as exc:
            raise ConnectError(f"connection failed for {req.url}: {_short(exc)}") from None
        except requests.exceptions.RequestException as exc:
            raise TransportError(f"request failed for {req.url}: {_short(exc)}") from None
        try:
            content = _read_stream(resp.raw, req, deadline)  # requests streams urllib3's body
        finally:
            resp.close()
        return Response(
            url=resp.url,
            status=resp.status_code,
            headers=resp.headers,
            content=content,
            elapsed=time.monotonic() - start,
            declared_encoding=header_charset(resp.headers.get("content-type", "")),
            history=[r.url for r in resp.history],
        )


class Urllib3Fetcher:
    """The default fetcher: `RequestsFetcher`'s contract on urllib3 directly. One thread-safe
    `PoolManager` for the process (a `ProxyManager` per proxy), a whole-request deadline held
    between body chunks, the size limit, the same typed errors and redirect history. Cookies
    are only what the request carries (nothing is stored between requests), and the
    environment's proxy variables are ignored, as with `RequestsFetcher`."""

    def __init__(self, max_redirects: int = 10, pool_size: int = 256) -> None:
        self.max_redirects = max_redirects
        kw: dict[str, Any] = {}
        try:
            import certifi  # the CA bundle requests verifies with

            kw["ca_certs"] = certifi.where()
        except ImportError:
            pass
        self._pool_kw = {"maxsize": pool_size, "block": False, **kw}
        self.pm = urllib3.PoolManager(num_pools=64, retries=False, **self._pool_kw)
        self._proxies: dict[str, urllib3.ProxyManager] = {}
        self._lock = threading.Lock()
        self.base_headers = {
            "User-Agent": f"python-urllib3/{urllib3.__version__}",
            "Accept-Encoding": "gzip, deflate",
            "Accept": "*/*",
        }

    def _manager(self, proxy: str | None) -> urllib3.PoolManager:
        if not proxy:
            return self.pm
        m = self._proxies.get(proxy)
        if m is None:
            with self._lock:
                m = self._proxies.get(proxy)
                if m is None:
                    m = self._proxies[proxy] = _proxy_manager(proxy, self._pool_kw)
        return m

    def fetch(self, req: FetchRequest) -> Response:
        start = time.monotonic()
        deadline = start + req.timeout
        url = req.url
        if req.params:
            query = urlencode([(k, v) for k, v in req.params.items() if v is not None], doseq=True)
            if query:
                url += ("&" if "?" in url else "?") + query
        headers = {**self.base_headers, **(req.headers or {})}
        if req.cookies:
            jar = "; ".join(f"{k}={v}" for k, v in req.cookies.items())
            headers["Cookie"] = f"{headers['Cookie']}; {jar}" if headers.get("Cookie") else jar
        body = req.data
        if req.json is not None and body is None:  # serialized as requests does
            body = stdjson.dumps(req.json, allow_nan=False).encode()
            headers.setdefault("Content-Type", "application/json")
        elif isinstance(body, Mapping | list | tuple):
            body = urlencode(list(body.items()) if isinstance(body, Mapping) else body, doseq=True)
            headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        manager = self._manager(req.proxy)
        method, cur, history = req.method, url, []
        chain_cookies: dict[str, dict[str, str]] = {}  # host -> cookies set inside this chain
        while True:
            hop_headers = headers
            jar = chain_cookies.get(urlsplit(cur).netloc)
            if jar:  # as requests does within one request (the session itself keeps nothing)
                extra = "; ".join(f"{k}={v}" for k, v in jar.items())
                hop_headers = {**headers, "Cookie": f"{headers['Cookie']}; {extra}"
                               if headers.get("Cookie") else extra}  # fmt: skip
            left = max(0.001, deadline - time.monotonic())
            timeout = urllib3.Timeout(connect=min(req.connect_timeout, left), read=left)
            try:
                resp = manager.request(
                    method, cur, body=body, headers=hop_headers, preload_content=False,
                    redirect=False, retries=False, timeout=timeout,
                )  # fmt: skip
            except urllib3.exceptions.HTTPError as exc:
                raise _map_error(exc, req) from None
            location = resp.headers.get("location")
            if not (req.allow_redirects and location and resp.status in _REDIRECTS):
                break
            if len(history) >= self.max_redirects:
                _discard(resp)
                raise TooManyRedirects(f"more than {self.max_redirects} redirects from {req.url}")
            for cookie in resp.headers.getlist("set-cookie"):
                name, _, rest = cookie.partition("=")
                if name.strip():
                    jar = chain_cookies.setdefault(urlsplit(cur).netloc, {})
                    jar[name.strip()] = rest.split(";", 1)[0].strip()
            size = resp.headers.get("content-length", "")
            if size.isdigit() and int(size) <= _CHUNK:  # a small redirect body: keep the socket
                resp.drain_conn()
                resp.release_conn()
            else:
                _discard(resp)
            history.append(cur)
            nxt = urljoin(cur, location)
            if (resp.status == 303 and method != "HEAD") or (
                resp.status in (301, 302) and method == "POST"
            ):  # the method changes as browsers (and requests) change it
                method, body = "GET", None
                headers = {k: v for k, v in headers.items()
                           if k.lower() not in ("content-type", "content-length")}  # fmt: skip
            if urlsplit(nxt).netloc != urlsplit(cur).netloc:
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            cur = nxt
            if time.monotonic() > deadline:
                raise FetchTimeout(f"{req.url} not answered within {req.timeout:.1f}s")
        try:
            content = _read_stream(resp, req, deadline)
        except BaseException:
            _discard(resp)  # a half-read body must not go back to the pool with its connection
            raise
        resp.release_conn()
        return Response(
            url=cur,
            status=resp.status,
            headers=resp.headers,
            content=content,
            elapsed=time.monotonic() - start,
            declared_encoding=header_charset(resp.headers.get("content-type", "")),
            history=history,
        )


def _discard(resp: Any) -> None:
    """Close the response's connection, then hand it back: the pool reconnects it on reuse
    (releasing it unread would let the next request read this body's rest)."""
    try:
        resp.close()
    finally:
        resp.release_conn()


def _proxy_manager(proxy: str, pool_kw: Mapping[str, Any]) -> urllib3.ProxyManager:
    """A ProxyManager for `proxy`; credentials in its URL become Proxy-Authorization, as
    requests does (urllib3 ignores them in the URL)."""
    parts = urlsplit(proxy)
    headers = None
    if parts.username is not None:
        from urllib.parse import unquote

        auth = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers = urllib3.make_headers(proxy_basic_auth=auth)
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port:
            netloc += f":{parts.port}"
        proxy = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return urllib3.ProxyManager(
        proxy, proxy_headers=headers, num_pools=16, retries=False, **pool_kw
    )


def _read_stream(resp: Any, req: FetchRequest, deadline: float) -> bytes:
    """The body in chunks, the clock checked between them, the size limit held."""
    declared = resp.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > req.max_bytes:
        raise ResponseTooLarge(f"{req.url} declares {declared} bytes > limit {req.max_bytes}")
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in resp.stream(_CHUNK, decode_content=True):
            size += len(chunk)
            if size > req.max_bytes:
                raise ResponseTooLarge(f"{req.url} body exceeds limit {req.max_bytes} bytes")
            chunks.append(chunk)
            if time.monotonic() > deadline:
                raise FetchTimeout(f"body of {req.url} not read within {req.timeout:.1f}s")
    except (ResponseTooLarge, FetchTimeout):
        raise
    except Exception as exc:  # urllib3 ProtocolError, IncompleteRead, ReadTimeoutError...
        name = type(exc).__name__
        if "Timeout" in name:
            raise FetchTimeout(f"read timeout for {req.url}") from None
        raise TruncatedResponse(f"body of {req.url} ended early ({name})") from None
    return b"".join(chunks)


def _map_error(exc: BaseException | None, req: FetchRequest) -> Exception:
    """urllib3's errors as ours, as RequestsFetcher maps requests' (which wraps the same)."""
    u3 = urllib3.exceptions
    if isinstance(exc, u3.ProxyError):
        return ProxyError(f"proxy failed for {req.url}: {type(exc).__name__}")
    text = _short(exc) if exc is not None else ""
    # NewConnectionError subclasses ConnectTimeoutError (urllib3 compatibility): test it first
    if isinstance(exc, u3.NewConnectionError):
        return ConnectError(f"connection failed for {req.url}: {text}")
    if isinstance(exc, u3.ConnectTimeoutError):
        return FetchTimeout(f"connect timeout for {req.url}")
    if isinstance(exc, u3.ReadTimeoutError | u3.TimeoutError):
        return FetchTimeout(f"read timeout for {req.url}")
    if isinstance(exc, u3.ProtocolError | u3.SSLError | OSError):
        return ConnectError(f"connection failed for {req.url}: {text}")
    return TransportError(f"request failed for {req.url}: {text}")


def default_fetcher(
    max_redirects: int = 10, kind: str = "urllib3", slots: int = 0, cache: HttpCache | None = None
) -> Fetcher:
    """The fetcher workers use (`CHAINCRAWL_FETCHER`: urllib3, the default, or requests),
    limited to `slots` requests in flight when that is set (`CHAINCRAWL_FETCH_SLOTS`), behind
    the development HTTP cache when one is given (`HttpCache.from_settings()`)."""
    inner: Fetcher
    if kind == "requests":
        inner = RequestsFetcher(max_redirects=max_redirects)
    else:
        inner = Urllib3Fetcher(max_redirects=max_redirects)
    if slots > 0:
        inner = LimitedFetcher(inner, slots)
    return CachingFetcher(inner, cache) if cache is not None else inner


class CachingFetcher:
    """GETs answered from the development HTTP cache when it holds them, stored when not
    (external_interface/httpcache.py). Outermost, so a cached answer takes no fetch slot."""

    def __init__(self, inner: Fetcher, cache: HttpCache) -> None:
        self.inner = inner
        self.cache = cache

    def lookup(self, req: FetchRequest) -> Response | None:
        """The stored answer to `req`, or None: a caller that finds one can skip the rate
        limits, the throttle and robots.txt too, as no request goes out."""
        key = self.cache.key(req.method, req.url, req.params, req.headers)
        hit = self.cache.get(key) if key is not None else None
        if hit is None:
            return None
        headers = urllib3.HTTPHeaderDict(hit.headers)
        return Response(
            url=hit.url,
            status=hit.status,
            headers=headers,
            content=hit.content,
            elapsed=0.0,
            declared_encoding=header_charset(headers.get("content-type", "")),
            history=hit.history,
            from_cache=True,
        )

    def fetch(self, req: FetchRequest) -> Response:
        key = self.cache.key(req.method, req.url, req.params, req.headers)
        if key is None:
            return self.inner.fetch(req)
        hit = self.lookup(req)
        if hit is not None:
            return hit
        resp = self.inner.fetch(req)
        if storable(resp.status) and not resp.from_cache:
            entry = CachedResponse(resp.url, resp.status, list(resp.headers.items()),
                                   resp.content, list(resp.history))  # fmt: skip
            self.cache.put(key, entry, {"method": req.method, "url": req.url})
        return resp


class LimitedFetcher:
    """At most `slots` requests of this process in flight, whatever the number of task slots.

    A task slot also parses, commits, acks and takes its next message, a few ms in which its
    "request slot" sits idle: with 16 task slots and 250 ms pages that gap alone costs 1-2 % of
    the 64 pages/s bound. With more task slots than fetch slots (`-c 20`, 16 fetch slots) the
    next request starts the moment one ends, as Scrapy's CONCURRENT_REQUESTS counts downloads
    only, and the site still never sees more than `slots` at once. Waiting for a slot counts
    against the request's own deadline (a task's time limit does not fire under threads or
    gevent)."""

    def __init__(self, inner: Fetcher, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"fetch slots must be at least 1, got {slots}")
        self.inner = inner
        self.slots = slots
        self._sem: Any = None  # made at first use: after gevent
        self._ranked = False  # the slots go by FetchRequest.rank (gevent)
        self._made = threading.Lock()  # patched `threading` (a real lock would block the hub)

    def _semaphore(self) -> Any:
        if self._sem is None:
            with self._made:
                if self._sem is None:
                    sem = _bounded_semaphore(self.slots)
                    self._ranked = isinstance(sem, RankedSlots)
                    self._sem = sem
        return self._sem

    def fetch(self, req: FetchRequest) -> Response:
        sem = self._semaphore()
        t0 = time.monotonic()
        wait = max(0.0, req.timeout)
        got = sem.acquire(req.rank, wait) if self._ranked else sem.acquire(timeout=wait)
        if not got:
            raise FetchTimeout(
                f"no fetch slot free within {req.timeout:.1f} s ({self.slots} requests in "
                f"flight) for {req.url}"
            )
        try:
            waited = time.monotonic() - t0
            if waited > 0.001:
                req = replace(req, timeout=max(0.001, req.timeout - waited))
            return self.inner.fetch(req)
        finally:
            sem.release()


def _bounded_semaphore(n: int) -> Any:
    """Ranked greenlet slots once gevent patched `threading` (utils/ranked_slots.py): the
    stdlib semaphore is built on a Condition whose every acquire and release goes through the
    hub (three trips per request); these count in place, wake a waiter directly, and let the
    most urgent run's request go first. Threads: the stdlib semaphore, first come first served
    (a threads worker's page slots are its threads, already taken in the broker's order)."""
    from utils.greenlets import gevent_patched

    if gevent_patched():
        return RankedSlots(n)
    return threading.BoundedSemaphore(n)


class _NoStore(DefaultCookiePolicy):
    def set_ok(self, cookie: object, request: object) -> bool:
        return False


_BAD = threading.local()


def _count_and_replace(exc: UnicodeError) -> tuple[str, int]:
    """Codec error handler: U+FFFD, as `errors="replace"`, counting the bytes replaced."""
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    _BAD.n = getattr(_BAD, "n", 0) + (exc.end - exc.start)
    return "\ufffd", exc.end


codecs.register_error("chaincrawl-count", _count_and_replace)


def decode_counting(data: bytes, encoding: str) -> tuple[str, int]:
    """`data` decoded as `errors="replace"` does, and how many bytes were replaced. The
    strict decode goes first: a clean page (the usual case) costs no more than before."""
    bom_enc, bom = read_bom(data)
    body = data[len(bom) :] if bom and bom_enc == encoding else data
    try:
        return body.decode(encoding), 0
    except UnicodeDecodeError:
        pass
    _BAD.n = 0  # a decode never yields to another greenlet: the count is this call's
    text = body.decode(encoding, errors="chaincrawl-count")
    return text, _BAD.n


def header_charset(content_type: str) -> str | None:
    """The charset a Content-Type names (`text/html; charset=gbk` -> `gbk`), or None."""
    for part in content_type.split(";")[1:]:
        k, _, v = part.strip().partition("=")
        if k.lower() == "charset" and v:
            return v.strip("\"' ")
    return None


def _short(exc: BaseException) -> str:
    """Exception text without URLs' credentials (proxy URLs may carry user:pass)."""
    return re.sub(r"//[^/@\s]+@", "//***@", str(exc))[:200]
