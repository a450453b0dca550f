from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, cast

import pytest

from base_task import Item, Params, backoff, endpoint, get_endpoint, run_endpoint
from config import Settings
from exceptions import ParamsError, Policy, UndecodableText, policy_for
from external_interface.fetch import Response
from external_interface.fetch.mock import MockFetcher
from ledger.publish import broker_priority
from utils.registry import UnknownNameError

if TYPE_CHECKING:
    from tests.testsite.local.text import TextResult


def test_bad_parameter_is_rejected_naming_the_field() -> None:
    spec = get_endpoint("testsite.local.reviews")
    with pytest.raises(ParamsError) as ei:
        spec.validate_params({"entry_id": "e1", "page": "two"})
    msg = str(ei.value)
    assert "testsite.local.reviews" in msg and "'page'" in msg


def test_missing_and_unknown_parameters_are_named() -> None:
    spec = get_endpoint("testsite.local.reviews")
    with pytest.raises(ParamsError, match="'entry_id'"):
        spec.validate_params({})
    with pytest.raises(ParamsError, match="'pgae'"):
        spec.validate_params({"entry_id": "e1", "pgae": 2})
    with pytest.raises(ParamsError, match="must be an object"):
        spec.validate_params(["e1"])


def test_endpoint_spec_derives_site_platform_queue() -> None:
    spec = get_endpoint("testsite.local.listing")
    assert (spec.site, spec.platform, spec.queue) == ("testsite", "local", "testsite")
    assert spec.task.name == "testsite.local.listing"
    assert spec.task.acks_late and spec.task.reject_on_worker_lost


def test_unknown_task_suggests_the_closest_name() -> None:
    with pytest.raises(UnknownNameError, match=r"did you mean 'testsite.local.listing'"):
        get_endpoint("testsite.local.listin")


def test_item_requires_key_fields_that_exist() -> None:
    with pytest.raises(TypeError, match="key_fields"):

        class Bad(Item):
            item_type: ClassVar[str] = "x.bad"
            key_fields: ClassVar[tuple[str, ...]] = ("nope",)
            a: int


def test_params_forbid_unknown_fields() -> None:
    class P(Params):
        a: int

    with pytest.raises(ValueError):
        P(a=1, b=2)  # type: ignore[call-arg]


def test_backoff_grows_with_jitter_and_stays_under_visibility_timeout() -> None:
    s = Settings(retry_backoff=1.0, retry_backoff_max=300, visibility_timeout=60)
    samples = [backoff(0, s) for _ in range(200)]
    assert all(0.5 <= x <= 1.0 for x in samples) and len(set(samples)) > 100
    assert all(4 <= backoff(3, s) <= 8 for _ in range(50))
    assert all(backoff(20, s) <= 30 for _ in range(50))  # half the visibility timeout


def test_priority_is_mirrored_for_redis_only() -> None:
    assert broker_priority(9, "redis://x") == 0 and broker_priority(0, "redis://x") == 9
    assert broker_priority(9, "amqp://x") == 9
    assert broker_priority(42, "amqp://x") == 9


def test_resource_plan_orders_kinds_and_applies_overrides() -> None:
    from lifecycle.runtime import Runtime

    spec = get_endpoint("testsite.local.listing")
    spec_res = dict(spec.resources)
    try:
        spec.resources = {"sign": "sign", "user_agent": "user_agent", "cookie": "cookie"}
        s = Settings(providers="cookie=noop,testsite.user_agent=ua_static", proxy_sites="testsite")
        assert Runtime(s).resource_plan(spec) == [
            ("proxy", "proxy"),
            ("user_agent", "ua_static"),
            ("cookie", "noop"),
            ("sign", "sign"),
        ]
    finally:
        spec.resources = spec_res


def test_secrets_are_masked_in_displayed_arguments() -> None:
    from utils.logsafe import mask, redact

    shown = repr(
        mask(({"post_id": "p1", "cookie": "sid=abc", "nested": {"password": "pw"}}, {"run": "r"}))
    )
    assert "p1" in shown and "sid=abc" not in shown and "pw'" not in shown
    assert (
        redact("via http://user:hunter2@127.0.0.2:8080/x") == "via http://***:***@127.0.0.2:8080/x"
    )
    assert "abc123" not in redact("Set-Cookie: session=abc123; Path=/")


def _latin1_page(req: Any) -> Response:
    body = '<p class="t">café</p>'.encode("latin-1")
    return Response(req.url, 200, {}, body, 0.0, "utf-8")


def test_undecodable_text_is_counted_and_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        items, _ = run_endpoint("testsite.local.text", {"path": "/x"}, MockFetcher(_latin1_page))
    assert cast("TextResult", items[0]).title == "caf\ufffd"
    assert "1 bytes are not valid utf-8" in caplog.text and 'decode_errors="strict"' in caplog.text


def test_a_strict_endpoint_fails_the_page_on_undecodable_text() -> None:
    assert get_endpoint("testsite.local.text_strict").decode_errors == "strict"
    with pytest.raises(UndecodableText, match="not valid utf-8"):
        run_endpoint("testsite.local.text_strict", {"path": "/x"}, MockFetcher(_latin1_page))
    assert policy_for(UndecodableText("x")) is Policy.FAIL  # the same bytes on every retry


def test_decode_errors_takes_replace_or_strict() -> None:
    with pytest.raises(ValueError, match="decode_errors"):
        endpoint(Params, name="x.y.z", decode_errors="ignore")  # type: ignore[arg-type]
