"""The HTTP fetchers: `Urllib3Fetcher` (the default) and `RequestsFetcher`.

Both keep the same contract and raise the same typed errors; urllib3 directly costs about a
third less CPU per request than requests on top of it (docs/performance.md).
`CHAINCRAWL_FETCHER=requests` switches back. Each request's whole-request deadline and size
limit are held in the body's read loop (`_read_stream`), see the package's docstring.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from http.cookiejar import DefaultCookiePolicy
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import certifi
import requests
import requests.adapters
import urllib3

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
from external_interface.fetch.response import (
    Response,
    default_user_agent,
    encode_body,
    full_url,
    header_charset,
    short_error,
)

_CHUNK = 64 * 1024


_REDIRECTS = frozenset((301, 302, 303, 307, 308))


class RequestsFetcher:
    """Default fetcher: one pooled `requests.Session` per thread (greenlet under gevent)."""

    def __init__(self, max_redirects: int = 10, pool_size: int = 32, ca_bundle: str = "") -> None:
        self.max_redirects = max_redirects
        self.pool_size = pool_size
        self.ca_bundle = ca_bundle  # "": certifi's, as requests does
        self._local = threading.local()

    def session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = requests.Session()
            s.max_redirects = self.max_redirects
            s.trust_env = False  # never route through a proxy from the environment by accident
            s.headers["User-Agent"] = default_user_agent()  # not python-requests/x
            if self.ca_bundle:
                s.verify = self.ca_bundle
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
                cookies=dict(req.cookies) if req.cookies is not None else None,
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
            raise ConnectError(f"connection failed for {req.url}: {short_error(exc)}") from None
        except requests.exceptions.RequestException as exc:
            raise TransportError(f"request failed for {req.url}: {short_error(exc)}") from None
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

    def __init__(self, max_redirects: int = 10, pool_size: int = 256, ca_bundle: str = "") -> None:
        self.max_redirects = max_redirects
        kw: dict[str, Any] = {"ca_certs": ca_bundle or certifi.where()}  # requests' CA bundle
        self._pool_kw = {"maxsize": pool_size, "block": False, **kw}
        self.pm = urllib3.PoolManager(num_pools=64, retries=False, **self._pool_kw)
        self._proxies: dict[str, urllib3.ProxyManager] = {}
        self._lock = threading.Lock()
        self.base_headers = {
            "User-Agent": default_user_agent(),  # a request's own (the site's, a lent one) wins
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
        url = full_url(req.url, req.params)
        headers = {**self.base_headers, **(req.headers or {})}
        if req.cookies:
            given = "; ".join(f"{k}={v}" for k, v in req.cookies.items())
            headers["Cookie"] = f"{headers['Cookie']}; {given}" if headers.get("Cookie") else given
        body, content_type = encode_body(req.data, req.json)  # serialized as requests does
        if content_type:
            headers.setdefault("Content-Type", content_type)
        manager = self._manager(req.proxy)
        method, cur, history = req.method, url, list[str]()
        chain_cookies: dict[str, dict[str, str]] = {}  # host -> cookies set inside this chain
        while True:
            hop_headers = headers
            jar = chain_cookies.get(urlsplit(cur).netloc)
            if jar:  # as requests does within one request (the session itself keeps nothing)
                extra = "; ".join(f"{k}={v}" for k, v in jar.items())
                hop_headers = {
                    **headers,
                    "Cookie": f"{headers['Cookie']}; {extra}" if headers.get("Cookie") else extra,
                }
            left = max(0.001, deadline - time.monotonic())
            timeout = urllib3.Timeout(connect=min(req.connect_timeout, left), read=left)
            try:
                resp = manager.request(
                    method,
                    cur,
                    body=body,
                    headers=hop_headers,
                    preload_content=False,
                    redirect=False,
                    retries=False,
                    timeout=timeout,
                )
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
                headers = {
                    k: v
                    for k, v in headers.items()
                    if k.lower() not in ("content-type", "content-length")
                }
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
    text = short_error(exc) if exc is not None else ""
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


class _NoStore(DefaultCookiePolicy):
    def set_ok(self, cookie: object, request: object) -> bool:
        return False
