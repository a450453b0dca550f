"""`RunHandle.wait()` follows a run by its wake list: it returns on the event of the run's end,
not on a polling tick, and a progress view is called when the run moved."""

from __future__ import annotations

import threading
import uuid

import pytest
import redis

import chains.runner
import sites
from chains.runner import Progress, RunHandle
from config import Settings
from ledger.model import Chain, step
from ledger.state import RunState


@pytest.fixture
def state(rds: redis.Redis, redis_url: str, key_prefix: str) -> RunState:
    return RunState(rds, Settings(redis_url=redis_url, key_prefix=key_prefix))


@pytest.fixture(autouse=True)
def no_safety_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A minute between safety reads: what returns `wait()` in these tests is the event."""
    monkeypatch.setattr(chains.runner, "SAFETY_READ", 60.0)


class Counted(RunHandle):
    """A handle that counts its reads of the run."""

    reads = 0

    def progress(self) -> Progress:
        self.reads += 1
        return super().progress()


def handle(state: RunState, tasks: int) -> tuple[Counted, list[str]]:
    rid = uuid.uuid4().hex[:12]
    state.create_run(rid, "wait_t", b"{}", 5)
    state.add_dispatched(rid, "listing", tasks)
    chain = Chain(
        "wait_t", step("testsite.local.listing", _id="listing"), lookup=sites.get_endpoint
    )
    return Counted(rid, chain, state), [uuid.uuid4().hex for _ in range(tasks)]


def commit(state: RunState, rid: str, tid: str) -> None:
    state.run_commits(
        [
            state.commit_call(
                rid=rid, tid=tid, step="listing", outcome="succeeded", n_items=0, entries=()
            )
        ]
    )


def later(after: float, *steps: object) -> threading.Thread:
    """Run the callables `steps` one after another in a thread, `after` seconds apart."""

    def go() -> None:
        for s in steps:
            threading.Event().wait(after)
            s()  # type: ignore[operator]

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_wait_returns_on_the_end_event_after_two_reads(state: RunState) -> None:
    h, (tid,) = handle(state, 1)
    t = later(0.5, lambda: commit(state, h.run_id, tid))
    p = h.wait(timeout=30)  # the safety read is a minute away: only the event can end this
    t.join(10)
    assert p.ended and p.ok
    assert h.reads == 2  # before blocking, and once woken by the end


def test_a_progress_view_is_called_when_the_run_moves(state: RunState) -> None:
    h, tids = handle(state, 3)
    seen: list[int] = []
    t = later(0.5, *(lambda tid=tid: commit(state, h.run_id, tid) for tid in tids))
    p = h.wait(timeout=30, poll=0.0, on_progress=lambda p: seen.append(p.totals["succeeded"]))
    t.join(10)
    assert p.ended and seen[0] == 0 and seen[-1] == 3
    assert 2 <= len(seen) <= 4 and seen == sorted(seen)  # one call per move, no ticks between


def test_wait_still_times_out_with_the_run_named(state: RunState) -> None:
    h, _ = handle(state, 1)
    with pytest.raises(TimeoutError, match=f"run {h.run_id} .*1 tasks outstanding"):
        h.wait(timeout=1.0)
