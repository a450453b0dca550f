"""Guards against a page that does not hold what the parser expects: a selector that matches
nothing fails loudly instead of yielding nothing.

`need`/`need_int` are for one value a page must have (`ParseError` naming the query and the
page); `yielded_nothing` is the framework's own check on a whole page, called once the
endpoint's code has run: a page that yielded no item and no follow-up is counted `empty`
(the endpoint's metrics, the run's step) or, for an endpoint declared `must_yield=True`,
fails with `EmptyPage` (retried, then dead-lettered).
"""

from __future__ import annotations

from typing import Any, Protocol

from exceptions import EmptyPage, ParseError
from lifecycle.endpoints import EndpointSpec


class _Counting(Protocol):
    """What `yielded_nothing` needs of a Context: its metrics and the URLs it fetched."""

    _metrics: Any
    report: Any  # lifecycle.context.PageReport: its answered_urls


def need(sel: Any, query: str) -> str:
    """The first match of a CSS query on a Response or a selector, stripped; `ParseError`
    when nothing matches (a changed layout, a page cut short), naming the query and the URL."""
    value = sel.css(query).get()
    if value is None:
        url = getattr(sel, "url", "")
        raise ParseError(
            f"nothing matches {query!r}{f' at {url}' if url else ''}: has the page layout changed?"
        )
    return str(value).strip()


def need_int(sel: Any, query: str) -> int:
    """`need`, as an integer (`ParseError` when it is none)."""
    value = need(sel, query)
    try:
        return int(value)
    except ValueError:
        raise ParseError(f"{query!r} is {value!r}, not an integer") from None


def yielded_nothing(ctx: _Counting, spec: EndpointSpec) -> None:
    """The page yielded neither an item nor a follow-up: fail it (`must_yield`) or count it."""
    urls = ", ".join(ctx.report.answered_urls[:3]) or "no request made"
    if spec.must_yield:
        raise EmptyPage(
            f"{spec.name}: the page yielded nothing (no item, no follow-up; must_yield=True) "
            f"from {urls}: does a selector match nothing?"
        )
    ctx._metrics.counts["empty"] += 1
