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
import random
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import redis
from celery import Task, shared_task
from celery.exceptions import Reject, SoftTimeLimitExceeded
from pydantic import ValidationError

from config import Settings, get_settings
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
    PoisonMessage,
    Policy,
    ResourceUnavailable,
    Throttled,
    UndecodableText,
    error_for_status,
    policy_for,
)
from external_interface.fetch import Fetcher, Response
from external_interface.fetch.mock import FixtureFetcher, load_case, outputs_of
from external_interface.fetch.select import parse_spec as parse_fetcher
from external_interface.fetch.sitemap import sitemap_urls
from external_interface.resources.rules import Verdict, add_rules, rule
from ledger.meta import AVOID_KEEP, TaskMeta
from ledger.publish import broker_priority
from ledger.state import Begun, CommitCall, Committed, RunState
from lifecycle import hooks, runtime
from lifecycle.adaptive import auto
from lifecycle.commits import aggregate, current_batch, run_commits, skip_call
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
from lifecycle.outputs import children, outbox_entries
from monitor.deadletter import DeadLetter, DeadLetterStore, keep_capture
from monitor.metrics import TaskMetrics
from scheduling.gate import get_gate
from settings.sitevars import site_env
from utils.logsafe import safe_text, task_argsrepr
from utils.wire import TaskEnvelope

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
        task = shared_task(base=SiteTask, bind=True, name=tname, spec=spec,  # type: ignore[call-overload]
                           soft_time_limit=dl + 5, time_limit=dl + 15)(run)  # fmt: skip
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
                return self._execute(params, meta)
            except (
                redis.exceptions.ConnectionError,
                redis.exceptions.TimeoutError,
                redis.exceptions.ClusterError,
            ) as exc:
                # Our state store is unreachable (or a cluster is failing over, or a commit was
                # not confirmed by its replicas): the message must not be acknowledged.
                # Requeue it; the commit's idempotency makes a second run harmless.
                log.warning("%s: state store unreachable (%s); message requeued", self.name, exc)
                runtime.pause_before_requeue()
                raise Reject(exc, requeue=True) from None

    def _execute(
        self, params: Any, wire: Mapping[str, Any] | None, begun: Begun | None = None
    ) -> str:
        """One page: begin, run the endpoint, commit, send the children. Inside a batch
        (`begun` from the batch's one begin round trip) the commit is deferred to the batch."""
        spec = self.spec
        rt = runtime.current()
        state = rt.state()
        meta = TaskMeta.from_wire(wire)
        tid = self.request.id or uuid.uuid4().hex
        rid, step = meta.run_id, meta.step
        metrics = TaskMetrics()
        metrics.outcome("started")
        started = time.monotonic()
        rt.load.busy()  # keep the CPU window fresh for batch sizing
        attempt = (self.request.retries or 0) + meta.retry_base
        if begun is None:
            begun = state.begin(rid, tid, attempt)
        elif rid and not (begun.cancelled or begun.paused):
            hold = rt.hold(state, rid)  # cancelled or paused since its batch began?
            if hold:
                begun = begun._replace(cancelled=hold == "cancelled", paused=hold == "paused")
        committed, deliveries, cancelled, paused = begun
        if deliveries > 1:  # its earlier delivery's worker died (or lost its connection)
            metrics.counts["redelivered"] += 1
        # its delivery counter goes with its commit or retry (nothing of a page left behind)
        forget = (state.deliveries_key(rid, tid, attempt),) if deliveries else ()
        if paused and not (cancelled or committed):
            # back as a new message: its retry number kept, its wait for a resource restarted
            # (a pause is no time spent waiting for a pool: `resource_wait_max`)
            meta.wait_since, meta.retry_base = None, attempt
            msg = TaskEnvelope(tid, self.name, params, meta.to_wire()).encode()
            parked = state.park(rid, tid, msg, attempt, counted=deliveries > 0)
            if parked:
                outcome = "paused" if parked > 0 else "duplicate"
                metrics.outcome(outcome)
                aggregate(rt, metrics, spec)
                return outcome
        if committed:  # a redelivery of a committed task: send what is still staged
            metrics.outcome("duplicate")
            aggregate(rt, metrics, spec)
            self._send_staged(rt, state, rid, tid)
            return "duplicate"
        if cancelled:  # its run was cancelled: no fetch, counted as cancelled
            metrics.outcome("cancelled")
            aggregate(rt, metrics, spec)
            res = run_commits(rt, state, rid, [skip_call(state, rid, tid, step, forget)])[0]
            if res is not None:  # backpressure may have released children here before
                self._send_staged(rt, state, rid, tid, res)
            return "cancelled"
        aggregate(rt, metrics, spec)
        ctx: Context | None = None
        gate = get_gate()
        admitted = False
        try:
            if deliveries > rt.settings.max_redeliveries + 1:
                raise PoisonMessage(
                    f"{spec.name}: delivered {deliveries} times without finishing "
                    f"(cap {rt.settings.max_redeliveries} redeliveries)"
                )
            p = spec.validate_params(params)
            wait = gate.admit(spec.site, spec.name, tid, spec.deadline)
            if wait > 0:
                raise Throttled(f"{spec.name}: over its shared limit", retry_after=wait)
            admitted = True
            ctx = Context(spec, p, meta, rt, metrics)
            items, follows = self._collect(ctx, p)
        except Exception as exc:
            return self._handle_error(exc, params, meta, ctx, rt, state, metrics, started, forget)
        finally:
            if admitted:
                gate.release(spec.site, spec.name, tid)
        dumped = [it.model_dump(mode="json") for it in items]  # once: outbox rows and fan-out
        empty = metrics.counts.get("empty", 0)  # read before aggregate() takes the counts
        stored = [(it, row) for it, row in zip(items, dumped, strict=True) if it.store]
        entries = outbox_entries(rid, step, spec.name, stored)
        chain = rt.chain(state, rid) if rid else None
        seen: dict[str, tuple[str, int]] = {}
        kids = children(rt, chain, spec.name, meta, items, follows, dumped, seen)
        for ktask, n in seen.values():  # the skipped endpoint's metrics count them
            skips = TaskMetrics()
            skips.counts["skipped_seen"] += n
            skips.aggregate(ktask, ktask.split(".", 1)[0], rt.settings)
        metrics.outcome("succeeded")
        metrics.counts["items"] += len(stored)
        metrics.latency(time.monotonic() - started)
        aggregate(rt, metrics, spec)
        summary = f"{len(stored)} items, {len(kids)} follow-ups"
        batch = current_batch(rt)
        calls: list[CommitCall] = batch.calls if batch is not None else []
        state.commit(
            rid=rid, tid=tid, step=step, outcome="succeeded", n_items=len(stored),
            entries=entries, kids=kids, defer=calls, forget=forget,
            counts={**{(sid, "skipped_seen"): n for sid, (_, n) in seen.items()},
                    (step, "undecodable"): int(bool(ctx and ctx._undecodable_seen)),
                    (step, "empty"): empty},
        )  # fmt: skip
        if batch is not None:
            batch.after.append((self, tid, meta.dedup_id))
            return summary
        res = run_commits(rt, state, rid, calls)[0]
        self._send_staged(rt, state, rid, tid, res)
        if meta.dedup_id:  # crawled and handed off durably: remember it for skip_seen
            rt.request_dedup(spec.name).mark_many([meta.dedup_id], refresh=True)
        return summary

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
            items = hooks.filter_items(ctx, self.spec.name, items)  # before_store hooks
        except ValidationError as exc:
            raise ItemValidationError(f"{self.spec.name}: item invalid: {describe(exc)}") from None
        except SoftTimeLimitExceeded:
            raise DeadlineExceeded(f"{self.spec.name}: soft time limit exceeded") from None
        return items, follows

    def _send_staged(
        self,
        rt: runtime.Runtime,
        state: RunState,
        rid: str,
        tid: str,
        res: Committed | None = None,
    ) -> None:
        """Publish the children this task's commit staged (`res`; None: read them back, as a
        redelivered committed task does). Inside a batch they wait for the batch's publish.
        A failure after the commit requeues the message: its redelivery finds the task
        committed and sends what is still staged, where acking it would strand the children
        (tests/base_task/test_send_path.py::test_a_publish_failure_after_the_commit_requeues...)."""
        at = state.staged_at(rid, tid)
        try:
            staged = res.staged if res is not None else state.staged(rid, tid)
            outstanding = res.outstanding if res is not None else 0
            batch = current_batch(rt)
            if batch is not None:
                batch.add(staged, at, outstanding)
            elif staged:
                rt.publisher(self.app).publish(state, [(staged, at)], outstanding)
        except Exception as exc:
            log.warning("%s: children of %s not sent (%s: %s); message requeued",
                        self.name, tid, type(exc).__name__, safe_text(exc))  # fmt: skip
            raise Reject(exc, requeue=True) from None

    # -- failure paths: each error type's policy (exceptions.py) decides

    def _handle_error(
        self,
        exc: Exception,
        params: Any,
        meta: TaskMeta,
        ctx: Context | None,
        rt: runtime.Runtime,
        state: RunState,
        metrics: TaskMetrics,
        started: float,
        forget: tuple[str, ...] = (),
    ) -> str:
        if isinstance(exc, SoftTimeLimitExceeded):
            exc = DeadlineExceeded(f"{self.spec.name}: soft time limit exceeded")
        exc = hooks.page_error(ctx, self.spec.name, exc, hooks.counting(metrics.counts))
        spec, settings = self.spec, rt.settings
        policy = policy_for(exc)
        err = type(exc).__name__
        rid, step = meta.run_id, meta.step
        retries_used = (self.request.retries or 0) + meta.retry_base - meta.waits
        max_retries = spec.max_retries if spec.max_retries is not None else settings.max_retries
        metrics.latency(time.monotonic() - started)
        r = state.r

        if policy is Policy.SKIP:  # not sent on purpose (robots.txt): no retry, no dead letter
            reason = getattr(exc, "reason", "skipped")
            metrics.outcome("skipped", reason)
            calls: list[CommitCall] = []
            state.commit(rid=rid, tid=self.request.id or "", step=step, outcome="skipped",
                         n_items=0, entries=(), kids=(), defer=calls, forget=forget)  # fmt: skip
            res = run_commits(rt, state, rid, calls, pipe_extra=lambda pipe: metrics.flush(
                pipe, spec.name, spec.site, settings))[0]  # fmt: skip
            log.info("%s skipped (%s): %s", spec.name, reason, safe_text(exc))
            if res is not None:  # backpressure may have released waiting children to this task
                self._send_staged(rt, state, rid, self.request.id or "", res)
            return f"skipped: {reason}"

        now = time.time()
        waiting_since = meta.wait_since or now
        if policy is Policy.WAIT and (
            isinstance(exc, Throttled) or now - waiting_since < settings.resource_wait_max
        ):  # a contended pool is not a failure; a pool nobody refills for this long is
            meta.waits += 1
            meta.wait_since = round(waiting_since, 3)
            countdown = min(getattr(exc, "retry_after", 2.0), countdown_cap(settings))
            metrics.outcome("waited", err)
            pipe = r.pipeline(transaction=False)
            if forget:  # the next attempt counts its own deliveries
                pipe.unlink(*forget)
            metrics.flush(pipe, spec.name, spec.site, settings)
            pipe.execute()
            raise self._retry_later(params, meta, countdown, exc)

        if policy in (Policy.RETRY, Policy.ROTATE) and retries_used < max_retries:
            if ctx is not None and ctx._failed_leases:  # a retry never reuses what just failed
                meta.avoid = tuple(sorted(set(meta.avoid) | ctx._failed_leases)[-AVOID_KEEP:])
            countdown = backoff(retries_used, settings)
            hint = getattr(exc, "retry_after", None)
            if hint:
                countdown = max(countdown, min(float(hint), countdown_cap(settings)))
            metrics.outcome("retried", err)
            pipe = r.pipeline(transaction=False)
            state.count_retry(rid, step, pipe)
            if forget:
                pipe.unlink(*forget)
            metrics.flush(pipe, spec.name, spec.site, settings)
            pipe.execute()
            log.info("%s retry %d/%d in %.1fs after %s: %s",
                     spec.name, retries_used + 1, max_retries, countdown, err, safe_text(exc))  # fmt: skip
            raise self._retry_later(params, meta, countdown, exc)

        # final failure: dead-letter it, count it, let the run move on
        tid = self.request.id or ""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]
        dl = DeadLetter(
            id=tid,
            task=spec.name,
            params=params if isinstance(params, dict) else {"_raw": repr(params)[:500]},
            meta=meta.to_wire(),
            error_type=err,
            error=safe_text(exc),
            traceback=tb,
            retries=retries_used,
            capture=keep_capture(exc, tid or uuid.uuid4().hex, settings.var_dir),
        )
        metrics.outcome("failed", err)
        dls = DeadLetterStore(r, settings)

        def extra(pipe: Any) -> None:
            dls.add(dl, pipe)
            metrics.flush(pipe, spec.name, spec.site, settings)

        calls = []
        state.commit(
            rid=rid, tid=tid, step=step, outcome="failed", n_items=0, entries=(), kids=(),
            defer=calls, forget=forget,
        )  # fmt: skip
        res = run_commits(rt, state, rid, calls, pipe_extra=extra)[0]
        log.warning("%s failed for good after %d retries (%s: %s); dead-lettered as %s",
                    spec.name, retries_used, err, safe_text(exc), tid)  # fmt: skip
        if res is not None:  # backpressure may have released waiting children to this task
            self._send_staged(rt, state, rid, tid, res)
        return f"failed: {err}"

    def _retry_later(
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


def countdown_cap(s: Settings) -> float:
    """Countdown retries wait inside the worker unacknowledged: stay under the visibility timeout."""
    return max(1.0, min(s.retry_backoff_max, s.visibility_timeout * 0.5))


def backoff(attempt: int, s: Settings | None = None) -> float:
    """Exponential backoff with equal jitter: half the step fixed, half random."""
    s = s or get_settings()
    step = min(countdown_cap(s), s.retry_backoff * (2.0**attempt))
    return step / 2 + random.uniform(0, step / 2)


def run_endpoint(
    name: str, params: Mapping[str, Any], fetcher: Fetcher, meta: Mapping[str, Any] | None = None
) -> tuple[list[Item], list[Follow]]:
    """Run one endpoint's code in-process with a given fetcher: no broker, no Redis, no
    providers. For parser tests against saved pages (external_interface/fetch/mock.py)."""
    spec = get_endpoint(name)
    p = spec.validate_params(params)
    ctx = Context(spec, p, TaskMeta.from_wire(meta), runtime.current(), TaskMetrics(), fetcher,
                  online=False)  # fmt: skip
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
