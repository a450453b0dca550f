"""The PostgreSQL sink against a real server of the test's own (utils/pgserver.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from external_interface.storage.sinks.base import Origin, PermanentSinkError, Policies, SinkError
from external_interface.storage.sinks.history import version_time
from external_interface.storage.sinks.postgres import PostgresSink
from tests.external_interface.postgres_fixtures import (  # noqa: F401 - fixtures
    pg_server,
    pg_url,
    private_server,
)
from utils.pgserver import available
from utils.servers import free_port

pytestmark = pytest.mark.integration

T = "demo.post"


def policies(**kw: tuple[str, ...]) -> Policies:
    p = Policies()
    p.set(T, track=kw.get("track", ("likes", "stats.views")),
          search=kw.get("search", ("title", "content")))  # fmt: skip
    return p


@pytest.fixture
def sink(pg_url: str) -> Iterator[PostgresSink]:  # noqa: F811
    s = PostgresSink(pg_url, policies=policies(), timeout=5.0)
    try:
        yield s
    finally:
        s.close()


def o(entry: str, run: str = "r1") -> Origin:
    return Origin(entry, run, "feed", "demo.h5.feed")


def rows(sink: PostgresSink, sql: str, *args: object) -> list[tuple]:
    with sink._conn() as conn:
        return conn.execute(sql, args).fetchall()


def post(pid: str, likes: int = 0, title: str = "t", **kw: object) -> dict:
    return {"post_id": pid, "likes": likes, "title": title, "content": "", **kw}


def test_upsert_by_key_is_idempotent_and_never_goes_back(sink: PostgresSink) -> None:
    items = [post(f"p{i}", i) for i in range(5)]
    sink.write(T, ["post_id"], items, origins=[o("1700000000000-0")] * 5)
    before = rows(sink, "SELECT post_id, _updated_at FROM items_demo_post ORDER BY post_id")
    sink.write(T, ["post_id"], items, origins=[o("1700000000000-0")] * 5)  # redelivered
    assert rows(sink, "SELECT post_id, _updated_at FROM items_demo_post ORDER BY post_id") == before
    assert sink.count(T) == 5
    sink.write(T, ["post_id"], [post("p1", 50)], origins=[o("1700000000009-0", "r2")])
    sink.write(T, ["post_id"], [post("p1", 7)], origins=[o("1700000000005-0")])  # late, older
    (doc, run, fetched), = rows(sink, "SELECT doc, _run, _fetched_at FROM items_demo_post "
                                      "WHERE post_id = 'p1'")  # fmt: skip
    assert doc["likes"] == 50 and run == "r2"
    assert fetched == version_time(1700000000009 * 1_000_000)
    assert sink.count(T, run="r2") == 1
    # within one batch, the later entry of a key wins
    sink.write(T, ["post_id"], [post("p9", 2), post("p9", 1)],
               origins=[o("1700000000300-0"), o("1700000000200-0")])  # fmt: skip
    assert rows(sink, "SELECT doc->>'likes' FROM items_demo_post WHERE post_id = 'p9'") == [("2",)]


def test_a_field_changed_three_times_reads_back_as_three_versions(sink: PostgresSink) -> None:
    entries = ["1700000000000-0", "1700000060000-0", "1700000120000-0", "1700000180000-0"]
    for entry, likes in zip(entries, (3, 5, 5, 8), strict=True):  # 5 twice: no new version
        sink.write(T, ["post_id"], [post("p1", likes, stats={"views": 10})], origins=[o(entry)])
    sink.write(T, ["post_id"], [post("p1", 5)], origins=[o(entries[1])])  # redelivered: nothing
    got = [v for v in sink.history(T, ["p1"]) if v.field == "likes"]
    t0 = version_time(1700000000000 * 1_000_000)
    assert [(v.value, v.valid_from - t0, v.valid_to and v.valid_to - t0) for v in got] == [
        (3, timedelta(0), timedelta(minutes=1)),
        (5, timedelta(minutes=1), timedelta(minutes=3)),
        (8, timedelta(minutes=3), None),
    ]
    views = [v for v in sink.history(T, ["p1"]) if v.field == "stats.views"]
    assert [(v.value, v.valid_to) for v in views] == [(10, None)]  # a dotted path, unchanged
    # the view holds the same intervals for SQL users
    assert rows(sink, "SELECT value, valid_from, valid_to FROM items_demo_post__versions "
                      "WHERE field = 'likes' ORDER BY valid_from") == [
        (v.value, v.valid_from, v.valid_to) for v in got
    ]  # fmt: skip


def test_history_recorded_out_of_order_still_reads_in_order(sink: PostgresSink) -> None:
    """An entry stored late (claimed after an outage) takes its place among the versions."""
    sink.write(T, ["post_id"], [post("p1", 1)], origins=[o("1700000000000-0")])
    sink.write(T, ["post_id"], [post("p1", 3)], origins=[o("1700000002000-0")])
    sink.write(T, ["post_id"], [post("p1", 2)], origins=[o("1700000001000-0")])  # late
    got = [(v.value, v.valid_to is None) for v in sink.history(T, ["p1"]) if v.field == "likes"]
    assert got == [(1, False), (2, False), (3, True)]
    assert rows(sink, "SELECT doc->>'likes' FROM items_demo_post") == [("3",)]


def test_search_over_the_named_fields(sink: PostgresSink) -> None:
    sink.write(T, ["post_id"], [
        post("p1", title="Rust in production", content="memory safety without a collector"),
        post("p2", title="Gardening", content="tomatoes and basil in production beds"),
        post("p3", title="Cooking", content="basil pesto", summary="production"),
    ])  # fmt: skip
    assert [d["post_id"] for d in sink.search(T, "production")] == ["p1", "p2"]  # not summary
    assert [d["post_id"] for d in sink.search(T, "basil -pesto")] == ["p2"]
    assert [d["post_id"] for d in sink.search(T, '"memory safety"')] == ["p1"]
    assert sink.search(T, "nothing-like-this") == []


def test_schema_is_versioned_and_follows_the_declared_search_fields(pg_url: str) -> None:  # noqa: F811
    s1 = PostgresSink(pg_url, policies=policies(search=("title",)))
    s1.write(T, ["post_id"], [post("p1", title="alpha", content="beta")])
    assert [d["post_id"] for d in s1.search(T, "alpha")] == ["p1"]
    assert s1.search(T, "beta") == []
    s1.close()
    s2 = PostgresSink(pg_url, policies=policies(search=("content",)))  # the declaration changed
    s2.write(T, ["post_id"], [post("p2", title="gamma", content="beta")])
    assert [d["post_id"] for d in s2.search(T, "beta")] == ["p1", "p2"]  # old rows indexed too
    assert rows(s2, "SELECT component, version FROM chaincrawl_schema ORDER BY component") == [
        ("sink", 1), (f"type:{T}", 1)
    ]  # fmt: skip
    assert rows(s2, "SELECT search_fields FROM chaincrawl_types") == [(["content"],)]
    with pytest.raises(SinkError, match="now its key is"):  # a type's key cannot change
        s2.write(T, ["title"], [post("p3")])
    s2.close()


def test_data_errors_are_permanent(sink: PostgresSink) -> None:
    with pytest.raises(PermanentSinkError, match="no key field"):
        sink.write(T, ["post_id"], [{"likes": 1}])
    with pytest.raises(PermanentSinkError, match="scalars"):
        sink.write(T, ["post_id"], [post(["p1"])])  # type: ignore[arg-type]
    # NUL, which PostgreSQL text cannot hold, is stored as U+2400
    sink.write(T, ["post_id"], [post("p\x001", title="a\x00b")])
    assert rows(sink, "SELECT post_id, doc->>'title' FROM items_demo_post") == [
        ("p\u24001", "a\u2400b")
    ]


def test_an_unreachable_server_is_transient_and_the_password_never_shows() -> None:
    if available():
        pytest.skip(available())
    url = f"postgresql://cc:s3cr3t-pw@127.0.0.1:{free_port()}/cc"
    s = PostgresSink(url, timeout=1.0)
    with pytest.raises(SinkError) as info:
        s.write(T, ["post_id"], [post("p1")])
    assert not isinstance(info.value, PermanentSinkError)
    assert "s3cr3t-pw" not in str(info.value)
    s.close()


def test_an_outage_then_the_same_sink_writes_again() -> None:
    with private_server() as server:
        s = PostgresSink(server.url, policies=policies(), timeout=1.0)
        s.write(T, ["post_id"], [post("p1", 1)], origins=[o("1700000000000-0")])
        server.stop()
        with pytest.raises(SinkError):
            s.write(T, ["post_id"], [post("p1", 2)], origins=[o("1700000001000-0")])
        server.start()
        deadline = time.monotonic() + 30  # the drainer retries with backoff; so do we
        while True:
            try:
                s.write(T, ["post_id"], [post("p1", 2)], origins=[o("1700000001000-0")])
                break
            except SinkError:
                assert time.monotonic() < deadline, "the sink did not reconnect"
                time.sleep(0.5)
        assert [v.value for v in s.history(T, ["p1"]) if v.field == "likes"] == [1, 2]
        s.close()
