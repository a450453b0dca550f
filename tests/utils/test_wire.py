"""The exact bytes and ARGV layouts the Lua scripts read (ledger/commit.lua's header)."""

from __future__ import annotations

import orjson
import pytest

from utils.wire import (
    CommitArgs,
    KidArgs,
    OutboxFields,
    TaskEnvelope,
    WireError,
    commit_argv,
    envelope_id,
)


def test_a_task_envelope_starts_with_its_id_as_the_scripts_read_it() -> None:
    env = TaskEnvelope("t1", "demo.h5.feed", {"page": 2}, {"run": "r1", "step": "h5.feed"})
    raw = env.encode()
    assert raw == (b'{"id":"t1","task":"demo.h5.feed","params":{"page":2},'
                   b'"meta":{"run":"r1","step":"h5.feed"}}')  # fmt: skip
    assert envelope_id(raw) == "t1"
    assert TaskEnvelope.decode(raw) == env
    assert env.to_dict() == orjson.loads(raw)


def test_a_message_in_another_key_order_still_gives_its_id() -> None:
    assert envelope_id(b'{"task":"x","id":"t9","params":{},"meta":{}}') == "t9"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"not json", "not JSON"),
        (b"[1]", "must be a JSON object"),
        (b'{"id":"t","task":"x","params":[],"meta":{}}', "'params' must be dict"),
        (b'{"task":"x","params":{},"meta":{}}', "'id' must be str"),
    ],
)
def test_a_malformed_message_is_refused_naming_what_is_wrong(raw: bytes, why: str) -> None:
    with pytest.raises(WireError, match=why):
        TaskEnvelope.decode(raw)


def test_a_foreign_message_is_read_leniently_where_asked() -> None:
    env = TaskEnvelope.from_dict({"id": None, "task": "x", "params": "?", "meta": 3})
    assert env == TaskEnvelope("", "x", {}, {})


def test_outbox_fields_are_the_drainers_layout() -> None:
    f = OutboxFields.of("r1", "h5.feed", "demo.h5.feed", "demo.post", ["post_id"],
                        [{"post_id": 1}, {"post_id": 2}]).encode()  # fmt: skip
    assert list(f) == ["run", "step", "task", "type", "key", "items"]
    assert f["key"] == b'["post_id"]' and f["items"] == b'[{"post_id":1},{"post_id":2}]'
    with_dedup = OutboxFields.of("", "", "t", "x", [], [], dedup={"k": 1}).encode()
    assert with_dedup["run"] == "" and with_dedup["dedup"] == b'{"k":1}'


def test_the_commit_argv_layout_is_what_commit_lua_reads() -> None:
    e1 = OutboxFields.of("r1", "s", "t", "a", ["k"], [{"k": 1}]).encode()
    e2 = OutboxFields.of("r1", "s", "t", "a", ["k"], [{"k": 2}]).encode()  # same group as e1
    bad = {"run": "r1", "type": "a", "items": b"{}"}  # not an array: a raw group
    one = CommitArgs("t1", "s", "succeeded", 1, (KidArgs("c", "", b'{"id":"k1"}'),),
                     (("c", "skipped_seen", 3),))  # fmt: skip
    two = CommitArgs("t2", "s", "failed", 0)
    argv = commit_argv("r1", "100.000", 60, "cc:run:{r1}:uniq:", [(one, [e1, bad]), (two, [e2])])
    fields = [x for k, v in e1.items() if k != "items" for x in (k, v)]
    assert argv == [
        # run, now, ttl, uniq prefix, n commits, n groups, the task ids
        "r1", "100.000", 60, "cc:run:{r1}:uniq:", 2, 2, "t1", "t2",
        # per group: kind, n_fields, fields (an `m` group's without items)
        "m", len(fields), *fields,
        "r", 6, "run", "r1", "type", "a", "items", b"{}",
        # per commit: step, outcome, n_items, n_entries, (group, inside of items)...,
        # n_kids, (step, uniq, msg)..., n_counts, (step, counter, n)...
        "s", "succeeded", 1, 2, 1, b'{"k":1}', 2, "", 1, "c", "", b'{"id":"k1"}',
        1, "c", "skipped_seen", 3,
        "s", "failed", 0, 1, 1, b'{"k":2}', 0, 0,
    ]  # fmt: skip
