"""The framework's guards against a selector that matches nothing."""

from __future__ import annotations

import pytest

from base_task import ParseError, Response, need, need_int


def page(html: str) -> Response:
    return Response(url="http://127.0.0.1:1/p", status=200, headers={"content-type": "text/html"},
                    content=html.encode(), elapsed=0.0)  # fmt: skip


def test_need_reads_a_value_the_page_must_have_and_names_query_and_url() -> None:
    resp = page("<h1> Title </h1><span class='n'>42</span><span class='x'>x</span>")
    assert need(resp, "h1::text") == "Title" and need_int(resp, ".n::text") == 42
    with pytest.raises(ParseError) as err:
        need(resp, "h2::text")
    assert str(err.value) == (
        "nothing matches 'h2::text' at http://127.0.0.1:1/p: has the page layout changed?"
    )
    with pytest.raises(ParseError, match=r"'\.x::text' is 'x', not an integer"):
        need_int(resp, ".x::text")
    (row,) = resp.css("span.n")
    with pytest.raises(ParseError, match=r"^nothing matches 'b::text': has"):
        need(row, "b::text")  # a selector has no URL
