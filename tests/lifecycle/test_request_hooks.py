"""`ctx.request` and its before_request hooks: the hooks change the request the providers
then lend to, and what they all left is what the fetcher is given."""

from __future__ import annotations

from typing import Any

import pytest

from base_task import Params
from external_interface.fetch import FetchRequest, Response
from external_interface.resources.base import Outcome, OutgoingRequest, providers
from lifecycle import hooks as h
from lifecycle import runtime
from lifecycle.context import Context
from lifecycle.endpoints import EndpointSpec
from monitor.metrics import TaskMetrics
from utils.wire import TaskMeta

TASK = "rqhook.local.page"
SEEN: dict[str, list[OutgoingRequest]] = {"hook": [], "prepare": [], "feedback": []}


class SigningProvider:
    """Signs what it is lent (a parameter, a header) and keeps the requests it saw."""

    kind = "sign"

    def prepare(self, req: OutgoingRequest, task: Any) -> None:
        SEEN["prepare"].append(req)
        req.params["sig"] = "abc"
        req.headers["X-Device-Id"] = "dev-1"

    def feedback(self, req: OutgoingRequest, outcome: Outcome, task: Any) -> None:
        SEEN["feedback"].append(req)


providers.add("rqhook_test_sign", lambda site, platform: SigningProvider())


class RecordingFetcher:
    """Answers 200 to everything; keeps what it was asked to send."""

    def __init__(self) -> None:
        self.sent: list[FetchRequest] = []

    def fetch(self, req: FetchRequest) -> Response:
        self.sent.append(req)
        return Response(url=req.url, status=200, headers={}, content=b"ok", elapsed=0.1)


class P(Params):
    pass


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> h.HookRegistry:
    reg = h.HookRegistry()
    monkeypatch.setattr(h, "HOOKS", reg)
    for seen in SEEN.values():
        seen.clear()
    return reg


def context(fetcher: RecordingFetcher) -> Context:
    spec = EndpointSpec(name=TASK, site="rqhook", platform="local", fn=lambda c, p: (),
                        params=P, item_types=(), resources={"sign": "rqhook_test_sign"})  # fmt: skip
    return Context(spec, P(), TaskMeta(), runtime.current(), TaskMetrics(), fetcher)


def test_what_the_hooks_change_is_what_the_providers_lend_to_and_what_is_sent(
    registry: h.HookRegistry,
) -> None:
    @h.before_request(TASK)
    def rewrite(ctx: Any, req: OutgoingRequest) -> None:
        SEEN["hook"].append(req)
        req.method = "POST"
        req.url = f"http://127.0.0.1:1/api/{req.url}"
        req.params["page"] = 2
        req.headers["Accept-Language"] = "zh"
        req.cookies["session"] = "s1"
        req.json = {"id": 7}

    caller_params = {"q": "x"}
    fetcher = RecordingFetcher()
    resp = context(fetcher).get("post-7", params=caller_params, headers={"X-A": "1"})

    assert resp.status == 200
    (sent,) = fetcher.sent
    assert (sent.method, sent.url) == ("POST", "http://127.0.0.1:1/api/post-7")
    assert sent.params == {"q": "x", "page": 2, "sig": "abc"}
    assert sent.headers is not None and sent.headers["Accept-Language"] == "zh"
    assert sent.headers["X-A"] == "1" and sent.headers["X-Device-Id"] == "dev-1"
    assert sent.cookies == {"session": "s1"} and sent.json == {"id": 7}
    # one request from the hooks to the feedback: the one the hooks changed
    (drafted,) = SEEN["hook"]
    assert len(SEEN["prepare"]) == len(SEEN["feedback"]) == 1
    assert SEEN["prepare"][0] is drafted and SEEN["feedback"][0] is drafted
    assert caller_params == {"q": "x"}  # the caller's mappings are copied, never changed


def test_without_hooks_the_request_goes_as_asked(registry: h.HookRegistry) -> None:
    fetcher = RecordingFetcher()
    context(fetcher).post("http://127.0.0.1:1/x", data=b"body", cookies={"c": "1"})
    (sent,) = fetcher.sent
    assert (sent.method, sent.url, sent.data) == ("POST", "http://127.0.0.1:1/x", b"body")
    assert sent.params == {"sig": "abc"} and sent.cookies == {"c": "1"}
