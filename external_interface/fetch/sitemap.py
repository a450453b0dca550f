"""URLs from a site's sitemaps, for a chain's first step.

    for entry in sitemap_urls("https://example.com/robots.txt", ctx.get):
        yield Page(url=entry.url, lastmod=entry.lastmod)

`start` is a robots.txt (its `Sitemap:` lines are read), a sitemap, or a sitemap index; the
index's children are followed depth first, in document order, at most `max_depth` indexes
deep (the protocol allows one level; some sites nest), each sitemap once. Bodies may be
gzipped (`.xml.gz` files, or a `Content-Encoding` the fetch function left undecoded): the
gzip magic bytes decide, not the name. Plain-text sitemaps (one URL a line) are read too.

Safe against hostile files: a body may decompress to at most `max_bytes` (the protocol's own
limit, 50 MiB, by default), entities are never expanded and no DTD or network resource is
loaded (a "billion laughs" document yields its URLs, unexpanded, at once), and at most
`max_sitemaps` files are fetched. The XML is parsed as a stream, so memory stays flat.

`fetch(url)` returns an object with `.status` and `.content` (a `fetch.Response`; the
endpoint's `ctx.get` fits, and raises the typed error for a status >= 400 itself).
"""

from __future__ import annotations

import io
import logging
import re
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, NamedTuple
from urllib.parse import urljoin, urlsplit

from lxml import etree
from protego import Protego

from exceptions import ParseError, ResponseTooLarge, error_for_status

log = logging.getLogger(__name__)

MAX_BYTES = 50 * 1024 * 1024  # the sitemap protocol's limit for one uncompressed file
MAX_DEPTH = 3
MAX_SITEMAPS = 1000
_GZIP_MAGIC = b"\x1f\x8b"
_BARE_AMP = re.compile(rb"&(?!#?[A-Za-z0-9_]+;)")


class SitemapEntry(NamedTuple):
    """One page URL, its `<lastmod>` (UTC; None when absent or unreadable) and the sitemap
    that listed it."""

    url: str
    lastmod: datetime | None
    sitemap: str


def sitemap_urls(
    start: str,
    fetch: Callable[[str], Any],
    *,
    max_depth: int = MAX_DEPTH,
    max_bytes: int = MAX_BYTES,
    max_sitemaps: int = MAX_SITEMAPS,
    follow: Callable[[str], bool] | None = None,
) -> Iterator[SitemapEntry]:
    """Yield every page URL the sitemaps reachable from `start` list (module docstring).

    `follow(url)` may refuse child sitemaps (e.g. only the product ones). Fetch errors
    propagate, typed, so the step retries or fails as for any other page."""
    if urlsplit(start).path == "/robots.txt":
        body = _body(start, fetch(start), max_bytes)
        roots = robots_sitemaps(body.decode("utf-8", errors="replace"), base=start)
    else:
        roots = [start]
    stack = [(url, 0) for url in reversed(roots)]
    seen: set[str] = set()
    while stack:
        url, depth = stack.pop()
        if url in seen:
            continue
        if len(seen) >= max_sitemaps:
            log.warning("sitemaps from %s: stopped at %d files (max_sitemaps)", start, max_sitemaps)
            return
        seen.add(url)
        kind, entries = parse_sitemap(_body(url, fetch(url), max_bytes), url)
        if kind == "sitemapindex":
            children = [e.url for e in entries if follow is None or follow(e.url)]
            if depth >= max_depth:
                log.warning(
                    "sitemap index %s: %d children not followed, deeper than %d",
                    url,
                    len(children),
                    max_depth,
                )
                continue
            stack.extend((child, depth + 1) for child in reversed(children))
        else:
            yield from entries


def robots_sitemaps(text: str, base: str = "") -> list[str]:
    """The `Sitemap:` URLs of a robots.txt, made absolute against `base`."""
    return [urljoin(base, u) for u in Protego.parse(text).sitemaps]


def parse_sitemap(body: bytes, source: str = "") -> tuple[str, list[SitemapEntry]]:
    """`("urlset" | "sitemapindex" | "text", entries)` of one (already decompressed) file."""
    if not body.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"<"):
        text = body.decode("utf-8-sig", errors="replace")
        urls = (line.strip() for line in text.splitlines())
        return "text", [SitemapEntry(u, None, source) for u in urls if _is_http(u)]
    entries: list[SitemapEntry] = []
    root = ""
    events = etree.iterparse(
        io.BytesIO(_BARE_AMP.sub(b"&amp;", body)),  # `?a=1&b=2` unescaped is common
        events=("start", "end"),
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        huge_tree=False,
        recover=True,
        remove_comments=True,
        remove_pis=True,
    )
    try:
        for event, el in events:
            name = etree.QName(el).localname if isinstance(el.tag, str) else ""
            if event == "start":
                root = root or name
                continue
            if name in ("url", "sitemap"):
                loc = lastmod = None
                for child in el:
                    if not isinstance(child.tag, str):
                        continue
                    child_name = etree.QName(child).localname
                    if child_name == "loc" and not len(child):  # no entity inside
                        loc = (child.text or "").strip()
                    elif child_name == "lastmod":
                        lastmod = parse_lastmod(child.text or "")
                if loc and _is_http(loc):
                    entries.append(SitemapEntry(loc, lastmod, source))
                el.clear(keep_tail=False)  # and the cleared siblings before it: flat memory
                parent = el.getparent()
                while parent is not None and el.getprevious() is not None:
                    del parent[0]
    except etree.XMLSyntaxError as exc:
        log.warning("sitemap %s: XML error after %d entries: %s", source, len(entries), exc)
    fatal = [e for e in events.error_log if e.level_name == "FATAL"]
    if fatal:  # recover=True ends quietly, e.g. at libxml2's entity amplification limit
        log.warning(
            "sitemap %s: read stopped after %d entries: %s", source, len(entries), fatal[0].message
        )
    return ("sitemapindex" if root == "sitemapindex" else "urlset"), entries


def parse_lastmod(text: str) -> datetime | None:
    """A W3C datetime (`2024-05-01`, `2024-05-01T10:00:00+02:00`, `...Z`) in UTC, else None."""
    text = text.strip()
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _body(url: str, resp: Any, max_bytes: int) -> bytes:
    status = int(getattr(resp, "status", 200))
    if status >= 400:
        raise error_for_status(status, url)
    data = bytes(resp.content)
    for _ in range(2):  # a .gz file also sent with Content-Encoding: gzip is gzipped twice
        if not data.startswith(_GZIP_MAGIC):
            break
        data = gunzip(data, max_bytes, url)
    if len(data) > max_bytes:
        raise ResponseTooLarge(f"sitemap {url} is over {max_bytes} bytes")
    return data


def gunzip(data: bytes, max_bytes: int, url: str = "") -> bytes:
    """Decompress gzip data, refusing to produce more than `max_bytes` (a gzip bomb)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise ParseError(f"sitemap {url}: not valid gzip ({exc})") from None
    if len(out) > max_bytes or d.unconsumed_tail:
        raise ResponseTooLarge(f"sitemap {url} decompresses to more than {max_bytes} bytes")
    return out


def _is_http(url: str) -> bool:
    return url.startswith(("http://", "https://"))
