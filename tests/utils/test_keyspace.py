"""Keyspace.family: a key's family by its name, as the benchmarks' breakdowns group them."""

from __future__ import annotations

import pytest

from utils.keyspace import Keyspace

KS = Keyspace("cc")


@pytest.mark.parametrize(
    ("key", "family"),
    [
        (KS.pool("cookie", "demo") + ":free", "pool:cookie"),
        (KS.pool("device_id", "demo"), "pool:device_id"),
        (KS.proxy_channel("demo") + ":ready", "proxy channel"),
        (KS.proxy("ok"), "proxy pool"),
        (KS.limit("demo.h5.feed", "tat"), "gate"),
        (KS.throttle("demo"), "throttle"),
        (KS.run("r1"), "run"),
        (KS.counters("r1"), "run"),
        (KS.done("", "t1"), "run"),
        (KS.uniq_prefix("r1") + "demo.h5.user_info", "dedup"),
        (KS.run_outbox("r1"), "outbox"),
        (KS.outbox, "outbox"),
        ("cc:dedup:demo.post:ab", "dedup"),
        ("cc:metrics:task:demo.h5.feed", "metrics"),
        (KS.active_runs, "runs"),
        ("other:metrics:task:x", "foreign"),
    ],
)
def test_a_keys_family_is_read_from_its_name(key: str, family: str) -> None:
    assert KS.family(key) == family
