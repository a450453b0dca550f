"""`send_commits`: which commits of a run's tail take the process's pending metrics into their
pipeline (throttled in the tail's first part, every one near its end, the completing commit's
process writing what it left pending)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

import lifecycle.commits
import monitor.metrics
from ledger.publish import Load
from ledger.records import Committed
from lifecycle.commits import TAIL_SYNC_EVERY, send_commits
from monitor.metrics import Aggregator
from utils.redis import NotReplicated


class Pipe:
    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log

    def hincrby(self, *args: Any) -> None:
        self.log.append(args)

    def execute_command(self, *args: Any) -> None:
        """The metrics script's call (`monitor.metrics.add_sums`), logged as the (key, field,
        n) adds it makes, one a field of each key as HINCRBYs were."""
        assert args[0] == "EVAL"
        n_keys = args[2]
        keys, argv = args[3 : 3 + n_keys], list(args[3 + n_keys :])
        for key in keys:
            n, argv = argv[0], argv[1:]
            for f in range(n):
                self.log.append((key, argv[2 * f], argv[2 * f + 1]))
            argv = argv[2 * n :]

    def execute(self) -> list[Any]:
        return []


class State:
    """A run's commits answering a given outstanding count; records the metrics each took."""

    def __init__(self) -> None:
        self.outstanding = 100
        self.synced: list[int] = []  # per commit: HINCRBYs in its pipeline
        self.flushed: list[tuple[Any, ...]] = []  # written apart from a commit
        self.r = SimpleNamespace(pipeline=lambda transaction=False: Pipe(self.flushed))

    def compact_settled(self, rids: list[str]) -> None:
        pass

    def run_commits(
        self, calls: Any, pipe_pre: Any = None, pipe_extra: Any = None, replies: Any = None
    ) -> Any:
        log: list[tuple[Any, ...]] = []
        if pipe_pre is not None:
            pipe_pre(Pipe(log))
        self.synced.append(len(log))
        return [Committed(self.outstanding, [])]


@pytest.fixture
def setup(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, State, Aggregator]:
    agg = Aggregator()
    monkeypatch.setattr(lifecycle.commits, "aggregator", lambda: agg)
    monkeypatch.setattr(lifecycle.commits, "known_lost", lambda r: None)
    monkeypatch.setattr(lifecycle.commits, "_tail_sync", [0.0])
    seen: dict[str, int] = {}
    rt = SimpleNamespace(
        load=Load(slots=16),
        outstanding_seen=seen.get,
        note_outstanding=seen.__setitem__,
        note_hold=lambda rid, hold: None,
    )
    return rt, State(), agg


def commit(rt: Any, state: State, agg: Aggregator, outstanding: int) -> int:
    """One page's metrics, then its commit leaving `outstanding`: the HINCRBYs it carried
    (one a field of each key: 2 whenever it took the sums)."""
    agg.add(("m:task", "m:site"), {"succeeded": 1})
    state.outstanding = outstanding
    send_commits(rt, state, "r1", [])  # type: ignore[arg-type]
    return state.synced[-1]


def test_a_tails_first_part_takes_the_metrics_once_a_quarter_second_then_every_commit(
    setup: tuple[Any, State, Aggregator], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, state, agg = setup
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    tail = rt.load.tail_backlog()
    assert commit(rt, state, agg, 200) == 2  # not seen yet: taken
    assert commit(rt, state, agg, 150) == 0  # deep in the run: the flush thread's
    assert commit(rt, state, agg, tail - 1) == 0 and state.flushed  # entering the tail: flushed
    state.flushed.clear()
    assert commit(rt, state, agg, tail - 2) == 2  # the tail's first commit takes them all
    assert [commit(rt, state, agg, tail - 3 - k) for k in range(3)] == [0, 0, 0]
    clock[0] += TAIL_SYNC_EVERY
    assert commit(rt, state, agg, 30) == 2  # a quarter second on: the three pages' sums
    assert commit(rt, state, agg, 20) == 0
    assert commit(rt, state, agg, 15) == 0  # seen 20: still the first part
    assert [commit(rt, state, agg, n) for n in (10, 5)] == [2, 2]  # below the slots: each
    assert not state.flushed


def test_the_commit_that_completes_the_run_writes_what_its_process_left_pending(
    setup: tuple[Any, State, Aggregator], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, state, agg = setup
    monkeypatch.setattr(time, "monotonic", lambda: 1000.0)
    assert commit(rt, state, agg, 40) == 2  # not seen yet: taken
    assert commit(rt, state, agg, 30) == 2  # the tail's first commit
    assert commit(rt, state, agg, 20) == 0  # throttled: pending
    assert commit(rt, state, agg, 0) == 0  # seen 20, throttled, but it completed the run
    assert sorted(state.flushed) == [("m:site", "succeeded", 2), ("m:task", "succeeded", 2)]
    assert not agg.pending()


class PartlyFailing(State):
    """A pipeline whose commit script and metrics sums are written, but one command after them
    (another master's sums or extras) fails: the whole call raises, as `run_commits` does."""

    def __init__(self, fail_at: int | None) -> None:
        super().__init__()
        self.fail_at = fail_at  # which queued metrics call fails (None: a later extra)
        self.written: list[tuple[Any, ...]] = []

    def run_commits(
        self, calls: Any, pipe_pre: Any = None, pipe_extra: Any = None, replies: Any = None
    ) -> Any:
        log: list[tuple[Any, ...]] = []
        pipe = Pipe(log)
        per_call: list[list[tuple[Any, ...]]] = []

        def execute_command(*args: Any) -> None:
            before = len(log)
            Pipe.execute_command(pipe, *args)
            per_call.append(log[before:])

        pipe.execute_command = execute_command  # type: ignore[method-assign]
        if pipe_pre is not None:
            pipe_pre(pipe)
        out: list[Any] = []
        for n, adds in enumerate(per_call):
            if n == self.fail_at:
                out.append(ConnectionError("a master away"))
            else:
                self.written += adds
                out.append(1)
        out.append([0, 0])  # the commit script's reply: committed
        out.append(ConnectionError("an extra on a master away") if self.fail_at is None else 1)
        if replies is not None:
            replies.extend(out)
        if self.fail_at == -1:  # all written, too few replicas confirmed
            raise NotReplicated("0 of 1 replicas")
        raise next(r for r in out if isinstance(r, Exception))


@pytest.mark.parametrize("fail_at", [0, 1, None, -1])
def test_a_partial_pipeline_failure_after_the_commit_writes_no_sum_twice(
    setup: tuple[Any, State, Aggregator], fail_at: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit script succeeded on the run's master, another part of its pipeline (a sum
    on another master, or an extra) failed, or its replicas did not confirm it: the sums
    written are not kept for the next flush (they would be added twice), only those whose
    call failed are."""
    rt, _, agg = setup
    monkeypatch.setattr(monitor.metrics, "ClusterPipeline", Pipe)  # one call a key
    state = PartlyFailing(fail_at)
    agg.add(("m:task", "m:site"), {"succeeded": 1})
    with pytest.raises(NotReplicated if fail_at == -1 else ConnectionError):
        send_commits(rt, state, "r1", [])  # type: ignore[arg-type]
    agg.flush(SimpleNamespace(pipeline=lambda transaction=False: Pipe(state.written)))
    assert sorted(state.written) == [("m:site", "succeeded", 1), ("m:task", "succeeded", 1)]
    assert not agg.pending()
