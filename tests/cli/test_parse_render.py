"""`control.sh parse` on an endpoint that renders: the page it rendered (with what its
actions did) is shown and counted as a request, and its `ctx.log` lines are on stderr."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.cli.conftest import control
from tests.external_interface.browser_fixtures import needs_browser
from tests.external_interface.jssite import JsSite

pytestmark = [needs_browser, pytest.mark.integration]


@pytest.fixture
def site() -> Iterator[JsSite]:
    with JsSite() as s:
        yield s


def test_parse_shows_the_rendered_page_its_items_and_its_log(
    site: JsSite, redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    env = {**os.environ, "CHAINCRAWL_REDIS_URL": redis_url, "CHAINCRAWL_KEY_PREFIX": key_prefix,
           "CHAINCRAWL_VAR_DIR": str(tmp_path / "var"),
           "CHAINCRAWL_EXTRA_SITE_PACKAGES": "tests.rendersite"}  # fmt: skip
    url = site.url("/scroll?batches=2&size=3")
    out = control("parse", "rendersite.local.scroll", orjson.dumps({"url": url}).decode(),
                  env=env, timeout=180)  # fmt: skip
    assert out.returncode == 0, out.stderr
    texts = [orjson.loads(x)["item"]["text"] for x in out.stdout.splitlines()]
    assert texts == ["first-0", "first-1", "first-2", "b1-0", "b1-1", "b1-2"]
    err = out.stderr
    assert "log: INFO scrolled 2 rounds, 6 entries, complete=True" in err, err
    assert f"RENDER {url} -> 200" in err
    assert "scroll_to_end (rounds 2, items 6, complete True)" in err
    assert "6 item(s) (rendersite.entry)" in err and "; 1 request(s) (1 rendered)" in err
    assert "0 request(s)" not in err
