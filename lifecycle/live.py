"""One endpoint, once, live, outside the broker: what `control.sh parse` and `shell` run.

No Celery, no run ledger, no outbox: the endpoint's code runs in this process with what a
worker gives it (its providers: proxy, user agent, cookie, device id, signature; robots.txt,
the site's shared limits and adaptive delay; the fetch layer, behind the development HTTP
cache when `CHAINCRAWL_HTTP_CACHE` is set), and what it yields is returned, never stored. Given its chain,
the children its step would dispatch are computed as the commit would (`outputs.children`;
a `skip_seen_hours` step reads the dedup store, and writes nothing).

`run_endpoint` (base_task.py) is the offline twin, for parser tests: a given fetcher,
no providers, no gate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from external_interface.browser import RenderedPage
from external_interface.fetch import CachingFetcher, Fetcher, FetchRequest, Response
from external_interface.fetch.cache import HttpCache
from ledger.model import Chain
from ledger.state import Kid
from lifecycle import runtime
from lifecycle.commits import children
from lifecycle.context import Context
from lifecycle.endpoints import EndpointSpec, Follow, Item, Params, iter_endpoints
from monitor.metrics import TaskMetrics
from utils.registry import UnknownNameError
from utils.wire import TaskMeta

T = TypeVar("T")


class Announced(list[T]):
    """A list that calls `hook` with each element appended (`parse` prints each request and
    rendered page as it happens, beside the endpoint's log lines, not all after the run)."""

    def __init__(self, hook: Callable[[T], None] | None = None) -> None:
        super().__init__()
        self.hook = hook

    def append(self, value: T) -> None:
        super().append(value)
        if self.hook is not None:
            self.hook(value)


Exchange = tuple[FetchRequest, Response]


class RecordingFetcher:
    """Passes every request on to `inner` and keeps each request with its response."""

    def __init__(self, inner: Fetcher, exchanges: list[Exchange] | None = None) -> None:
        self.inner = inner
        self.exchanges: list[Exchange] = [] if exchanges is None else exchanges

    def fetch(self, req: FetchRequest) -> Response:
        resp = self.inner.fetch(req)
        self.exchanges.append((req, resp))
        return resp


class RecordingCache(CachingFetcher):
    """The development HTTP cache keeping each answer it gives, from disk or from the site. A
    `CachingFetcher` still, so `Context` answers from the cache before anything goes out."""

    def __init__(
        self, inner: Fetcher, cache: HttpCache, exchanges: list[Exchange] | None = None
    ) -> None:
        super().__init__(inner, cache)
        self.exchanges: list[Exchange] = [] if exchanges is None else exchanges

    def lookup(self, req: FetchRequest) -> Response | None:
        hit = super().lookup(req)
        if hit is not None:
            self.exchanges.append((req, hit))
        return hit

    def fetch(self, req: FetchRequest) -> Response:
        seen = len(self.exchanges)
        resp = super().fetch(req)
        if len(self.exchanges) == seen:  # not answered by `lookup`
            self.exchanges.append((req, resp))
        return resp


def recording(
    fetcher: Fetcher, exchanges: list[Exchange] | None = None
) -> RecordingFetcher | RecordingCache:
    """`fetcher` keeping what it answers (`.exchanges`: `exchanges` when given)."""
    if isinstance(fetcher, CachingFetcher):
        return RecordingCache(fetcher.inner, fetcher.cache, exchanges)
    return RecordingFetcher(fetcher, exchanges)


@dataclass
class LiveResult:
    """What one live run of an endpoint yielded and the requests it made."""

    spec: EndpointSpec
    params: dict[str, Any]
    items: list[Item] = field(default_factory=list)
    follows: list[Follow] = field(default_factory=list)
    children: list[Kid] = field(default_factory=list)
    exchanges: list[tuple[FetchRequest, Response]] = field(default_factory=list)
    renders: list[RenderedPage] = field(default_factory=list)  # the pages `ctx.render` rendered
    error: Exception | None = None  # what the endpoint raised (items and follows are then empty)
    dropped: dict[str, int] = field(default_factory=dict)  # items before_store hooks skipped


def context(
    spec: EndpointSpec,
    params: Mapping[str, Any] | Params,
    fetcher: Fetcher | None = None,
    meta: TaskMeta | None = None,
    *,
    online: bool = True,
    renders: list[RenderedPage] | None = None,
) -> Context:
    """A `Context` as a worker builds it for a page of `spec` (providers, gate and robots.txt
    included; `online=False`: none of them), on `fetcher` (default: the process's fetch layer,
    behind the development HTTP cache when `CHAINCRAWL_HTTP_CACHE` is set); each page it
    renders is appended to `renders` when given."""
    rt = runtime.current()
    p = spec.validate_params(params)
    return Context(
        spec,
        p,
        meta or TaskMeta(),
        rt,
        TaskMetrics(),
        fetcher or rt.fetcher(),
        online=online,
        renders=renders,
    )


def site_spec(site: str, platform: str | None = None) -> EndpointSpec:
    """A stand-in endpoint of `site` (on `platform`, else the one most of its endpoints use)
    that borrows every resource kind any of its endpoints declares: what `control.sh shell
    --site` sends requests as. The site's endpoints must be imported (`sites.load_all()`)."""
    everything = list(iter_endpoints())
    mine = [s for s in everything if s.site == site and platform in (None, s.platform)]
    if not mine:
        known = sorted({f"{s.site}.{s.platform}" if platform else s.site for s in everything})
        raise UnknownNameError(
            "site" + (" and platform" if platform else ""),
            f"{site}.{platform}" if platform else site,
            known,
        )
    platform = platform or Counter(s.platform for s in mine).most_common(1)[0][0]
    resources: dict[str, str] = {}
    for s in mine:
        for kind, name in s.resources.items():
            resources.setdefault(kind, name)
    return EndpointSpec(
        name=f"{site}.{platform}.shell",
        site=site,
        platform=platform,
        fn=_nothing,
        params=Params,
        item_types=(),
        resources=resources,
        queue=mine[0].queue,
    )


def _nothing(ctx: Context, p: Params) -> None:
    return None


def run_live(
    spec: EndpointSpec,
    params: Mapping[str, Any],
    *,
    fetcher: Fetcher | None = None,
    chain: Chain | None = None,
    step: str = "",
    on_exchange: Callable[[Exchange], None] | None = None,
    on_render: Callable[[RenderedPage], None] | None = None,
) -> LiveResult:
    """Run `spec` once on `params` (a ParamsError for bad ones, before any request). The
    endpoint's own errors are returned in `error`, with the requests made and the pages
    rendered until then. `on_exchange` / `on_render` are called with each request (with its
    answer) and each rendered page as it happens."""
    recorder = recording(fetcher or runtime.current().fetcher(), Announced(on_exchange))
    meta = TaskMeta(step=step)
    rendered: list[RenderedPage] = Announced(on_render)
    ctx = context(spec, params, recorder, meta, renders=rendered)
    result = LiveResult(
        spec, ctx.params.model_dump(mode="json"), exchanges=recorder.exchanges, renders=rendered
    )
    try:
        result.items, result.follows = spec.task._collect(ctx, ctx.params)
    except Exception as exc:
        result.error = exc
        return result
    counts = ctx._metrics.counts  # the page's own counters: what a worker would add to metrics
    result.dropped = {k[8:]: n for k, n in counts.items() if k.startswith("dropped:") and n}
    if chain is not None and step:
        dumped = [it.model_dump(mode="json") for it in result.items]
        result.children = children(
            runtime.current(), chain, spec.name, meta, result.items, result.follows, dumped
        )
    return result
