"""The endpoint contract a site author holds: what `base_task` exports, what `endpoint()`
accepts, and what a `Context` shows."""

from __future__ import annotations

import inspect

import pytest

import base_task
from base_task import Context, Params, endpoint

PUBLIC_CONTEXT = {
    "count", "follow", "get", "log", "params", "post", "remaining", "render", "report",
    "request",
}  # fmt: skip


def test_everything_in_all_is_importable_and_the_errors_endpoints_raise_are_there() -> None:
    for name in base_task.__all__:
        assert getattr(base_task, name) is not None
    assert {"ParseError", "LoginRequired", "BannedError", "NotFound", "CrawlError",
            "ResourceUnavailable"} <= set(base_task.__all__)  # fmt: skip
    assert {"Context", "Item", "Params", "Outputs", "endpoint", "run_endpoint"} <= set(
        base_task.__all__
    )


def test_endpoint_takes_its_documented_options_only() -> None:
    options = set(inspect.signature(endpoint).parameters)
    assert options == {"params", "items", "name", "resources", "max_retries", "deadline",
                       "request_timeout", "queue", "decode_errors", "fetcher", "render",
                       "must_yield"}  # fmt: skip
    with pytest.raises(TypeError, match="acks_late"):
        endpoint(Params, acks_late=False)  # type: ignore[call-arg]


def test_a_context_shows_endpoints_only_its_public_surface() -> None:
    public = {n for n in dir(Context) if not n.startswith("_")}
    assert public == PUBLIC_CONTEXT - {"params", "log", "report"}  # instance attributes
    init = inspect.getsource(Context.__init__)
    assigned = {line.split("=")[0].strip().removeprefix("self.").split(":")[0]
                for line in init.splitlines() if line.strip().startswith("self.")}  # fmt: skip
    assert {a for a in assigned if not a.startswith("_")} == {"params", "log", "report"}


def test_render_takes_the_options_the_docs_list_and_returns_a_response() -> None:
    """`ctx.render` (README's endpoint section, docs/browser.md): the page is a Response of
    the DOM that also carries the captured answers."""
    sig = inspect.signature(Context.render)
    assert set(sig.parameters) == {
        "self", "url", "wait_for", "actions", "timeout", "capture_json", "params", "headers",
        "cookies", "wait_until", "block", "ok_statuses", "resources",
    }  # fmt: skip
    assert all(
        p.kind is inspect.Parameter.KEYWORD_ONLY
        for n, p in sig.parameters.items()
        if n not in ("self", "url")
    )
    page = inspect.get_annotations(Context.render, eval_str=True)["return"]
    assert issubclass(page, base_task.Response)
    assert {"captured", "steps", "json_answers", "css", "xpath", "json"} <= set(dir(page))
