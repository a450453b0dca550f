"""`Response.selector`: a clean UTF-8 body goes to lxml as its bytes, and the tree, the type and
what a query finds are those of `Selector(text=resp.text)`, whatever the body; anything else
goes as the text."""

from __future__ import annotations

import pytest
from lxml import etree
from parsel import Selector

from bench import shop_site
from exceptions import UndecodableText
from external_interface.fetch import Response
from external_interface.fetch.response import lxml_bytes

DOCS = {
    "html": "<html><body><p class='a'>café ünïcode</p></body></html>",
    "spaced": " \n\t<html><body><p>x</p></body></html>\r\n ",
    "no-html-tag": "<p>a fragment</p><p>two</p>",
    "xml": '<?xml version="1.0"?><root><item id="1">é</item></root>',
    "xml-spaced": '  <?xml version="1.0"?>\n<root><item/></root>\n',
    "nbsp-edge": "\u00a0<html><body><p>x</p></body></html>\u00a0",
    "control-edge": "\x1c<html><body><p>x</p></body></html>",
    "nul": "<html><body><p>a\x00b</p></body></html>",
    "nul-edge": "<html><body><p>x</p></body></html> \x00",
    "json": '{"a": [1, 2], "b": "<p>x</p>"}',
    "text-end": "<html><body><p>x</p></body></html>trailing",
    "empty": "",
    "spaces": "   ",
}


def _resp(body: bytes, charset: str | None = "utf-8") -> Response:
    ctype = f"text/html; charset={charset}" if charset else "text/html"
    return Response(
        url="http://127.0.0.1/x",
        status=200,
        headers={"content-type": ctype},
        content=body,
        elapsed=0.0,
        declared_encoding=charset,
    )


def _same(a: Selector, b: Selector) -> None:
    assert a.type == b.type
    if a.type in ("html", "xml"):
        assert etree.tostring(a.root) == etree.tostring(b.root)
        assert a.css("p::text").getall() == b.css("p::text").getall()
        assert a.xpath("//*/@id").getall() == b.xpath("//*/@id").getall()
    else:
        assert a.root == b.root


@pytest.mark.parametrize("name", sorted(DOCS))
def test_the_selector_is_the_text_s_whatever_the_body(name: str) -> None:
    for body in (DOCS[name].encode("utf-8"), b"\xef\xbb\xbf" + DOCS[name].encode("utf-8")):
        r = _resp(body)
        _same(r.selector, Selector(text=r.text))


def test_clean_utf8_documents_go_as_bytes_the_rest_as_text() -> None:
    def kind(text: str, encoding: str = "utf-8", body: bytes | None = None) -> str | None:
        raw = text.encode(encoding) if body is None else body
        return lxml_bytes(raw, text, encoding, 0)

    assert kind(DOCS["html"]) == "html" and kind(DOCS["spaced"]) == "html"
    assert kind(DOCS["xml"]) == "xml" and kind(DOCS["xml-spaced"]) == "xml"
    for name in ("nbsp-edge", "control-edge", "nul", "nul-edge", "json", "text-end", "empty"):
        assert kind(DOCS[name]) is None, name
    assert kind(DOCS["html"], "cp1252", DOCS["html"].encode("cp1252")) is None
    assert kind("<p>x</p>", body=b"\xef\xbb\xbf<p>x</p>") is None  # a BOM at the start
    assert lxml_bytes(b"<p>\xff</p>", "<p>\ufffd</p>", "utf-8", 1) is None  # replaced bytes


def test_undecodable_bytes_are_still_reported_or_raised() -> None:
    r = _resp(b"<html><body><p>ok \xff\xfe</p></body></html>")
    heard: list[int] = []
    r.on_undecodable = lambda resp, n: heard.append(n)
    assert r.selector.css("p::text").get() == "ok \ufffd\ufffd" and heard == [2]
    assert r.undecodable == 2
    strict = _resp(b"<p>\xff</p>")
    strict.decode_errors = "strict"
    with pytest.raises(UndecodableText):
        strict.selector  # noqa: B018


def test_other_charsets_parse_their_text() -> None:
    r = _resp("<p>中文标题</p>".encode("gb18030"), "gbk")
    assert r.selector.css("p::text").get() == "中文标题"


def test_the_shop_s_pages_parse_the_same() -> None:
    pages = shop_site.generate(shop_site.ShopConfig(categories=1, catalog_pages=1, heavy=True))
    for page in list(pages.values())[:8]:
        r = _resp(page.body)
        assert lxml_bytes(r.content, r.text, r.encoding, r.undecodable) == "html"
        _same(r.selector, Selector(text=r.text))
