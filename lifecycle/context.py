"""`Context`: what an endpoint sees of the machinery — requests, rendered pages, follow-ups,
its log, its deadline.

Everything else a page needs (providers, the shared gate, the browser pool, metrics, the
deadline arithmetic) is private to it, so endpoint code stays a page of business logic and
cannot lean on internals that change.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from exceptions import (
    BannedError,
    BrowserUnavailable,
    ConfigError,
    DeadlineExceeded,
    RateLimited,
    ResourceUnavailable,
    error_for_status,
)
from external_interface.browser import Action, BrowserPool, RenderedPage, RenderRequest, get_pool
from external_interface.browser.model import WaitUntil
from external_interface.fetch import CachingFetcher, Fetcher, FetchRequest, Response, choose
from external_interface.fetch.response import default_user_agent, has_user_agent
from external_interface.resources.base import Outcome, OutgoingRequest, Provider
from lifecycle import hooks
from lifecycle.adaptive import AutoPage
from lifecycle.endpoints import BROWSER, EndpointSpec, Follow, Params
from lifecycle.runtime import Runtime
from monitor.metrics import TaskMetrics
from scheduling.gate import RENDER, Gate, get_gate
from utils.wire import TaskMeta


@dataclass
class PageTaskState:
    """The page as the providers lending it resources see it (their `TaskState`)."""

    site: str
    platform: str
    task_name: str
    avoid: set[str] = field(default_factory=set)  # "kind:id" leases that failed this task


@dataclass
class PageReport:
    """What a page's requests left for the task (`ctx.report`): the leases lent to requests
    that failed ("kind:id", never lent to its retry) and how many responses had text their
    charset could not decode (counted with the commit)."""

    failed_leases: set[str] = field(default_factory=set)
    undecodable: int = 0
    answered_urls: list[str] = field(
        default_factory=list
    )  # the first few (an empty page's message)


class Context:
    """What an endpoint gets: `get`, `post`, `request`, `render`, `follow`, `log`, `remaining`,
    `count`.

    Requests and rendered pages go through the resource providers the endpoint declared
    (`resources=`), the site's shared limits, and the task's deadline; a failure raises a typed
    error whose retry policy the task applies (exceptions.py). `params` is the validated
    parameters object.
    """

    def __init__(
        self,
        spec: EndpointSpec,
        params: Params,
        meta: TaskMeta,
        rt: Runtime,
        metrics: TaskMetrics,
        fetcher: Fetcher | None = None,
        online: bool = True,
        renders: list[RenderedPage] | None = None,
    ) -> None:
        self.params = params
        self._renders = renders  # the live runner (`control.sh parse`) keeps each rendered page
        self.log: logging.Logger = rt.logger(spec.name)
        self._spec = spec
        self._meta = meta
        self._settings = rt.settings
        self._metrics = metrics
        self._fetcher = fetcher or rt.fetcher()
        self._online = online  # offline (parser tests): no providers, no shared gate, no robots
        self._cache = self._fetcher if isinstance(self._fetcher, CachingFetcher) else None
        self._robots = rt.robots() if online else None
        self._rank = meta.priority if meta.priority is not None else rt.settings.default_priority
        self._task_state = PageTaskState(spec.site, spec.platform, spec.name, set(meta.avoid))
        self.report = PageReport()
        self._deadline = time.monotonic() + (spec.deadline or rt.settings.task_deadline)
        self._providers = (
            [rt.provider(n, spec.site, spec.platform) for _, n in rt.resource_plan(spec)]
            if online
            else []
        )
        self._via = choose(spec.fetcher, spec.site, spec.platform)  # the fetcher, its profile
        self._auto: AutoPage | None = None  # render="auto": the page's plan (lifecycle/adaptive.py)

    # -- what endpoints use

    def remaining(self) -> float:
        """Seconds left before the task's deadline (every request is cut to fit in it)."""
        return self._deadline - time.monotonic()

    def follow(self, **changes: Any) -> Follow:
        """The same endpoint again with some parameters changed (next page, next cursor)."""
        return Follow({**self.params.model_dump(mode="json"), **changes})

    def count(self, counter: str, by: int = 1) -> None:
        """Add to a counter of this endpoint's metrics (`chaincrawl_task_counts_total`)."""
        self._metrics.counts[counter] += by

    def get(self, url: str, **kw: Any) -> Response:
        return self.request("GET", url, **kw)

    def post(self, url: str, **kw: Any) -> Response:
        return self.request("POST", url, **kw)

    def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        cookies: Mapping[str, str] | None = None,
        data: Any = None,
        json: Any = None,
        ok_statuses: Iterable[int] = (),
        allow_redirects: bool = True,
        timeout: float | None = None,
        resources: bool = True,
    ) -> Response:
        """Send a request through the providers; raise a typed error for failures.

        A status >= 400 raises (404 -> NotFound, 429 -> RateLimited, 5xx -> ServerError...)
        unless listed in `ok_statuses`. Providers may raise BannedError from their feedback.
        `resources=False` sends it without the lent resources (a public asset, say).

        Politeness comes first: a URL the site's robots.txt disallows is skipped
        (`RobotsDisallowed`: the task ends as skipped, not failed), and the site's shared
        limits and adaptive delay hold the request back as long as they ask. With the
        development HTTP cache on, a stored answer is returned at once, none of that asked.
        """
        remaining = self.remaining()
        if remaining <= 0:
            raise DeadlineExceeded(f"{self._spec.name}: task deadline passed before {method} {url}")
        # One request from here on: the before_request hooks change it (lifecycle/hooks.py),
        # the providers then lend to it, and what they all left is what is sent.
        out = OutgoingRequest(
            method=method,
            url=url,
            params=dict(params or {}),
            headers=dict(headers or {}),
            cookies=dict(cookies or {}),
            data=data,
            json=json,
        )
        if self._online and "before_request" in hooks.HOOKS.points:
            hooks.in_page(self, "before_request", self._spec.name, f"{method} {url}", out)
            remaining = self.remaining()
        method, url = out.method, out.url
        auto = self._auto
        if auto is not None and method == "GET" and auto.renders(_with_query(url, out.params)):
            return self.render(
                url,
                params=out.params,
                headers=out.headers,
                cookies=out.cookies,
                ok_statuses=ok_statuses,
                resources=resources,
                wait_until=auto.wait_until,
            )
        if self._cache is not None:
            hit = self._cache.lookup(
                FetchRequest(
                    method=method,
                    url=url,
                    params=dict(out.params) if out.params else None,
                    headers=dict(out.headers) if out.headers else None,
                )
            )
            if hit is not None:
                self._metrics.request(hit.status, len(hit.content))
                self._watch(hit)
                self._check_status(hit, url, ok_statuses)
                self._answered(hit, method, url)
                return hit
        if self._robots is not None:
            self._robots.check(_with_query(url, out.params), site=self._spec.site)
        gate = get_gate() if self._online else None
        if gate is not None:
            gate.before_request(self._spec.site, self._spec.name)
        active = self._lend(out, resources)
        if not has_user_agent(out.headers):  # nothing lent or set: who we are, honestly
            out.headers["User-Agent"] = default_user_agent(self._spec.site)
        s = self._settings
        req = FetchRequest(
            method=out.method,
            url=out.url,
            params=out.params or None,
            headers=out.headers or None,
            cookies=out.cookies or None,
            data=out.data,
            json=out.json,
            proxy=out.proxy,
            timeout=min(timeout or self._spec.request_timeout or s.request_timeout, remaining),
            connect_timeout=s.connect_timeout,
            max_bytes=s.max_response_bytes,
            allow_redirects=allow_redirects,
            rank=self._rank,
            fetcher=self._via.fetcher,
            profile=self._via.profile,
        )
        start = time.monotonic()
        try:
            resp = self._fetcher.fetch(req)
        except Exception as exc:
            elapsed = time.monotonic() - start
            if gate is not None:
                gate.feedback(self._spec.site, elapsed, 0, None)
            self._failed(active, out, elapsed, exc)
            raise
        self._metrics.request(resp.status, len(resp.content))
        wait_hint = retry_after(resp.headers.get("retry-after")) if resp.status >= 400 else None
        if gate is not None and not resp.from_cache:
            gate.feedback(self._spec.site, resp.elapsed, resp.status, wait_hint)
        self._watch(resp)
        self._settle(active, out, resp, url, ok_statuses)
        self._answered(resp, method, url)
        return resp

    def render(
        self,
        url: str,
        *,
        wait_for: str | None = None,
        actions: Sequence[Action] = (),
        timeout: float | None = None,
        capture_json: str | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        cookies: Mapping[str, str] | None = None,
        wait_until: WaitUntil = "load",
        block: Sequence[str] | None = None,
        ok_statuses: Iterable[int] = (),
        resources: bool = True,
    ) -> RenderedPage:
        """Render `url` in this worker's browser and return the page: a `Response` of the
        rendered DOM (`css`, `xpath`, `text`; the document's `status` and `headers`) whose
        `captured` answers (`json_answers()`) are the page's own answers whose URLs match
        the `capture_json` regex. Needs `resources=["browser"]` in the endpoint's declaration.

        `wait_for`: a CSS selector to wait for after load; `actions`: `Click`, `WaitFor`,
        `Wait`, `ScrollToEnd`, `LoadMore` (external_interface.browser), run in order; `timeout`:
        the whole render (default CHAINCRAWL_BROWSER_TIMEOUT), never past the task's deadline.
        The other resources the endpoint declared are lent to the page as to a request: the
        proxy, cookies and user agent apply to its browser context, other headers and signed
        query parameters to its requests; they hear how it went, as after a fetch.

        As for `get`: robots.txt first; a status >= 400 raises its typed error unless listed in
        `ok_statuses` (an error document is returned at once either way: it would never show
        `wait_for`). Renders also hold a place in the site's `<site>.render` scope, capped
        across workers (CHAINCRAWL_BROWSER_SITE_LIMIT), and may wait for it (`Throttled`).
        Failures: `RenderTimeout` (the page did not settle in time; `SelectorTimeout`, never
        retried, when a loaded, quiet page never showed the selector), `InvalidSelector` (a
        selector that cannot parse, before the page loads; never retried), `BrowserCrashed`
        (a retry on a new browser), `RenderError`, the fetch layer's network errors; the
        timeouts, crashes and `RenderError` carry the page's screenshot and DOM into the
        task's dead letter (docs/browser.md, "Errors").
        """
        spec = self._spec
        if not spec.renders:
            raise ConfigError(
                f"{spec.name}: ctx.render needs resources=[{BROWSER!r}] in its @endpoint"
            )
        remaining = self.remaining()
        if remaining <= 0:
            raise DeadlineExceeded(f"{spec.name}: task deadline passed before rendering {url}")
        pool = get_pool()
        oks = tuple(ok_statuses)
        # checked before anything is lent or waited for: a bad selector is the endpoint's bug
        draft = RenderRequest(
            _with_query(url, params),
            wait_for=wait_for,
            actions=actions,
            timeout=min(timeout or pool.config.timeout, remaining),
            headers=dict(headers or {}),
            cookies=dict(cookies or {}),
            capture_json=capture_json,
            wait_until=wait_until,
            block=block,
        )
        if self._robots is not None:
            self._robots.check(draft.url, site=spec.site)
        gate = get_gate() if self._online else None
        if gate is None:
            return self._render(pool, draft, url, params, None, oks, resources)
        holder = gate.enter(spec.site, RENDER, float(draft.timeout or 0) + pool.config.answer_grace)
        try:
            return self._render(pool, draft, url, params, gate, oks, resources)
        finally:
            gate.leave(spec.site, RENDER, holder)

    # -- the machinery's side

    def _answered(self, resp: Response, method: str, url: str) -> None:
        """An answer the status and the providers accepted: the after_response hooks."""
        if len(self.report.answered_urls) < 3:
            self.report.answered_urls.append(resp.url or url)
        if self._online and "after_response" in hooks.HOOKS.points:
            hooks.in_page(self, "after_response", self._spec.name, f"{method} {url}", resp)

    def _render(
        self,
        pool: BrowserPool,
        draft: RenderRequest,
        url: str,
        params: Mapping[str, Any] | None,
        gate: Gate | None,
        ok_statuses: tuple[int, ...],
        resources: bool,
    ) -> RenderedPage:
        """One render with the resources lent (see `render`): the deadline, the providers'
        lending and feedback, metrics, and the document's status."""
        site = self._spec.site
        if gate is not None:
            gate.before_request(site, self._spec.name)
        out = OutgoingRequest(
            method="GET",
            url=url,
            params=dict(params or {}),
            headers=dict(draft.headers),
            cookies=dict(draft.cookies),
        )
        active = self._lend(out, resources)
        remaining = self.remaining()  # the gate and the pools may have waited
        if remaining <= 0:
            self._give_back(active, out)
            raise DeadlineExceeded(
                f"{self._spec.name}: task deadline passed before rendering {url}"
            )
        headers = {k: v for k, v in out.headers.items() if k.lower() != "user-agent"}
        agent = next((v for k, v in out.headers.items() if k.lower() == "user-agent"), None)
        req = dataclasses.replace(
            draft,
            url=_with_query(out.url, out.params),
            timeout=min(float(draft.timeout or remaining), remaining),
            proxy=out.proxy,
            cookies=out.cookies,
            user_agent=agent,
            headers=headers,
        )
        start = time.monotonic()
        try:
            page = pool.render(req).page()
        except (ResourceUnavailable, BrowserUnavailable, ValueError):
            self._give_back(active, out)  # nothing was sent: the resources go back untouched
            raise
        except Exception as exc:
            self._failed(active, out, time.monotonic() - start, exc)
            raise
        self._metrics.request(page.status, len(page.content))
        self._metrics.counts["renders"] += 1
        if self._renders is not None:
            self._renders.append(page)
        if gate is not None and page.status != 200:
            # a render's time is the browser's, not the site's: only the status is told
            hint = retry_after(page.headers.get("retry-after"))
            gate.feedback(site, 0.0, page.status, hint)
        self._settle(active, out, page, url, ok_statuses)
        return page

    def _lend(self, out: OutgoingRequest, resources: bool) -> list[Provider]:
        """The declared providers prepare `out` (or, on a refusal, give back what the ones
        before lent); returns the providers that lent, to hear the outcome."""
        active = self._providers if resources else []
        for i, p in enumerate(active):
            try:
                p.prepare(out, self._task_state)
            except BaseException:
                self._give_back(active[:i], out)
                raise
        return active

    def _give_back(self, active: Sequence[Provider], out: OutgoingRequest) -> None:
        """What was lent for `out` goes back untouched: nothing was sent."""
        for p in reversed(active):
            cancel = getattr(p, "cancel", None)
            if cancel is not None:
                cancel(out, self._task_state)

    def _failed(
        self, active: Sequence[Provider], out: OutgoingRequest, elapsed: float, exc: Exception
    ) -> None:
        """No answer came: count it, tell the providers, never lend the same again."""
        self._metrics.request(None, 0)
        self._feedback(active, out, Outcome(elapsed=elapsed, error=exc))
        self.report.failed_leases.update(f"{k}:{v}" for k, v in out.leases.items())

    def _watch(self, resp: Response) -> None:
        """The endpoint's `decode_errors`, and its metrics told of undecodable text."""
        resp.decode_errors = self._spec.decode_errors
        resp.on_undecodable = self._report_undecodable

    def _report_undecodable(self, resp: Response, n: int) -> None:
        """Text decoded with replacement characters: counted and warned of, never silent."""
        self.report.undecodable += 1
        self._metrics.counts["undecodable"] += 1
        self._metrics.counts["undecodable_bytes"] += n
        self.log.warning(
            "%s: %d bytes are not valid %s (declared: %s), replaced with U+FFFD; "
            'decode_errors="strict" on the endpoint fails the page instead',
            resp.url,
            n,
            resp.encoding,
            resp.declared_encoding or "none",
        )

    def _settle(
        self,
        active: Sequence[Provider],
        out: OutgoingRequest,
        resp: Response,
        url: str,
        ok_statuses: Iterable[int],
    ) -> None:
        """An answer came: the providers judge it (bans, captchas, retirements), then its
        status raises its typed error unless allowed."""
        if active:
            outcome = Outcome(
                elapsed=resp.elapsed,
                status=resp.status,
                text_sample=resp.text[:2048],
                retry_after=retry_after(resp.headers.get("retry-after")),
            )
            try:
                self._feedback(active, out, outcome)
            except BannedError:
                self.report.failed_leases.update(f"{k}:{v}" for k, v in out.leases.items())
                raise
        if resp.status >= 400 and resp.status not in set(ok_statuses):
            self.report.failed_leases.update(f"{k}:{v}" for k, v in out.leases.items())
        self._check_status(resp, url, ok_statuses)

    def _check_status(self, resp: Response, url: str, ok_statuses: Iterable[int]) -> None:
        """The typed error of an HTTP error status (naming the URL), unless it is allowed."""
        if resp.status >= 400 and resp.status not in set(ok_statuses):
            err = error_for_status(resp.status, url)
            if isinstance(err, RateLimited):
                err.retry_after = retry_after(resp.headers.get("retry-after"))  # type: ignore[attr-defined]
            raise err

    def _check_deadline(self) -> None:
        if self.remaining() <= 0:
            raise DeadlineExceeded(f"{self._spec.name}: task deadline passed")

    def _feedback(self, active: Sequence[Provider], out: OutgoingRequest, outcome: Outcome) -> None:
        """Every provider hears the outcome; the first ban any of them detects is raised."""
        banned: BaseException | None = None
        for p in active:
            try:
                p.feedback(out, outcome, self._task_state)
            except BannedError as exc:
                banned = banned or exc
        if banned is not None:
            raise banned


def _with_query(url: str, params: Mapping[str, Any] | None) -> str:
    """The URL as it goes out, query parameters included (robots.txt rules match them)."""
    if not params:
        return url
    return f"{url}{'&' if '?' in url else '?'}{urlencode(params, doseq=True)}"


def retry_after(value: str | None) -> float | None:
    """A `Retry-After` header's seconds (the HTTP-date form reads as absent)."""
    try:
        return float(value) if value else None
    except ValueError:
        return None
