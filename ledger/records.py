"""What the ledger's scripts and readers exchange: its counters, the records a commit, a begin,
a cancel, a pause and a resume return, and the pure readings of a run's hash and counters
(`run_status`, `items_settled`). No client of its own: the keys are ledger/keys.py's (named
by utils/keyspace.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from utils.wire import CommitArgs, TaskEnvelope

RUN_TTL = 7 * 24 * 3600  # the default of CHAINCRAWL_RUN_RETENTION (`RunState.ttl`)
RECENT_KEEP = 10_000  # runs listed by `recent` (their records expire after the retention)
DELIV_TTL = 2 * 24 * 3600  # a delivery counter a task never got to commit or retry

COUNTERS = (
    "dispatched",
    "succeeded",
    "failed",
    "retried",
    "items",
    "stored",
    "store_failed",
    "resent",  # re-sent by the sweeper after the broker lost their message
    "cancelled",  # not run: their run was cancelled (`RunState.cancel`)
    "skipped",  # ended without a request on purpose (robots.txt): neither failed nor retried
    # children never sent: crawled within the step's `skip_seen_hours` (the dedup store), or
    # already sent in this run (a `unique` step)
    "skipped_seen",
    "skipped_unique",
    "undecodable",  # pages whose text had bytes its charset cannot decode (U+FFFD stored)
    "empty",  # pages that yielded nothing (no item, no follow-up): a selector matching nothing?
)


@dataclass
class Kid:
    """A child task staged by a commit: sent to the broker right after it."""

    step: str
    task: str
    params: dict[str, Any]
    meta: dict[str, Any]
    task_id: str
    uniq: str = ""

    def encode(self) -> bytes:
        return TaskEnvelope(self.task_id, self.task, self.params, self.meta).encode()


class StagedAt(NamedTuple):
    """Where a commit's children wait until sent: a field of a run's staged hash (`field`
    the task id), or a whole staging list (`field` "": a task without a run, a client's)."""

    key: str
    field: str = ""


def drop_staged(pipe: Any, ats: Sequence[StagedAt]) -> None:
    """Queue (on a pipeline) or run (on a client) the deletes of staged children once sent."""
    lists = [a.key for a in ats if not a.field]
    fields: dict[str, list[str]] = {}
    for a in ats:
        if a.field:
            fields.setdefault(a.key, []).append(a.field)
    if lists:
        pipe.delete(*lists)
    for key, tids in fields.items():
        pipe.hdel(key, *tids)


@dataclass
class CommitCall:
    """One task's commit, waiting to be sent with others (`RunState.run_commits`)."""

    rid: str
    done_key: str
    staging: str  # the run's staged hash, or (without a run) the task's kids list
    args: CommitArgs  # its part of the script's ARGV (utils/wire.py)
    forget: tuple[str, ...] = ()  # keys unlinked right after the commit (its delivery counter)
    kids: tuple[bytes, ...] = ()  # its children's messages, as the script stages them
    entries: tuple[Mapping[str, Any], ...] = ()  # its outbox entries (fields)


@dataclass
class Committed:
    """What a commit left: the run's outstanding tasks (0 without a run) and the child
    messages (`Kid.encode()` form) it staged, that the task must now send; the run's hold
    as the commit read it ("cancelled", "paused" or "", `Runs.hold`)."""

    outstanding: int
    staged: list[bytes]
    hold: str = ""


class Begun(NamedTuple):
    """What `begin` found for a task about to run."""

    committed: bool  # a redelivery of a task that has committed: only re-send what it staged
    deliveries: int  # of this attempt (0 inside a batch: the batch message's count)
    cancelled: bool = False  # its run was cancelled: skip it (commit it as `cancelled`)
    paused: bool = False  # its run is paused: park it in the run's waiting list (`park`)

    @property
    def hold(self) -> str:
        """The run's hold as `Runs.hold` says it."""
        return "cancelled" if self.cancelled else "paused" if self.paused else ""


@dataclass
class Cancelled:
    """What `RunState.cancel` did."""

    run_id: str
    was: str  # the run's status before: running, done or cancelled ("" = no such run)
    dropped: int  # children waiting behind the run's cap, dropped at once
    outstanding: int  # tasks still in the broker or running: skipped as they begin


@dataclass
class Paused:
    """What `RunState.pause` found: `was` is the status before (running, paused, cancelling,
    done, cancelled; "" = no such run); the run is paused now only if it was running."""

    run_id: str
    was: str


@dataclass
class Resumed:
    """What `RunState.resume` did: `was` as for `Paused`; `released` tasks were moved from
    the waiting list to be sent (the rest follow as the run's cap allows)."""

    run_id: str
    was: str
    released: int


def stalled_resends(info: Mapping[str, Any]) -> int:
    """Tasks the sweeper re-sent since the run's last commit (from its run hash, str values):
    more than a few means re-sending brings no progress."""
    mark = info.get("resend_mark")
    if mark is None or mark != (info.get("last") or ""):
        return 0
    return int(info.get("resends_stalled") or 0)


def items_settled(counters: Mapping[str, int]) -> bool:
    """Every item the run's tasks produced reached the sinks (stored, or refused by a sink for
    good and dead-lettered in the outbox: `store_failed`)."""
    c = counters
    return int(c.get("stored", 0)) + int(c.get("store_failed", 0)) >= int(c.get("items", 0))


def run_status(info: Mapping[str, Any], counters: Mapping[str, int] | None = None) -> str:
    """A run's status as shown (from its run hash, str values): `cancelling` while a cancelled
    run's tasks still drain, `paused` while it is held, and with its `counters` `storing`
    while its tasks are done but items still wait in the outbox (a dead drainer's entries
    wait to be claimed): `done` only once every item is stored."""
    status = info.get("status") or "unknown"
    if status == "done" and counters is not None and not items_settled(counters):
        return "storing"
    if status != "running":
        return status
    return "cancelling" if info.get("cancelled") else "paused" if info.get("paused") else status


def _shown(status: Any, paused: Any, cancelled: Any) -> str:
    """`run_status` of a script's reply ("" = no such run)."""
    status = status.decode() if isinstance(status, bytes) else str(status or "")
    if not status:
        return ""
    return run_status({"status": status, "paused": int(paused), "cancelled": int(cancelled)})


def step_counters(counters: Mapping[str, int], steps: Sequence[str]) -> dict[str, dict[str, int]]:
    """Reshape flat `{step}:{counter}` fields into {step: {counter: n}} in chain order."""
    out = {s: dict.fromkeys(COUNTERS, 0) for s in steps}
    for k, v in counters.items():
        s, _, c = k.rpartition(":")
        if s in out and c in out[s]:
            out[s][c] = v
    return out
