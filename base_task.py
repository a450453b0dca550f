"""The endpoint contract: what a site module writes, and what every endpoint inherits.

An endpoint module is a page of business logic:

    from base_task import Context, Item, Outputs, Params, endpoint

    class UserParams(Params):
        user_id: str

    class User(Item):
        item_type: ClassVar[str] = "demo.user"
        key_fields: ClassVar[tuple[str, ...]] = ("user_id",)
        user_id: str
        name: str

    @endpoint(UserParams, items=[User], resources=["user_agent"])
    def user_info(ctx: Context, p: UserParams) -> Outputs:
        data = ctx.get(f"{base_url()}/h5/api/user/{p.user_id}").json()
        yield User(user_id=data["id"], name=data["name"])

`__all__` is everything an endpoint module needs, errors included. Everything else happens
here, once (`SiteTask`): parameter validation, per-request and per-task deadlines (held on
every pool), typed errors mapped to retry policies with backoff and jitter, resource providers
around each request, redelivery caps, dead-lettering, metrics, and the atomic commit that hands
items to the outbox and dispatches the chain's next steps. The machinery beneath it is the
`lifecycle` package (schemas and registry, `Context`, process state, commits, the batch task).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from celery import Task, shared_task
from celery.exceptions import Reject, SoftTimeLimitExceeded
from pydantic import ValidationError

from config import get_settings
from exceptions import (
    BannedError,
    CaptchaRequired,
    ChainCrawlError,
    CrawlError,
    DeadlineExceeded,
    EmptyPage,
    ItemValidationError,
    LoginRequired,
    NotFound,
    ParseError,
    Policy,
    ResourceUnavailable,
    UndecodableText,
    error_for_status,
)
from external_interface.fetch import Fetcher, Response
from external_interface.fetch.mock import FixtureFetcher, load_case, outputs_of
from external_interface.fetch.select import parse_spec as parse_fetcher
from external_interface.fetch.sitemap import sitemap_urls
from external_interface.resources.rules import Verdict, add_rules, rule
from ledger.publish import broker_priority
from ledger.state import Begun
from lifecycle import hooks, runtime
from lifecycle.adaptive import auto
from lifecycle.commits import requeue_unreplicated
from lifecycle.context import Context
from lifecycle.endpoints import (
    BROWSER,
    ENDPOINTS,
    EndpointSpec,
    Follow,
    Item,
    Output,
    Outputs,
    Params,
    describe,
    get_endpoint,
    queue_for,
)
from lifecycle.guards import need, need_int, yielded_nothing
from lifecycle.hooks import (
    CONTINUE,
    Signal,
    StoredContext,
    after_response,
    after_store,
    before_request,
    before_store,
    fail,
    on_error,
    retry,
    skip,
)
from lifecycle.lost import (
    LOST,
    STATE_STORE_ERRORS,
    lost_for_message,
    park_seconds,
    parked_meta,
    uncount_delivery,
    uncount_pending,
)
from lifecycle.page import run_page
from lifecycle.policy import backoff as backoff  # re-exported: imported from here before
from lifecycle.policy import countdown_cap as countdown_cap
from monitor.metrics import TaskMetrics
from settings.sitevars import site_env
from utils.logsafe import task_argsrepr
from utils.redis import NotReplicated, get_redis
from utils.slots import SlotsLost, lost_ranges
from utils.wire import TaskMeta

log = logging.getLogger("chaincrawl.task")


def endpoint(
    params: type[Params],
    items: Sequence[type[Item]] = (),
    *,
    name: str | None = None,
    resources: Sequence[str] | Mapping[str, str] = (),
    max_retries: int | None = None,
    deadline: float | None = None,
    request_timeout: float | None = None,
    queue: str | None = None,
    decode_errors: Literal["replace", "strict"] = "replace",
    fetcher: str = "",
    render: Literal["", "auto"] = "",
    must_yield: bool = False,
) -> Callable[[Callable[..., Any]], Any]:
    """Turn `fn(ctx, params) -> outputs` into a Celery task on SiteTask.

    - `params`, `items`: the parameter model and the item types the endpoint may yield.
    - `name`: the task name; defaults to the module path under `sites.`
      (`sites/demo/h5/feed.py` -> `demo.h5.feed`). Its first part is the site, which names its
      queue, its resource defaults and its shared limits.
    - `resources`: provider kinds lent to every request (`["cookie", "user_agent"]`), or
      kind -> provider name (`{"cookie": "noop"}`).
    - `max_retries`, `deadline` (seconds for the whole task), `request_timeout` (seconds per
      request): this endpoint's own values instead of the settings'.
    - `queue`: a queue of its own instead of the site's.
    - `decode_errors`: bytes of a response's text its charset cannot decode (invalid UTF-8, a
      mislabelled charset). "replace" (the default): U+FFFD, and the page is counted
      (`undecodable` in the endpoint's metrics and the run's step) and logged as a warning;
      "strict": `resp.text` raises `UndecodableText` and the page fails (no retry).
    - `fetcher`: who sends its requests: "impersonate" (a browser's TLS handshake, HTTP/2 and
      headers; "impersonate:firefox", "impersonate:safari/mobile"), "requests", "urllib3";
      default the process's (`CHAINCRAWL_FETCHER`); `CHAINCRAWL_FETCHER_<SITE>` overrides it.
    - `render`: "auto" fetches each `ctx.get` over HTTP where that yields the items a browser
      would, and renders it where it does not, learnt per URL pattern from pages fetched both
      ways (needs the browser: implies `resources=["browser"]`; docs/browser.md).
    - `must_yield`: a page that yields nothing (no item, no follow-up) fails with `EmptyPage`
      (retried: a page that came back wrong may come back whole; then dead-lettered). Without
      it such a page is counted `empty` (the endpoint's metrics, the run's step) and warned.

    Nothing else: acknowledgement, redelivery and time-limit behaviour are the mechanism's,
    the same for every endpoint (a site cannot turn `acks_late` off by accident).
    """

    if decode_errors not in ("replace", "strict"):
        raise ValueError(f'decode_errors must be "replace" or "strict", not {decode_errors!r}')
    if render not in ("", "auto"):
        raise ValueError(f'render must be "auto" or left out, not {render!r}')

    def deco(fn: Callable[..., Any]) -> Any:
        tname = name or _name_from_module(fn.__module__)
        parts = tname.split(".")
        if len(parts) < 2:
            raise ValueError(f"task name {tname!r} must look like site.platform.endpoint")
        res = dict(resources) if isinstance(resources, Mapping) else {k: k for k in resources}
        if render:
            res.setdefault(BROWSER, BROWSER)
        platform = parts[1] if len(parts) > 2 else "common"
        if fetcher:
            parse_fetcher(fetcher, platform)  # a bad name or profile fails at import
        dl = deadline or get_settings().task_deadline
        spec = EndpointSpec(
            name=tname,
            site=parts[0],
            platform=platform,
            fn=auto(fn) if render else fn,
            params=params,
            item_types=tuple(items),
            resources=res,
            max_retries=max_retries,
            deadline=deadline,
            request_timeout=request_timeout,
            queue=queue or parts[0],
            decode_errors=decode_errors,
            fetcher=fetcher,
            render=render,
            must_yield=must_yield,
        )

        def run(self: SiteTask, params: dict[str, Any], meta: dict[str, Any] | None = None) -> Any:
            return self.execute(params, meta)

        run.__name__ = fn.__name__
        run.__doc__ = fn.__doc__
        run.__module__ = fn.__module__
        task = shared_task(
            base=SiteTask,
            bind=True,
            name=tname,
            spec=spec,  # type: ignore[call-overload]
            soft_time_limit=dl + 5,
            time_limit=dl + 15,
        )(run)
        spec.task = task
        ENDPOINTS.add(tname, spec)
        return task

    return deco


def _name_from_module(module: str) -> str:
    if not module.startswith("sites."):
        raise ValueError(f"endpoint in {module!r} is outside sites/: pass name='site.platform.x'")
    return module[len("sites.") :]


class SiteTask(Task[Any, Any]):
    """Celery task base for endpoints: see the module docstring for what it adds."""

    spec: EndpointSpec
    max_retries = None  # our policy counts retries; Celery's default (3) would cut it short
    acks_late = True
    reject_on_worker_lost = True
    ignore_result = True
    typing = False  # arguments are checked by our schemas, with better messages

    def execute(self, params: Any, meta: Mapping[str, Any] | None) -> str:
        rt = runtime.current()
        with rt.holding(meta):
            try:
                uncount_pending(rt.state)  # requeues an outage left counted (lifecycle/lost.py)
                out = self.run_page(params, meta)
            except NotReplicated as exc:  # its replicas did not confirm: not acked, quietly
                self.uncount(rt, meta)
                requeue_unreplicated(rt, self.name, exc)
            except STATE_STORE_ERRORS as exc:
                ranges = lost_for_message(
                    get_redis(rt.settings.redis_url), exc, [(self.name, meta)]
                )
                wait = park_seconds(rt.settings)  # under the visibility timeout
                if ranges and LOST.surplus(self.request.id or "", countdown=wait):
                    return "parked already"  # its parked copy is out (lifecycle/lost.py)
                if ranges:  # its slots no node serves: parked quietly (lifecycle/lost.py)
                    LOST.parked_one(self.name, ranges, wait)
                    raise self.retry_later(
                        params, parked_meta(meta), wait, SlotsLost(ranges)
                    ) from None
                # Our state store is unreachable (or a cluster is failing over): the message
                # must not be acknowledged.
                # Requeue it; the commit's idempotency makes a second run harmless.
                self.uncount(rt, meta)
                log.warning("%s: state store unreachable (%s); message requeued", self.name, exc)
                runtime.pause_before_requeue()
                raise Reject(exc, requeue=True) from None
            if LOST.since is not None and not lost_ranges(get_redis(rt.settings.redis_url)):
                LOST.served()
            return out

    def uncount(self, rt: runtime.Runtime, wire: Mapping[str, Any] | None) -> None:
        """A requeue the state store caused is not a delivery (lifecycle/lost.py)."""
        meta = TaskMeta.from_wire(wire)
        attempt = (self.request.retries or 0) + meta.retry_base
        uncount_delivery(rt.state(), meta.run_id, self.request.id or "", attempt)

    def run_page(
        self, params: Any, wire: Mapping[str, Any] | None, begun: Begun | None = None
    ) -> str:
        """One page (lifecycle/page.py); a batch entry passes the `begun` of its batch."""
        return run_page(self, params, wire, begun)

    def _collect(self, ctx: Context, p: Params) -> tuple[list[Item], list[Follow]]:
        items: list[Item] = []
        follows: list[Follow] = []
        allowed = self.spec.item_types
        try:
            result = self.spec.fn(ctx, p)
            for out in result or ():
                if isinstance(out, Item):
                    if allowed and not isinstance(out, allowed):
                        raise ItemValidationError(
                            f"{self.spec.name} yielded {type(out).__name__}, not declared in items="
                        )
                    items.append(out)
                elif isinstance(out, Follow):
                    follows.append(out)
                else:
                    raise ItemValidationError(
                        f"{self.spec.name} yielded {type(out).__name__}; yield Item or ctx.follow()"
                    )
                ctx._check_deadline()
            if not (items or follows):  # a selector that matched nothing? counted or failed
                yielded_nothing(ctx, self.spec)
            if "before_store" in hooks.HOOKS.points:
                items = hooks.filter_items(ctx, self.spec.name, items)
        except ValidationError as exc:
            raise ItemValidationError(f"{self.spec.name}: item invalid: {describe(exc)}") from None
        except SoftTimeLimitExceeded:
            raise DeadlineExceeded(f"{self.spec.name}: soft time limit exceeded") from None
        return items, follows

    def retry_later(
        self, params: Any, meta: TaskMeta, countdown: float, exc: Exception
    ) -> Exception:
        """A retry is its own message with the same task id (also for a batch entry)."""
        wire = meta.to_wire()
        opts: dict[str, Any] = {"queue": meta.queue or queue_for(self.name)}
        if meta.priority is not None:
            opts["priority"] = broker_priority(meta.priority)
        opts.update(argsrepr=task_argsrepr(params, wire), kwargsrepr="{}")  # apply_async's
        return self.retry(
            args=(params, wire), kwargs={}, countdown=countdown, max_retries=None, exc=exc, **opts
        )


def run_endpoint(
    name: str, params: Mapping[str, Any], fetcher: Fetcher, meta: Mapping[str, Any] | None = None
) -> tuple[list[Item], list[Follow]]:
    """Run one endpoint's code in-process with a given fetcher: no broker, no Redis, no
    providers. For parser tests against saved pages (external_interface/fetch/mock.py)."""
    spec = get_endpoint(name)
    p = spec.validate_params(params)
    ctx = Context(
        spec, p, TaskMeta.from_wire(meta), runtime.current(), TaskMetrics(), fetcher, online=False
    )
    out: tuple[list[Item], list[Follow]] = spec.task._collect(ctx, p)
    return out


__all__ = [
    "CONTINUE",
    "BannedError",
    "CaptchaRequired",
    "ChainCrawlError",
    "Context",
    "CrawlError",
    "EmptyPage",
    "FixtureFetcher",
    "Follow",
    "Item",
    "ItemValidationError",
    "LoginRequired",
    "NotFound",
    "Output",
    "Outputs",
    "Params",
    "ParseError",
    "Policy",
    "ResourceUnavailable",
    "Response",
    "Signal",
    "StoredContext",
    "UndecodableText",
    "Verdict",
    "add_rules",
    "after_response",
    "after_store",
    "before_request",
    "before_store",
    "endpoint",
    "error_for_status",
    "fail",
    "get_endpoint",
    "load_case",
    "need",
    "need_int",
    "on_error",
    "outputs_of",
    "queue_for",
    "retry",
    "rule",
    "run_endpoint",
    "site_env",
    "sitemap_urls",
    "skip",
]
