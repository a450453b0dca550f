"""The fetch layer: one-method `Fetcher` interface, a requests-based default, typed errors.

Timeouts are enforced here rather than left to Celery, because Celery's time limits do not
fire under the threads and gevent pools. Every request gets `min(request_timeout, time left
in the task)` as a *whole-request* deadline: the connect and read timeouts bound each socket
operation, and the body is read in chunks with the clock checked between them, so a server
that drips one byte a second cannot hold a worker slot past the deadline. The same loop
enforces the response size limit.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from http.cookiejar import DefaultCookiePolicy
from typing import Any, Protocol

import orjson
import requests
import requests.adapters
from parsel import Selector

from exceptions import (
    ConnectError,
    FetchTimeout,
    ParseError,
    ProxyError,
    ResponseTooLarge,
    TooManyRedirects,
    TransportError,
    TruncatedResponse,
)

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_\-]+)""", re.I)
_CHUNK = 64 * 1024


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

    @cached_property
    def encoding(self) -> str:
        """Header charset, else an HTML/XML meta charset, else UTF-8 (lenient on errors)."""
        enc = self.declared_encoding
        if not enc:
            m = _META_CHARSET.search(self.content[:4096])
            enc = m.group(1).decode("ascii") if m else "utf-8"
        enc = enc.lower()
        if enc in ("gb2312", "gbk"):
            enc = "gb18030"  # a superset: real sites label gb18030 text as gb2312
        try:
            "".encode(enc)
        except LookupError:
            enc = "utf-8"
        return enc

    @cached_property
    def text(self) -> str:
        return self.content.decode(self.encoding, errors="replace")

    def json(self) -> Any:
        try:
            return orjson.loads(self.content)
        except orjson.JSONDecodeError as exc:
            raise ParseError(f"invalid JSON from {self.url}: {exc}") from None

    @cached_property
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
            content = self._read_body(resp, req, deadline)
        finally:
            resp.close()
        return Response(
            url=resp.url,
            status=resp.status_code,
            headers=resp.headers,
            content=content,
            elapsed=time.monotonic() - start,
            declared_encoding=_header_charset(resp.headers.get("content-type", "")),
            history=[r.url for r in resp.history],
        )

    @staticmethod
    def _read_body(resp: requests.Response, req: FetchRequest, deadline: float) -> bytes:
        declared = resp.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > req.max_bytes:
            raise ResponseTooLarge(f"{req.url} declares {declared} bytes > limit {req.max_bytes}")
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in resp.raw.stream(_CHUNK, decode_content=True):
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


class _NoStore(DefaultCookiePolicy):
    def set_ok(self, cookie: object, request: object) -> bool:
        return False


def _header_charset(content_type: str) -> str | None:
    for part in content_type.split(";")[1:]:
        k, _, v = part.strip().partition("=")
        if k.lower() == "charset" and v:
            return v.strip("\"' ")
    return None


def _short(exc: BaseException) -> str:
    """Exception text without URLs' credentials (proxy URLs may carry user:pass)."""
    return re.sub(r"//[^/@\s]+@", "//***@", str(exc))[:200]
