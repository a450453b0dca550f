"""The mechanism layer every endpoint inherits: schemas, the fetch context and `SiteTask`.

An endpoint module is a page of business logic:

    class Params(base_task.Params):
        user_id: str

    class User(base_task.Item):
        item_type: ClassVar[str] = "demo.user"
        key_fields: ClassVar[tuple[str, ...]] = ("user_id",)
        user_id: str
        name: str

    @endpoint(Params, items=[User], resources=["user_agent"])
    def user_info(ctx: Context, p: Params) -> Outputs:
        data = ctx.get(f"{base_url()}/h5/api/user/{p.user_id}").json()
        yield User(user_id=data["id"], name=data["name"])

Everything else happens here, once: parameter validation, per-request and per-task deadlines
(held on every pool), typed errors mapped to retry policies with backoff and jitter, resource
providers around each request, redelivery caps, dead-lettering, metrics, and the atomic commit
that hands items to the outbox and dispatches the chain's next steps.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import math
import os
import random
import socket
import threading
import time
import traceback
import uuid
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

import orjson
import redis
from celery import Task, shared_task
from celery.exceptions import Reject, SoftTimeLimitExceeded
from celery.utils.saferepr import saferepr
from pydantic import BaseModel, ConfigDict, ValidationError

from chains.model import Chain, chain_from_dict, fan_out
from chains.state import Begun, CommitCall, Committed, Kid, RunState
from config import Settings, get_settings, is_redis_url
from exceptions import (
    BannedError,
    ChainCrawlError,
    DeadlineExceeded,
    ItemValidationError,
    ParamsError,
    PoisonMessage,
    Policy,
    RateLimited,
    ResourceUnavailable,
    Throttled,
    error_for_status,
    policy_for,
)
from external_interface.base import (
    Outcome,
    OutgoingRequest,
    Provider,
    load_providers,
    provider_name,
    providers,
)
from external_interface.fetch import Fetcher, FetchRequest, Response, default_fetcher
from monitor.deadletter import DeadLetter, DeadLetterStore
from monitor.metrics import TaskMetrics, aggregator
from scheduling.gate import get_gate
from utils.cpuload import CpuMeter
from utils.greenlets import gevent_patched
from utils.ids import new_id
from utils.logsafe import mask, redact, task_argsrepr
from utils.ranked_slots import RankedSlots
from utils.redis import get_redis
from utils.registry import Registry, UnknownNameError

log = logging.getLogger("chaincrawl.task")

PROVIDER_ORDER = ("proxy", "device_id", "user_agent", "cookie", "sign")


# --- schemas -----------------------------------------------------------------------------


class Params(BaseModel):
    """An endpoint's input. Unknown fields are rejected so a typo in a chain mapping shows."""

    model_config = ConfigDict(extra="forbid")


class Item(BaseModel):
    """An endpoint's output record. `item_type` names its collection; `key_fields` its identity
    (sinks upsert by them, so a redelivered task never duplicates an item)."""

    model_config = ConfigDict(extra="forbid")
    item_type: ClassVar[str] = ""
    key_fields: ClassVar[tuple[str, ...]] = ()
    store: ClassVar[bool] = True  # False: feeds child steps only (e.g. a captcha challenge)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if not cls.item_type:
            return  # an abstract intermediate class
        missing = [k for k in cls.key_fields if k not in cls.model_fields]
        if not cls.key_fields or missing:
            raise TypeError(
                f"Item {cls.__name__}: key_fields must name fields of the item (missing: {missing})"
            )


@dataclass
class Follow:
    """A follow-up of the same endpoint and step, e.g. the next page."""

    params: dict[str, Any]


Output = Item | Follow
Outputs = Iterable[Output]


# --- endpoint registry -------------------------------------------------------------------


@dataclass
class EndpointSpec:
    name: str
    site: str
    platform: str
    fn: Callable[..., Outputs | None]
    params: type[Params]
    item_types: tuple[type[Item], ...]
    resources: dict[str, str]
    max_retries: int | None = None
    deadline: float | None = None
    request_timeout: float | None = None
    queue: str = ""
    task: Any = None

    def validate_params(self, data: Any) -> Params:
        """Params or a ParamsError naming the task, the field and what is wrong."""
        if isinstance(data, self.params):
            return data
        if not isinstance(data, Mapping):
            raise ParamsError(
                f"{self.name}: parameters must be an object, got {type(data).__name__}"
            )
        try:
            return self.params.model_validate(data)
        except ValidationError as exc:
            raise ParamsError(f"{self.name}: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors()[:5]:
        loc = ".".join(str(x) for x in e["loc"]) or "(root)"
        parts.append(f"field {loc!r}: {e['msg']}")
    return "; ".join(parts)


ENDPOINTS: Registry[EndpointSpec] = Registry("task")
_loaded = threading.Event()


def get_endpoint(name: str) -> EndpointSpec:
    """The endpoint spec by task name, importing every site module on first use."""
    if name not in ENDPOINTS and not _loaded.is_set():
        from sites import load_all

        load_all()
    return ENDPOINTS.get(name)


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
    **task_options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """Turn `fn(ctx, params) -> outputs` into a Celery task on SiteTask.

    The task name defaults to the module path under `sites.` (`sites/demo/h5/feed.py` ->
    `demo.h5.feed`); its site (the first part) names its queue and its resource defaults.
    `resources` lists provider kinds (or kind -> provider name) lent to every request.
    """

    def deco(fn: Callable[..., Any]) -> Any:
        tname = name or _name_from_module(fn.__module__)
        parts = tname.split(".")
        if len(parts) < 2:
            raise ValueError(f"task name {tname!r} must look like site.platform.endpoint")
        res = dict(resources) if isinstance(resources, Mapping) else {k: k for k in resources}
        settings = get_settings()
        dl = deadline or settings.task_deadline
        spec = EndpointSpec(
            name=tname,
            site=parts[0],
            platform=parts[1] if len(parts) > 2 else "common",
            fn=fn,
            params=params,
            item_types=tuple(items),
            resources=res,
            max_retries=max_retries,
            deadline=deadline,
            request_timeout=request_timeout,
            queue=queue or parts[0],
        )
        opts = {"soft_time_limit": dl + 5, "time_limit": dl + 15, **task_options}

        def run(self: SiteTask, params: dict[str, Any], meta: dict[str, Any] | None = None) -> Any:
            return self.execute(params, meta)

        run.__name__ = fn.__name__
        run.__doc__ = fn.__doc__
        run.__module__ = fn.__module__
        task = shared_task(base=SiteTask, bind=True, name=tname, spec=spec, **opts)(run)
        spec.task = task
        ENDPOINTS.add(tname, spec)
        return task

    return deco


def _name_from_module(module: str) -> str:
    if not module.startswith("sites."):
        raise ValueError(f"endpoint in {module!r} is outside sites/: pass name='site.platform.x'")
    return module[len("sites.") :]


# --- the fetch context -------------------------------------------------------------------


_fetcher: Fetcher | None = None
_provider_cache: dict[tuple[str, str, str], Provider] = {}
_provider_lock = threading.Lock()


def get_fetcher() -> Fetcher:
    global _fetcher
    if _fetcher is None:
        s = get_settings()
        _fetcher = default_fetcher(s.max_redirects, s.fetcher, s.fetch_slots)
    return _fetcher


def get_provider(name: str, site: str, platform: str) -> Provider:
    key = (name, site, platform)
    p = _provider_cache.get(key)
    if p is None:
        with _provider_lock:
            p = _provider_cache.get(key)
            if p is None:
                if name not in providers:
                    load_providers()
                p = providers.get(name)(site, platform)
                _provider_cache[key] = p
    return p


_plans: dict[str, tuple[Settings, list[tuple[str, str]]]] = {}  # per endpoint, per settings


def resource_plan(spec: EndpointSpec, settings: Settings) -> list[tuple[str, str]]:
    """(kind, provider name) in the order providers must run: proxy first, sign last.
    Computed once per endpoint and settings object: every page asks."""
    cached = _plans.get(spec.name)
    if cached is not None and cached[0] is settings:
        return cached[1]
    plan = _resource_plan(spec, settings)
    _plans[spec.name] = (settings, plan)
    return plan


def _resource_plan(spec: EndpointSpec, settings: Settings) -> list[tuple[str, str]]:
    wanted = dict(spec.resources)
    if spec.site in {x.strip() for x in settings.proxy_sites.split(",")}:
        wanted.setdefault("proxy", "proxy")
    plan = [(k, provider_name(spec.site, k, n, settings.providers)) for k, n in wanted.items()]
    order = {k: i for i, k in enumerate(PROVIDER_ORDER)}
    return sorted(plan, key=lambda kn: order.get(kn[0], 99))


_site_loggers: dict[str, logging.Logger] = {}


def _site_logger(name: str) -> logging.Logger:
    """`logging.getLogger` takes the logging module's lock: once per endpoint, not per page."""
    lg = _site_loggers.get(name)
    if lg is None:
        lg = _site_loggers[name] = logging.getLogger(f"chaincrawl.site.{name}")
    return lg


class Context:
    """What an endpoint sees: its parameters' context, `get/post`, `follow`, the deadline.

    Satisfies `external_interface.base.TaskState` for providers.
    """

    def __init__(
        self,
        spec: EndpointSpec,
        params: Params,
        meta: Mapping[str, Any],
        settings: Settings,
        metrics: TaskMetrics,
        task_id: str = "",
        fetcher: Fetcher | None = None,
        use_providers: bool = True,
    ) -> None:
        self.spec = spec
        self.fetcher = fetcher or get_fetcher()
        self._online = use_providers  # offline (parser tests): no providers, no shared gate
        self.params = params
        self.meta = meta
        self.settings = settings
        self.metrics = metrics
        self.task_id = task_id
        self.site, self.platform, self.task_name = spec.site, spec.platform, spec.name
        self.run_id: str = meta.get("run", "")
        self.step: str = meta.get("step", "")
        self.avoid: set[str] = set(meta.get("avoid", ()))
        self.failed_leases: set[str] = set()
        self.deadline = time.monotonic() + (spec.deadline or settings.task_deadline)
        self.log = _site_logger(spec.name)
        self._providers = (
            [get_provider(n, spec.site, spec.platform) for _, n in resource_plan(spec, settings)]
            if use_providers
            else []
        )

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def check_deadline(self) -> None:
        if self.remaining() <= 0:
            raise DeadlineExceeded(f"{self.task_name}: task deadline passed")

    def follow(self, **changes: Any) -> Follow:
        """The same endpoint again with some parameters changed (next page, next cursor)."""
        return Follow({**self.params.model_dump(mode="json"), **changes})

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
        """
        remaining = self.remaining()
        if remaining <= 0:
            raise DeadlineExceeded(f"{self.task_name}: task deadline passed before {method} {url}")
        out = OutgoingRequest(
            method=method,
            url=url,
            params=dict(params or {}),
            headers=dict(headers or {}),
            cookies=dict(cookies or {}),
            data=data,
            json=json,
        )
        if self._online:
            get_gate().before_request(self.site, self.task_name)
        active = self._providers if resources else []
        for i, p in enumerate(active):
            try:
                p.prepare(out, self)
            except BaseException:
                for done in reversed(active[:i]):  # give back what was lent before the failure
                    cancel = getattr(done, "cancel", None)
                    if cancel is not None:
                        cancel(out, self)
                raise
        s = self.settings
        req = FetchRequest(
            method=out.method,
            url=out.url,
            params=out.params or None,
            headers=out.headers or None,
            cookies=out.cookies or None,
            data=out.data,
            json=out.json,
            proxy=out.proxy,
            timeout=min(timeout or self.spec.request_timeout or s.request_timeout, remaining),
            connect_timeout=s.connect_timeout,
            max_bytes=s.max_response_bytes,
            allow_redirects=allow_redirects,
            rank=page_rank(self.meta),
        )
        start = time.monotonic()
        try:
            resp = self.fetcher.fetch(req)
        except Exception as exc:
            outcome = Outcome(elapsed=time.monotonic() - start, error=exc)
            self.metrics.request(None, 0)
            self._feedback(active, out, outcome)
            self.failed_leases.update(f"{k}:{v}" for k, v in out.leases.items())
            raise
        self.metrics.request(resp.status, len(resp.content))
        if active:  # the providers judge the response (bans, captchas, retirements)
            outcome = Outcome(elapsed=resp.elapsed, status=resp.status,
                              text_sample=resp.text[:2048],
                              retry_after=_retry_after(resp.headers.get("retry-after")))  # fmt: skip
            try:
                self._feedback(active, out, outcome)
            except BannedError:
                self.failed_leases.update(f"{k}:{v}" for k, v in out.leases.items())
                raise
        if resp.status >= 400 and resp.status not in set(ok_statuses):
            self.failed_leases.update(f"{k}:{v}" for k, v in out.leases.items())
            err = error_for_status(resp.status, url)
            if isinstance(err, RateLimited):
                err.retry_after = _retry_after(resp.headers.get("retry-after"))  # type: ignore[attr-defined]
            raise err
        return resp

    def _feedback(self, active: Sequence[Provider], out: OutgoingRequest, outcome: Outcome) -> None:
        """Every provider hears the outcome; the first ban any of them detects is raised."""
        banned: BaseException | None = None
        for p in active:
            try:
                p.feedback(out, outcome, self)
            except BannedError as exc:
                banned = banned or exc
        if banned is not None:
            raise banned


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


# --- the task base class -----------------------------------------------------------------


_states: dict[tuple[int, int], RunState] = {}


def _run_state(client: Any, settings: Settings) -> RunState:
    """One RunState per client and settings: building one hashes its Lua scripts."""
    key = (id(client), id(settings))
    st = _states.get(key)
    if st is None:
        st = _states[key] = RunState(client, settings)
    return st


_chain_cache: OrderedDict[str, Chain] = OrderedDict()
_chain_lock = threading.Lock()


def _run_chain(state: RunState, rid: str) -> Chain | None:
    with _chain_lock:
        ch = _chain_cache.get(rid)
        if ch is not None:
            _chain_cache.move_to_end(rid)
            return ch
    raw = state.chain_def(rid)
    if raw is None:
        return None
    ch = chain_from_dict(orjson.loads(raw), validate=False)
    with _chain_lock:
        _chain_cache[rid] = ch
        while len(_chain_cache) > 256:
            _chain_cache.popitem(last=False)
    return ch


def broker_priority(prio: int, broker_url: str | None = None) -> int:
    """Our scale is 0..9 with 9 most urgent. AMQP agrees; the Redis transport pops priority 0
    first, so it gets the mirror image."""
    prio = max(0, min(9, int(prio)))
    url = broker_url or get_settings().broker_url
    return 9 - prio if is_redis_url(url) else prio


def send_kid(app: Any, kid: Mapping[str, Any], producer: Any = None) -> None:
    meta = kid["meta"]
    opts: dict[str, Any] = {
        "task_id": kid["id"],
        "argsrepr": task_argsrepr(kid["params"], meta),
        "kwargsrepr": "{}",
    }
    if "prio" in meta:
        opts["priority"] = broker_priority(meta["prio"])
    if meta.get("queue"):
        opts["queue"] = meta["queue"]
    if producer is not None:
        opts["producer"] = producer
    app.send_task(kid["task"], args=(kid["params"], meta), **opts)


# --- sending children: batches, raw envelopes ---------------------------------------------

BATCH_TASK = "chaincrawl.batch"  # args = [entries], each entry a `Kid.encode()` dict
_worker_slots = 0


def set_worker_slots(n: int) -> None:
    """The worker's pool size (worker.py, at `celeryd_init`): sizes the batching threshold."""
    global _worker_slots, _page_sem
    _worker_slots = max(1, int(n))
    _page_sem = None  # sized anew on first use


_page_sem: RankedSlots | None = None


def page_slots() -> RankedSlots | None:
    """Under gevent, the worker's slots, which every page holds while it runs, as a message of
    its own or as a batch entry: a batch runs its entries side by side (each one waits for a
    slot), so a worker never has more pages in progress, or requests in flight, than its
    concurrency, however its pages are packed into messages. The slots go to the most urgent
    waiting page first (`page_rank`): the worker's reserved batches can hold many pages. None
    on the threads and prefork pools, which run a batch's entries one after the other."""
    global _page_sem
    if _page_sem is None and gevent_patched():
        _page_sem = RankedSlots(_worker_slots or 16)
    return _page_sem


def page_rank(meta: Mapping[str, Any] | None) -> int:
    """A page's claim on a slot: its run's priority (0..9, 9 most urgent; the default where a
    message carries none or a malformed one, which must not keep the page from running)."""
    try:
        return int((meta or {})["prio"])
    except (KeyError, TypeError, ValueError):
        return get_settings().default_priority


def _holding(slots: RankedSlots | None, meta: Mapping[str, Any] | None) -> Any:
    """`with _holding(page_slots(), meta):` holds a page slot where there are page slots."""
    return slots.slot(page_rank(meta)) if slots is not None else contextlib.nullcontext()


def batch_size(s: Settings, outstanding: int, cpu_floor: bool = True) -> int:
    """Pages per message for children of a run with `outstanding` tasks.

    With `CHAINCRAWL_BATCH_BACKLOG` set: `batch` from that backlog on, else 1. Auto (0): the
    backlog must still make enough messages to keep the worker busy — two per slot (every slot
    needs work; ramp-up and tail stay one page per message; a second worker gets its share), a
    quarter of that (at least 4) once it is CPU-bound (more messages would not add throughput,
    only per-message cost).

    Where a batch runs its pages one after the other (threads, prefork), also one page per
    message while the worker wants less than 3/4 of a core (`cpu_busy`: latency-bound, the CPU
    is to spare, and k pages in one slot cost k latencies; skipped with `cpu_floor=False`).
    Under gevent a batch runs its pages side by side (`_side_by_side`), so latency-bound
    workers batch too, and slots beyond 2 x `batch` count no further (one message keeps up to
    `batch` of them busy). Measured on a slow 2-core machine: at 250 ms latency 3.4-4.0 ms of
    CPU per page instead of 5.6-6.4 at the same pages/s; at 100 ms latency and 256 slots
    375-477 pages/s instead of 250-277 (two pages per message had paid the ~3 ms a message
    costs every other page). There `Publisher.plan` also packs a shallow backlog's fan-out
    into a few messages (`FANOUT_MESSAGES`) instead of one page each."""
    size = max(1, s.batch)
    if size == 1:
        return 1
    if s.batch_backlog > 0:
        return size if outstanding >= s.batch_backlog else 1
    busy = cpu_busy()
    side_by_side = gevent_patched()  # a batch's pages run together (`_side_by_side`)
    if cpu_floor and busy < BATCH_CPU_MIN and not side_by_side:
        return 1
    slots = _worker_slots or 16
    if side_by_side:  # one message can keep up to `batch` slots busy
        slots = min(slots, BATCH_SLOT_FACTOR * size)
    wanted = BATCH_SLOT_FACTOR * slots
    if busy >= BATCH_CPU_BOUND:
        wanted = max(4, wanted // 4)
    return max(1, min(size, outstanding // wanted))


BATCH_CPU_MIN = 0.75  # threads/prefork: below this share of a core wanted, one page per
# message: CPU to spare, and a batch runs its pages one after the other in one slot (k pages =
# k latencies), which left slots idle in the tail of a latency-bound run. Not lower: a
# latency-bound crawl parses its 16 responses together every 250 ms, and on the threads pool
# (two cores) one 0.1 s window read 0.5-0.6; batched then, a user's ten posts ran one after
# the other in one slot and made a 2.5 s tail. A CPU-bound crawl reads 0.95 and more from its first 20 ms. (Smoothing the share
# over windows instead delayed the first batches of a CPU-bound crawl and cost it 30 % CPU per
# page: the first user pages' publishes decide whether their subtrees run batched.)
FANOUT_MESSAGES = 4  # gevent: one publish's children of one destination go in at most this
# many messages (`Publisher.plan`), however shallow the backlog. Its pages run side by side, so
# a batch costs no latency, while a message costs its consumer ~1-3 ms of CPU: one page per
# message made a 100 ms/256-slot crawl's first levels start their requests ~1.7 ms apart
# (20 user pages over 38 ms) and paid that cost all through a CPU-bound crawl's ramp-up.
# Measured (fast 2-core machine, interleaved): cpu scenario 0.85-0.89 ms/page instead of
# 0.97-1.06, half the BRPOPs; lat250 1.55-1.63 instead of 1.75-1.90 at the same pages/s;
# 100 ms/256 880-988 pages/s instead of 775-881. Four, not one: a second worker (a second
# core, in a CPU-bound crawl) still gets its share of a small fan-out.
BATCH_SLOT_FACTOR = 2  # messages per worker slot the backlog must still make when batched
BATCH_CPU_BOUND = 0.85  # share of a core wanted recently from which the worker counts as CPU-bound
CPU_WINDOW = 0.1  # seconds over which cpu_busy() measures
_cpu_meter = CpuMeter(CPU_WINDOW)


def cpu_busy() -> float:
    """Share of one core this process wanted over the last tenth of a second or so: its CPU
    plus the time its threads waited for a core (`utils.cpuload`), so a CPU-bound worker that
    shares its cores with another still reads busy. Every page ticks it (`SiteTask._execute`),
    so it is fresh whenever a publish asks: asked only by publishes, it went stale between the
    few pages with several children, read 0 on a CPU-bound crawl and left it at one page per
    message (3.3 ms instead of 1.4 per page)."""
    return _cpu_meter.demand()


def _tail_backlog(s: Settings) -> int:
    """Below this many outstanding tasks a run is in its tail: tasks write the pending metrics
    with their commit, so a finished run's metrics are complete."""
    return max(64, 2 * (_worker_slots or 16))


_seen_outstanding: dict[str, int] = {}  # run id -> outstanding count at this process's last commit


@dataclass
class _Message:
    task: str
    id: str
    args: list[Any]
    queue: str
    priority: int | None
    argsrepr: str


class Publisher:
    """Sends committed children. On a Redis broker they are LPUSHed as ready Celery
    protocol-2 messages in kombu's Redis transport format, all in one pipeline together with
    the DEL of the staging lists: no `send_task`, no kombu client per publish, no task-sent
    event. Other brokers go through kombu's producer batch."""

    def __init__(self, app: Any, s: Settings) -> None:
        self.app = app
        self.s = s
        self.redis_broker = s.redis_broker
        opts = app.conf.broker_transport_options or {}
        self.prefix = opts.get("global_keyprefix", "")
        self.sep = opts.get("sep", "\x06\x16")
        self.steps = sorted(opts.get("priority_steps") or (0, 3, 6, 9))
        self.origin = f"gen{os.getpid()}@{socket.gethostname()}"
        self._queues: dict[str, str] = {}

    def queue_for(self, task: str) -> str:
        q = self._queues.get(task)
        if q is None:
            from worker import route

            q = self._queues[task] = route(task, (), {}, {})["queue"]
        return q

    def plan(
        self, kids: list[dict[str, Any]], outstanding: int, spread: bool = True
    ) -> list[_Message]:
        """The children of one (task, queue, priority) in messages of up to `batch_size`
        entries, evenly filled; one message per child when that is 1. Under gevent (and
        `spread`) a group also goes in at most `FANOUT_MESSAGES` messages, `batch` allowing."""
        size = batch_size(self.s, outstanding) if len(kids) > 1 else 1
        fan = spread and self.s.batch > 1 and self.s.batch_backlog <= 0 and gevent_patched()
        groups: dict[tuple[str, str, int | None], list[dict[str, Any]]] = {}
        for kid in kids:
            meta = kid["meta"]
            prio = broker_priority(meta["prio"], self.s.broker_url) if "prio" in meta else None
            dest = (kid["task"], meta.get("queue") or self.queue_for(kid["task"]), prio)
            groups.setdefault(dest, []).append(kid)
        out: list[_Message] = []
        for (task, queue, prio), group in groups.items():
            per = size
            if fan and len(group) > FANOUT_MESSAGES:
                per = max(size, min(self.s.batch, math.ceil(len(group) / FANOUT_MESSAGES)))
            n_msgs = math.ceil(len(group) / per) if per > 1 else len(group)
            q, r = divmod(len(group), n_msgs)  # even sizes: 10 in 4 -> 3, 3, 2, 2
            start = 0
            for j in range(n_msgs):
                chunk = group[start : start + q + (j < r)]
                start += len(chunk)
                if len(chunk) == 1:
                    k = chunk[0]
                    args = [k["params"], k["meta"]]
                    rep = task_argsrepr(k["params"], k["meta"])
                    out.append(_Message(task, k["id"], args, queue, prio, rep))
                else:
                    rep = batch_argsrepr(chunk)
                    out.append(_Message(BATCH_TASK, new_id(), [chunk], queue, prio, rep))
        return out

    def publish(
        self,
        state: RunState,
        groups: Sequence[tuple[list[bytes], str]],
        outstanding: int,
        front: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Send the staged children of `groups` ((messages, staging key)), then drop the
        staging lists. Anything raised leaves them staged for a redelivery to send. `front`:
        entries a batch did not start, due already, so on a Redis broker they go to the head
        of their queues (the next BRPOP takes them) instead of behind the whole backlog."""
        keys = [key for staged, key in groups if staged]
        kids = [orjson.loads(m) for staged, _ in groups for m in staged]
        if not kids and not front:
            return
        msgs = self.plan(kids, outstanding)
        first = self.plan(list(front), outstanding, spread=False)  # as a batch hands them out
        if self.redis_broker:
            broker = get_redis(self.s.broker_url)
            pipe = broker.pipeline(transaction=False)
            for m in msgs:
                pipe.lpush(*self.envelope(m))
            for m in reversed(first):  # the head is the right end: keep their order
                pipe.rpush(*self.envelope(m))
            same = self.s.broker_url == self.s.redis_url
            if same and keys:
                pipe.delete(*keys)
            pipe.execute()
            if not same and keys:
                state.r.delete(*keys)
            return
        with self.app.producer_or_acquire() as producer, producer.batch():
            for m in first + msgs:
                opts: dict[str, Any] = {"queue": m.queue}
                if m.priority is not None:
                    opts["priority"] = m.priority
                self.app.send_task(m.task, args=m.args, task_id=m.id, argsrepr=m.argsrepr,
                                   kwargsrepr="{}", producer=producer, **opts)  # fmt: skip
        if keys:
            state.r.delete(*keys)

    def envelope(self, m: _Message) -> tuple[str, bytes]:
        """(queue key, message) as kombu's Redis transport LPUSHes a Celery protocol-2 task."""
        body = orjson.dumps(
            [m.args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
        )
        pri = m.priority or 0
        msg = {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {
                "lang": "py",
                "task": m.task,
                "id": m.id,
                "shadow": None,
                "eta": None,
                "expires": None,
                "group": None,
                "group_index": None,
                "retries": 0,
                "timelimit": [None, None],
                "root_id": m.id,
                "parent_id": None,
                "argsrepr": m.argsrepr,
                "kwargsrepr": "{}",
                "origin": self.origin,
                "ignore_result": True,
                "replaced_task_nesting": 0,
                "stamped_headers": None,
                "stamps": {},
            },
            "properties": {
                "correlation_id": m.id,
                "reply_to": "",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": m.queue},
                "priority": pri,
                "body_encoding": "base64",
                "delivery_tag": new_id(),
            },
        }
        step = self.steps[bisect_right(self.steps, pri) - 1] if self.steps else 0
        queue = f"{m.queue}{self.sep}{step}" if step else m.queue
        return f"{self.prefix}{queue}", orjson.dumps(msg)


def batch_argsrepr(chunk: list[dict[str, Any]]) -> str:
    """What Flower shows of a batch message: its size and its first page, masked. Masking and
    repr-ing every entry cost more than building the message (each entry's own events, when
    on, show its arguments)."""
    first = chunk[0]
    head = redact(saferepr(mask({"id": first["id"], "params": first["params"],
                                 "meta": first["meta"]}), 512))  # fmt: skip
    return f"[{len(chunk)} pages of {first['task']}: {head}, ...]"


_publishers: dict[tuple[int, int, int], Publisher] = {}


def publisher(app: Any, s: Settings) -> Publisher:
    key = (id(app), id(s), os.getpid())
    p = _publishers.get(key)
    if p is None:
        p = _publishers[key] = Publisher(app, s)
    return p


class _BatchRun:
    """The entries of one batch message being run: their commits (sent in one round trip
    after the last entry) and their children (published in one pipeline after that)."""

    def __init__(self) -> None:
        self.calls: list[CommitCall] = []
        self.after: list[tuple[SiteTask, str, str]] = []  # (task, tid, dedup id) per call
        self.groups: list[tuple[list[bytes], str]] = []
        self.outstanding = 0

    def add(self, staged: list[bytes], key: str, outstanding: int) -> None:
        if staged:
            self.groups.append((staged, key))
        self.outstanding = max(self.outstanding, outstanding)


_tls = threading.local()


def _current_batch() -> _BatchRun | None:
    return getattr(_tls, "batch", None)


_hold_seen: dict[str, tuple[float, str]] = {}  # run id -> (monotonic time read, `RunState.hold`)


def _run_hold(state: RunState, rid: str) -> str:
    """Whether run `rid` is cancelled or paused (`RunState.hold`), read at most once a second
    per process: a batch's pages all begin when the batch does, and those still waiting for a
    slot when the run is cancelled or paused should not be fetched."""
    now = time.monotonic()
    seen = _hold_seen.get(rid)
    if seen is not None and now - seen[0] < 1.0:
        return seen[1]
    if len(_hold_seen) > 10_000:  # old runs: forget them all, the next read costs one call
        _hold_seen.clear()
    # one reader per second: the other greenlets and threads keep the last answer meanwhile
    # (each of them reading at once cost 5 % more instructions per page under callgrind)
    _hold_seen[rid] = (now, seen[1] if seen is not None else "")
    hold = state.hold(rid)
    _hold_seen[rid] = (time.monotonic(), hold)
    return hold


def _attempt(request: Any, meta: Mapping[str, Any]) -> int:
    """The task's retry number: Celery's count in this message, plus the count it had when
    its run was paused and it was parked (`rbase`; a parked task comes back as a new message)."""
    return (request.retries or 0) + int(meta.get("rbase", 0))


def _skip_call(state: RunState, rid: str, tid: str, step: str) -> CommitCall:
    """The commit of a task whose run was cancelled: no items, no children."""
    calls: list[CommitCall] = []
    state.commit(rid=rid, tid=tid, step=step, outcome="cancelled", n_items=0, entries=(),
                 kids=(), defer=calls)  # fmt: skip
    return calls[0]


def _run_commits(
    state: RunState, s: Settings, rid: str, calls: list[CommitCall], pipe_extra: Any = None
) -> list[Committed | None]:
    """Commit calls in one round trip. While the run's backlog is shallow (its tail, or not
    seen yet) this process's pending metrics go first in the same pipeline, so they are
    written no later than the commit that may complete the run."""
    agg = aggregator()
    seen = _seen_outstanding.get(rid) if rid else 0
    tail = _tail_backlog(s)
    sync = seen is None or seen < tail
    taken: dict[str, Any] = {}

    def pre(pipe: Any) -> None:
        taken.update(agg.drain_into(pipe))

    try:
        results = state.run_commits(calls, pipe_pre=pre if sync else None, pipe_extra=pipe_extra)
    except Exception:
        agg.restore(taken)
        raise
    done = [res for res in results if res is not None]
    if rid and done:
        n = max(res.outstanding for res in done)
        if len(_seen_outstanding) > 1024:
            _seen_outstanding.clear()
        _seen_outstanding[rid] = n
        if not sync and n < tail and agg.pending():  # entering the tail: write the sums now
            try:
                agg.flush(state.r)
            except redis.exceptions.RedisError as exc:
                log.warning("metrics flush failed (kept for the next try): %s", exc)
    return results


def _aggregate(metrics: TaskMetrics, spec: EndpointSpec, s: Settings) -> None:
    """This task's metrics into the process's sums (written within the flush interval)."""
    agg = aggregator()
    agg.start(get_redis(), s.metrics_flush_interval)
    metrics.aggregate(spec.name, spec.site, s)


class SiteTask(Task):
    """Celery task base for endpoints: see the module docstring for what it adds."""

    spec: EndpointSpec
    max_retries = None  # our policy counts retries; Celery's default (3) would cut it short
    acks_late = True
    reject_on_worker_lost = True
    ignore_result = True
    typing = False  # arguments are checked by our schemas, with better messages

    def execute(self, params: Any, meta: Mapping[str, Any] | None) -> str:
        with _holding(page_slots(), meta):
            try:
                return self._execute(params, meta)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                # Our state store is unreachable: nothing was committed (the commit is one
                # script), so the message must not be acknowledged. Requeue it; the commit's
                # idempotency makes a second run harmless.
                log.warning("%s: state store unreachable (%s); message requeued", self.name, exc)
                _pause_before_requeue()
                raise Reject(exc, requeue=True) from None

    def _execute(
        self, params: Any, meta: Mapping[str, Any] | None, begun: Begun | None = None
    ) -> str:
        """One page: begin, run the endpoint, commit, send the children. Inside a batch
        (`begun` from the batch's one begin round trip) the commit is deferred to the batch."""
        spec = self.spec
        settings = get_settings()
        r = get_redis()
        state = _run_state(r, settings)
        meta = dict(meta or {})
        tid = self.request.id or uuid.uuid4().hex
        rid, step = meta.get("run", ""), meta.get("step", "")
        metrics = TaskMetrics()
        metrics.outcome("started")
        started = time.monotonic()
        cpu_busy()  # keep the CPU window fresh for batch sizing
        attempt = _attempt(self.request, meta)
        if begun is None:
            begun = state.begin(rid, tid, attempt)
        elif rid and not (begun.cancelled or begun.paused):
            hold = _run_hold(state, rid)  # cancelled or paused since its batch began?
            if hold:
                begun = begun._replace(cancelled=hold == "cancelled", paused=hold == "paused")
        committed, deliveries, cancelled, paused = begun
        if paused and not (cancelled or committed):
            # back as a new message: its retry number kept, its wait for a resource restarted
            # (a pause is no time spent waiting for a pool: `resource_wait_max`)
            kept = {k: v for k, v in meta.items() if k != "wait_since"}
            msg = orjson.dumps(
                {"id": tid, "task": self.name, "params": params, "meta": {**kept, "rbase": attempt}}
            )
            parked = state.park(rid, tid, msg, attempt, counted=deliveries > 0)
            if parked:
                outcome = "paused" if parked > 0 else "duplicate"
                metrics.outcome(outcome)
                _aggregate(metrics, spec, settings)
                return outcome
        if committed:  # a redelivery of a committed task: send what is still staged
            metrics.outcome("duplicate")
            _aggregate(metrics, spec, settings)
            self._send_staged(state, tid)
            return "duplicate"
        if cancelled:  # its run was cancelled: no fetch, counted as cancelled
            metrics.outcome("cancelled")
            _aggregate(metrics, spec, settings)
            res = _run_commits(state, settings, rid, [_skip_call(state, rid, tid, step)])[0]
            if res is not None:  # backpressure may have released children here before
                self._send_staged(state, tid, res)
            return "cancelled"
        _aggregate(metrics, spec, settings)
        ctx: Context | None = None
        gate = get_gate()
        admitted = False
        try:
            if deliveries > settings.max_redeliveries + 1:
                raise PoisonMessage(
                    f"{spec.name}: delivered {deliveries} times without finishing "
                    f"(cap {settings.max_redeliveries} redeliveries)"
                )
            p = spec.validate_params(params)
            wait = gate.admit(spec.site, spec.name, tid)
            if wait > 0:
                raise Throttled(f"{spec.name}: over its shared limit", retry_after=wait)
            admitted = True
            ctx = Context(spec, p, meta, settings, metrics, tid)
            items, follows = self._collect(ctx, p)
        except Exception as exc:
            return self._handle_error(exc, params, meta, ctx, state, metrics, started)
        finally:
            if admitted:
                gate.release(spec.site, spec.name, tid)
        dumped = [it.model_dump(mode="json") for it in items]  # once: outbox rows and fan-out
        stored = [(it, row) for it, row in zip(items, dumped, strict=True) if it.store]
        entries = _outbox_entries(rid, step, spec.name, stored)
        kids = self._kids(state, rid, step, meta, items, follows, dumped)
        metrics.outcome("succeeded")
        metrics.counts["items"] += len(stored)
        metrics.latency(time.monotonic() - started)
        _aggregate(metrics, spec, settings)
        summary = f"{len(stored)} items, {len(kids)} follow-ups"
        batch = _current_batch()
        calls: list[CommitCall] = batch.calls if batch is not None else []
        state.commit(
            rid=rid, tid=tid, step=step, outcome="succeeded", n_items=len(stored),
            entries=entries, kids=kids, defer=calls,
        )  # fmt: skip
        if batch is not None:
            batch.after.append((self, tid, meta.get("dd", "")))
            return summary
        res = _run_commits(state, settings, rid, calls)[0]
        self._send_staged(state, tid, res)
        if meta.get("dd"):  # crawled and handed off durably: remember it for skip_seen
            _request_dedup(spec.name).mark_many([meta["dd"]], refresh=True)
        return summary

    # -- running the endpoint

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
                ctx.check_deadline()
        except ValidationError as exc:
            raise ItemValidationError(f"{self.spec.name}: item invalid: {_describe(exc)}") from None
        except SoftTimeLimitExceeded:
            raise DeadlineExceeded(f"{self.spec.name}: soft time limit exceeded") from None
        return items, follows

    def _kids(
        self,
        state: RunState,
        rid: str,
        step: str,
        meta: Mapping[str, Any],
        items: list[Item],
        follows: list[Follow],
        dumped: list[dict[str, Any]],
    ) -> list[Kid]:
        base = {k: meta[k] for k in ("run", "prio") if k in meta}
        kids: list[Kid] = []
        chain = _run_chain(state, rid) if rid else None
        node = chain.steps.get(step) if chain else None
        page = int(meta.get("page", 1))
        max_pages = node.options.max_pages if node else None
        if follows and (max_pages is None or page < max_pages):
            for f in follows:
                kids.append(
                    Kid(
                        step=step,
                        task=self.name,
                        params=f.params,
                        meta={**base, "step": step, "page": page + 1, **_queue(meta)},
                        task_id=new_id(),
                    )
                )
        if node is None or not node.children:
            return kids
        pairs = [(it.item_type, row) for it, row in zip(items, dumped, strict=True)]
        for child in node.children:
            cmeta = {**base, "step": child.id}
            if child.options.priority is not None:
                cmeta["prio"] = child.options.priority
            if child.options.queue:
                cmeta["queue"] = child.options.queue
            batch = []
            for params in fan_out(child, pairs):
                uniq = _fingerprint(params) if child.options.unique else ""
                batch.append(Kid(child.id, child.task, params, dict(cmeta), new_id(), uniq))
            if child.options.skip_seen_hours is not None and batch:
                batch = _skip_seen(child.task, batch, child.options.skip_seen_hours)
            kids.extend(batch)
        return kids

    def _send_staged(self, state: RunState, tid: str, res: Committed | None = None) -> None:
        """Publish the children this task's commit staged (`res`; None: read them back, as a
        redelivered committed task does). Inside a batch they wait for the batch's publish.
        A failure after the commit requeues the message (bug 2): its redelivery finds the
        task committed and sends what is still staged; acking it would strand the children."""
        key = state.kids_key(tid)
        try:
            staged = res.staged if res is not None else state.r.lrange(key, 0, -1)
            outstanding = res.outstanding if res is not None else 0
            batch = _current_batch()
            if batch is not None:
                batch.add(staged, key, outstanding)
            elif staged:
                publisher(self.app, state.s).publish(state, [(staged, key)], outstanding)
        except Exception as exc:
            log.warning("%s: children of %s not sent (%s: %s); message requeued",
                        self.name, tid, type(exc).__name__, _safe(exc))  # fmt: skip
            raise Reject(exc, requeue=True) from None

    # -- failure paths

    def _handle_error(
        self,
        exc: Exception,
        params: Any,
        meta: dict[str, Any],
        ctx: Context | None,
        state: RunState,
        metrics: TaskMetrics,
        started: float,
    ) -> str:
        if isinstance(exc, SoftTimeLimitExceeded):
            exc = DeadlineExceeded(f"{self.spec.name}: soft time limit exceeded")
        spec, settings = self.spec, get_settings()
        policy = policy_for(exc)
        err = type(exc).__name__
        rid, step = meta.get("run", ""), meta.get("step", "")
        waits = int(meta.get("waits", 0))
        retries_used = _attempt(self.request, meta) - waits
        max_retries = spec.max_retries if spec.max_retries is not None else settings.max_retries
        metrics.latency(time.monotonic() - started)
        r = state.r

        now = time.time()
        waiting_since = float(meta.get("wait_since") or now)
        if policy is Policy.WAIT and (
            isinstance(exc, Throttled) or now - waiting_since < settings.resource_wait_max
        ):  # a contended pool is not a failure; a pool nobody refills for this long is
            meta["waits"] = waits + 1
            meta["wait_since"] = round(waiting_since, 3)
            countdown = min(getattr(exc, "retry_after", 2.0), _countdown_cap(settings))
            metrics.outcome("waited", err)
            pipe = r.pipeline(transaction=False)
            metrics.flush(pipe, spec.name, spec.site, settings)
            pipe.execute()
            raise self._retry_later(params, meta, countdown, exc)

        if policy in (Policy.RETRY, Policy.ROTATE) and retries_used < max_retries:
            if ctx is not None and ctx.failed_leases:  # a retry never reuses what just failed
                meta["avoid"] = sorted(set(meta.get("avoid", ())) | ctx.failed_leases)[-32:]
            countdown = backoff(retries_used, settings)
            hint = getattr(exc, "retry_after", None)
            if hint:
                countdown = max(countdown, min(float(hint), _countdown_cap(settings)))
            metrics.outcome("retried", err)
            pipe = r.pipeline(transaction=False)
            state.count_retry(rid, step, pipe)
            metrics.flush(pipe, spec.name, spec.site, settings)
            pipe.execute()
            log.info("%s retry %d/%d in %.1fs after %s: %s",
                     spec.name, retries_used + 1, max_retries, countdown, err, _safe(exc))  # fmt: skip
            raise self._retry_later(params, meta, countdown, exc)

        # final failure: dead-letter it, count it, let the run move on
        tid = self.request.id or ""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]
        dl = DeadLetter(
            id=tid,
            task=spec.name,
            params=params if isinstance(params, dict) else {"_raw": repr(params)[:500]},
            meta=meta,
            error_type=err,
            error=_safe(exc),
            traceback=tb,
            retries=retries_used,
        )
        metrics.outcome("failed", err)
        dls = DeadLetterStore(r, settings)

        def extra(pipe: Any) -> None:
            dls.add(dl, pipe)
            metrics.flush(pipe, spec.name, spec.site, settings)

        calls: list[CommitCall] = []
        state.commit(
            rid=rid, tid=tid, step=step, outcome="failed", n_items=0, entries=(), kids=(),
            defer=calls,
        )  # fmt: skip
        res = _run_commits(state, settings, rid, calls, pipe_extra=extra)[0]
        log.warning("%s failed for good after %d retries (%s: %s); dead-lettered as %s",
                    spec.name, retries_used, err, _safe(exc), tid)  # fmt: skip
        if res is not None:  # backpressure may have released waiting children to this task
            self._send_staged(state, tid, res)
        return f"failed: {err}"

    def _retry_later(
        self, params: Any, meta: dict[str, Any], countdown: float, exc: Exception
    ) -> Exception:
        """A retry is its own message with the same task id (also for a batch entry)."""
        opts: dict[str, Any] = {}
        if "prio" in meta:
            opts["priority"] = broker_priority(meta["prio"])
        if meta.get("queue"):
            opts["queue"] = meta["queue"]
        return self.retry(
            args=(params, meta),
            kwargs={},
            countdown=countdown,
            max_retries=None,
            exc=exc,
            argsrepr=task_argsrepr(params, meta),
            kwargsrepr="{}",
            **opts,
        )


# --- the batch task ------------------------------------------------------------------------


@shared_task(name=BATCH_TASK, bind=True, acks_late=True, reject_on_worker_lost=True,
             ignore_result=True, typing=False, max_retries=None)  # fmt: skip
def run_batch(self: Task, entries: list[dict[str, Any]]) -> str:
    """Several pages in one message (`Publisher.plan`). Each entry runs as the task it names,
    with its own task id: its own begin and commit (exactly once per id), its own retry
    (a message of its own, same id) and its own dead letter. The entries' begins go in one
    round trip, their commits in one, their children in one publish pipeline."""
    try:
        return _run_batch(self, entries)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        log.warning("%s: state store unreachable (%s); message requeued", BATCH_TASK, exc)
        _pause_before_requeue()
        raise Reject(exc, requeue=True) from None


def _run_batch(btask: Task, entries: list[dict[str, Any]]) -> str:
    from celery.exceptions import Retry

    settings = get_settings()
    state = _run_state(get_redis(), settings)
    todo: list[tuple[EndpointSpec, dict[str, Any]]] = []
    for e in entries:
        try:
            todo.append((get_endpoint(e["task"]), e))
        except UnknownNameError:
            _dead_letter_unknown(state, settings, e)
    begun, deliveries = state.begin_many(
        [(e["meta"].get("run", ""), e["id"], 0) for _, e in todo], batch_id=btask.request.id or ""
    )
    # A redelivered batch (its worker died, or it was requeued) runs entry by entry: each
    # entry counts its own delivery as it starts and commits at once, so a poison entry is
    # charged alone and the work done before a death is kept.
    careful = deliveries > 1
    run = _BatchRun()
    req = btask.request
    events = settings.task_events
    _tls.batch = None if careful else run
    budget, t_batch = _batch_budget(settings), time.monotonic()
    rid = next((e["meta"].get("run", "") for _, e in todo), "")
    slots = page_slots()  # gevent: every entry holds a page slot while it runs
    side_by_side = slots is not None and not careful

    def hand_out(k: int) -> str:
        """Why entry k should go to a message of its own instead of running here ("": run)."""
        if not k:
            return ""
        # Slow pages: hand the entries not started to a new message rather than run towards
        # the visibility timeout (a restore would run the batch twice).
        if time.monotonic() - t_batch > budget:
            return f"over its {budget:.0f}s budget"
        # A batch no longer worth its one-slot-at-a-time pages: hand them out too (a batch
        # whose pages run side by side has none waiting behind each other).
        if not side_by_side and _unbatch(settings, rid):
            return "in its run's tail"
        return ""

    def one(spec: EndpointSpec, e: dict[str, Any], b: Begun) -> None:
        if careful:
            b = state.begin(e["meta"].get("run", ""), e["id"], int(e["meta"].get("rbase", 0)))
            b = b._replace(deliveries=b.deliveries + 1)  # + the first, as for a single message
        task: SiteTask = spec.task
        params, meta = e["params"], e["meta"]
        task.push_request(
            id=e["id"], root_id=e["id"], parent_id=None, correlation_id=e["id"],
            args=[params, meta], kwargs={}, retries=0, called_directly=False,
            is_eager=False, hostname=req.hostname, delivery_info=req.delivery_info,
            reply_to=None, ignore_result=True,
        )  # fmt: skip
        t0 = time.monotonic()
        try:
            if events:
                _entry_event(task, "task-received", name=spec.name, retries=0,
                             args=task_argsrepr(params, meta), kwargs="{}")  # fmt: skip
                _entry_event(task, "task-started")
            result = task._execute(params, meta, begun=b)
            if events:
                _entry_event(task, "task-succeeded", result=result,
                             runtime=time.monotonic() - t0)  # fmt: skip
        except Retry as exc:  # already sent as its own message, same id
            if events:
                _entry_event(task, "task-retried", exception=_safe(exc))
        except (Reject, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            raise
        except Exception as exc:  # as for a single message: logged, not committed
            log.exception("%s[%s] raised inside %s", spec.name, e["id"], BATCH_TASK)
            if events:
                _entry_event(task, "task-failed", exception=_safe(exc))
        finally:
            task.pop_request()

    entries_b = list(zip(todo, begun, strict=True))
    try:
        if side_by_side:
            rest, why = _side_by_side(slots, run, entries_b, hand_out, one)
        else:  # one after the other (threads, prefork, or a redelivered batch)
            rest, why = [], ""
            for k, ((spec, e), b) in enumerate(entries_b):
                why = hand_out(k)
                if why:
                    rest = [x for _, x in todo[k:]]
                    break
                with _holding(slots, e["meta"]):
                    one(spec, e, b)
    finally:
        _tls.batch = None
    results = _run_commits(state, settings, rid, run.calls) if run.calls else []
    for (_task, tid, _dd), res in zip(run.after, results, strict=True):
        key = state.kids_key(tid)
        if res is None:  # committed meanwhile by another delivery: send what it staged
            run.add(state.r.lrange(key, 0, -1), key, 0)
        else:
            run.add(res.staged, key, res.outstanding)
    if rest:
        log.info("%s %s: %d of %d pages handed to new messages",
                 BATCH_TASK, why, len(rest), len(entries))  # fmt: skip
    if run.groups or rest:
        try:
            publisher(btask.app, settings).publish(state, run.groups, run.outstanding, rest)
        except Exception as exc:  # bug 2: committed entries re-send what is staged
            log.warning("%s: children not sent (%s: %s); message requeued",
                        BATCH_TASK, type(exc).__name__, _safe(exc))  # fmt: skip
            raise Reject(exc, requeue=True) from None
    marks: dict[str, list[str]] = {}
    for task, _tid, dd in run.after:
        if dd:
            marks.setdefault(task.name, []).append(dd)
    for name, ids in marks.items():  # crawled and handed off durably: skip_seen may skip them
        _request_dedup(name).mark_many(ids, refresh=True)
    if rest:
        return f"{len(entries) - len(rest)} pages, {len(rest)} re-queued"
    return f"{len(entries)} pages"


REQUEUE_PAUSE = 1.0  # seconds a slot waits before requeueing a message it could not run


def _pause_before_requeue() -> None:
    """With the state store down and the broker elsewhere (RabbitMQ, another Redis), a requeued
    message comes straight back: without a pause every slot would spin through the queue,
    logging a warning per delivery, until Redis returns."""
    time.sleep(REQUEUE_PAUSE)


def _side_by_side(
    sem: RankedSlots,
    run: _BatchRun,
    entries: list[tuple[tuple[EndpointSpec, dict[str, Any]], tuple[bool, int]]],
    hand_out: Callable[[int], str],
    one: Callable[[EndpointSpec, dict[str, Any], tuple[bool, int]], None],
) -> tuple[list[dict[str, Any]], str]:
    """Run a batch's entries in greenlets of their own, each holding a page slot (gevent): at
    100 ms latency and 256 slots a batch run one page after the other was worth only two
    pages per message, and each message costs ~3 ms of CPU on a slow machine. An entry that
    gets its slot past the batch's budget is handed out instead (returned, in order, with
    why). Errors that must requeue the message (Reject, Redis unreachable) are raised once
    every entry has finished: nothing is committed before the batch's one commit anyway."""
    import gevent

    left: dict[int, dict[str, Any]] = {}
    whys: list[str] = []
    errors: list[BaseException] = []

    def entry(k: int, spec: EndpointSpec, e: dict[str, Any], b: tuple[bool, int]) -> None:
        _tls.batch = run  # greenlet-local under gevent: each entry defers to the batch
        try:
            with _holding(sem, e["meta"]):
                why = hand_out(k)
                if why:
                    left[k] = e
                    whys.append(why)
                    return
                one(spec, e, b)
        except BaseException as exc:
            errors.append(exc)

    greenlets = [gevent.spawn(entry, k, spec, e, b) for k, ((spec, e), b) in enumerate(entries)]
    try:
        gevent.joinall(greenlets)
    except BaseException:  # the batch itself is being killed (cold shutdown): its entries too
        gevent.killall(greenlets)
        raise
    if errors:
        raise errors[0]
    return [left[k] for k in sorted(left)], (whys[0] if whys else "")


def _unbatch(s: Settings, rid: str) -> bool:
    """Whether a running batch should hand its pages not started to messages of their own: the
    run's backlog, as this process last saw it, is too shallow for batches (`batch_size` would
    publish one page per message now: the run's tail). A batch runs its pages one after the
    other in one slot, k pages = k latencies: in a latency-bound crawl on a slow machine, a
    batch formed during a burst of parsing ran last and fetched six pages one at a time while
    15 fetch slots sat idle (1.3 s, 6 % of the run; 6 of 27 runs ended below 91 % of the
    bound). The CPU share is not asked here: mid-run, a slot busy with a batch leaves the
    others their work, and splitting every batch a quiet 0.1 s window finds cost 10-15 % more
    CPU per page in messages."""
    seen = _seen_outstanding.get(rid) if rid else None
    if seen is None or s.batch <= 1:
        return False
    return batch_size(s, seen, cpu_floor=False) == 1


def _batch_budget(s: Settings) -> float:
    """Seconds a batch may run before it hands its remaining pages to new messages: well under
    the visibility timeout (a batch running past it would be restored and run twice) and short
    enough that a worker's death loses little (a batch commits its pages at its end)."""
    return max(1.0, min(30.0, 0.25 * s.visibility_timeout))


def _entry_event(task: Task, type_: str, **fields: Any) -> None:
    """Task events for one entry of a batch, in its own id, so Flower lists every page."""
    try:
        task.send_event(type_, **fields)
    except Exception as exc:  # monitoring never fails a page
        log.debug("event %s not sent: %s", type_, exc)


def _dead_letter_unknown(state: RunState, s: Settings, e: Mapping[str, Any]) -> None:
    """An entry naming no registered task: dead-lettered and counted failed, so its run ends."""
    meta = dict(e.get("meta") or {})
    rid, step, tid = meta.get("run", ""), meta.get("step", ""), str(e.get("id", ""))
    dl = DeadLetter(
        id=tid,
        task=str(e.get("task")),
        params=e.get("params") if isinstance(e.get("params"), dict) else {},
        meta=meta,
        error_type="NotRegistered",
        error=f"no task named {e.get('task')!r} in this worker",
        traceback="",
        retries=0,
    )
    dls = DeadLetterStore(state.r, s)
    calls: list[CommitCall] = []
    state.commit(rid=rid, tid=tid, step=step, outcome="failed", n_items=0, entries=(), kids=(),
                 defer=calls)  # fmt: skip
    state.run_commits(calls, pipe_extra=lambda pipe: dls.add(dl, pipe))
    log.error("%s: entry %s names unknown task %r; dead-lettered", BATCH_TASK, tid, e.get("task"))


def _queue(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {"queue": meta["queue"]} if meta.get("queue") else {}


def _countdown_cap(s: Settings) -> float:
    """Countdown retries wait inside the worker unacknowledged: stay under the visibility timeout."""
    return max(1.0, min(s.retry_backoff_max, s.visibility_timeout * 0.5))


def backoff(attempt: int, s: Settings | None = None) -> float:
    """Exponential backoff with equal jitter: half the step fixed, half random."""
    s = s or get_settings()
    step = min(_countdown_cap(s), s.retry_backoff * (2**attempt))
    return step / 2 + random.uniform(0, step / 2)


_dedup_stores: dict[tuple[str, int], Any] = {}


def _request_dedup(task: str) -> Any:
    """The dedup store of a task's requests (namespace `req:<task>`), one per process."""
    from external_interface.dedup import RedisDedup

    key = (task, os.getpid())
    store = _dedup_stores.get(key)
    if store is None:
        store = _dedup_stores[key] = RedisDedup(f"req:{task}", get_redis())
    return store


def _skip_seen(task: str, kids: list[Kid], hours: float) -> list[Kid]:
    """Drop children crawled within `hours`; the rest carry their dedup id so they mark it
    once they have committed (marking after the durable hand-off, seed 002)."""
    ids = [_fingerprint(k.params) for k in kids]
    within = timedelta(hours=hours) if hours > 0 else None  # 0: skip if ever seen
    todo = set(_request_dedup(task).filter_new(ids, within=within))
    keep = []
    for k, i in zip(kids, ids, strict=True):
        if i in todo:
            k.meta["dd"] = i
            keep.append(k)
    return keep


def _fingerprint(params: Mapping[str, Any]) -> str:
    return hashlib.blake2b(
        orjson.dumps(params, option=orjson.OPT_SORT_KEYS), digest_size=12
    ).hexdigest()


def _safe(exc: BaseException) -> str:
    """Error text for logs and dead letters; URLs lose their credentials."""
    import re

    return re.sub(r"//[^/@\s]+@", "//***@", str(exc))[:500]


def _outbox_entries(
    rid: str, step: str, task: str, stored: list[tuple[Item, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Outbox entries of the stored items, one per item type; `stored` pairs each item with
    its JSON dump (made once per item for these entries and for the children's fan-out)."""
    by_type: dict[type[Item], list[dict[str, Any]]] = {}
    for it, row in stored:
        by_type.setdefault(type(it), []).append(row)
    return [
        {
            "run": rid,
            "step": step,
            "task": task,
            "type": cls.item_type,
            "key": orjson.dumps(list(cls.key_fields)),
            "items": orjson.dumps(rows),
        }
        for cls, rows in by_type.items()
    ]


def run_endpoint(
    name: str, params: Mapping[str, Any], fetcher: Fetcher, meta: Mapping[str, Any] | None = None
) -> tuple[list[Item], list[Follow]]:
    """Run one endpoint's code in-process with a given fetcher: no broker, no Redis, no
    providers. For parser tests against saved pages (see external_interface/mock.py)."""
    spec = get_endpoint(name)
    p = spec.validate_params(params)
    ctx = Context(spec, p, meta or {}, get_settings(), TaskMetrics(), "", fetcher, False)
    return spec.task._collect(ctx, p)


def iter_endpoints() -> Iterator[EndpointSpec]:
    for n in ENDPOINTS.names():
        yield ENDPOINTS.get(n)


__all__ = [
    "ChainCrawlError",
    "Context",
    "EndpointSpec",
    "Follow",
    "Item",
    "Outputs",
    "Params",
    "ResourceUnavailable",
    "SiteTask",
    "endpoint",
    "get_endpoint",
]
