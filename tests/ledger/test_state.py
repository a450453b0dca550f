"""ledger.state: a batch's commits go in one script call that sums their counters, and every
task still commits at most once, whatever else the call holds."""

from __future__ import annotations

import uuid
from typing import Any, cast

import orjson
import pytest
import redis

import ledger.state
from config import Settings
from ledger.state import CommitCall, Kid, Resumed, RunState, run_status
from utils.lua import script


@pytest.fixture
def state(rds: redis.Redis, redis_url: str, key_prefix: str) -> RunState:
    rds.script_load(
        script(ledger.state.__file__, "commit.lua")
    )  # loaded, as on a running deployment: one EVALSHA per call
    return RunState(rds, Settings(redis_url=redis_url, key_prefix=key_prefix))


def kid(step: str, uniq: str = "") -> Kid:
    tid = uuid.uuid4().hex
    return Kid(step, "t.x", {"n": tid[:6]}, {"run": "r1", "step": step}, tid, uniq)


def commit(state: RunState, calls: list[CommitCall], tid: str, kids: list[Kid], **kw: Any) -> None:
    opts: dict[str, Any] = {"rid": "r1", "step": "s", "outcome": "succeeded", "n_items": 0,
                            "entries": ()} | kw  # fmt: skip
    calls.append(state.commit_call(tid=tid, kids=kids, **opts))


def test_a_batch_commits_in_one_script_call_with_summed_counters(
    state: RunState, rds: redis.Redis
) -> None:
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 4)
    calls: list[CommitCall] = []
    entry = {"run": "r1", "step": "s", "item": '{"a":1}'}
    commit(state, calls, "a", [kid("k", "u1"), kid("k", "u2")], n_items=1, entries=[entry])
    commit(state, calls, "b", [kid("k", "u2"), kid("j")], n_items=2, entries=[entry, entry])
    commit(state, calls, "a", [kid("k", "u9")])  # the same task id again: nothing
    commit(state, calls, "c", [], outcome="failed")
    rds.config_resetstat()
    a, b, dup, c = state.run_commits(calls)
    assert rds.info("commandstats")["cmdstat_evalsha"]["calls"] == 1
    assert dup is None
    assert a is not None and b is not None and c is not None
    assert len(a.staged) == 2 and len(b.staged) == 1  # u2 was already claimed by a
    assert orjson.loads(b.staged[0])["meta"]["step"] == "j"
    # 4 outstanding - 3 committed + 3 children; every reply carries the run's count after the call
    assert a.outstanding == b.outstanding == c.outstanding == 4
    got = state.counters("r1")
    want = {"outstanding": 4, "dispatched": 7, "s:dispatched": 4, "k:dispatched": 2,
            "j:dispatched": 1, "succeeded": 2, "s:succeeded": 2, "failed": 1, "s:failed": 1,
            "items": 3, "s:items": 3}  # fmt: skip
    assert {k: got.get(k, 0) for k in want} == want
    assert rds.xlen(state.outbox_key) == 3
    ledger = state.ledger("r1")
    assert set(ledger) == {orjson.loads(m)["id"] for m in a.staged + b.staged}
    for key in (state.done_key("r1", "a"), state.ledger_key("r1"), state.staged_key("r1")):
        assert 0 < rds.ttl(key) <= 7 * 24 * 3600, key


def test_a_calls_counters_are_one_hmget_and_one_hset_with_the_sums_hincrbys_left(
    state: RunState, rds: redis.Redis
) -> None:
    """The commit script reads every counter it changes with one HMGET and writes them with
    one HSET (no HINCRBY a counter): the same sums, other fields of the counters hash kept,
    a capped run's `inflight` read by that same HMGET (no HGET) and written as its net
    change."""
    state.create_run("r1", "c", b"{}", 5, cap=4)
    state.add_dispatched("r1", "s", 3)
    rds.hset(state.counters_key("r1"), mapping={"inflight": 3, "stored": 7, "s:succeeded": 2})
    calls: list[CommitCall] = []
    commit(state, calls, "a", [kid("k")], n_items=2)
    commit(state, calls, "b", [], outcome="failed")
    rds.config_resetstat()
    a, b = state.run_commits(calls)
    stats = rds.info("commandstats")
    assert "cmdstat_hincrby" not in stats
    assert stats["cmdstat_hmget"]["calls"] == 2  # the run hash's flags, the counters
    assert "cmdstat_hget" not in stats
    assert a is not None and b is not None and a.outstanding == b.outstanding == 2
    got = state.counters("r1")
    want = {"outstanding": 2, "inflight": 2, "stored": 7, "s:succeeded": 3, "succeeded": 1,
            "s:failed": 1, "failed": 1, "items": 2, "s:items": 2, "k:dispatched": 1,
            "dispatched": 4, "s:dispatched": 3}  # fmt: skip
    assert {k: got.get(k, 0) for k in want} == want


def test_a_batchs_entries_of_one_type_and_step_become_one_entry_of_all_their_items(
    state: RunState, rds: redis.Redis
) -> None:
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 5)
    calls: list[CommitCall] = []

    def entry(items: list[int], type: str = "post", step: str = "s") -> dict[str, Any]:
        return {"run": "r1", "step": step, "task": "t.x", "type": type, "key": '["n"]',
                "items": orjson.dumps([{"n": n} for n in items])}  # fmt: skip

    commit(state, calls, "a", [], entries=[entry([1, 2]), entry([7], "user")])
    commit(state, calls, "b", [], entries=[entry([3])])
    commit(state, calls, "a", [], entries=[entry([99])])  # a again: not fresh, not written
    commit(state, calls, "c", [], entries=[entry([]), entry([4], step="t")])
    commit(state, calls, "d", [], entries=[entry([5]), {"run": "r1", "type": "x", "items": "{"}])
    state.run_commits(calls)
    stream = cast("list[tuple[bytes, dict[bytes, bytes]]]", rds.xrange(state.outbox_key))
    got = [(f[b"type"], f.get(b"step"), f[b"items"]) for _, f in stream]
    assert got == [
        (b"post", b"s", orjson.dumps([{"n": n} for n in (1, 2, 3, 5)])),  # in commit order
        (b"user", b"s", b'[{"n":7}]'),
        (b"post", b"t", b'[{"n":4}]'),
        (b"x", None, b"{"),  # not a JSON array: alone, as it came (the drainer dead-letters it)
    ]


def test_the_call_that_commits_the_last_tasks_completes_the_run(
    state: RunState, rds: redis.Redis
) -> None:
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 2)
    calls: list[CommitCall] = []
    commit(state, calls, "a", [kid("k")])
    commit(state, calls, "b", [])
    first, second = state.run_commits(calls)
    assert first is not None and second is not None and first.outstanding == 1
    assert state.info("r1")["status"] == "running"
    calls.clear()
    commit(state, calls, orjson.loads(first.staged[0])["id"], [], step="k")
    (last,) = state.run_commits(calls)
    assert last is not None and last.outstanding == 0
    info = state.info("r1")
    assert info["status"] == "done" and "finished" in info
    assert "r1" not in state.active_runs() and state.ledger("r1") == {}


def test_with_a_cap_each_commit_releases_waiting_children_to_itself(
    state: RunState, rds: redis.Redis
) -> None:
    """Backpressure inside one call: every commit frees its slot and takes over waiting
    children up to the cap, in order, as separate commits did; a commit that found nothing
    waiting does not stop a later one from releasing what was queued after it."""
    state.create_run("r1", "c", b"{}", 5, cap=2)
    state.add_dispatched("r1", "s", 3)
    rds.hset(state.counters_key("r1"), "inflight", 2)
    calls: list[CommitCall] = []
    waiting = [kid("k") for _ in range(3)]
    commit(state, calls, "z", [])  # nothing waits yet
    commit(state, calls, "a", waiting)  # 3 children wait behind the cap; a's slot and z's: 2
    commit(state, calls, "b", [])  # b's slot: the third
    z, a, b = state.run_commits(calls)
    assert z is not None and a is not None and b is not None
    ids = [k.task_id for k in waiting]
    assert z.staged == []
    assert [orjson.loads(m)["id"] for m in a.staged] == ids[:2]
    assert [orjson.loads(m)["id"] for m in b.staged] == ids[2:]
    assert state.waiting("r1") == 0
    assert state.counters("r1")["inflight"] == 2
    calls.clear()
    more = [kid("k") for _ in range(2)]
    commit(state, calls, ids[0], more, step="k")  # at the cap: one of two goes, one waits
    (c,) = state.run_commits(calls)
    assert c is not None and [orjson.loads(m)["id"] for m in c.staged] == [more[0].task_id]
    assert state.waiting("r1") == 1 and state.counters("r1")["inflight"] == 2


def test_with_a_cap_children_skip_the_waiting_list_only_while_nothing_waits(
    state: RunState, rds: redis.Redis
) -> None:
    """Below the cap with nobody waiting, children are staged directly (no RPUSH/LPOP hop
    through `pending`, and no list of their own: their ids go to the run's staged hash); once
    some wait, later ones queue behind them, so the order in which children are released
    stays the order they were made in."""
    state.create_run("r1", "c", b"{}", 5, cap=3)
    state.add_dispatched("r1", "s", 1)
    rds.hset(state.counters_key("r1"), "inflight", 1)
    calls: list[CommitCall] = []
    first = [kid("k") for _ in range(2)]
    commit(state, calls, "a", first)
    rds.config_resetstat()
    (a,) = state.run_commits(calls)
    stats = rds.info("commandstats")
    assert "cmdstat_lpop" not in stats and "cmdstat_rpush" not in stats
    assert rds.hget(state.staged_key("r1"), "a") == " ".join(k.task_id for k in first).encode()
    assert a is not None and [orjson.loads(m)["id"] for m in a.staged] == [k.task_id for k in first]
    assert not rds.exists(state.pending_key("r1"))
    assert state.counters("r1")["inflight"] == 2
    calls.clear()
    # 2 in flight, cap 3: one of four goes, three wait; then a commit whose slot frees one more
    # sends the oldest waiting child before its own new one, which waits behind the rest
    four = [kid("k") for _ in range(4)]
    commit(state, calls, first[0].task_id, four, step="k")
    late = kid("k")
    commit(state, calls, first[1].task_id, [late], step="k")
    b, c = state.run_commits(calls)
    assert b is not None and c is not None
    assert [orjson.loads(m)["id"] for m in b.staged] == [four[0].task_id, four[1].task_id]
    assert [orjson.loads(m)["id"] for m in c.staged] == [four[2].task_id]
    waiting = [orjson.loads(m)["id"] for m in rds.lrange(state.pending_key("r1"), 0, -1)]
    assert waiting == [four[3].task_id, late.task_id]
    assert state.counters("r1")["inflight"] == 3


def test_commits_of_different_runs_and_without_a_run_go_in_their_own_calls(
    state: RunState, rds: redis.Redis
) -> None:
    for rid in ("r1", "r2"):
        state.create_run(rid, "c", b"{}", 5)
        state.add_dispatched(rid, "s", 1)
    calls: list[CommitCall] = []
    commit(state, calls, "a", [])
    commit(state, calls, "b", [], rid="r2")
    commit(state, calls, "n1", [kid("k")], rid="")
    commit(state, calls, "n1", [kid("k")], rid="")  # no run: SET NX keeps it once as well
    rds.config_resetstat()
    a, b, n1, again = state.run_commits(calls)
    assert rds.info("commandstats")["cmdstat_evalsha"]["calls"] == 3
    assert a is not None and a.outstanding == 0 and b is not None and b.outstanding == 0
    assert n1 is not None and n1.outstanding == 0 and len(n1.staged) == 1 and again is None
    assert state.info("r1")["status"] == state.info("r2")["status"] == "done"
    assert state.counters("r1")["succeeded"] == state.counters("r2")["succeeded"] == 1


# --- cancelling a run ------------------------------------------------------------------------------


def test_cancel_drops_the_waiting_children_and_stops_new_ones(
    state: RunState, rds: redis.Redis
) -> None:
    """A capped run: 1 task in the broker, 3 children waiting behind the cap. Cancelling
    drops the 3 at once (ledger too); the task still in the broker then begins as cancelled
    and commits without fetching; a running task commits its items but no children; the run
    ends `cancelled` with every dispatched task accounted for."""
    state.create_run("r1", "c", b"{}", 5, cap=2)
    state.add_dispatched("r1", "s", 2)
    rds.hset(state.counters_key("r1"), "inflight", 2)
    state.ledger_add("r1", [orjson.dumps({"id": t, "task": "t.x", "params": {},
                                          "meta": {"run": "r1", "step": "s"}}) for t in "ab"])  # fmt: skip
    calls: list[CommitCall] = []
    waiting = [kid("k") for _ in range(5)]
    commit(state, calls, "a", waiting)  # a's slot takes 1; 4 wait... and the cap is 2 - 1
    (a,) = state.run_commits(calls)
    assert a is not None and len(a.staged) == 1
    held = state.waiting("r1")
    assert held == 4
    running = orjson.loads(a.staged[0])["id"]

    out = state.cancel("r1", "wrong seeds")
    assert (out.was, out.dropped, out.outstanding) == ("running", 4, 2)  # b, and a's child
    info = state.info("r1")
    assert info["status"] == "running" and info["cancel_reason"] == "wrong seeds"
    assert state.waiting("r1") == 0
    assert set(state.ledger("r1")) == {"b", running}
    assert state.begin("r1", "b", 0) == (False, 1, True, False)
    assert state.begin("r9", "x", 0).cancelled is False  # another run

    calls.clear()
    commit(state, calls, running, [kid("k2") for _ in range(3)], step="k", n_items=2,
           entries=[{"run": "r1", "step": "k", "item": "{}"}] * 2)  # fmt: skip
    (r,) = state.run_commits(calls)
    assert r is not None and r.staged == [] and r.outstanding == 1  # items kept, no children
    calls.clear()
    commit(state, calls, "b", [], outcome="cancelled")
    (b,) = state.run_commits(calls)
    assert b is not None and b.outstanding == 0
    info = state.info("r1")
    assert info["status"] == "cancelled" and "finished" in info
    assert "r1" not in state.active_runs() and state.ledger("r1") == {}
    c = state.counters("r1")
    assert (c["cancelled"], c["k:cancelled"], c["s:cancelled"]) == (5, 4, 1)
    assert c["succeeded"] == 2 and c["items"] == 2 and c["dispatched"] == 2 + 5
    assert c["dispatched"] == c["succeeded"] + c["cancelled"]
    assert rds.xlen(state.outbox_key) == 2  # what ran is stored
    again = state.cancel("r1")
    assert (again.was, again.dropped) == ("cancelled", 0)
    assert state.info("r1")["cancel_reason"] == "wrong seeds"  # the first reason stays


def test_cancelling_an_idle_run_ends_it_at_once_and_a_finished_one_is_left_alone(
    state: RunState,
) -> None:
    state.create_run("r1", "c", b"{}", 5, cap=1)
    state.enqueue_and_release("r1", "s", [orjson.dumps({"id": f"t{i}", "task": "t.x",
                              "params": {}, "meta": {"run": "r1", "step": "s"}}) for i in range(3)],
                              state.kids_key("r1", "client"))  # fmt: skip
    assert state.waiting("r1") == 2
    state.r.delete(state.kids_key("r1", "client"))
    out = state.cancel("r1")
    assert (out.dropped, out.outstanding) == (2, 1)
    state.create_run("r2", "c", b"{}", 5)
    state.add_dispatched("r2", "s", 1)
    calls: list[CommitCall] = []
    commit(state, calls, "x", [], rid="r2")
    state.run_commits(calls)
    assert state.info("r2")["status"] == "done"
    assert state.cancel("r2").was == "done" and state.info("r2")["status"] == "done"
    assert "cancelled" not in state.info("r2")
    assert state.cancel("nope").was == ""
    state.create_run("r3", "c", b"{}", 5)  # no task sent yet: cancelled outright
    assert state.cancel("r3").outstanding == 0 and state.info("r3")["status"] == "cancelled"


# --- pausing a run ---------------------------------------------------------------------------------


def msg(tid: str, step: str = "s", **meta: Any) -> bytes:
    return orjson.dumps(
        {"id": tid, "task": "t.x", "params": {}, "meta": {"run": "r1", "step": step, **meta}}
    )


def test_a_paused_run_parks_its_tasks_and_children_and_resume_sends_them_in_order(
    state: RunState, rds: redis.Redis
) -> None:
    """No cap: a task that begins while its run is paused goes back to the run's waiting list
    (ledger kept, its delivery not counted), a task that was running commits its items and
    its children wait too; resume hands every one of them out, oldest first."""
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 3)
    state.ledger_add("r1", [msg(t) for t in "abc"])
    out = state.pause("r1", "site maintenance")
    assert out.was == "running"
    info = state.info("r1")
    assert info["pause_reason"] == "site maintenance"
    assert run_status(info) == "paused"
    assert state.pause("r1").was == "paused"  # idempotent; the first reason stays
    assert state.info("r1")["pause_reason"] == "site maintenance"
    assert state.hold("r1") == "paused"

    b = state.begin("r1", "a", 0)
    assert (b.paused, b.cancelled, b.deliveries) == (True, False, 1)
    parked = msg("a", rbase=0)
    assert state.park("r1", "a", parked, 0, counted=True) == 1
    assert rds.get(state.deliveries_key("r1", "a", 0)) == b"0"  # parking was no delivery
    assert state.waiting("r1") == 1 and state.ledger("r1")["a"] == parked
    # its worker died before the ack: the message comes back, and is not parked twice
    assert state.begin("r1", "a", 0).deliveries == 1
    assert state.park("r1", "a", parked, 0, counted=True) == 1
    assert state.waiting("r1") == 1 and rds.get(state.deliveries_key("r1", "a", 0)) == b"0"

    calls: list[CommitCall] = []
    kids = [kid("k") for _ in range(2)]
    commit(state, calls, "b", kids, n_items=1, entries=[{"run": "r1", "step": "s", "item": "{}"}])
    (rb,) = state.run_commits(calls)
    assert rb is not None and rb.staged == [] and rb.outstanding == 4  # a, c and b's two
    assert state.waiting("r1") == 3 and rds.xlen(state.outbox_key) == 1

    staging = state.kids_key("r1", "client-resume")
    res = state.resume("r1", staging)
    assert (res.was, res.released) == ("paused", 3)
    assert [orjson.loads(m)["id"] for m in rds.lrange(staging, 0, -1)] == [
        "a", kids[0].task_id, kids[1].task_id
    ]  # fmt: skip
    info = state.info("r1")
    assert run_status(info) == "running" and "pause_reason" not in info
    assert state.waiting("r1") == 0 and state.hold("r1") == ""
    assert state.park("r1", "c", msg("c"), 0, counted=True) == 0  # resumed: c runs as usual
    assert state.begin("r1", "a", 0).deliveries == 1  # the re-sent a: its first delivery
    assert state.resume("r1", staging).was == "running"


def test_a_paused_capped_run_frees_its_slots_and_resume_refills_only_up_to_the_cap(
    state: RunState, rds: redis.Redis
) -> None:
    state.create_run("r1", "c", b"{}", 5, cap=2)
    staging = state.kids_key("r1", "client")
    state.enqueue_and_release("r1", "s", [msg(f"t{i}") for i in range(4)], staging)
    assert rds.llen(staging) == 2 and state.waiting("r1") == 2
    rds.delete(staging)  # "sent": t0, t1 in the broker
    state.pause("r1")
    state.enqueue_and_release("r1", "s", [msg("t4")], staging)  # a replay: held too
    assert rds.llen(staging) == 0 and state.waiting("r1") == 3
    assert state.park("r1", "t0", msg("t0"), 0, counted=False) == 1
    assert state.counters("r1")["inflight"] == 1  # t0 left the broker
    calls: list[CommitCall] = []
    commit(state, calls, "t1", [kid("k")])
    (r,) = state.run_commits(calls)
    assert r is not None and r.staged == []  # its slot is free, but nothing is released
    assert state.counters("r1")["inflight"] == 0 and state.waiting("r1") == 5
    res = state.resume("r1", staging)
    assert res.released == 2 and state.waiting("r1") == 3
    assert [orjson.loads(m)["id"] for m in rds.lrange(staging, 0, -1)] == ["t2", "t3"]
    assert state.counters("r1")["inflight"] == 2


def test_pause_leaves_ended_runs_alone_and_cancel_drops_what_a_paused_run_holds(
    state: RunState, rds: redis.Redis
) -> None:
    assert state.pause("nope").was == "" and state.resume("nope", "x").was == ""
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 2)
    state.ledger_add("r1", [msg("a"), msg("b")])
    state.pause("r1")
    assert state.park("r1", "a", msg("a"), 0, counted=False) == 1
    rds.sadd(state.done_key("r1", "b"), "b")  # b committed meanwhile by another delivery
    assert state.park("r1", "b", msg("b"), 0, counted=False) == -1
    rds.srem(state.done_key("r1", "b"), "b")
    out = state.cancel("r1")
    assert (out.was, out.dropped, out.outstanding) == ("running", 1, 1)
    assert run_status(state.info("r1")) == "cancelling"
    assert state.park("r1", "b", msg("b"), 0, counted=False) == 0  # cancelled: b is skipped
    assert state.begin("r1", "b", 0).cancelled
    assert state.pause("r1").was == "cancelling"
    assert state.resume("r1", "x") == Resumed("r1", "cancelling", 0)  # not "paused"
    state.create_run("r2", "c", b"{}", 5)  # a finished run
    assert state.pause("r2").was == "running"
    state.resume("r2", "x")
    rds.hset(state.run_key("r2"), "status", "done")
    assert state.pause("r2").was == "done" and "paused" not in state.info("r2")


def test_recent_lists_runs_newest_first_and_forgets_expired_ones(state: RunState) -> None:
    for i, rid in enumerate(("a", "b", "c")):
        state.create_run(rid, "c", b"{}", 5)
        state.r.zadd(state.recent_key, {rid: 1000 + i})  # started one second apart
    assert state.recent(2) == ["c", "b"]
    state.r.delete(state.run_key("b"))  # its record expired
    assert state.recent(5) == ["c", "a"]
    assert state.r.zcard(state.recent_key) == 2


def test_recent_counts_a_run_on_a_lost_slot_range_alive_without_reading_it(
    state: RunState, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis.crc import key_slot

    import ledger.runs
    from utils.slots import LostRange

    for i, rid in enumerate(("a", "b", "c")):
        state.create_run(rid, "c", b"{}", 5)
        state.r.zadd(state.recent_key, {rid: 1000 + i})
    state.r.delete(state.run_key("a"))  # expired
    slot = key_slot(state.run_key("b").encode())
    lost = [LostRange(slot, slot, "127.0.0.1:1", ("127.0.0.1:2",))]
    monkeypatch.setattr(ledger.runs, "lost_ranges", lambda r: lost)
    state.r.delete(state.run_key("b"))  # unread: still listed while its slot is lost
    assert state.recent(5) == ["c", "b"]
    assert state.r.zcard(state.recent_key) == 2


def test_active_runs_of_one_chain(state: RunState) -> None:
    """What `control.sh pause --chain NAME` holds."""
    for rid, chain in (("a", "shop"), ("b", "news"), ("c", "shop")):
        state.create_run(rid, chain, b"{}", 5)
    assert state.active_runs() == ["a", "b", "c"]
    assert state.active_runs("shop") == ["a", "c"] and state.active_runs("none") == []


def test_a_finished_run_is_storing_until_its_items_are_stored(state: RunState) -> None:
    assert run_status({"status": "done"}, {"items": 3, "stored": 2}) == "storing"
    assert run_status({"status": "done"}, {"items": 3, "stored": 2, "store_failed": 1}) == "done"
    assert run_status({"status": "done"}) == "done"  # without counters: the tasks' view
    assert run_status({"status": "cancelled"}, {"items": 3}) == "cancelled"
    rid, tid = uuid.uuid4().hex[:8], uuid.uuid4().hex
    state.create_run(rid, "c", b"{}", 5)
    state.add_dispatched(rid, "s", 1)
    entry = {"type": "t.x", "run": rid, "step": "s", "items": "[]"}
    state.commit(rid=rid, tid=tid, step="s", outcome="succeeded", n_items=2, entries=[entry],
                 kids=[])  # fmt: skip
    assert state.info(rid)["status"] == "done" and state.status(rid) == "storing"
    assert state.storing_runs() == [rid] and rid not in state.active_runs()
    state.r.hincrby(state.counters_key(rid), "stored", 2)  # what the outbox's ack does
    assert state.status(rid) == "done"
    assert state.storing_runs() == [] and not state.r.exists(state.storing_key)
    assert state.status("no-such-run") == ""


def test_a_complete_stored_run_is_compacted_to_its_counters(
    state: RunState, rds: redis.Redis
) -> None:
    """Once complete and stored, a run keeps its hash and counters (for the retention) and
    nothing per task: no done set, no `unique` sets; a late duplicate still counts as
    committed, at begin and at commit."""
    chain = {"name": "c", "root": {"id": "s", "task": "t.x", "then": [{"id": "k", "task": "t.y"}]}}
    state.create_run("r1", "c", orjson.dumps(chain), 5)
    state.add_dispatched("r1", "s", 1)
    calls: list[CommitCall] = []
    commit(state, calls, "a", [kid("k", "u1"), kid("k", "u1")], n_items=2,
           entries=[{"run": "r1", "step": "s", "item": "{}"}])  # fmt: skip
    (res,) = state.run_commits(calls)
    assert res is not None and res.outstanding == 1
    kid_id = orjson.loads(res.staged[0])["id"]
    state.clear_kids("r1", "a")  # sent: the publisher drops what it staged after sending
    assert not state.compact("r1")  # running
    calls = []
    commit(state, calls, kid_id, [], step="k")
    state.run_commits(calls)
    assert state.info("r1")["status"] == "done"
    assert state.compact_settled(["r1"]) == []  # done, but its 2 items are not stored yet
    assert rds.exists(state.uniq_key("r1", "k"), state.done_key("r1", "")) == 2
    rds.hincrby(state.counters_key("r1"), "stored", 2)
    assert state.compact_settled(["r1", "r1", ""]) == ["r1"]
    assert not state.compact("r1")  # once
    assert set(rds.scan_iter(match=state.run_key("r1") + "*")) == {
        state.run_key("r1").encode(),
        state.counters_key("r1").encode(),
        state.wake_key("r1").encode(),  # the end's wake for a waiter: a minute, then gone
    }
    assert 0 < rds.ttl(state.wake_key("r1")) <= 60
    assert 0 < rds.ttl(state.run_key("r1")) <= state.ttl
    before = state.counters("r1")
    assert before["succeeded"] == 2 and before["items"] == 2
    # a stray redelivery: committed already, and a commit changes nothing
    assert state.begin("r1", "a", 0).committed
    calls = []
    commit(state, calls, "a", [kid("k")], n_items=5)
    assert state.run_commits(calls) == [None]
    assert state.counters("r1") == before
    # a replayed dead letter reopens it: its new task commits as usual
    state.reopen_failed("r1", "k")
    assert "compacted" not in state.info("r1")
    calls = []
    commit(state, calls, "replayed", [], step="k")
    (res,) = state.run_commits(calls)
    assert res is not None and res.outstanding == 0


def test_a_commit_forgets_its_delivery_counter(state: RunState, rds: redis.Redis) -> None:
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 1)
    assert state.begin("r1", "a", 0).deliveries == 1
    assert rds.exists(state.deliveries_key("r1", "a", 0))
    calls: list[CommitCall] = []
    commit(state, calls, "a", [], forget=[state.deliveries_key("r1", "a", 0)])
    state.run_commits(calls)
    assert not rds.exists(state.deliveries_key("r1", "a", 0))


def test_the_retention_is_a_setting(rds: redis.Redis, redis_url: str, key_prefix: str) -> None:
    s = Settings(redis_url=redis_url, key_prefix=key_prefix, run_retention=3600)
    st = RunState(rds, s)
    st.create_run("r2", "c", b"{}", 5)
    assert 0 < rds.ttl(st.run_key("r2")) <= 3600


def test_skips_are_counted_with_the_commit_once(state: RunState, rds: redis.Redis) -> None:
    """A `unique` child sent before counts as `skipped_unique` on its step; counts handed to
    the commit (`skipped_seen`) are added once per task id, like the rest; the counters they
    change are among those the script reads before its loop (no second HMGET)."""
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 2)
    calls: list[CommitCall] = []
    seen = {("k", "skipped_seen"): 3}
    commit(state, calls, "a", [kid("k", "u1"), kid("k", "u1")], counts=seen)
    commit(state, calls, "b", [kid("k", "u1")], counts={("k", "skipped_seen"): 0})
    commit(state, calls, "a", [kid("k", "u2")], counts=seen)  # a again: nothing
    rds.config_resetstat()
    state.run_commits(calls)
    assert rds.info("commandstats")["cmdstat_hmget"]["calls"] == 2  # run flags, counters
    c = state.counters("r1")
    assert c["k:skipped_unique"] == c["skipped_unique"] == 2
    assert c["k:skipped_seen"] == c["skipped_seen"] == 3
    assert c["k:dispatched"] == 1


def test_a_first_delivery_writes_no_counter_and_a_redelivery_counts_from_two(
    state: RunState, rds: redis.Redis
) -> None:
    """The broker's `redelivered` flag: a first delivery is delivery 1 with no counter in
    Redis; each redelivery counts, so the poison cap sees the same numbers as before."""
    state.create_run("r1", "c", b"{}", 5)
    key = state.deliveries_key("r1", "a", 0)
    assert state.begin("r1", "a", 0, redelivered=False).deliveries == 1
    assert not rds.exists(key)
    assert state.begin("r1", "a", 0, redelivered=True).deliveries == 2
    assert state.begin("r1", "a", 0, redelivered=True).deliveries == 3
    assert rds.ttl(key) > 0
    begun, n = state.begin_many([("r1", "b", 0)], batch_id="b1", redelivered=False)
    assert n == 1 and begun[0].deliveries == 0
    assert not rds.exists(state.deliveries_key("", "b1", 0))
    assert state.begin_many([("r1", "b", 0)], batch_id="b1", redelivered=True)[1] == 2


def test_last_and_the_keys_expiry_are_written_at_most_once_a_second(
    state: RunState, rds: redis.Redis
) -> None:
    """Commits of a run within a second of its `last` leave `last` and the expiry of its done
    set, ledger and staged hash alone; one after a re-send writes `last` at once; the run's
    last commit writes them all."""
    state.create_run("r1", "c", b"{}", 5)
    state.add_dispatched("r1", "s", 3)
    calls: list[CommitCall] = []
    commit(state, calls, "a", [kid("k")])  # no `last` yet: written, keys expire
    state.run_commits(calls)
    last = rds.hget(state.run_key("r1"), "last")
    assert last is not None and rds.ttl(state.done_key("r1", "")) > 0
    rds.persist(state.done_key("r1", ""))
    # `last` a minute ahead of the server's clock: the next commit falls within the second
    # however long a busy machine takes between the two
    last = f"{float(last) + 60:.3f}".encode()
    rds.hset(state.run_key("r1"), "last", last)
    calls = []
    commit(state, calls, "b", [])
    state.run_commits(calls)
    assert rds.hget(state.run_key("r1"), "last") == last
    assert rds.ttl(state.done_key("r1", "")) == -1  # within the second: not renewed
    rds.hset(state.run_key("r1"), "resend_mark", last)  # the sweeper re-sent meanwhile
    calls = []
    commit(state, calls, "c", [])
    state.run_commits(calls)
    assert rds.hget(state.run_key("r1"), "last") != last  # the re-send's progress is seen
    assert rds.ttl(state.done_key("r1", "")) > 0


def test_a_capped_run_reads_its_waiting_list_once_while_nothing_waits(
    state: RunState, rds: redis.Redis
) -> None:
    """The first commit that finds nothing waiting marks the run (`nowait`); later commits
    read no LLEN. A client's queueing drops the mark with its push, so the next commit reads
    the list again and releases the waiting task into its freed slot before its own child."""
    state.create_run("r1", "c", b"{}", 5, cap=2)
    state.add_dispatched("r1", "s", 2)
    rds.hset(state.counters_key("r1"), "inflight", 2)
    calls: list[CommitCall] = []
    commit(state, calls, "a", [])
    rds.config_resetstat()
    state.run_commits(calls)
    assert rds.info("commandstats")["cmdstat_llen"]["calls"] == 1
    assert rds.hget(state.run_key("r1"), "nowait") == b"1"
    calls.clear()
    commit(state, calls, "b", [kid("k"), kid("k")])  # two slots, nothing waits: no LLEN
    rds.config_resetstat()
    (b,) = state.run_commits(calls)
    assert "cmdstat_llen" not in rds.info("commandstats")
    assert b is not None and len(b.staged) == 2
    seed = kid("s")
    state.enqueue_and_release("r1", "s", [seed.encode()], state.kids_key("r1", "client"))
    assert rds.hget(state.run_key("r1"), "nowait") is None
    assert rds.llen(state.pending_key("r1")) == 1  # the cap is full: it waits
    calls.clear()
    own = kid("k")
    commit(state, calls, orjson.loads(b.staged[0])["id"], [own], step="k")
    (c,) = state.run_commits(calls)
    assert c is not None and [orjson.loads(m)["id"] for m in c.staged] == [seed.task_id]
    assert [orjson.loads(m)["id"] for m in rds.lrange(state.pending_key("r1"), 0, -1)] == [
        own.task_id
    ]
    assert rds.hget(state.run_key("r1"), "nowait") is None  # its child waits now
