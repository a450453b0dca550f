"""The fetch layer's test doubles answer as a live fetch would: headers read in any case."""

from __future__ import annotations

from pathlib import Path

from external_interface.fetch import FetchRequest, Response
from external_interface.fetch.mock import FixtureFetcher, load_case, save_case
from external_interface.fetch.response import Response as LiveResponse


def test_replayed_and_fixture_headers_are_read_in_any_case(tmp_path: Path) -> None:
    """A parser reading `resp.headers["Content-Type"]` works live (the fetchers' headers are
    case-insensitive); its replayed test must not fail on a KeyError."""
    req = FetchRequest(method="GET", url="http://shop.test/p/1")
    live = LiveResponse(
        url=req.url,
        status=200,
        headers={"content-type": "text/html; charset=utf-8"},
        content=b"<h1>One</h1>",
        elapsed=0.01,
    )
    save_case(tmp_path, "shop.pc.p", {}, [(req, live)], {"items": [], "follows": []})
    replayed = load_case(tmp_path).fetcher().fetch(req)
    assert isinstance(replayed, Response)
    assert replayed.headers["Content-Type"] == "text/html; charset=utf-8"
    assert replayed.headers.get("CONTENT-TYPE") == "text/html; charset=utf-8"
    assert replayed.headers.get("Set-Cookie") is None  # not recorded: never kept
    page = tmp_path / "p.html"
    page.write_text("<h1>Two</h1>")
    fixture = FixtureFetcher({"/p/1": str(page)}).fetch(req)
    assert fixture.headers["Content-Type"] == "text/html"
