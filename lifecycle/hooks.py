"""Lifecycle hooks: code a site author runs at five points of every page (before_request,
after_response, before_store, after_store, on_error), each answering with a signal that tells
the machinery what to do next. Signals become errors of the tree (`HookSkip`, `HookRetry`,
`HookFailed`) so a page's usual policy applies, and each hook's calls, time and answers are
counted in the endpoint's metrics. The points, signals, order and metrics: docs/hooks.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, overload

from config import get_settings
from exceptions import (
    CrawlError,
    DeadlineExceeded,
    HookFailed,
    HookRetry,
    HookSkip,
    Policy,
    policy_for,
)
from external_interface.storage.outbox import EntriesRefused, OutboxEntry, on_stored_entries
from monitor.metrics import TaskMetrics
from utils.redis import get_redis

Point = Literal["before_request", "after_response", "before_store", "after_store", "on_error"]
POINTS: tuple[Point, ...] = get_args(Point)
KINDS = ("continue", "skip", "retry", "fail")


@dataclass(frozen=True)
class Signal:
    """What a hook tells the machinery: go on, skip, retry or fail, with a reason."""

    kind: str
    reason: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"signal {self.kind!r}: one of {', '.join(KINDS)}")


CONTINUE = Signal("continue")


def skip(reason: str) -> Signal:
    return Signal("skip", reason)


def retry(reason: str) -> Signal:
    return Signal("retry", reason)


def fail(reason: str) -> Signal:
    return Signal("fail", reason)


@dataclass(frozen=True)
class Hook:
    point: Point
    fn: Callable[..., Any]
    endpoint: str | None = None
    site: str | None = None

    @property
    def name(self) -> str:
        mod = self.fn.__module__.removeprefix("sites.")
        return f"{mod}.{self.fn.__qualname__}"

    def applies(self, task: str) -> bool:
        if self.endpoint is not None:
            return task == self.endpoint
        if self.site is not None:
            return task.split(".", 1)[0] == self.site
        return True

    @property
    def rank(self) -> int:
        return 2 if self.endpoint is not None else 1 if self.site is not None else 0


class HookRegistry:
    """Every hook registered in this process, and the ordered list each endpoint runs."""

    def __init__(self) -> None:
        self._hooks: list[Hook] = []
        self._cache: dict[tuple[str, str], tuple[Hook, ...]] = {}
        self._lock = threading.Lock()
        # the points some hook is registered at: a page tests this before calling in here, so
        # a point without hooks costs it no call (the common case: no hooks at all)
        self.points: frozenset[str] = frozenset()

    def add(self, hook: Hook) -> None:
        with self._lock:
            # a module imported twice (tests reloading sites) registers its hooks once
            self._hooks = [
                h
                for h in self._hooks
                if (h.point, h.name, h.endpoint, h.site)
                != (hook.point, hook.name, hook.endpoint, hook.site)
            ]
            self._hooks.append(hook)
            self._changed()
        if hook.point == "after_store" and after_store_entries not in on_stored_entries:
            on_stored_entries.append(after_store_entries)  # the drainer calls it from now on

    def remove(self, fn: Callable[..., Any]) -> None:
        with self._lock:
            self._hooks = [h for h in self._hooks if h.fn is not fn]
            self._changed()

    def _changed(self) -> None:
        self._cache.clear()
        self.points = frozenset(h.point for h in self._hooks)

    def of(self, point: str, task: str) -> tuple[Hook, ...]:
        key = (point, task)
        found = self._cache.get(key)
        if found is None:
            with self._lock:
                mine = [h for h in self._hooks if h.point == point and h.applies(task)]
                found = tuple(sorted(mine, key=lambda h: h.rank))  # stable: registration order
                self._cache[key] = found
        return found

    def all(self) -> list[Hook]:
        return list(self._hooks)


HOOKS = HookRegistry()

F = Callable[..., Any]


def _registrar(point: Point) -> Callable[..., Any]:
    @overload
    def register(endpoint: F, /) -> F: ...

    @overload
    def register(
        endpoint: str | None = None, /, *, site: str | None = None
    ) -> Callable[[F], F]: ...

    def register(endpoint: Any = None, /, *, site: str | None = None) -> Any:
        if callable(endpoint):  # used bare: every endpoint
            HOOKS.add(Hook(point, endpoint))
            return endpoint
        if endpoint is not None and site is not None:
            raise ValueError(f"@{point}: give an endpoint or a site, not both")
        if endpoint is not None and len(str(endpoint).split(".")) < 2:
            raise ValueError(
                f"@{point}({endpoint!r}): an endpoint is site.platform.name (site=...?)"
            )

        def deco(fn: F) -> F:
            HOOKS.add(Hook(point, fn, endpoint, site))
            return fn

        return deco

    register.__name__ = point
    register.__doc__ = f"Register a `{point}` hook for one endpoint, `site=`, or every endpoint."
    return register


before_request = _registrar("before_request")
after_response = _registrar("after_response")
before_store = _registrar("before_store")
after_store = _registrar("after_store")
on_error = _registrar("on_error")


# --- running ------------------------------------------------------------------------------


Count = Callable[[str, int], None]


def counting(counter: MutableMapping[str, int]) -> Count:
    """A `Count` adding to a counter (a page's metrics before its Context exists)."""

    def count(key: str, by: int) -> None:
        counter[key] = counter.get(key, 0) + by

    return count


def _as_signal(hook: Hook, out: Any) -> Signal:
    if out is None:
        return CONTINUE
    if isinstance(out, Signal):
        return out
    raise TypeError(
        f"hook {hook.name} returned {type(out).__name__}: return None or a Signal "
        "(skip(reason), retry(reason), fail(reason))"
    )


def run(hooks: Sequence[Hook], count: Count, *args: Any) -> tuple[Signal, Hook | None]:
    """Call `hooks` in order until one does not continue; -> (its signal, it). Counts each
    hook's calls, time and signal; a hook's exception is counted and raised."""
    for h in hooks:
        base = f"hook:{h.point}:{h.name}"
        t0 = time.perf_counter()
        try:
            sig = _as_signal(h, h.fn(*args))
        except BaseException:
            count(f"{base}:error", 1)
            raise
        finally:
            count(f"{base}:calls", 1)
            count(f"{base}:us", round((time.perf_counter() - t0) * 1e6))
        count(f"{base}:{sig.kind}", 1)
        if sig.kind != "continue":
            return sig, h
    return CONTINUE, None


def signal_error(sig: Signal, hook: Hook, what: str) -> CrawlError:
    """A page's hook signal as the error whose policy does what it says."""
    why = f"{hook.point} hook {hook.name} said {sig.kind} ({sig.reason or 'no reason'}) for {what}"
    if sig.kind == "skip":
        return HookSkip(why, sig.reason or "hook")
    if sig.kind == "retry":
        return HookRetry(why)
    return HookFailed(why)


def in_page(ctx: Any, point: Point, task: str, what: str, *args: Any) -> None:
    """Run a page's hooks of `point` (before_request, after_response): a signal other than
    continue raises its error; past the page's deadline, DeadlineExceeded."""
    hooks = HOOKS.of(point, task)
    if not hooks:
        return
    sig, hook = run(hooks, ctx.count, ctx, *args)
    if hook is not None:
        raise signal_error(sig, hook, what)
    if ctx.remaining() <= 0:
        raise DeadlineExceeded(f"{task}: task deadline passed in its {point} hooks")


def filter_items(ctx: Any, task: str, items: list[Any]) -> list[Any]:
    """The page's items its before_store hooks keep: a skip drops the item (counted under
    `dropped:<reason>`), a retry or fail raises for the page."""
    hooks = HOOKS.of("before_store", task)
    if not hooks:
        return items
    kept = []
    for item in items:
        sig, hook = run(hooks, ctx.count, ctx, item)
        if hook is None:
            kept.append(item)
        elif sig.kind == "skip":
            ctx.count(f"dropped:{sig.reason or 'hook'}", 1)
        else:
            raise signal_error(sig, hook, f"a {type(item).__name__}")
        if ctx.remaining() <= 0:
            raise DeadlineExceeded(f"{task}: task deadline passed in its before_store hooks")
    return kept


def page_error(ctx: Any, task: str, exc: Exception, count: Count) -> Exception:
    """The error a page's on_error hooks make of `exc`: itself (continue), or the skip, retry
    or fail they say. Waits (a full pool, a shared limit) and hooks' own signals are no errors
    and are not shown to them; an exception an on_error hook raises becomes the page's error."""
    hooks = HOOKS.of("on_error", task)
    if not hooks or isinstance(exc, HookSkip | HookRetry | HookFailed):
        return exc
    if policy_for(exc) is Policy.WAIT:
        return exc
    try:
        sig, hook = run(hooks, count, ctx, exc)
    except Exception as raised:
        return raised
    if hook is None:
        return exc
    return signal_error(sig, hook, f"{type(exc).__name__}: {exc}")


# --- after_store: in the outbox drainer --------------------------------------------------------


@dataclass
class StoredContext:
    """What an after_store hook sees of where its item came from: the endpoint (`task`), its
    `site`, the run and step, the item type; `count()` adds to the endpoint's metrics."""

    task: str
    site: str
    run_id: str
    step: str
    item_type: str
    metrics: TaskMetrics = field(default_factory=TaskMetrics, repr=False)

    def count(self, counter: str, by: int = 1) -> None:
        self.metrics.counts[counter] += by


def after_store_entries(item_type: str, entries: list[OutboxEntry]) -> None:
    """The drainer's entries hook: each stored item through its endpoint's after_store hooks.
    A skip passes the item no further; a retry (or an error whose policy is not fail) writes
    its entry again later and calls its hooks again (at least once); a fail (or a fail-policy
    error) sends its entry to the outbox dead letters with the reason. An entry holds the
    items of one step's pages committed together (a batch): its fate is theirs."""
    refused: dict[str, str] = {}
    again: set[str] = set()
    contexts: list[StoredContext] = []
    try:
        for e in entries:
            hooks = HOOKS.of("after_store", e.task)
            if not hooks:
                continue
            sctx = StoredContext(e.task, e.task.split(".", 1)[0], e.run, e.step, item_type)
            contexts.append(sctx)
            for item in e.items:
                try:
                    sig, hook = run(hooks, sctx.count, sctx, item)
                except Exception as exc:
                    if policy_for(exc) is Policy.FAIL:
                        refused[e.id] = f"after_store: {type(exc).__name__}: {exc}"
                    else:
                        again.add(e.id)
                    break
                if hook is None:
                    continue
                if sig.kind == "skip":
                    sctx.count(f"after_store_skipped:{sig.reason or 'hook'}", 1)
                    continue
                if sig.kind == "retry":
                    again.add(e.id)
                else:
                    refused[e.id] = str(signal_error(sig, hook, f"a stored {item_type}"))
                break
    finally:
        _flush(contexts)
    if refused or again:
        raise EntriesRefused(refused, again)


def _flush(contexts: Iterable[StoredContext]) -> None:
    s = get_settings()
    pipe = None
    for c in contexts:
        if c.metrics.counts:
            pipe = pipe or get_redis(s.redis_url).pipeline(transaction=False)
            c.metrics.flush(pipe, c.task, c.site, s)
    if pipe is not None:
        pipe.execute()


__all__ = [
    "CONTINUE",
    "HOOKS",
    "Hook",
    "Signal",
    "StoredContext",
    "after_response",
    "after_store",
    "before_request",
    "before_store",
    "fail",
    "on_error",
    "retry",
    "skip",
]
