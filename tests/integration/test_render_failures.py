"""Rendered pages on real workers (gevent) when things go wrong, and what the site sees.

A page that never settles times out and is dead-lettered with its screenshot and DOM; the
proxy, session and user agent the pools lend reach the site through the browser (the demo's
`/headers` echo and the proxy's own count show them), a dead proxy leaves the pool and the
page is retried through another; a login wall in a rendered page retires the session.
Endpoints: tests/rendersite (site `rendersite`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import chains
import sites
from chains import Chain, step
from cli import deadletter as cli_deadletter
from config import get_settings, reset_settings
from demo.proxy_farm import ProxyFarm, dead_address
from demo.testing import DemoServer
from external_interface.resources.cookie import add_cookies
from external_interface.resources.pool import Pool, pool_stats
from external_interface.resources.proxy.channel import ChannelPool
from external_interface.resources.proxy.models import ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.storage.sinks.jsonl import iter_records
from monitor.deadletter import DeadLetterStore
from monitor.metrics import read, task_key
from tests.external_interface.browser_fixtures import needs_browser
from tests.external_interface.jssite import JsSite
from utils.redis import get_redis

pytestmark = [needs_browser, pytest.mark.integration, pytest.mark.timeout(300)]

PACKAGES = "tests.testsite,tests.rendersite"
QUEUES = "rendersite,resources,default"
# A render (the driver's start, a 3 s deadline, the capture) outlasts the suite's 6 s
# visibility timeout on a busy machine: the broker would hand the message out a second time
# while it runs, and the counts below are of one delivery per attempt.
WORKER = {"CHAINCRAWL_EXTRA_SITE_PACKAGES": PACKAGES, "CHAINCRAWL_VISIBILITY_TIMEOUT": "60"}


@pytest.fixture
def render_env(cc_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process and its workers know the rendersite endpoints."""
    monkeypatch.setenv("CHAINCRAWL_EXTRA_SITE_PACKAGES", PACKAGES)
    reset_settings()
    sites.load_all()
    yield
    monkeypatch.undo()
    reset_settings()


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoServer]:
    with DemoServer(size="tiny", features=["login"]) as server:
        yield server


def run(name: str, task: str, seeds: list[dict[str, Any]]) -> chains.runner.Progress:
    return chains.run(Chain(name, step(task)), seeds=seeds).wait(timeout=180)


def letters(run_id: str) -> list[Any]:
    return DeadLetterStore(get_redis()).list(50, run=run_id)


def test_a_page_that_never_settles_is_dead_lettered_with_its_screenshot(
    render_env: None, start_worker: Any, demo: DemoServer, capsys: pytest.CaptureFixture[str]
) -> None:
    start_worker(queues=QUEUES, CHAINCRAWL_PROVIDERS="rendersite.cookie=noop", **WORKER)
    url = demo.url_for("/js/hang")
    p = run("render_hang", "rendersite.local.page", [{"url": url, "timeout": 3}])
    assert p.ended and p.totals["failed"] == 1 and p.totals["retried"] == 1  # max_retries=1
    (dl,) = letters(p.run_id)
    assert dl.error_type == "RenderTimeout" and dl.task == "rendersite.local.page"
    cap = dl.capture
    assert cap["page_url"] == url and cap["dir"].startswith(str(get_settings().var_dir))
    shot = (cap["dir"] + "/screenshot.png", cap["files"]["screenshot.png"])
    with open(shot[0], "rb") as f:
        png = f.read()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) == shot[1] > 1000
    with open(cap["dir"] + "/dom.html", encoding="utf-8") as f:
        assert 'id="hang"' in f.read()
    # `control.sh deadletter list -v` says where they are
    cli_deadletter.list_view(verbose=True, run=p.run_id)
    out = capsys.readouterr().out
    assert "page capture of" in out and shot[0] in out.replace("\n", "")


def test_the_lent_proxy_session_and_user_agent_reach_the_site_and_a_dead_proxy_leaves(
    render_env: None, start_worker: Any, demo: DemoServer
) -> None:
    r = get_redis()
    with ProxyFarm() as farm:
        healthy = farm.add_proxy(auth=("crawler", "s3cr:t@pass"))
        dead_host, dead_port = dead_address()
        dead = ProxyAddress.parse(f"{dead_host}:{dead_port}")
        pool = GlobalPool()
        pool.clear()
        ChannelPool("rendersite", pool).clear()
        for addr in (ProxyAddress.parse(healthy.url), dead):
            pool.admit(addr, elapsed=0.1)
        cookies = Pool("cookie", "rendersite")
        cookies.clear()
        for i in (1, 2):
            add_cookies("rendersite", {"session": f"s-{i}"})
        start_worker(queues=QUEUES, CHAINCRAWL_PROXY_SITES="rendersite", **WORKER)
        url = demo.url_for("/headers")
        p = run(
            "render_headers", "rendersite.local.headers", [{"url": url, "n": n} for n in range(4)]
        )
        assert p.complete and p.totals["failed"] == 0 and p.totals["stored"] == 4
        seen = {rec["item"]["n"]: rec["item"] for rec in iter_records("rendersite.seen")
                if rec["run"] == p.run_id}  # fmt: skip
        assert sorted(seen) == [0, 1, 2, 3]
        for item in seen.values():
            assert item["remote_addr"] == healthy.host != "127.0.0.1"  # through the proxy
            assert item["cookie"] in ("session=s-1", "session=s-2")  # a lent session, alone
            ua = item["user_agent"]
            assert ua.startswith("Mozilla/5.0") and "Headless" not in ua  # the lent one
        assert healthy.requests >= 4
        # the dead proxy was lent once, failed the page, and left the pool; the retry went
        # through the healthy one
        assert dead.id not in pool and ProxyAddress.parse(healthy.url).id in pool
        m = read(r, task_key("rendersite.local.headers", get_settings()))
        assert m.get("retried:ProxyError", 0) >= 1 and m.get("renders", 0) >= 4


def test_a_login_wall_in_a_rendered_page_retires_the_session(
    render_env: None, start_worker: Any, demo: DemoServer
) -> None:
    cookies = Pool("cookie", "rendersite")
    cookies.clear()
    for i in (1, 2):
        add_cookies("rendersite", {"session": f"not-logged-in-{i}"})
    start_worker(queues=QUEUES, **WORKER)
    url = demo.url_for("/pc/post/p1/comments?page=1")  # needs a login: the wall answers 200
    p = run("render_wall", "rendersite.local.page", [{"url": url}])
    assert p.ended and p.totals["failed"] == 1 and p.totals["retried"] == 1
    (dl,) = letters(p.run_id)
    assert dl.error_type == "LoginRequired" and dl.capture is None
    stats = pool_stats(get_redis(), get_settings().key_prefix, "cookie")["cookie:rendersite"]
    assert stats["bans"] == 2 and stats["retired_by"].get("banned") == 2  # one per attempt


def test_selectors_that_cannot_succeed_fail_without_retries_and_loading_pages_retry(
    render_env: None, start_worker: Any
) -> None:
    start_worker(queues=QUEUES, CHAINCRAWL_PROVIDERS="rendersite.cookie=noop", **WORKER)
    with JsSite() as site:
        static, loading = site.url("/static"), site.url("/xhr?api=/api/hang")
        seeds = [
            {"url": static, "wait_for": "div[", "timeout": 5},  # refused in the worker
            {"url": static, "wait_for": "##bad", "timeout": 5},  # refused by the browser
            {"url": static, "wait_for": ".never", "timeout": 8},  # quiet page: final
            {"url": loading, "wait_for": ".late", "timeout": 3},  # still loading: retried
        ]
        p = run("render_selectors", "rendersite.local.page", seeds)
        hits = dict(site.hits)
    by_sel = {dl.params["wait_for"]: dl for dl in letters(p.run_id)}
    assert {k: (v.error_type, v.retries) for k, v in by_sel.items()} == {
        "div[": ("InvalidSelector", 0),
        "##bad": ("InvalidSelector", 0),
        ".never": ("SelectorTimeout", 0),
        ".late": ("RenderTimeout", 1),
    }, {k: v.error for k, v in by_sel.items()}
    assert p.ended and p.totals["failed"] == 4 and p.totals["retried"] == 1
    assert hits["/static"] == 1, hits  # only the quiet page's one attempt loaded it
    assert hits["/xhr"] == 2, hits  # tried, then retried once (max_retries=1)
    assert "wait_for '.never'" in by_sel[".never"].error and "quiet" in by_sel[".never"].error
    assert "still loading" in by_sel[".late"].error
