"""Sitemaps: urlsets, indexes (bounded depth, each file once), gzip either way, plain text,
hostile files (gzip and entity bombs); then a local site through the real fetch layer."""

from __future__ import annotations

import gzip
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from exceptions import NotFound, ParseError, ResponseTooLarge
from external_interface.fetch import FetchRequest, Urllib3Fetcher
from external_interface.fetch.sitemap import (
    parse_lastmod,
    parse_sitemap,
    robots_sitemaps,
    sitemap_urls,
)
from tests.polite_site import PAGES, PoliteSite, sitemapindex, urlset

B = "https://example.com"


@dataclass
class Answer:
    status: int
    content: bytes


@dataclass
class Files:
    """A fetch function over a dict of path -> body (missing: 404), counting fetches."""

    files: dict[str, bytes]
    calls: list[str] = field(default_factory=list)

    def __call__(self, url: str) -> Answer:
        self.calls.append(url)
        path = url.removeprefix(B)
        return Answer(200, self.files[path]) if path in self.files else Answer(404, b"")


def test_a_urlset_with_lastmod() -> None:
    body = (
        b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        b"<url><loc> https://example.com/a </loc><lastmod>2024-05-01T10:00:00+02:00</lastmod>"
        b"<changefreq>daily</changefreq></url>"
        b"<url><loc>https://example.com/b?x=1&amp;y=2</loc><lastmod>bogus</lastmod></url>"
        b"<url><loc>https://example.com/c?x=1&y=2</loc></url>"  # unescaped &, common in the wild
        b"<url><loc>ftp://example.com/d</loc></url><!-- a comment --></urlset>"
    )
    kind, entries = parse_sitemap(body, "s.xml")
    assert kind == "urlset"
    assert [(e.url, e.lastmod) for e in entries] == [
        ("https://example.com/a", datetime(2024, 5, 1, 8, 0, tzinfo=UTC)),
        ("https://example.com/b?x=1&y=2", None),
        ("https://example.com/c?x=1&y=2", None),
    ]
    assert {e.sitemap for e in entries} == {"s.xml"}


def test_lastmod_forms() -> None:
    assert parse_lastmod("2024-05-01") == datetime(2024, 5, 1, tzinfo=UTC)
    assert parse_lastmod("2024-05-01T10:00Z") == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert parse_lastmod(" 2024-05-01T10:00:00.5-01:00 ") == datetime(
        2024, 5, 1, 11, 0, 0, 500000, tzinfo=UTC
    )
    assert parse_lastmod("") is None and parse_lastmod("May 1st") is None


def test_index_children_in_order_each_once_with_gzip_both_ways() -> None:
    files = {
        "/index.xml": sitemapindex(B, ["/a.xml", "/b.xml.gz", "/a.xml", "/missing-not-listed"])
        .replace(b"<sitemap><loc>https://example.com/missing-not-listed</loc></sitemap>", b""),
        "/a.xml": urlset(B, ["/1", "/2"]),
        "/b.xml.gz": gzip.compress(gzip.compress(urlset(B, ["/3"], lastmod=None))),
    }  # fmt: skip
    fetch = Files(files)
    got = [(e.url, e.lastmod is not None, e.sitemap) for e in sitemap_urls(f"{B}/index.xml", fetch)]
    assert got == [
        (f"{B}/1", True, f"{B}/a.xml"),
        (f"{B}/2", True, f"{B}/a.xml"),
        (f"{B}/3", False, f"{B}/b.xml.gz"),
    ]
    assert fetch.calls == [f"{B}/index.xml", f"{B}/a.xml", f"{B}/b.xml.gz"]


def test_robots_sitemap_lines_are_the_roots() -> None:
    robots = b"User-agent: *\nDisallow: /x\nSitemap: /rel.xml\nSitemap: https://example.com/t.txt\n"
    files = {
        "/robots.txt": robots,
        "/rel.xml": urlset(B, ["/r"]),
        "/t.txt": b"\xef\xbb\xbfhttps://example.com/t1\n\n  https://example.com/t2  \nnot-a-url\n",
    }
    assert [e.url for e in sitemap_urls(f"{B}/robots.txt", Files(files))] == [
        f"{B}/r", f"{B}/t1", f"{B}/t2",
    ]  # fmt: skip
    assert robots_sitemaps(robots.decode(), f"{B}/robots.txt") == [
        f"{B}/rel.xml", f"{B}/t.txt",
    ]  # fmt: skip


def test_depth_is_bounded_and_loops_end() -> None:
    files = {f"/n{d}.xml": sitemapindex(B, [f"/n{d - 1}.xml"]) for d in range(1, 6)}
    files["/n0.xml"] = urlset(B, ["/deep"])
    assert [e.url for e in sitemap_urls(f"{B}/n3.xml", Files(files))] == [f"{B}/deep"]
    fetch = Files(files)
    assert list(sitemap_urls(f"{B}/n5.xml", fetch, max_depth=3)) == []
    assert len(fetch.calls) == 4  # n5 (depth 0) .. n2 (depth 3), whose children are not followed
    loop = {"/loop.xml": sitemapindex(B, ["/loop.xml", "/a.xml"]), "/a.xml": urlset(B, ["/1"])}
    assert [e.url for e in sitemap_urls(f"{B}/loop.xml", Files(loop))] == [f"{B}/1"]


def test_max_sitemaps_and_follow_filter() -> None:
    files = {"/i.xml": sitemapindex(B, [f"/s{i}.xml" for i in range(5)])}
    files.update({f"/s{i}.xml": urlset(B, [f"/p{i}"]) for i in range(5)})
    assert len(list(sitemap_urls(f"{B}/i.xml", Files(files), max_sitemaps=3))) == 2
    odd = sitemap_urls(f"{B}/i.xml", Files(files), follow=lambda u: u[-5] in "13")
    assert [e.url for e in odd] == [f"{B}/p1", f"{B}/p3"]


def test_errors_are_typed() -> None:
    files = {"/i.xml": sitemapindex(B, ["/gone.xml"]), "/bad.gz": b"\x1f\x8bnot gzip at all"}
    with pytest.raises(NotFound):
        list(sitemap_urls(f"{B}/i.xml", Files(files)))
    with pytest.raises(ParseError):
        list(sitemap_urls(f"{B}/bad.gz", Files(files)))


def test_a_gzip_bomb_is_refused_at_the_cap() -> None:
    bomb = gzip.compress(b"<urlset>" + b" " * (64 * 1024 * 1024))  # 64 MiB in about 64 KiB
    assert len(bomb) < 200_000
    t0 = time.monotonic()
    with pytest.raises(ResponseTooLarge, match="decompresses to more than"):
        list(sitemap_urls(f"{B}/bomb.xml.gz", Files({"/bomb.xml.gz": bomb})))
    with pytest.raises(ResponseTooLarge):
        list(sitemap_urls(f"{B}/big.xml", Files({"/big.xml": b"<urlset>" + b" " * 2000}),
                          max_bytes=1000))  # fmt: skip
    assert time.monotonic() - t0 < 5


def test_entities_are_never_expanded() -> None:
    """Billion laughs and an external entity: no expansion, no file read, no hang."""
    ents = '<!ENTITY lol "lol">' + "".join(
        f'<!ENTITY lol{i} "{("&lol;" if i == 2 else f"&lol{i - 1};") * 10}">' for i in range(2, 10)
    )
    laughs = (
        f'<?xml version="1.0"?><!DOCTYPE lolz [{ents}]><urlset>'
        f"<url><loc>{B}/before</loc></url><url><loc>{B}/&lol9;</loc></url></urlset>"
    ).encode()
    xxe = (
        f'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
        f"<urlset><url><loc>{B}/&xxe;</loc></url><url><loc>{B}/after</loc></url></urlset>"
    ).encode()
    t0 = time.monotonic()
    _, entries = parse_sitemap(laughs, "laughs")
    assert [e.url for e in entries] == [f"{B}/before"]
    _, entries = parse_sitemap(xxe, "xxe")
    assert [e.url for e in entries] == [f"{B}/after"]  # the entity's <loc> is dropped
    assert time.monotonic() - t0 < 10  # expanded, the laughs would take minutes and gigabytes


@pytest.mark.integration
def test_a_local_site_from_robots_txt(polite_site: PoliteSite) -> None:
    """robots.txt -> index -> plain, .xml.gz (application/gzip) and Content-Encoding: gzip
    children, through the real fetch layer."""
    fetcher = Urllib3Fetcher()

    def fetch(url: str):
        return fetcher.fetch(FetchRequest("GET", url))

    base = polite_site.url
    entries = list(sitemap_urls(f"{base}/robots.txt", fetch))
    assert [e.url for e in entries] == [f"{base}/page/{i}" for i in range(3 * PAGES)]
    dated = [e for e in entries if e.lastmod is not None]
    assert len(dated) == 2 * PAGES  # the Content-Encoding child has no <lastmod>
    assert {e.lastmod for e in dated} == {datetime(2024, 5, 1, tzinfo=UTC)}
    assert {e.sitemap for e in entries} == {
        f"{base}/sitemap-pages.xml", f"{base}/sitemap-more.xml.gz", f"{base}/sitemap-enc.xml",
    }  # fmt: skip
    nested = list(sitemap_urls(f"{base}/nested-2.xml", fetch))
    assert [e.url for e in nested] == [f"{base}/page/deep"]
    assert list(sitemap_urls(f"{base}/nested-5.xml", fetch, max_depth=2)) == []
