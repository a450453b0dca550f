"""The hook registry and runner: order, signals, counts, and what a page does with them."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from exceptions import DeadlineExceeded, HookFailed, HookRetry, HookSkip, NotFound, Throttled
from external_interface.storage.outbox import EntriesRefused, OutboxEntry
from lifecycle import hooks as h


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> h.HookRegistry:
    reg = h.HookRegistry()
    monkeypatch.setattr(h, "HOOKS", reg)
    return reg


class FakeCtx:
    def __init__(self, left: float = 10.0) -> None:
        self.counts: Counter[str] = Counter()
        self.left = left
        self.params = None

    def count(self, name: str, by: int = 1) -> None:
        self.counts[name] += by

    def remaining(self) -> float:
        return self.left


def test_hooks_run_every_endpoints_then_the_sites_then_the_endpoints_own(registry) -> None:
    order: list[str] = []

    @h.before_store("shop.pc.item")
    def own(ctx: Any, item: Any) -> None:
        order.append("own")

    @h.before_store(site="shop")
    def site(ctx: Any, item: Any) -> None:
        order.append("site")

    @h.before_store
    def every(ctx: Any, item: Any) -> None:
        order.append("every")

    @h.before_store(site="news")
    def other(ctx: Any, item: Any) -> None:
        order.append("other")

    assert [x.fn for x in registry.of("before_store", "shop.pc.item")] == [every, site, own]
    h.filter_items(FakeCtx(), "shop.pc.item", ["i"])
    assert order == ["every", "site", "own"]
    assert registry.of("after_store", "shop.pc.item") == ()


def test_registration_mistakes_are_named() -> None:
    with pytest.raises(ValueError, match="not both"):
        h.before_request("shop.pc.item", site="shop")
    with pytest.raises(ValueError, match=r"site\.platform\.name"):
        h.before_request("shop")
    with pytest.raises(ValueError, match="signal 'later'"):
        h.Signal("later")


def test_the_first_hook_not_continuing_decides_and_every_call_is_counted(registry) -> None:
    @h.after_response
    def first(ctx: Any, resp: Any) -> Any:
        return h.CONTINUE

    @h.after_response
    def second(ctx: Any, resp: Any) -> Any:
        return h.retry("soft block page")

    @h.after_response
    def third(ctx: Any, resp: Any) -> Any:  # pragma: no cover - never reached
        raise AssertionError("not called after a retry")

    ctx = FakeCtx()
    with pytest.raises(HookRetry, match=r"said retry \(soft block page\)"):
        h.in_page(ctx, "after_response", "shop.pc.item", "GET /x", object())
    name = "tests.lifecycle.test_hooks."
    first_n = f"hook:after_response:{name}test_the_first_hook_not_continuing_decides_and_every_call_is_counted.<locals>.first"
    assert ctx.counts[f"{first_n}:calls"] == 1 and ctx.counts[f"{first_n}:continue"] == 1
    assert ctx.counts[f"{first_n}:us"] >= 0
    assert sum(v for k, v in ctx.counts.items() if k.endswith(":retry")) == 1
    assert not any("third" in k for k in ctx.counts)


def test_signals_become_the_errors_of_their_policy(registry) -> None:
    answer: dict[str, Any] = {}

    @h.before_request
    def hook(ctx: Any, req: Any) -> Any:
        return answer.get("sig")

    for sig, err in ((h.skip("robots-like"), HookSkip), (h.fail("no"), HookFailed)):
        answer["sig"] = sig
        with pytest.raises(err) as got:
            h.in_page(FakeCtx(), "before_request", "a.b.c", "GET /", None)
        if err is HookSkip:
            assert got.value.reason == "robots-like"  # type: ignore[attr-defined]
    answer["sig"] = None
    with pytest.raises(DeadlineExceeded):  # continued, but past the page's deadline
        h.in_page(FakeCtx(left=-1), "before_request", "a.b.c", "GET /", None)
    answer["sig"] = "yes"
    with pytest.raises(TypeError, match="return None or a Signal"):
        h.in_page(FakeCtx(), "before_request", "a.b.c", "GET /", None)


def test_before_store_drops_what_it_skips_counting_the_reason(registry) -> None:
    @h.before_store(site="shop")
    def rule(ctx: Any, item: int) -> Any:
        return h.skip("odd") if item % 2 else None

    ctx = FakeCtx()
    assert h.filter_items(ctx, "shop.pc.item", [1, 2, 3, 4]) == [2, 4]
    assert ctx.counts["dropped:odd"] == 2


def test_on_error_turns_an_error_into_what_it_says_but_leaves_waits_alone(registry) -> None:
    @h.on_error("shop.pc.item")
    def handle(ctx: Any, exc: BaseException) -> Any:
        if isinstance(exc, NotFound):
            return h.skip("gone")
        if isinstance(exc, KeyError):
            raise NotFound("replaced", 404)
        return None

    counts: Counter[str] = Counter()
    count = h.counting(counts)
    out = h.page_error(None, "shop.pc.item", NotFound("404", 404), count)
    assert isinstance(out, HookSkip) and out.reason == "gone"
    wait = Throttled("over the limit")
    assert h.page_error(None, "shop.pc.item", wait, count) is wait  # no error: not shown
    assert isinstance(h.page_error(None, "shop.pc.item", KeyError("x"), count), NotFound)
    plain = ValueError("bug")
    assert h.page_error(None, "shop.pc.item", plain, count) is plain
    assert sum(v for k, v in counts.items() if k.endswith(":calls")) == 3


def entry(eid: str, task: str, *items: dict[str, Any]) -> OutboxEntry:
    return OutboxEntry(eid, {}, run="r1", step="s", task=task, type="shop.item", items=list(items))


def test_after_store_sets_entries_apart_for_now_or_for_good(registry, monkeypatch) -> None:
    flushed: list[h.StoredContext] = []
    monkeypatch.setattr(h, "_flush", lambda cs: flushed.extend(cs))

    @h.after_store(site="shop")
    def judge(ctx: h.StoredContext, item: dict[str, Any]) -> Any:
        ctx.count(f"seen:{item['k']}")
        return {"later": h.retry("sink lag"), "bad": h.fail("rule"),
                "quiet": h.skip("quiet")}.get(item["k"])  # fmt: skip

    with pytest.raises(EntriesRefused) as got:
        h.after_store_entries("shop.item", [
            entry("1-0", "shop.pc.item", {"k": "ok"}, {"k": "quiet"}),
            entry("2-0", "shop.pc.item", {"k": "later"}),
            entry("3-0", "shop.pc.item", {"k": "bad"}, {"k": "never"}),
            entry("4-0", "news.pc.item", {"k": "bad"}),  # no hook of its site
        ])  # fmt: skip
    assert got.value.again == {"2-0"}
    assert list(got.value.dead) == ["3-0"] and "said fail (rule)" in got.value.dead["3-0"]
    counts: Counter[str] = Counter()
    for c in flushed:
        counts.update(c.metrics.counts)
    assert counts["after_store_skipped:quiet"] == 1
    assert counts["seen:never"] == 0  # the entry's items after a fail are not hooked
    assert all(c.task == "shop.pc.item" and c.site == "shop" for c in flushed)


def test_the_points_with_a_hook_are_known_without_a_call(
    registry: h.HookRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page tests `HOOKS.points` before calling in: a point without hooks costs no call;
    the drainer's entries hook is registered with the first after_store hook."""
    entries_hooks: list[Any] = []
    monkeypatch.setattr(h, "on_stored_entries", entries_hooks)
    assert registry.points == frozenset()

    def keep(ctx: Any, item: Any) -> None:
        return None

    h.before_store("shop.pc.item")(keep)
    assert registry.points == {"before_store"} and entries_hooks == []
    h.after_store(site="shop")(keep)
    assert registry.points == {"before_store", "after_store"}
    assert entries_hooks == [h.after_store_entries]
    h.after_store("shop.pc.item")(keep)
    assert entries_hooks == [h.after_store_entries]  # once
    registry.remove(keep)
    assert registry.points == frozenset()
