"""Who the crawler says it is, end to end: a real worker per fetcher against a site of the
test's own that records the User-Agent of every request, robots.txt included. With no user
agent lent (no `resources=["user_agent"]`), pages and robots.txt go out as
`chaincrawl/VERSION (+URL)`, and robots.txt's `chaincrawl` group is the one applied."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator

import pytest
from aiohttp import web

import chains
from chains import Chain, step
from config import ROOT
from external_interface.fetch.response import VERSION, default_user_agent
from tests.threaded_site import ThreadedSite

pytestmark = pytest.mark.integration

ROBOTS = "User-agent: chaincrawl\nDisallow: /private\n\nUser-agent: *\nDisallow: /\n"
PAGE = "<html><body><ul><li class='row'>a</li></ul></body></html>"


class AgentSite(ThreadedSite):
    """Records (path, User-Agent) of each request; chaincrawl may fetch all but /private."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def app(self) -> web.Application:
        async def any_path(request: web.Request) -> web.Response:
            self.seen.append((request.path, request.headers.get("User-Agent", "")))
            if request.path == "/robots.txt":
                return web.Response(text=ROBOTS, content_type="text/plain")
            return web.Response(text=PAGE, content_type="text/html")

        app = web.Application()
        app.router.add_get("/{tail:.*}", any_path)
        return app


@pytest.fixture
def agent_site() -> Iterator[AgentSite]:
    site = AgentSite().start()
    try:
        yield site
    finally:
        site.stop()


@pytest.mark.parametrize("fetcher", ["urllib3", "requests", "impersonate"])
def test_pages_and_robots_txt_go_out_as_chaincrawl(start_worker, cc_env, agent_site,
                                                   fetcher) -> None:  # fmt: skip
    contact = "https://crawler.example/about"
    start_worker(CHAINCRAWL_FETCHER=fetcher, CHAINCRAWL_ROBOTS="on",
                 CHAINCRAWL_CONTACT_URL=contact)  # fmt: skip
    run = chains.run(Chain(f"ua_{fetcher}", step("testsite.local.rows")),
                     seeds=[{"url": f"{agent_site.url}/page"},
                            {"url": f"{agent_site.url}/private"}])  # fmt: skip
    p = run.wait(timeout=90)
    s = p.steps["local.rows"]
    # robots.txt matched as chaincrawl: /page allowed (the `*` group would refuse it), /private not
    assert (s["succeeded"], s["skipped"], s["items"]) == (1, 1, 1), s
    want = f"chaincrawl/{VERSION} (+{contact})"
    assert sorted(agent_site.seen) == [("/page", want), ("/robots.txt", want)]


def test_the_url_is_set_per_site_over_the_all_sites_one() -> None:
    env = {"CHAINCRAWL_CONTACT_URL": "https://all.example", "CHAINCRAWL_CONTACT_URL_SHOP":
           "https://shop-crawler.example"}  # fmt: skip
    assert (
        default_user_agent("shop", env) == f"chaincrawl/{VERSION} (+https://shop-crawler.example)"
    )
    assert default_user_agent("news", env) == f"chaincrawl/{VERSION} (+https://all.example)"
    assert default_user_agent("news", {}).startswith(f"chaincrawl/{VERSION} (+https://")


def test_the_version_is_the_project_s() -> None:
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == VERSION
