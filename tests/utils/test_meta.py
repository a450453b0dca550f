"""Task metadata: readable fields in code, the compact wire form in messages."""

from __future__ import annotations

from utils.wire import TaskMeta


def test_round_trip_keeps_every_field_and_leaves_unset_ones_out() -> None:
    m = TaskMeta(run_id="r1", step="h5.feed", priority=7, page=3, queue="q2", dedup_id="d",
                 retry_base=2, waits=1, wait_since=12.5, avoid=("proxy:a",))  # fmt: skip
    wire = m.to_wire()
    assert wire == {"run": "r1", "step": "h5.feed", "prio": 7, "page": 3, "queue": "q2",
                    "dd": "d", "rbase": 2, "waits": 1, "wait_since": 12.5,
                    "avoid": ["proxy:a"]}  # fmt: skip
    assert TaskMeta.from_wire(wire) == m
    assert TaskMeta().to_wire() == {}
    assert TaskMeta(run_id="r", step="s", priority=0).to_wire() == {"run": "r", "step": "s",
                                                                    "prio": 0}  # fmt: skip


def test_a_malformed_or_missing_message_part_reads_as_unset() -> None:
    assert TaskMeta.from_wire(None) == TaskMeta.from_wire({}) == TaskMeta()
    assert TaskMeta.from_wire({"prio": "urgent"}).priority is None
    assert TaskMeta.from_wire({"prio": "3"}).priority == 3


def test_a_child_keeps_run_and_priority_and_starts_afresh() -> None:
    m = TaskMeta(run_id="r", step="a", priority=4, page=5, queue="q", dedup_id="d",
                 retry_base=3, waits=2, wait_since=1.0, avoid=("cookie:x",))  # fmt: skip
    assert m.child("b") == TaskMeta(run_id="r", step="b", priority=4)
    assert m.child("a", 6).page == 6
