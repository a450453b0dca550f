"""Selectors that cannot work, found before a render waits on them.

Two checks, both raising `InvalidSelector` (never retried):

- `check_syntax` (the worker, while the request is built: no browser needed) rejects what
  is wrong in any selector language: unbalanced brackets, parentheses or quotes, a trailing
  combinator. It leaves Playwright's engines (`text=...`, `xpath=...`, `a >> b`) to the
  browser, since their bodies are free text.
- `check_in_page` (the driver, on the context's page before it navigates) asks the browser
  itself: Playwright's parser for the selectors Playwright waits on (`wait_for`, `WaitFor`,
  `Click`, `LoadMore`'s button) and `document.querySelector` for those counted by plain CSS
  in the page (`item`, `until`). Its answer is the browser's own message.

Playwright objects are typed `Any`: this module never imports Playwright.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from exceptions import InvalidSelector

_ENGINE = re.compile(r"^\s*[a-zA-Z][a-zA-Z0-9_-]*(:[a-zA-Z0-9_-]+)?=")  # text=, xpath=, internal:x=
_PAIRS = {")": "(", "]": "["}
# the CSS the page counts with (querySelectorAll): any parse error is the browser's message
_CSS_ERROR = "(s) => { try { document.querySelector(s); return null } catch (e) { return String(e.message) } }"
_PARSE_ERROR = re.compile(
    r"while parsing|is not a valid|Unexpected token|not a valid XPath|Unknown engine"
)


def check_syntax(selector: str, what: str) -> None:
    """Raise InvalidSelector for a selector no engine could parse (see the module doc)."""
    if _ENGINE.match(selector) or ">>" in selector:
        return  # Playwright's engines: free text, the browser's to judge
    stack: list[str] = []
    quote = ""
    escaped = False
    for ch in selector:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([":
            stack.append(ch)
        elif ch in _PAIRS and (not stack or stack.pop() != _PAIRS[ch]):
            raise InvalidSelector(f"{what}: unbalanced {ch!r} in selector {selector!r}")
    if quote:
        raise InvalidSelector(f"{what}: unclosed {quote} in selector {selector!r}")
    if stack:
        raise InvalidSelector(f"{what}: unclosed {stack[-1]!r} in selector {selector!r}")
    if selector.rstrip()[-1:] in (">", "+", "~", ","):
        raise InvalidSelector(f"{what}: selector {selector!r} ends with a combinator")


def selectors_of(req: dict[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(Playwright selectors, plain CSS selectors) of a wire request, each as (what, selector)."""
    pw: list[tuple[str, str]] = []
    css: list[tuple[str, str]] = []
    if req.get("wait_for"):
        pw.append(("wait_for", req["wait_for"]))
    for a in req.get("actions") or ():
        kind = a.get("kind", "")
        for name in ("selector", "wait_for"):
            if a.get(name):
                pw.append((f"{kind}.{name}", a[name]))
        for name in ("item", "until"):
            if a.get(name):
                css.append((f"{kind}.{name}", a[name]))
    return pw, css


async def check_in_page(
    page: Any,
    playwright: Sequence[tuple[str, str]],
    css: Iterable[tuple[str, str]],
    error: type[Exception],
) -> None:
    """Raise InvalidSelector for the first selector the browser cannot parse; `error` is
    Playwright's Error class (others, such as a page gone away, pass through)."""
    for what, sel in playwright:
        try:
            await page.locator(sel).count()
        except error as exc:
            text = (str(exc).strip().splitlines() or [""])[0]
            if _PARSE_ERROR.search(text):
                text = text.split(": ", 1)[-1]
                raise InvalidSelector(f"{what}: {sel!r} is not a valid selector: {text}") from None
            raise
    for what, sel in css:
        problem = await page.evaluate(_CSS_ERROR, sel)
        if problem:
            raise InvalidSelector(
                f"{what}: {sel!r} is not a valid CSS selector (it is counted with "
                f"document.querySelectorAll, so Playwright's own syntax does not apply): {problem}"
            )
