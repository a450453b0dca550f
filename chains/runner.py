"""Starting chain runs and watching them: `run(...)` returns a `RunHandle`."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from chains.model import Chain, chain_from_dict
from chains.registry import get_chain
from chains.state import (
    COUNTERS,
    Cancelled,
    Paused,
    Resumed,
    RunState,
    run_status,
    step_counters,
)
from config import get_settings
from exceptions import ParamsError, UnknownChainError
from utils.redis import get_redis


@dataclass
class Progress:
    run_id: str
    chain: str
    status: str  # running | paused | cancelling (tasks still draining) | done | cancelled
    steps: dict[str, dict[str, int]]
    totals: dict[str, int]
    outstanding: int
    waiting: int  # children held back by the run's cap (backpressure)
    created: float
    finished: float | None
    tasks: dict[str, str] = field(default_factory=dict)  # step id -> task name

    @property
    def complete(self) -> bool:
        """Every dispatched task finished and every item it produced reached the sinks (stored,
        or refused by a sink as invalid and dead-lettered in the outbox: `store_failed`)."""
        return self.status == "done" and self.items_settled

    @property
    def ended(self) -> bool:
        """Nothing more will happen: complete, or cancelled with its last task committed and
        the items of the tasks that did run settled."""
        return self.status in ("done", "cancelled") and self.items_settled

    @property
    def items_settled(self) -> bool:
        t = self.totals
        return t["stored"] + t["store_failed"] >= t["items"]

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
            "outstanding": self.outstanding,
            "waiting": self.waiting,
            "elapsed": round(self.elapsed, 3),
            "totals": self.totals,
            "steps": {s: {"task": self.tasks.get(s, ""), **c} for s, c in self.steps.items()},
        }


class RunHandle:
    def __init__(self, run_id: str, chain: Chain, state: RunState | None = None) -> None:
        self.run_id = run_id
        self.chain = chain
        self.state = state or RunState(get_redis())

    def __repr__(self) -> str:
        return f"RunHandle({self.chain.name!r}, run_id={self.run_id!r})"

    def progress(self) -> Progress:
        info = self.state.info(self.run_id)
        c = self.state.counters(self.run_id)
        return Progress(
            run_id=self.run_id,
            chain=self.chain.name,
            status=run_status(info),
            steps=step_counters(c, list(self.chain.steps)),
            totals={k: c.get(k, 0) for k in COUNTERS},
            outstanding=c.get("outstanding", 0),
            waiting=self.state.waiting(self.run_id),
            created=float(info.get("created", 0) or 0),
            finished=float(info["finished"]) if info.get("finished") else None,
            tasks={s.id: s.task for s in self.chain.root.walk()},
        )

    def wait(
        self,
        timeout: float | None = None,
        poll: float = 0.2,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> Progress:
        """Block until the run is complete (tasks finished, items stored), or cancelled and
        drained (`p.status == "cancelled"`, `p.complete` False); TimeoutError if neither."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            p = self.progress()
            if on_progress:
                on_progress(p)
            if p.ended:
                return p
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"run {self.run_id} ({self.chain.name}) not complete after {timeout}s: "
                    f"{p.outstanding} tasks outstanding, {p.totals['stored']}/{p.totals['items']} items stored"
                )
            time.sleep(poll)

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


def resume(run_id: str) -> Resumed:
    """Let a paused run go on: what waits is sent now (up to the run's cap, the rest as its
    tasks finish). A run that is not paused is left as it is (`was` says so)."""
    from base_task import publisher
    from worker import app

    settings = get_settings()
    state = RunState(get_redis(), settings)
    staging = settings.key("kids", f"client-resume-{run_id}-{uuid.uuid4().hex[:8]}")
    out = state.resume(run_id, staging)
    _known(out.was, run_id)
    if out.released:  # the ledger holds them: a crash before this send is the sweeper's case
        staged = state.r.lrange(staging, 0, -1)
        outstanding = state.counters(run_id).get("outstanding", 0)
        publisher(app, settings).publish(state, [(staged, staging)], outstanding)
    return out


def run(
    chain: str | Chain,
    seeds: Iterable[Mapping[str, Any]] | None = None,
    priority: int | None = None,
    *,
    run_id: str | None = None,
    max_in_flight: int | None = None,
) -> RunHandle:
    """Start a run: validate the seeds against the root step's Params, record the run and
    its chain definition in Redis, and send the root tasks. Returns at once."""
    from base_task import get_endpoint, send_kid
    from worker import app

    ch = chain if isinstance(chain, Chain) else get_chain(chain)
    settings = get_settings()
    prio = settings.default_priority if priority is None else int(priority)
    if not 0 <= prio <= 9:
        raise ParamsError(f"priority must be 0..9 (9 = most urgent), got {priority}")
    seed_list = list(seeds) if seeds is not None else [{}]
    if not seed_list:
        raise ParamsError(f"chain {ch.name!r}: no seeds given")
    spec = get_endpoint(ch.root.task)
    params = []
    for i, s in enumerate(seed_list):
        if not isinstance(s, Mapping):
            raise ParamsError(f"seed {i}: must be an object of parameters, got {type(s).__name__}")
        try:
            params.append(spec.validate_params({**ch.root.const, **s}).model_dump(mode="json"))
        except ParamsError as exc:
            raise ParamsError(f"seed {i}: {exc}") from None
    cap = settings.run_max_in_flight if max_in_flight is None else int(max_in_flight)
    rid = run_id or uuid.uuid4().hex[:16]
    state = RunState(get_redis(), settings)
    state.create_run(rid, ch.name, ch.to_json(), prio, cap)
    meta: dict[str, Any] = {"run": rid, "step": ch.root.id, "prio": prio}
    if ch.root.options.queue:
        meta["queue"] = ch.root.options.queue
    msgs = [
        orjson.dumps({"id": uuid.uuid4().hex, "task": ch.root.task, "params": p, "meta": meta})
        for p in params
    ]
    staging = settings.key("kids", f"client-{rid}")
    state.enqueue_and_release(rid, ch.root.id, msgs, staging)
    r = state.r
    for raw in r.lrange(staging, 0, -1):
        send_kid(app, orjson.loads(raw))
    r.delete(staging)
    return RunHandle(rid, ch, state)


def get_run(run_id: str) -> RunHandle:
    """A handle on an existing run (from any process), using the definition stored with it."""
    state = RunState(get_redis())
    raw = state.chain_def(run_id)
    if raw is None:
        raise UnknownChainError(f"no run {run_id!r} in {get_settings().redis_url.split('@')[-1]}")
    return RunHandle(run_id, chain_from_dict(orjson.loads(raw), validate=False), state)
