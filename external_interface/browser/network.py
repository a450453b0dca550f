"""What a page's network is doing, and what a render was waiting for when time ran out.

`Network` follows one page's requests during one render (Playwright's request events): the
ones in flight, when the last one started or ended, and the ones that failed (a network error
or a 5xx/429 answer; requests aborted by the `block` list are not failures). Two things read
it:

- `ScrollToEnd` (actions.py) ends an unmarked infinite scroll only once the page has been
  quiet (nothing in flight, nothing new) for its `quiet_ms`, never while an answer is loading;
- `timeout_reply` decides what a render that ran out of time was: a selector that never came
  on a page that loaded and went quiet with nothing failed (`selector_timeout`: never retried,
  a retry would wait for the same nothing) or a page still loading, or one whose requests
  failed (`timeout`: retried). The message names what was waited for and for how long.

Playwright objects are typed `Any`: this module never imports Playwright.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# long-lived by design: they never "finish", so they never keep a page from being quiet
NEVER_DONE = frozenset(("websocket", "eventsource"))
QUIET_TO_FAIL = 1.0  # seconds of a quiet network before a missing selector is called final
FAILED_STATUS = 500


@dataclass
class Progress:
    """What the render is waiting for right now (`what`), and whether it is the page itself
    (loading, `selector=False`) or something on it (a selector, `selector=True`)."""

    what: str = "waiting for a free browser context"
    selector: bool = False

    def waiting(self, what: str, selector: bool) -> None:
        self.what, self.selector = what, selector


class Network:
    """One page's requests during one render (see the module doc)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.inflight: dict[int, str] = {}
        self.last_change = clock()
        self.failures: list[str] = []

    def attach(self, page: Any) -> None:
        page.on("request", self._started)
        page.on("requestfinished", self._finished)
        page.on("requestfailed", self._failed)
        page.on("response", self._answered)

    def detach(self, page: Any) -> None:
        for event, fn in (
            ("request", self._started),
            ("requestfinished", self._finished),
            ("requestfailed", self._failed),
            ("response", self._answered),
        ):
            page.remove_listener(event, fn)

    def _started(self, request: Any) -> None:
        if request.resource_type not in NEVER_DONE:
            self.inflight[id(request)] = request.url
            self.last_change = self.clock()

    def _finished(self, request: Any) -> None:
        if self.inflight.pop(id(request), None) is not None:
            self.last_change = self.clock()

    def _failed(self, request: Any) -> None:
        self._finished(request)
        reason = str(request.failure or "")
        if "BLOCKED_BY_CLIENT" not in reason and request.resource_type not in NEVER_DONE:
            self.failures.append(f"{request.method} {request.url}: {reason or 'failed'}")

    def _answered(self, response: Any) -> None:
        if response.status >= FAILED_STATUS or response.status == 429:
            self.failures.append(
                f"{response.request.method} {response.url}: HTTP {response.status}"
            )

    def quiet_for(self, since: float | None = None) -> float:
        """Seconds without a request in flight or a new one (counted from `since` at the
        earliest); 0 while anything is loading."""
        if self.inflight:
            return 0.0
        start = self.last_change if since is None else max(since, self.last_change)
        return max(0.0, self.clock() - start)

    def describe(self) -> str:
        """The page's network in a few words, for a timeout's message."""
        if self.failures:
            more = f" (+{len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
            return f"a request of the page failed: {self.failures[0]}{more}"
        if self.inflight:
            first = next(iter(self.inflight.values()))
            return f"{len(self.inflight)} request(s) still loading, e.g. {first}"
        return f"the page's network was quiet for the last {self.quiet_for():.1f} s"


def timeout_reply(
    url: str,
    elapsed: float,
    timeout: float,
    progress: Progress,
    net: Network | None,
    detail: str = "",
) -> tuple[str, str]:
    """(kind, message) of a render that ran out of time: `selector_timeout` when a selector
    never came on a quiet page with nothing failed, else `timeout` (see the module doc)."""
    state = net.describe() if net is not None else ""
    msg = f"{url}: gave up after {elapsed:.1f} s (deadline {timeout:.1f} s) {progress.what}"
    msg += f" ({detail})" if detail else ""
    msg += f"; {state}" if state else ""
    final = (
        progress.selector
        and net is not None
        and not net.failures
        and net.quiet_for() >= QUIET_TO_FAIL
    )
    return ("selector_timeout" if final else "timeout"), msg
