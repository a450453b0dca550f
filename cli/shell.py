"""`control.sh shell URL [--site SITE | --task TASK]`: a page fetched through the fetch layer,
in an interactive session to try selectors on.

In the session: `resp` (the `Response`: `css`, `xpath`, `json`, `text`, `status`, `headers`),
`fetch(url, **kw)` (another request the same way; it becomes `resp`) and `ctx`. With `--site`
the requests carry what the site's endpoints carry (every resource kind any of them declares:
proxy, user agent, cookie, device id, signature) and pass its shared limits; `--task` uses one
endpoint's exactly; neither: the bare fetch layer. `CHAINCRAWL_HTTP_CACHE` is honoured. IPython
when it is installed and the input is a terminal, else Python's own console; `-c CODE` runs
CODE instead and exits.
"""

from __future__ import annotations

import argparse
import builtins
import code
import sys
import traceback
from typing import Any
from urllib.parse import urljoin

import sites
from cli import UserError, procs
from config import get_settings
from exceptions import ChainCrawlError, RobotsDisallowed
from external_interface.fetch import Response
from lifecycle.context import Context
from lifecycle.endpoints import EndpointSpec, Params
from lifecycle.live import context, site_spec
from utils.registry import UnknownNameError

ANY_STATUS = range(100, 600)  # the shell shows error pages too instead of raising


def spec_for(site: str | None, task: str | None) -> EndpointSpec | None:
    """The endpoint whose requests the shell imitates (None: the bare fetch layer)."""
    if site and task:
        raise UserError("give --site or --task, not both")
    try:
        if task:
            return sites.get_endpoint(task)
        if site:
            sites.load_all()
            name, _, platform = site.partition(".")
            return site_spec(name, platform or None)
    except UnknownNameError as exc:
        raise UserError(str(exc)) from None
    return None


class Session:
    """What the session's `fetch` does: a request through `ctx`, which becomes `resp`."""

    def __init__(self, ctx: Context, namespace: dict[str, Any], site: str = "") -> None:
        self.ctx, self.ns, self.site = ctx, namespace, site
        self.shown: Response | None = None  # the response `fetch` just announced
        self.why_none = ""  # why `resp` is None: the last fetch's failure, said again by `run`
        self.base = ""  # what a relative URL is resolved against: the last page, or URL asked

    def explain(self, exc: BaseException) -> str | None:
        """The line for an error of the session's code that is no bug of it: `resp` read
        while the last fetch got no page (None: show the traceback)."""
        if isinstance(exc, Exception) and no_page(exc, self.ns) and self.why_none:
            return f"error: resp is None: {self.why_none}"
        return None

    def fetch(self, url: str, method: str = "GET", **kw: Any) -> Response | None:
        """`url` may be relative to the current `resp`; any status is shown, not raised."""
        current = self.ns.get("resp")
        url = urljoin(current.url if current is not None else self.base, url)
        self.base = url  # a failed fetch leaves `resp` None: the next relative URL needs a base
        kw.setdefault("ok_statuses", ANY_STATUS)
        try:
            resp = self.ctx.request(method, url, **kw)
        except ChainCrawlError as exc:
            # `resp` must not stay the previous page: selectors tried next would read it
            self.ns["resp"] = self.shown = None
            if isinstance(exc, RobotsDisallowed):
                print(
                    f"{method} {url} blocked by robots.txt ({exc}); resp is None now",
                    file=sys.stderr,
                )
                self.why_none = robots_help(method, url, exc.user_agent, self.site or "SITE")
            else:
                print(
                    f"{method} {url} failed: {type(exc).__name__}: {exc}; resp is None now",
                    file=sys.stderr,
                )
                self.why_none = f"{method} {url} failed ({type(exc).__name__}: {exc})"
            return None
        self.why_none = ""
        cached = ", from the HTTP cache" if resp.from_cache else ""
        ctype = resp.headers.get("content-type", "?")
        print(
            f"{method} {resp.url} -> {resp.status} ({ctype}, {len(resp.content)} bytes{cached})",
            file=sys.stderr,
        )
        self.ns["resp"] = self.shown = resp
        return resp

    def displayhook(self, value: object) -> None:
        """The console's echo of `fetch(url)`: the line `fetch` printed says it already."""
        if value is not None and value is self.shown:
            builtins._ = value  # type: ignore[attr-defined]
            self.shown = None
            return
        sys.__displayhook__(value)


BANNER = """chaincrawl shell: {how}
  resp                the response: resp.css("a::attr(href)").getall(), resp.xpath(...),
                      resp.json(), resp.text, resp.status, resp.headers
  fetch(url, **kw)    fetch another page the same way (it becomes resp; one that fails or
                      robots.txt forbids leaves resp None)
  ctx                 the endpoint context the requests go through"""


def run(
    url: str, *, site: str | None = None, task: str | None = None, command: str | None = None
) -> int:
    """The command; -> exit status (1 when `command` raised)."""
    spec = spec_for(site, task)
    if spec is not None:
        if procs.ensure_redis(get_settings()) == "started":  # providers, limits live there
            print("redis: started the embedded Redis", file=sys.stderr)  # as `parse` says
        # the endpoint's parameters are not needed to fetch a URL as it would
        ctx = context(spec, spec.params.model_construct())
        how = f"requests as {spec.name} (resources: {', '.join(spec.resources) or 'none'})"
    else:
        ctx = context(site_less(), {}, online=False)
        how = "the bare fetch layer (--site SITE sends the site's headers, cookies, proxies)"
    namespace: dict[str, Any] = {"ctx": ctx, "resp": None}
    session = Session(ctx, namespace, spec.site if spec is not None else "")
    namespace["fetch"] = session.fetch
    session.fetch(url)
    session.shown = None
    if command is not None:
        try:
            exec(compile(command, "<shell -c>", "exec"), namespace)
        except Exception as exc:
            line = session.explain(exc)  # not a bug of CODE's
            if line is not None:
                print(line, file=sys.stderr)
            else:
                traceback.print_exc()
            return 1
        return 0
    sys.displayhook = session.displayhook
    interact(session, BANNER.format(how=how))
    return 0


class Console(code.InteractiveConsole):
    """Python's console, with a `resp` read after a failed fetch said in one line (why the
    fetch got no page), not as an AttributeError's traceback."""

    def __init__(self, session: Session) -> None:
        super().__init__(locals=session.ns)
        self.session = session

    def showtraceback(self) -> None:
        exc = sys.exc_info()[1]
        line = self.session.explain(exc) if exc is not None else None
        if line is None:
            super().showtraceback()
        else:
            self.write(line + "\n")


def robots_help(method: str, url: str, user_agent: str, site: str) -> str:
    """A URL robots.txt forbids: said with where to look and how to fetch it anyway."""
    return (
        f"robots.txt disallows {method} {url} for user agent {user_agent!r}; "
        "`./control.sh limits` shows the robots.txt setting and `./control.sh parse TASK` "
        f"fetches as a worker would; CHAINCRAWL_ROBOTS_IGNORE={site} skips robots.txt for "
        "the site (CHAINCRAWL_ROBOTS=off for every site)"
    )


def no_page(exc: Exception, namespace: dict[str, Any]) -> bool:
    """CODE read `resp` (`resp.css`, ...) while it was None: the last fetch got no page."""
    return (
        isinstance(exc, AttributeError)
        and namespace.get("resp") is None
        and "'NoneType'" in str(exc)
    )


def site_less() -> EndpointSpec:
    """No site's endpoint: what the bare fetch layer's requests are made as."""
    return EndpointSpec(
        name="shell.common.fetch",
        site="shell",
        platform="common",
        fn=lambda ctx, p: None,
        params=Params,
        item_types=(),
        resources={},
        queue="shell",
    )


def interact(session: Session, banner: str) -> None:
    if sys.stdin.isatty():
        try:
            from IPython import start_ipython  # optional, third-party: only when installed
        except ImportError:
            pass
        else:
            print(banner)
            start_ipython(argv=[], user_ns=session.ns)
            return
    Console(session).interact(banner=banner, exitmsg="")


def main(a: argparse.Namespace) -> int:
    return run(a.url, site=a.site, task=a.task, command=a.command)
