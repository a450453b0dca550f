"""Starting chain runs and watching them: `run(...)` returns a `RunHandle`."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from celery import Celery

import sites
from broker.app import default_app
from broker.workers import TaskSets
from chains.registry import get_chain
from config import get_settings
from exceptions import ParamsError, UnknownChainError
from ledger.model import Chain, chain_from_dict
from ledger.publish import send_kid
from ledger.state import (
    COUNTERS,
    Cancelled,
    Paused,
    Resumed,
    RunState,
    StagedAt,
    items_settled,
    run_status,
    stalled_resends,
    step_counters,
)
from lifecycle import runtime
from lifecycle.endpoints import queue_for
from utils.redis import get_redis
from utils.wire import TaskEnvelope, TaskMeta

log = logging.getLogger("chaincrawl.runs")

SAFETY_READ = 2.0  # seconds: `wait()` reads a run again after this long without an event


@dataclass
class Progress:
    run_id: str
    chain: str
    status: str  # running | paused | cancelling (tasks still draining) | storing | done | cancelled
    steps: dict[str, dict[str, int]]
    totals: dict[str, int]
    outstanding: int
    waiting: int  # children held back by the run's cap (backpressure)
    created: float
    finished: float | None
    tasks: dict[str, str] = field(default_factory=dict)  # step id -> task name
    resending: int = 0  # tasks the sweeper re-sent since the run's last commit

    @property
    def complete(self) -> bool:
        """Every dispatched task finished and every item it produced reached the sinks (stored,
        or refused by a sink as invalid and dead-lettered in the outbox: `store_failed`); a run
        whose tasks are done while items wait in the outbox is `storing`, not yet `done`.

        Complete is not "every task succeeded": a task that failed for good (dead-lettered)
        has finished too. `failed` counts those, `ok` says the run ended without any."""
        return self.status == "done" and self.items_settled

    @property
    def failed(self) -> int:
        """Tasks of the run that failed for good (its dead letters; a replay takes one back)."""
        return self.totals.get("failed", 0)

    @property
    def ok(self) -> bool:
        """Complete, with every task succeeded and every item stored (none refused by a sink)."""
        return self.complete and self.failed == 0 and self.totals.get("store_failed", 0) == 0

    @property
    def ending(self) -> str | None:
        """How the run ended: "ok", "failed" (complete, but with failed tasks or refused
        items), "cancelled"; None while it has not ended."""
        if not self.ended:
            return None
        if self.status == "cancelled":
            return "cancelled"
        return "ok" if self.ok else "failed"

    @property
    def ended(self) -> bool:
        """Nothing more will happen: complete, or cancelled with its last task committed and
        the items of the tasks that did run settled."""
        return self.status in ("done", "cancelled") and self.items_settled

    @property
    def items_settled(self) -> bool:
        return items_settled(self.totals)

    @property
    def skips(self) -> dict[str, int]:
        """Requests not made, by reason: `robots` (tasks that ended without their request),
        `seen` (children crawled before, `skip_seen_hours`), `unique` (children this run
        sent already)."""
        t = self.totals
        return {
            "robots": t.get("skipped", 0),
            "seen": t.get("skipped_seen", 0),
            "unique": t.get("skipped_unique", 0),
        }

    @property
    def elapsed(self) -> float:
        return (self.finished or time.time()) - self.created

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "chain": self.chain,
            "status": self.status,
            "complete": self.complete,
            "ended": self.ended,
            "ending": self.ending,
            "ok": self.ok,
            "failed": self.failed,
            "outstanding": self.outstanding,
            "waiting": self.waiting,
            "resending": self.resending,
            "elapsed": round(self.elapsed, 3),
            "totals": self.totals,
            "skips": self.skips,
            "steps": {s: {"task": self.tasks.get(s, ""), **c} for s, c in self.steps.items()},
        }


class RunHandle:
    def __init__(self, run_id: str, chain: Chain, state: RunState | None = None) -> None:
        self.run_id = run_id
        self.chain = chain
        self.state = state or RunState(get_redis())
        self.note = ""  # a warning from the start (`run`): no worker was up to check against

    def __repr__(self) -> str:
        return f"RunHandle({self.chain.name!r}, run_id={self.run_id!r})"

    def progress(self) -> Progress:
        info = self.state.info(self.run_id)
        c = self.state.counters(self.run_id)
        return Progress(
            run_id=self.run_id,
            chain=self.chain.name,
            status=run_status(info, c),
            steps=step_counters(c, list(self.chain.steps)),
            totals={k: c.get(k, 0) for k in COUNTERS},
            outstanding=c.get("outstanding", 0),
            waiting=self.state.waiting(self.run_id),
            created=float(info.get("created", 0) or 0),
            finished=float(info["finished"]) if info.get("finished") else None,
            tasks={s.id: s.task for s in self.chain.root.walk()},
            resending=stalled_resends(info),
        )

    def wait(
        self,
        timeout: float | None = None,
        poll: float = 0.2,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> Progress:
        """Block until the run is complete (tasks finished, items stored), or cancelled and
        drained (`p.status == "cancelled"`, `p.complete` False); TimeoutError if neither.

        It follows the run by events, not by polling: it blocks on the run's wake list,
        which the ledger's scripts push to when the run may have ended (its last commit, its
        last item stored, a cancel), so it returns as soon as the run ends. With
        `on_progress`, every commit wakes it too, and the callback runs when the run moved,
        at most once every `poll` seconds, and at each read without an event (a live view's
        elapsed time goes on; its totals may be unchanged). Without any event it reads the
        run again every `SAFETY_READ` seconds (a wake lost in a failover costs that much).

        A complete run may still have failed tasks (dead letters): check `p.ok` (or
        `p.failed`, `p.ending`) before reading complete as success."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if on_progress is not None:  # commits push to the wake list while it is open
                self.state.watch(self.run_id, SAFETY_READ + poll)
            p = self.progress()
            read = time.monotonic()
            if on_progress:
                on_progress(p)
            if p.ended:
                return p
            if deadline is not None and read > deadline:
                raise TimeoutError(
                    f"run {self.run_id} ({self.chain.name}) not complete after {timeout}s: "
                    f"{p.outstanding} tasks outstanding, {p.totals['stored']}/{p.totals['items']} items stored"
                )
            until = read + SAFETY_READ if deadline is None else min(read + SAFETY_READ, deadline)
            self._until_woken(until, read + poll)

    def _until_woken(self, until: float, not_before: float) -> None:
        """Return when the run may have ended (b"e": at once), when it moved (b"p") and
        `not_before` has passed, or at `until`."""
        moved = False
        while True:
            now = time.monotonic()
            horizon = min(until, not_before) if moved else until
            if now >= horizon:
                return
            got = self.state.next_wake(self.run_id, horizon - now)
            if got is None and moved:
                return
            if got == b"e" or (got is not None and time.monotonic() >= not_before):
                return
            moved = moved or got is not None

    def cancel(self, reason: str = "") -> Cancelled:
        """Stop this run (see `cancel`)."""
        return self.state.cancel(self.run_id, reason)

    def pause(self, reason: str = "") -> Paused:
        """Hold this run (see `pause`)."""
        return pause(self.run_id, reason)

    def resume(self) -> Resumed:
        """Let this run go on (see `resume`)."""
        return resume(self.run_id)


def cancel(run_id: str, reason: str = "") -> Cancelled:
    """Stop a run from any process, leaving workers and other runs alone. Children waiting
    behind its cap are dropped at once; its tasks in the broker are skipped when they begin
    (no request, counted `cancelled`); a task already running stores its items but sends no
    children. The run ends as `cancelled` once those have drained; what was stored stays.
    Unknown run id: UnknownChainError. A finished run is left as it is (`was` says so)."""
    out = RunState(get_redis()).cancel(run_id, reason)
    _known(out.was, run_id)
    return out


def _known(was: str, run_id: str) -> None:
    if not was:
        raise UnknownChainError(f"no run {run_id!r} in {get_settings().redis_url.split('@')[-1]}")


def pause(run_id: str, reason: str = "") -> Paused:
    """Hold a run without losing its place, from any process. Tasks already running finish and
    store their items; their children, and every task of the run that comes up in the broker,
    wait in the run's waiting list (no request is made). Workers and other runs go on.
    `resume` sends what waits; `cancel` drops it. Unknown run id: UnknownChainError; a run
    that is not running (done, cancelled, cancelling) is left as it is (`was` says so)."""
    out = RunState(get_redis()).pause(run_id, reason)
    _known(out.was, run_id)
    return out


def resume(run_id: str, *, app: Celery | None = None) -> Resumed:
    """Let a paused run go on: what waits is sent now (up to the run's cap, the rest as its
    tasks finish). A run that is not paused is left as it is (`was` says so). `app`: the
    Celery app to send with (default: `broker.app.default_app()`)."""
    app = app or default_app()
    settings = get_settings()
    state = RunState(get_redis(), settings)
    staging = state.kids_key(run_id, f"client-resume-{uuid.uuid4().hex[:8]}")
    out = state.resume(run_id, staging)
    _known(out.was, run_id)
    if out.released:  # the ledger holds them: a crash before this send is the sweeper's case
        staged = cast("list[bytes]", state.r.lrange(staging, 0, -1))
        outstanding = state.counters(run_id).get("outstanding", 0)
        runtime.current().publisher(app).publish(state, [(staged, StagedAt(staging))], outstanding)
    return out


def run(
    chain: str | Chain,
    seeds: Iterable[Mapping[str, Any]] | None = None,
    priority: int | None = None,
    *,
    run_id: str | None = None,
    max_in_flight: int | None = None,
    app: Celery | None = None,
    check_workers: bool = True,
    wait_for_workers: bool = True,
) -> RunHandle:
    """Start a run: validate the seeds against the root step's Params (strictly, as the JSON
    they travel as: `{"page": "2"}` or `{"page": true}` is a ParamsError, an unknown field
    gets a "did you mean"), check that the live workers know every task of the chain
    (`WorkersOutdated` if one lacks one; a warning in `RunHandle.note` when no worker is up;
    when workers are up but none consumes a queue of the chain, a warning too, or
    `QueuesUnserved` with `wait_for_workers=False`), record the run and its chain definition
    in Redis,
    and send the root tasks. Returns at once. `app`: the Celery app to send with (default:
    `broker.app.default_app()`, the worker's where one runs)."""
    app = app or default_app()
    ch = chain if isinstance(chain, Chain) else get_chain(chain)
    settings = get_settings()
    prio = settings.default_priority if priority is None else int(priority)
    if not 0 <= prio <= 9:
        raise ParamsError(f"priority must be 0..9 (9 = most urgent), got {priority}")
    if isinstance(seeds, Mapping | str | bytes):
        raise ParamsError(
            f"chain {ch.name!r}: seeds must be a list of parameter objects, got a "
            f"{type(seeds).__name__} (one seed is seeds=[{{...}}])"
        )
    seed_list = list(seeds) if seeds is not None else [{}]
    if not seed_list:
        raise ParamsError(f"chain {ch.name!r}: no seeds given")
    spec = sites.get_endpoint(ch.root.task)
    params = []
    for i, s in enumerate(seed_list):
        if not isinstance(s, Mapping):
            raise ParamsError(f"seed {i}: must be an object of parameters, got {type(s).__name__}")
        try:
            merged = {**ch.root.const, **s}  # strictly, as the chain's constants are
            params.append(spec.validate_params(merged, strict=True).model_dump(mode="json"))
        except ParamsError as exc:
            raise ParamsError(f"seed {i}: {exc}") from None
    note = workers_check(ch, wait_for_workers) if check_workers else ""
    cap = settings.run_max_in_flight if max_in_flight is None else int(max_in_flight)
    state = RunState(get_redis(), settings)
    rid = run_id or state.new_run_id()
    state.create_run(rid, ch.name, ch.to_json(), prio, cap)
    meta = TaskMeta(run_id=rid, step=ch.root.id, priority=prio, queue=ch.root.options.queue or "")
    wire = meta.to_wire()
    msgs = [TaskEnvelope(uuid.uuid4().hex, ch.root.task, p, dict(wire)).encode() for p in params]
    staging = state.kids_key(rid, "client")
    state.enqueue_and_release(rid, ch.root.id, msgs, staging)
    r = state.r
    for raw in r.lrange(staging, 0, -1):
        send_kid(app, orjson.loads(raw), queue_for)
    r.delete(staging)
    handle = RunHandle(rid, ch, state)
    handle.note = note
    return handle


def workers_check(ch: Chain, wait_for_workers: bool = True) -> str:
    """Refuse a chain that a live worker consuming one of its queues would drop as unknown
    (an endpoint added or a route changed after the workers started): `WorkersOutdated`,
    naming the tasks and the workers, before anything is recorded or sent. -> a warning
    ("" if none): no worker up yet, or none consuming a queue (the run waits for them)."""
    needed = {s.task: s.options.queue or queue_for(s.task) for s in ch.root.walk()}
    check = TaskSets(get_redis()).check(needed)
    check.raise_if_outdated()
    if not wait_for_workers:
        check.raise_if_unserved()
    if check.note:
        log.warning("chain %s: %s", ch.name, check.note)
    return check.note


def get_run(run_id: str) -> RunHandle:
    """A handle on an existing run (from any process), using the definition stored with it."""
    state = RunState(get_redis())
    raw = state.chain_def(run_id)
    if raw is None:
        raise UnknownChainError(f"no run {run_id!r} in {get_settings().redis_url.split('@')[-1]}")
    return RunHandle(run_id, chain_from_dict(orjson.loads(raw)), state)
