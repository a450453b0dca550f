"""The page actions of a render, run by the driver on a Playwright page (async API).

Every wait is bounded twice: by the action's own `settle_ms` (how long one round may take to
add content) and by the render's deadline. A round that runs into the deadline raises
`Deadline`; one that stalls before its end is reached raises `Stalled`; both end the render
as a timeout (retried) with the page's screenshot attached. Infinite scroll without an `until`
marker is the one case where "no new content" is the normal end, and only once the page's
network has been quiet for the action's `quiet_ms` (network.py). Before each wait the runner
tells its `Progress` what it waits for, so a timeout's message can name it.

Playwright objects are typed `Any`: this module never imports Playwright (the driver hands
in its TimeoutError class), so the worker side can import the package without it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from external_interface.browser.model import (
    Action,
    Click,
    LoadMore,
    ScrollToEnd,
    Wait,
    WaitFor,
)
from external_interface.browser.network import Network, Progress

# elements matching `sel`, or every element of the page when no selector is given
_COUNT = "(sel) => sel ? document.querySelectorAll(sel).length : document.getElementsByTagName('*').length"
_GROWN = """([sel, before, until]) => {
  if (until && document.querySelector(until)) return true;
  const n = sel ? document.querySelectorAll(sel).length : document.getElementsByTagName('*').length;
  return n > before;
}"""
_SCROLL = "() => window.scrollTo(0, Math.max(document.documentElement.scrollHeight, document.body ? document.body.scrollHeight : 0))"
_USABLE = """(sel) => {
  const el = document.querySelector(sel);
  if (!el || el.disabled || el.getAttribute('aria-disabled') === 'true') return false;
  const style = window.getComputedStyle(el);
  const box = el.getBoundingClientRect();
  return style.visibility !== 'hidden' && style.display !== 'none' && box.width > 0 && box.height > 0;
}"""


class Deadline(Exception):
    """The render's deadline ran out inside an action."""


class Stalled(Exception):
    """An action waited `settle_ms` for content that never came, before its end was reached."""


Remaining = Callable[[], float]  # milliseconds left until the render's deadline


class Runner:
    """Runs one render's actions on `page`; `timeout_error` is Playwright's TimeoutError."""

    def __init__(
        self,
        page: Any,
        remaining: Remaining,
        timeout_error: type[Exception],
        net: Network | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.page = page
        self.remaining = remaining
        self.timeout_error = timeout_error
        self.net = net or Network()
        self.progress = progress or Progress()

    def _left(self) -> float:
        left = self.remaining()
        if left <= 0:
            raise Deadline("the render's deadline ran out")
        return left

    async def run(self, action: Action) -> dict[str, Any]:
        if isinstance(action, WaitFor):
            self.progress.waiting(f"waiting for WaitFor {action.selector!r} ({action.state})", True)
            await self.page.wait_for_selector(
                action.selector, state=action.state, timeout=self._left()
            )
            return {"action": action.kind, "selector": action.selector}
        if isinstance(action, Click):
            self.progress.waiting(f"waiting to click Click {action.selector!r}", True)
            await self.page.click(action.selector, timeout=self._left())
            if action.wait_for:
                self.progress.waiting(f"waiting for Click.wait_for {action.wait_for!r}", True)
                await self.page.wait_for_selector(action.wait_for, timeout=self._left())
            return {"action": action.kind, "selector": action.selector}
        if isinstance(action, Wait):
            self.progress.waiting(f"in Wait({action.ms} ms)", False)
            left = self._left()
            await asyncio.sleep(min(action.ms, left) / 1000)
            if action.ms > left:
                raise Deadline(f"wait {action.ms} ms ran past the render's deadline")
            return {"action": action.kind, "ms": action.ms}
        if isinstance(action, ScrollToEnd):
            return await self.scroll_to_end(action)
        if isinstance(action, LoadMore):
            return await self.load_more(action)
        raise ValueError(f"unknown action {action!r}")

    async def _count(self, sel: str | None) -> int:
        return int(await self.page.evaluate(_COUNT, sel))

    async def _wait_growth(
        self, sel: str | None, before: int, until: str | None, settle_ms: int
    ) -> bool:
        """True once more content (or the `until` marker) is there; False after `settle_ms`
        without it. Raises Deadline when the render's deadline, not the settle time, ran out."""
        left = self._left()
        try:
            await self.page.wait_for_function(
                _GROWN, arg=[sel, before, until], timeout=min(settle_ms, left), polling=50
            )
            return True
        except self.timeout_error:
            if left <= settle_ms:
                raise Deadline("the render's deadline ran out waiting for new content") from None
            return False

    async def _scrolled_in(self, a: ScrollToEnd, before: int) -> bool:
        """True once the scroll brought content (or `until`); False once the page was quiet
        for `quiet_ms` without it; Stalled when it kept loading past `settle_ms`."""
        started = time.monotonic()
        while True:
            if await self.page.evaluate(_GROWN, [a.item, before, a.until]):
                return True
            if self.net.quiet_for(started) * 1000 >= a.quiet_ms:
                return False
            if (time.monotonic() - started) * 1000 >= a.settle_ms:
                raise Stalled(
                    f"scroll_to_end: nothing new within settle_ms={a.settle_ms} ms while the "
                    f"page kept loading ({self.net.describe()})"
                )
            if self.remaining() <= 50:
                raise Deadline("the render's deadline ran out waiting for new content")
            await asyncio.sleep(0.05)

    async def scroll_to_end(self, a: ScrollToEnd) -> dict[str, Any]:
        rounds, complete = 0, False
        while rounds < a.max_rounds:
            if a.until and await self.page.query_selector(a.until):
                complete = True
                break
            before = await self._count(a.item)
            self.progress.waiting(
                f"scrolling (round {rounds + 1}) for more {a.item or 'content'}", False
            )
            await self.page.evaluate(_SCROLL)
            rounds += 1
            if not await self._scrolled_in(a, before):
                if a.until:
                    raise Stalled(
                        f"scroll_to_end: round {rounds} added nothing before the page was quiet "
                        f"for {a.quiet_ms} ms and {a.until!r} never appeared"
                    )
                complete = True  # quiet, nothing new: the end of an unmarked infinite scroll
                break
        else:
            complete = bool(a.until and await self.page.query_selector(a.until))
        return {
            "action": a.kind,
            "rounds": rounds,
            "items": await self._count(a.item),
            "complete": complete,
        }

    async def load_more(self, a: LoadMore) -> dict[str, Any]:
        clicks, complete = 0, False
        while True:
            if not await self.page.evaluate(_USABLE, a.selector):
                complete = True  # the button is gone, hidden or disabled: everything is there
                break
            if clicks >= a.max_clicks:
                break
            before = await self._count(a.item)
            self.progress.waiting(f"clicking LoadMore {a.selector!r} (click {clicks + 1})", True)
            await self.page.click(a.selector, timeout=self._left())
            self.progress.waiting(
                f"waiting for more {a.item or 'content'} after click {clicks + 1}", False
            )
            clicks += 1
            if not await self._wait_growth(a.item, before, None, a.settle_ms):
                raise Stalled(
                    f"load_more: click {clicks} on {a.selector!r} added nothing within {a.settle_ms} ms"
                )
        return {
            "action": a.kind,
            "clicks": clicks,
            "items": await self._count(a.item),
            "complete": complete,
        }
