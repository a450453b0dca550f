"""What every fetcher shares: the request as it is sent, and the response as it is read.

- The request: the URL with its query (`full_url`), the body's encoding (`encode_body`), error
  text without a proxy's credentials (`short_error`), and who chaincrawl says it is
  (`default_user_agent`, below).
- The response: a fully read response (`Response`: text, JSON, CSS and XPath on demand) and the
  charset decoding that counts the bytes it could not decode.

Who chaincrawl says it is: one honest User-Agent, `chaincrawl/VERSION (+URL)`, sent by
every request no user agent was lent to or set on (every fetcher: urllib3, requests, the
impersonating one; robots.txt and sitemap fetches), and whose product token `chaincrawl` is
the one robots.txt groups are matched against. User-agent rotation stays opt-in
(`resources=["user_agent"]`).

URL: where a site's owner reads who crawls them and how to reach the operator:
`CHAINCRAWL_CONTACT_URL_<SITE>`, else `CHAINCRAWL_CONTACT_URL`, else the project's page.
"""

from __future__ import annotations

import codecs
import json as stdjson
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode

import orjson
from parsel import Selector
from w3lib.encoding import html_body_declared_encoding, read_bom, resolve_encoding

from config import site_env
from exceptions import (
    MalformedBody,
    ParseError,
    UndecodableText,
)

# -- the request -------------------------------------------------------------------------------
VERSION = "0.1.0"  # pyproject.toml's [project] version
PRODUCT = (
    "chaincrawl"  # the token robots.txt `User-agent:` lines name (CHAINCRAWL_ROBOTS_USER_AGENT)
)
DEFAULT_CONTACT = "https://github.com/chaincrawl/chaincrawl"


def default_user_agent(site: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """`chaincrawl/VERSION (+URL)`, the URL the site's (or every site's) contact URL."""
    url = site_env("contact_url", site or "", environ) or DEFAULT_CONTACT
    return f"{PRODUCT}/{VERSION} (+{url})"


def has_user_agent(headers: Mapping[str, str] | None) -> bool:
    return any(k.lower() == "user-agent" for k in headers or {})


def full_url(url: str, params: Mapping[str, Any] | None = None) -> str:
    """The URL a request goes to: `params` (None values left out) appended to its query."""
    if params:
        query = urlencode([(k, v) for k, v in params.items() if v is not None], doseq=True)
        if query:
            url += ("&" if "?" in url else "?") + query
    return url


def encode_body(data: Any, json: Any) -> tuple[Any, str | None]:
    """The body as requests would send it, and the Content-Type it implies (None: the
    caller's own): `json` serialized, a mapping or a list of pairs form-encoded, bytes or
    text as they are."""
    if json is not None and data is None:
        return stdjson.dumps(json, allow_nan=False).encode(), "application/json"
    if isinstance(data, Mapping | list | tuple):
        pairs = list(data.items()) if isinstance(data, Mapping) else data
        return urlencode(pairs, doseq=True), "application/x-www-form-urlencoded"
    return data, None


def short_error(exc: BaseException) -> str:
    """Exception text without URLs' credentials (proxy URLs may carry user:pass)."""
    return re.sub(r"//[^/@\s]+@", "//***@", str(exc))[:200]


# -- the response ------------------------------------------------------------------------------
_T = TypeVar("_T")


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

    def __repr__(self) -> str:
        """One line (a shell echoing a response, a log line): never the body."""
        ctype = self.headers.get("content-type", "?")
        cached = ", from the HTTP cache" if self.from_cache else ""
        return f"<Response {self.status} {self.url} ({ctype}, {len(self.content)} bytes{cached})>"

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
        self.__dict__["undecodable"] = n  # counted on the way: `undecodable` need not decode
        if n:
            if self.decode_errors == "strict":
                raise UndecodableText(
                    f"{self.url}: {n} bytes are not valid {self.encoding} "
                    f"(declared: {self.declared_encoding or 'none'})"
                )
            if self.on_undecodable is not None:
                self.on_undecodable(self, n)
        return text

    def json(self, retry: bool = False) -> Any:
        """The body as JSON. Invalid JSON in a 2xx answer is `MalformedBody` (dead-lettered at
        once: a refetch gets the same bytes) unless `retry` (the site sends bodies cut short
        now and then); in any other answer, or with `retry`, a `ParseError` (retried)."""
        try:
            return orjson.loads(self.content)
        except orjson.JSONDecodeError as exc:
            why = f"invalid JSON from {self.url} (HTTP {self.status}, {len(self.content)} bytes): {exc}"
            if 200 <= self.status < 300 and not retry:
                raise MalformedBody(why) from None
            raise ParseError(why) from None

    @lazy
    def selector(self) -> Selector:
        """parsel's selector of the decoded text. `text` is decoded first either way (its
        undecodable bytes counted, or raised with "strict"); a clean UTF-8 body lxml gets as
        the bytes it came as (`lxml_bytes`), not re-encoded from the text: the same bytes, the
        same parser, the same tree, without a second pass over the page (~10 % of the
        selector's cost on the heavy pages)."""
        text = self.text
        kind = lxml_bytes(self.content, text, self.encoding, self.undecodable)
        if kind is None:
            return Selector(text=text)
        return Selector(body=self.content, encoding="utf-8", type=kind)

    def css(self, query: str) -> Any:
        return self.selector.css(query)

    def xpath(self, query: str) -> Any:
        return self.selector.xpath(query)


# parsel's own test of an XML document (`parsel.selector._XML_DECLARATION`), on the text
_XML_DECLARATION = re.compile(r"[\s\ufeff]*<\?xml\s")


def lxml_bytes(content: bytes, text: str, encoding: str, undecodable: int) -> str | None:
    """ "html" or "xml" when parsel, given `content` as bytes, feeds lxml exactly the bytes
    it would make of `text` (`Selector(text=)`: stripped, NULs dropped, encoded as UTF-8) and
    reads it as the same type; None otherwise (then the text goes). So: UTF-8 decoded without
    a replacement (re-encoding gives the bytes back) and no NUL; ASCII whitespace around a
    document that starts with `<` and ends with `>` (then `str.strip` and `bytes.strip` cut
    at the same places: a BOM or other Unicode whitespace at an end is not that); the type
    parsel would detect from the text (a body starting with `<` is no JSON)."""
    if undecodable or b"\x00" in content or codecs.lookup(encoding).name != "utf-8":
        return None
    edges = content.strip()
    if edges[:1] != b"<" or edges[-1:] != b">":
        return None
    return "xml" if _XML_DECLARATION.match(text) else "html"


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
