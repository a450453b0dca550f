"""The JSON Lines sink: rotation, idempotency per outbox entry, torn writes, the reader."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import orjson

from external_interface.sinks.jsonl import JsonlSink, iter_records, read_items
from external_interface.storage import Origin

T = "demo.post"


def lines(root: Path, item_type: str = T) -> list[dict]:
    out = []
    for path in sorted((root / item_type).glob("*.jsonl")):
        out += [orjson.loads(x) for x in path.read_bytes().splitlines() if x]
    return out


def origin(entry: str, run: str = "r1") -> Origin:
    return Origin(entry, run, "feed", "demo.h5.feed")


def test_write_and_read_latest_per_key(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path)
    sink.write(T, ["post_id"], [{"post_id": 1, "likes": 1}, {"post_id": 2, "likes": 2}],
               origins=[origin("100-0"), origin("100-0")])  # fmt: skip
    sink.write(T, ["post_id"], [{"post_id": 1, "likes": 10}], origins=[origin("200-0")])
    assert read_items(T, tmp_path) == [{"post_id": 2, "likes": 2}, {"post_id": 1, "likes": 10}]
    recs = list(iter_records(T, tmp_path))
    assert [r["entry"] for r in recs] == ["100-0", "100-0", "200-0"]
    assert recs[0]["run"] == "r1" and recs[0]["task"] == "demo.h5.feed" and recs[0]["key"] == [1]


def test_redelivered_entry_is_written_once(tmp_path: Path) -> None:
    items = [{"post_id": i} for i in range(3)]
    sink = JsonlSink(tmp_path)
    sink.write(T, ["post_id"], items, origins=[origin("100-0")] * 3)
    sink.write(T, ["post_id"], items, origins=[origin("100-0")] * 3)  # same entry again
    assert len(lines(tmp_path)) == 4  # 3 items + 1 commit line
    # a new process (fresh sink) learns the committed entries from the files themselves
    JsonlSink(tmp_path).write(T, ["post_id"], items, origins=[origin("100-0")] * 3)
    # a batch mixing a written entry and a new one writes only the new one
    JsonlSink(tmp_path).write(
        T, ["post_id"], [{"post_id": 0}, {"post_id": 9}], origins=[origin("100-0"), origin("101-0")]
    )
    recs = list(iter_records(T, tmp_path))
    assert [r["entry"] for r in recs] == ["100-0"] * 3 + ["101-0"]


def test_concurrent_writers_of_one_entry(tmp_path: Path) -> None:
    """Two processes' sinks (separate objects) racing on the same entries: one copy each."""
    sinks = [JsonlSink(tmp_path), JsonlSink(tmp_path)]
    entries = [f"{1000 + i}-0" for i in range(40)]

    def work(sink: JsonlSink) -> None:
        for e in entries:
            sink.write(T, ["post_id"], [{"post_id": e}], origins=[origin(e)])

    threads = [threading.Thread(target=work, args=(s,)) for s in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r["entry"] for r in iter_records(T, tmp_path)) == sorted(entries)


def test_rotation_by_size_and_time(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, max_bytes=600)
    for i in range(20):
        sink.write(
            T, ["post_id"], [{"post_id": i, "text": "x" * 50}], origins=[origin(f"{i + 1}-0")]
        )
    files = sorted((tmp_path / T).glob("*.jsonl"))
    assert len(files) >= 4
    assert all(f.stat().st_size < 600 + 400 for f in files)
    assert [x["post_id"] for x in read_items(T, tmp_path)] == list(range(20))

    timed = tmp_path / "timed"
    sink = JsonlSink(timed, max_age=0.0)  # every write starts a new file
    for i in range(3):
        sink.write(T, ["post_id"], [{"post_id": i}], origins=[origin(f"{i + 1}-0")])
    assert len(list((timed / T).glob("*.jsonl"))) == 3
    sink = JsonlSink(timed, max_age=3600)
    sink.write(T, ["post_id"], [{"post_id": 9}], origins=[origin("9-0")])
    assert len(list((timed / T).glob("*.jsonl"))) == 3  # young enough: appended


def test_torn_write_is_ignored_and_cut(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path)
    sink.write(T, ["post_id"], [{"post_id": 1, "v": 1}], origins=[origin("100-0")])
    (path,) = (tmp_path / T).glob("*.jsonl")
    good_size = path.stat().st_size
    # a crash in the middle of writing entry 200-0: item lines but no commit line, half a line
    with open(path, "ab") as f:
        f.write(
            orjson.dumps({"entry": "200-0", "at": 1.0, "key": [2], "item": {"post_id": 2}}) + b"\n"
        )
        f.write(b'{"entry": "200-0", "at": 1.0, "key": [3], "it')
    assert read_items(T, tmp_path) == [{"post_id": 1, "v": 1}]
    # the redelivered entry is written whole, once; the torn bytes are gone
    fresh = JsonlSink(tmp_path)
    items = [{"post_id": 2}, {"post_id": 3}]
    fresh.write(T, ["post_id"], items, origins=[origin("200-0")] * 2)
    fresh.write(T, ["post_id"], items, origins=[origin("200-0")] * 2)
    assert path.read_bytes().count(b'"200-0"') == 3  # 2 item lines + the commit line
    assert read_items(T, tmp_path) == [{"post_id": 1, "v": 1}, *items]
    assert path.stat().st_size > good_size


def test_late_stale_entry_does_not_win(tmp_path: Path) -> None:
    """An old entry stored after a newer one (claimed after an outage) stays hidden."""
    sink = JsonlSink(tmp_path)
    sink.write(T, ["post_id"], [{"post_id": 1, "likes": 5}], origins=[origin("200-0")])
    sink.write(T, ["post_id"], [{"post_id": 1, "likes": 1}], origins=[origin("100-0")])
    assert read_items(T, tmp_path) == [{"post_id": 1, "likes": 5}]


def test_horizon_bounds_memory_and_scanning(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, max_age=0.0)
    sink.write(T, ["post_id"], [{"post_id": 1}], origins=[origin("1000-0")])
    sink.write(T, ["post_id"], [{"post_id": 2}], origins=[origin("2000-0")])
    st = sink._state(T)
    assert st.committed == {"1000-0", "2000-0"}
    sink.horizon("1500-0")
    assert st.committed == {"2000-0"}

    # A new process whose horizon is now skips files last written long before it.
    old, _new = sorted((tmp_path / T).glob("*.jsonl"))
    os.utime(old, (time.time() - 86400, time.time() - 86400))
    now_id = f"{int(time.time() * 1000)}-0"
    fresh = JsonlSink(tmp_path, max_age=0.0)
    fresh.horizon(now_id)
    fresh.write(T, ["post_id"], [{"post_id": 3}], origins=[origin(now_id)])
    assert "1000-0" not in fresh._state(T).committed
    assert "2000-0" in fresh._state(T).committed  # the newest file is always read


def test_writes_without_origin_and_bad_items(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, fsync=False)
    sink.write(T, ["post_id"], [{"post_id": 1, "v": 1}])
    sink.write(T, ["post_id"], [{"post_id": 1, "v": 2}])
    assert read_items(T, tmp_path) == [{"post_id": 1, "v": 2}]
    try:
        sink.write(T, ["post_id"], [{"post_id": 2, "v": object()}])
    except Exception as e:
        assert type(e).__name__ == "PermanentSinkError"
    else:
        raise AssertionError("unserialisable item accepted")
    assert read_items("nothing.here", tmp_path) == []
