"""bench/script_ops.py: script calls by operation, and the commands each ran, as MONITOR
shows them (a call, then its commands marked `lua`)."""

from __future__ import annotations

from bench.script_ops import ScriptOps, script_op

KEYS = "k1 k2 k3 k4 k5 k6 k7 k8 k9"


def test_a_lease_scripts_operation_and_a_releases_action_name_the_call() -> None:
    assert script_op(f"EVALSHA abc 9 {KEYS} checkout 60000 tok 0".split(), "pool") == (
        "pool checkout"
    )
    assert script_op(f"EVALSHA abc 9 {KEYS} release id tok ban banned 1000".split(), "pool") == (
        "pool release ban"
    )
    assert script_op(["EVALSHA", "abc", "2", "a", "b", "1796347870.669", "2"], "run") == "run"
    assert script_op(["EVALSHA", "abc"], "run") == "run"


def test_commands_in_a_script_count_for_the_call_read_last_and_a_lending_checkout_shows() -> None:
    ops = ScriptOps()
    feed = [
        (f"EVALSHA abc 9 {KEYS} checkout 60000 tok 0", False),
        ("TIME", True),
        ("ZRANGE k1 0 0", True),
        ("HSET cc:pool:token m1 tok", True),  # lent: its token written
        (f"EVALSHA abc 9 {KEYS} checkout 60000 tok 0", False),
        ("TIME", True),
        ("GET x", False),  # not a script: what follows is no one's
        ("HINCRBY m f 1", False),
    ]
    for line, lua in feed:
        ops.count(line.split(), "pool", lua)
    assert ops.calls == {"pool checkout": 2, "pool checkout lent": 1}
    assert ops.commands == {"pool checkout": 4}
    other = ScriptOps()
    other.merge(ops)
    assert other.per_page(2)["scripts_by_op_per_page"] == {
        "pool checkout": 1.0,
        "pool checkout lent": 0.5,
    }
