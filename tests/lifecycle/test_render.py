"""`ctx.render` without a browser: a stand-in pool records what the page would be rendered
with, so these show what the Context does around a render — the declaration it needs, what
the providers lend (proxy, cookies, user agent on the browser context), the deadline, the
document's status as the typed errors of `ctx.get`, and what the providers hear.
(Rendering for real: tests/integration/test_render_*.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from base_task import Params
from config import ROOT
from exceptions import (
    BannedError,
    BrowserCrashed,
    ConfigError,
    DeadlineExceeded,
    NotFound,
    RenderTimeout,
    ResourceUnavailable,
    ServerError,
)
from external_interface.browser import RenderRequest, RenderResult, WaitFor
from external_interface.browser.pool import PoolConfig
from external_interface.fetch import Response
from external_interface.resources.base import Outcome, OutgoingRequest, providers
from lifecycle import runtime
from lifecycle.context import Context
from lifecycle.endpoints import EndpointSpec
from monitor.metrics import TaskMetrics
from utils.wire import TaskMeta

LOGIN_WALL = b'<html><body class="page-login"><div id="login-wall">log in</div></body></html>'


@dataclass
class Heard:
    """What the stand-in providers were told, in order."""

    events: list[tuple[str, str, Any]] = field(default_factory=list)


HEARD = Heard()


class RecordingProvider:
    """A provider that lends one kind (`kind`) and records prepare / feedback / cancel."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def prepare(self, req: OutgoingRequest, task: Any) -> None:
        if self.kind == "proxy":
            req.proxy = "http://user:pw@127.0.0.9:3128"
        elif self.kind == "cookie":
            req.cookies["session"] = "s3cret"
        elif self.kind == "user_agent":
            req.headers["User-Agent"] = "Mozilla/5.0 (X11; Linux x86_64) Test/1.0"
        elif self.kind == "sign":
            req.params["sig"] = "abc"
            req.headers["X-Device-Id"] = "dev-1"
        req.leases[self.kind] = f"{self.kind}-1"
        HEARD.events.append(("prepare", self.kind, None))

    def feedback(self, req: OutgoingRequest, outcome: Outcome, task: Any) -> None:
        HEARD.events.append(("feedback", self.kind, outcome))
        if self.kind == "cookie" and b"login-wall" in outcome.text_sample.encode():
            raise BannedError("cookie cookie-1 rejected by the site (login wall)")

    def cancel(self, req: OutgoingRequest, task: Any) -> None:
        HEARD.events.append(("cancel", self.kind, None))


for _kind in ("proxy", "cookie", "user_agent", "sign"):
    providers.add(f"render_test_{_kind}", lambda site, platform, k=_kind: RecordingProvider(k))


class FakePool:
    """Answers renders with `answer` (a RenderResult or an exception); keeps the requests."""

    def __init__(self) -> None:
        self.config = PoolConfig(executable="", contexts=1, context_pages=1, memory_mb=1,
                                 timeout=30.0, queue_wait=1.0, block=())  # fmt: skip
        self.requests: list[RenderRequest] = []
        self.answer: RenderResult | Exception = page(200, b"<html><body><p>ok</p></body></html>")

    def render(self, req: RenderRequest) -> RenderResult:
        self.requests.append(req)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def page(status: int, body: bytes, captured: tuple[Response, ...] = ()) -> RenderResult:
    resp = Response(url="http://127.0.0.1:1/x", status=status, headers={}, content=body,
                    elapsed=0.5, declared_encoding="utf-8")  # fmt: skip
    return RenderResult(response=resp, captured=captured, steps=({"action": "wait_for"},))


class P(Params):
    pass


def spec(resources: dict[str, str], deadline: float | None = None) -> EndpointSpec:
    # one name per resource set: the runtime plans each endpoint's providers once
    name = "rtest.local." + "_".join(sorted(resources))
    return EndpointSpec(name=name, site="rtest", platform="local", fn=lambda c, p: (),
                        params=P, item_types=(), resources=resources, deadline=deadline)  # fmt: skip


ALL = {"browser": "browser", **{k: f"render_test_{k}" for k in ("proxy", "cookie", "user_agent", "sign")}}  # fmt: skip


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePool]:
    fake = FakePool()
    monkeypatch.setattr("lifecycle.context.get_pool", lambda: fake)
    HEARD.events.clear()
    yield fake


def context(resources: dict[str, str] = ALL, deadline: float | None = None) -> Context:
    metrics = TaskMetrics()
    return Context(spec(resources, deadline), P(), TaskMeta(), runtime.current(), metrics)


def test_rendering_needs_the_browser_declared(pool: FakePool) -> None:
    ctx = context({"cookie": "render_test_cookie"})
    with pytest.raises(
        ConfigError, match=r"rtest.local.cookie: ctx.render needs resources=\['browser'\]"
    ):
        ctx.render("http://127.0.0.1:1/x")
    assert pool.requests == [] and HEARD.events == []  # nothing lent, nothing rendered


def test_the_lent_resources_go_to_the_browser_context_and_hear_the_answer(pool: FakePool) -> None:
    ctx = context()
    got = ctx.render("http://127.0.0.1:1/x", params={"page": 2}, wait_for="p",
                     actions=[WaitFor("p")], headers={"Accept-Language": "zh"})  # fmt: skip
    req = pool.requests[0]
    assert req.url == "http://127.0.0.1:1/x?page=2&sig=abc"  # signed parameters in the URL
    assert req.proxy == "http://user:pw@127.0.0.9:3128"  # one proxy per context
    assert dict(req.cookies) == {"session": "s3cret"}
    assert req.user_agent == "Mozilla/5.0 (X11; Linux x86_64) Test/1.0"  # the context's UA
    assert dict(req.headers) == {"Accept-Language": "zh", "X-Device-Id": "dev-1"}
    assert req.wait_for == "p" and req.actions == (WaitFor("p"),)
    assert "s3cret" not in repr(req) and "pw@" not in repr(req)
    # proxy first, sign last, as for a request; each heard the rendered page's answer
    assert [(e, k) for e, k, _ in HEARD.events] == [
        ("prepare", "proxy"), ("prepare", "user_agent"), ("prepare", "cookie"), ("prepare", "sign"),
        ("feedback", "proxy"), ("feedback", "user_agent"), ("feedback", "cookie"), ("feedback", "sign"),
    ]  # fmt: skip
    outcome = HEARD.events[-1][2]
    assert outcome.status == 200 and "<p>ok</p>" in outcome.text_sample
    assert got.css("p::text").get() == "ok" and got.steps == ({"action": "wait_for"},)
    assert ctx._metrics.counts["renders"] == 1 and ctx._metrics.counts["http:200"] == 1


def test_a_render_never_outlives_the_task(pool: FakePool) -> None:
    context(deadline=4.0).render("http://127.0.0.1:1/x", timeout=60)
    assert pool.requests[0].timeout is not None and pool.requests[0].timeout <= 4.0
    context().render("http://127.0.0.1:1/x", timeout=7)
    assert pool.requests[1].timeout == 7
    context().render("http://127.0.0.1:1/x")
    assert pool.requests[2].timeout == 30.0  # the pool's default (CHAINCRAWL_BROWSER_TIMEOUT)
    ctx = context(deadline=0.01)
    while ctx.remaining() > 0:
        pass
    with pytest.raises(DeadlineExceeded):
        ctx.render("http://127.0.0.1:1/x")


def test_statuses_raise_the_typed_errors_of_get(pool: FakePool) -> None:
    pool.answer = page(503, b"<html>busy</html>")
    ctx = context()
    with pytest.raises(ServerError):
        ctx.render("http://127.0.0.1:1/x")
    assert ctx.report.failed_leases == {"proxy:proxy-1", "cookie:cookie-1", "user_agent:user_agent-1",
                                  "sign:sign-1"}  # fmt: skip
    pool.answer = page(404, b"<html>gone</html>")
    with pytest.raises(NotFound):
        context().render("http://127.0.0.1:1/x")
    assert context().render("http://127.0.0.1:1/x", ok_statuses=[404]).status == 404


def test_a_ban_seen_in_the_rendered_page_is_raised(pool: FakePool) -> None:
    pool.answer = page(200, LOGIN_WALL)
    ctx = context()
    with pytest.raises(BannedError, match="login wall"):
        ctx.render("http://127.0.0.1:1/x")
    assert "cookie:cookie-1" in ctx.report.failed_leases  # the retry gets another session


@pytest.mark.parametrize("error", [RenderTimeout("slow"), BrowserCrashed("gone")])
def test_a_failed_render_is_an_outcome_the_providers_hear(pool: FakePool, error: Exception) -> None:
    pool.answer = error
    ctx = context()
    with pytest.raises(type(error)):
        ctx.render("http://127.0.0.1:1/x")
    heard = [(e, k, o.error) for e, k, o in HEARD.events if e == "feedback"]
    assert heard and all(err is error for _, _, err in heard)
    assert ctx._metrics.counts["requests"] == 1 and ctx._metrics.counts["renders"] == 0


def test_a_render_that_never_started_gives_the_resources_back(pool: FakePool) -> None:
    pool.answer = ResourceUnavailable("all contexts busy", retry_after=1.0)
    with pytest.raises(ResourceUnavailable):
        context().render("http://127.0.0.1:1/x")
    assert [e for e, _, _ in HEARD.events].count("cancel") == 4
    assert not [e for e, _, _ in HEARD.events if e == "feedback"]


def test_a_bad_request_fails_before_anything_is_lent(pool: FakePool) -> None:
    with pytest.raises(ValueError, match="wait_until"):
        context().render("http://127.0.0.1:1/x", wait_until="soon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="absolute http"):
        context().render("/relative")
    assert HEARD.events == [] and pool.requests == []


def test_captured_answers_come_with_the_page(pool: FakePool) -> None:
    api = Response(url="http://127.0.0.1:1/api", status=200, headers={}, content=b'{"n": 1}',
                   elapsed=0.0)  # fmt: skip
    pool.answer = page(200, b"<html></html>", captured=(api,))
    got = context().render("http://127.0.0.1:1/x", capture_json="/api")
    assert pool.requests[0].capture_json == "/api"
    assert got.json_answers() == [{"n": 1}] and got.captured[0].url.endswith("/api")


def test_a_worker_running_plain_endpoints_never_loads_playwright() -> None:
    """Every site is imported (rendering endpoints included) and a plain page runs: no
    Playwright in the process, no browser driver below it."""
    code = textwrap.dedent("""
        import os, sys
        import worker, sites
        from base_task import run_endpoint
        from external_interface.browser import procmem
        from external_interface.fetch.mock import FixtureFetcher
        sites.load_all()
        assert sites.get_endpoint("demo.js.detail").renders
        fixture = "tests/sites/demo/h5/fixtures/post_p3.json"
        items, _ = run_endpoint("demo.h5.detail", {"post_id": "p3"}, FixtureFetcher({"/h5/api/post/p3": fixture}))
        assert [i.post_id for i in items] == ["p3"]
        sys.exit(("playwright" in sys.modules) or bool(procmem.descendants(os.getpid())))
    """)  # fmt: skip
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
