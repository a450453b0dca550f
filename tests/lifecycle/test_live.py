"""One endpoint run live outside the broker (lifecycle/live.py): what it yields, the children
its chain step would send, the requests it made, its error; and the stand-in endpoint of a
site that `control.sh shell --site` sends requests as."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exceptions import NotFound, ParamsError
from lifecycle import hooks as h
from lifecycle.context import Context
from lifecycle.endpoints import EndpointSpec
from lifecycle.live import run_live, site_spec
from sites import get_endpoint
from tests.testsite.chains import three_step
from tests.testsite.server import TestSite
from utils.registry import UnknownNameError


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    s = TestSite()
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(autouse=True)
def _site_url(site: TestSite, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTSITE_URL", site.url)


def test_items_follow_ups_and_the_children_of_its_step(site: TestSite) -> None:
    spec = get_endpoint("testsite.local.listing")
    chain = three_step()
    root = chain.root.id
    res = run_live(spec, {"page": 1, "per": 2}, chain=chain, step=root)
    assert res.error is None and res.params == {"page": 1, "per": 2}
    assert [i.model_dump() for i in res.items] == [{"entry_id": "e1-0", "n": 0},
                                                   {"entry_id": "e1-1", "n": 1}]  # fmt: skip
    assert [f.params for f in res.follows] == [{"page": 2, "per": 2}]
    kids = [(k.step, k.task, k.params) for k in res.children]
    assert kids[0] == (root, "testsite.local.listing", {"page": 2, "per": 2})
    assert sorted((k[1], sorted(k[2].items())) for k in kids[1:]) == [
        ("testsite.local.detail", [("entry_id", "e1-0")]),
        ("testsite.local.detail", [("entry_id", "e1-1")]),
        ("testsite.local.reviews", [("delay", 0.0), ("entry_id", "e1-0")]),
        ("testsite.local.reviews", [("delay", 0.0), ("entry_id", "e1-1")]),
    ]
    ((req, resp),) = res.exchanges
    assert req.url == f"{site.url}/list" and resp.status == 200
    assert run_live(spec, {"page": 1}).children == []  # no chain: no children computed


def test_the_endpoints_error_comes_back_with_its_requests(site: TestSite) -> None:
    spec = get_endpoint("testsite.local.probe")
    res = run_live(spec, {"path": "/status/404"})
    assert isinstance(res.error, NotFound) and res.items == [] and len(res.exchanges) == 1
    with pytest.raises(ParamsError, match="field 'path'"):
        run_live(spec, {})


def test_a_site_stand_in_borrows_what_its_endpoints_borrow() -> None:
    spec = site_spec("demo")
    assert isinstance(spec, EndpointSpec) and spec.site == "demo" and spec.queue == "demo"
    kinds = {k for s in (get_endpoint(n) for n in ("demo.h5.feed", "demo.app.detail",
                                                    "demo.pc.comment")) for k in s.resources}  # fmt: skip
    assert kinds <= set(spec.resources)
    assert site_spec("demo", "app").platform == "app"
    with pytest.raises(UnknownNameError, match="did you mean 'demo'"):
        site_spec("dmeo")


def test_items_a_before_store_hook_drops_are_counted_by_reason(
    site: TestSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`parse` says an item went to a hook, not that the selectors found nothing."""
    monkeypatch.setattr(h, "HOOKS", h.HookRegistry())

    @h.before_store("testsite.local.listing")
    def odd(ctx: object, item: object) -> object:
        return h.skip("odd") if getattr(item, "n", 0) % 2 else None

    res = run_live(get_endpoint("testsite.local.listing"), {"page": 1, "per": 3})
    assert [i.model_dump()["n"] for i in res.items] == [0, 2]
    assert res.dropped == {"odd": 1}
    assert run_live(get_endpoint("testsite.local.probe"), {"path": "/list"}).dropped == {}


def test_parse_says_each_request_as_it_happens_among_the_endpoints_log(
    site: TestSite, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A line the endpoint logs after its request comes after that request's `GET` line
    (every request was printed after the run, below log lines about its answer)."""
    from cli import parse

    monkeypatch.setattr(h, "HOOKS", h.HookRegistry())

    @h.before_store("testsite.local.listing")
    def said(ctx: Context, item: object) -> None:
        ctx.log.info("read the answer")

    monkeypatch.setattr(parse.procs, "ensure_redis", lambda s: "running")
    assert parse.run("testsite.local.listing", {"page": 1, "per": 1}) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [f"GET {site.url}/list?page=1&per=1 -> 200", "log: INFO read the answer"]
