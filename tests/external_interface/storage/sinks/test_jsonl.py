"""The JSON Lines sink: files of items only, exactly once per outbox entry, the latest version
per key (or every write in append mode), rotation within the size limit, crash repairs."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from external_interface.storage.sinks.base import Origin, PermanentSinkError
from external_interface.storage.sinks.jsonl import (
    JsonlSink,
    item_types,
    iter_records,
    open_snapshot,
    read_items,
    type_files,
)
from external_interface.storage.sinks.jsonl import compact as compact_module
from external_interface.storage.sinks.jsonl.store import JsonlWriter

T = "demo.post"


def file_lines(root: Path, item_type: str = T) -> list[dict[str, Any]]:
    """What a user sees: every line of every part file, parsed."""
    out = []
    for path in type_files(item_type, root):
        out += [orjson.loads(x) for x in path.read_bytes().splitlines()]
    return out


def origin(entry: str, run: str = "r1") -> Origin:
    return Origin(entry, run, "feed", "demo.h5.feed")


def test_the_file_holds_the_items_themselves(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path)
    items = [{"post_id": 1, "likes": 1}, {"post_id": 2, "likes": 2}]
    sink.write(T, ["post_id"], items, origins=[origin("100-0")] * 2)
    path = tmp_path / T / f"{T}.jsonl"
    assert type_files(T, tmp_path) == [path]
    assert path.read_bytes() == b'{"post_id":1,"likes":1}\n{"post_id":2,"likes":2}\n'
    assert sorted(p.name for p in (tmp_path / T).iterdir()) == [".journal", ".lock", path.name]
    assert item_types(tmp_path) == [T]
    assert type_files("nothing.here", tmp_path) == [] and read_items("nothing.here", tmp_path) == []


def test_write_and_read_latest_per_key(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path)
    sink.write(T, ["post_id"], [{"post_id": 1, "likes": 1}, {"post_id": 2, "likes": 2}],
               origins=[origin("100-0"), origin("100-0")])  # fmt: skip
    sink.write(T, ["post_id"], [{"post_id": 1, "likes": 10}], origins=[origin("200-0", "r2")])
    assert read_items(T, tmp_path) == [{"post_id": 2, "likes": 2}, {"post_id": 1, "likes": 10}]
    recs = list(iter_records(T, tmp_path))
    assert [r["entry"] for r in recs] == ["100-0", "100-0", "200-0"]
    assert recs[0]["run"] == "r1" and recs[0]["step"] == "feed" and recs[0]["key"] == [1]
    assert recs[2]["run"] == "r2" and recs[2]["version"] > recs[0]["version"]
    # a run's items: the latest version of each key that run stored
    assert read_items(T, tmp_path, run="r2") == [{"post_id": 1, "likes": 10}]
    assert read_items(T, tmp_path, run="r1") == [{"post_id": 1, "likes": 1},
                                                  {"post_id": 2, "likes": 2}]  # fmt: skip


def test_redelivered_entry_is_written_once(tmp_path: Path) -> None:
    items = [{"post_id": i} for i in range(3)]
    sink = JsonlSink(tmp_path)
    sink.write(T, ["post_id"], items, origins=[origin("100-0")] * 3)
    sink.write(T, ["post_id"], items, origins=[origin("100-0")] * 3)  # same entry again
    assert len(file_lines(tmp_path)) == 3
    # a new process (fresh sink) learns the committed entries from the journal
    JsonlSink(tmp_path).write(T, ["post_id"], items, origins=[origin("100-0")] * 3)
    # a batch mixing a written entry and a new one writes only the new one
    JsonlSink(tmp_path).write(
        T, ["post_id"], [{"post_id": 0}, {"post_id": 9}], origins=[origin("100-0"), origin("101-0")]
    )
    recs = list(iter_records(T, tmp_path))
    assert [r["entry"] for r in recs] == ["100-0"] * 3 + ["101-0"]
    assert file_lines(tmp_path) == [{"post_id": 0}, {"post_id": 1}, {"post_id": 2}, {"post_id": 9}]


def test_concurrent_writers_of_one_entry(tmp_path: Path) -> None:
    """Two processes' sinks (separate objects) racing on the same entries: one copy each."""
    sinks = [JsonlSink(tmp_path, mode="append"), JsonlSink(tmp_path, mode="append")]
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
    assert len(file_lines(tmp_path)) == 40


def test_nine_runs_leave_one_copy_and_append_mode_keeps_them_all(tmp_path: Path) -> None:
    def nine_runs(sink: JsonlSink) -> None:
        for run in range(9):
            items = [{"post_id": i, "run": run} for i in range(5)]
            sink.write(T, ["post_id"], items, origins=[origin(f"{1000 + run}-0", f"r{run}")] * 5)
            sink._next_compact.clear()  # the runs are microseconds apart here, not minutes
            sink.settle()

    latest = JsonlSink(tmp_path / "latest", compact_after=0.0)
    nine_runs(latest)
    assert file_lines(latest.root) == [{"post_id": i, "run": 8} for i in range(5)]
    assert len((latest.root / T / ".journal").read_bytes().splitlines()) <= 2
    # the entries written before the compaction are still known: a redelivery is skipped
    latest.write(T, ["post_id"], [{"post_id": 0, "run": 0}], origins=[origin("1000-0", "r0")])
    fresh = JsonlSink(latest.root)
    fresh.write(T, ["post_id"], [{"post_id": 0, "run": 3}], origins=[origin("1003-0", "r3")])
    assert read_items(T, latest.root)[0] == {"post_id": 0, "run": 8}
    assert len(file_lines(latest.root)) == 5

    append = JsonlSink(tmp_path / "append", mode="append", compact_after=0.0)
    nine_runs(append)
    assert len(file_lines(append.root)) == 45
    assert read_items(T, append.root) == [{"post_id": i, "run": 8} for i in range(5)]
    assert append.compact(T) == 40  # on demand, whatever the mode
    assert len(file_lines(append.root)) == 5


def test_settle_waits_for_a_quiet_moment(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, compact_after=0.5)
    for e in ("100-0", "200-0"):
        sink.write(T, ["post_id"], [{"post_id": 1, "e": e}], origins=[origin(e)])
    sink.settle()
    assert len(file_lines(tmp_path)) == 2  # written just now: not yet
    time.sleep(0.6)
    sink.settle()
    assert file_lines(tmp_path) == [{"post_id": 1, "e": "200-0"}]
    # nothing written since: no compaction reads the files again
    before = (tmp_path / T / ".journal").stat().st_ino
    sink._next_compact.clear()
    sink.settle()
    assert (tmp_path / T / ".journal").stat().st_ino == before


def test_late_stale_entry_does_not_win(tmp_path: Path) -> None:
    """An old entry stored after a newer one (claimed after an outage) stays hidden, also
    once compacted."""
    sink = JsonlSink(tmp_path)
    sink.write(T, ["post_id"], [{"post_id": 1, "likes": 5}], origins=[origin("200-0")])
    sink.write(T, ["post_id"], [{"post_id": 1, "likes": 1}], origins=[origin("100-0")])
    assert read_items(T, tmp_path) == [{"post_id": 1, "likes": 5}]
    assert sink.compact(T) == 1
    assert file_lines(tmp_path) == [{"post_id": 1, "likes": 5}]


def test_rotation_keeps_every_part_within_its_limit(tmp_path: Path) -> None:
    limit = 1000
    sink = JsonlSink(tmp_path, max_bytes=limit, mode="append")
    n = 0
    for batch in range(6):  # batches several times the limit: rotation happens inside them
        items = [{"post_id": n + i, "text": "x" * (20 + (n + i) % 40)} for i in range(60)]
        sink.write(T, ["post_id"], items, origins=[origin(f"{batch + 1}-0")] * len(items))
        n += len(items)
    files = type_files(T, tmp_path)
    assert len(files) > 6
    sizes = [f.stat().st_size for f in files]
    assert max(sizes) <= limit, sizes  # within the limit, not 10 % over it
    assert min(sizes[:-1]) > limit * 0.9  # and full before the next one starts
    assert [x["post_id"] for x in file_lines(tmp_path)] == list(range(n))
    assert [r["entry"] for r in iter_records(T, tmp_path)][::60] == [f"{b + 1}-0" for b in range(6)]
    # a line longer than the limit gets a part of its own
    sink.write(T, ["post_id"], [{"post_id": -1, "text": "y" * 3000}], origins=[origin("9-0")])
    sink.write(T, ["post_id"], [{"post_id": -2}], origins=[origin("10-0")])
    files = type_files(T, tmp_path)
    assert files[-2].stat().st_size > 3000 and file_lines(tmp_path)[-1] == {"post_id": -2}
    # compaction splits its output the same way
    sink.write(T, ["post_id"], [{"post_id": 0, "text": "new"}], origins=[origin("11-0")])
    assert sink.compact(T) == 1
    assert all(f.stat().st_size <= limit for f in type_files(T, tmp_path) if f != files[-2])
    assert len(read_items(T, tmp_path)) == n + 2


def test_rotation_holds_with_several_writers_and_batches_larger_than_a_part(
    tmp_path: Path,
) -> None:
    """Drainers of several processes (a sink each, taking turns on the type's lock) writing
    batches three times a part's size: every part stays within its limit (at most 10 % under
    it before the next starts), and no item is lost or doubled."""
    limit = 2000

    def drain(k: int) -> None:
        sink = JsonlSink(tmp_path, max_bytes=limit, fsync=False, mode="append")
        for b in range(10):
            items = [{"post_id": k * 10_000 + b * 100 + i, "text": "x" * (30 + i % 50)}
                     for i in range(80)]  # fmt: skip
            sink.write(T, ["post_id"], items, origins=[origin(f"{k * 100 + b + 1}-0")] * 80)

    threads = [threading.Thread(target=drain, args=(k,)) for k in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    sizes = [f.stat().st_size for f in type_files(T, tmp_path)]
    assert max(sizes) <= limit, sizes
    assert min(sizes[:-1]) >= limit * 0.9, sizes
    ids = [x["post_id"] for x in file_lines(tmp_path)]
    assert len(ids) == len(set(ids)) == 3 * 10 * 80


def test_rotation_by_age(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, max_age=0.0)  # every write starts a new part
    for i in range(3):
        sink.write(T, ["post_id"], [{"post_id": i}], origins=[origin(f"{i + 1}-0")])
    assert [p.name for p in type_files(T, tmp_path)] == [
        f"{T}.jsonl",
        f"{T}.2.jsonl",
        f"{T}.3.jsonl",
    ]
    sink = JsonlSink(tmp_path, max_age=3600)
    sink.write(T, ["post_id"], [{"post_id": 9}], origins=[origin("9-0")])
    assert len(type_files(T, tmp_path)) == 3  # young enough: appended


def test_an_unfinished_write_is_ignored_and_cut(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, max_bytes=60)
    sink.write(T, ["post_id"], [{"post_id": 1, "v": 1}], origins=[origin("100-0")])
    (path,) = type_files(T, tmp_path)
    good = path.read_bytes()
    # a crash in the middle of writing entry 200-0: lines, one more part, no journal record
    with open(path, "ab") as f:
        f.write(b'{"post_id":2}\n{"post_id":3,"v"')
    nxt = tmp_path / T / f"{T}.2.jsonl"
    nxt.write_bytes(b'{"post_id":4}\n')
    with open(tmp_path / T / ".journal", "ab") as f:
        f.write(b'{"key":["post_id"],"groups":[[2')  # and half its commit record
    assert read_items(T, tmp_path) == [{"post_id": 1, "v": 1}]
    assert path.read_bytes() == good and not nxt.exists()  # the reader's refresh cut them
    items = [{"post_id": 2}, {"post_id": 3}, {"post_id": 4}]
    fresh = JsonlSink(tmp_path, max_bytes=60)
    fresh.write(T, ["post_id"], items, origins=[origin("200-0")] * 3)
    fresh.write(T, ["post_id"], items, origins=[origin("200-0")] * 3)
    assert file_lines(tmp_path) == [{"post_id": 1, "v": 1}, *items]


def test_a_compaction_cut_short_is_completed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = JsonlSink(tmp_path, max_bytes=40)
    for e in range(1, 7):
        sink.write(T, ["post_id"], [{"post_id": e % 3, "e": e}], origins=[origin(f"{e}-0")])

    class Crash:  # the process dies after the journal was renamed, before the parts are
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        def replace(self, src: Any, dst: Any) -> None:
            raise OSError("killed")

    monkeypatch.setattr(compact_module, "os", Crash())
    with pytest.raises(OSError, match="killed"):
        sink.compact(T)
    monkeypatch.undo()
    assert list((tmp_path / T).glob(".tmp-*"))  # the new parts wait under temporary names
    expected = [{"post_id": 1, "e": 4}, {"post_id": 2, "e": 5}, {"post_id": 0, "e": 6}]
    assert read_items(T, tmp_path) == expected  # the reader's refresh renamed them
    assert file_lines(tmp_path) == expected
    assert not list((tmp_path / T).glob(".tmp-*"))
    JsonlSink(tmp_path).write(T, ["post_id"], [{"post_id": 1, "e": 4}], origins=[origin("4-0")])
    assert len(file_lines(tmp_path)) == 3


def test_files_changed_by_hand_are_adopted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = JsonlSink(tmp_path)
    sink.write(T, ["post_id"], [{"post_id": i} for i in range(3)], origins=[origin("100-0")] * 3)
    (path,) = type_files(T, tmp_path)
    path.write_bytes(b'{"post_id":0,"edited":true}\n')  # a user's editor: a new file
    with caplog.at_level(logging.WARNING):
        assert read_items(T, tmp_path) == [{"post_id": 0, "edited": True}]
    assert "rebuilt from the files" in caplog.text
    sink.write(T, ["post_id"], [{"post_id": 0, "v": 2}], origins=[origin("200-0")])
    assert read_items(T, tmp_path) == [{"post_id": 0, "v": 2}]  # the adopted line is oldest
    path.unlink()  # the user starts afresh
    sink.write(T, ["post_id"], [{"post_id": 5}], origins=[origin("300-0")])
    assert file_lines(tmp_path) == [{"post_id": 5}]


def test_a_reader_keeps_what_it_opened(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path)
    for e in range(1, 4):
        sink.write(T, ["post_id"], [{"post_id": 1, "e": e}], origins=[origin(f"{e}-0")])
    snap = open_snapshot(T, tmp_path)
    assert snap is not None
    with snap:
        sink.compact(T)
        sink.write(T, ["post_id"], [{"post_id": 2}], origins=[origin("9-0")])
        assert [orjson.loads(x)["e"] for x in snap.raw_lines()] == [1, 2, 3]
    assert read_items(T, tmp_path) == [{"post_id": 1, "e": 3}, {"post_id": 2}]


def test_horizon_bounds_memory(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, max_age=0.0)
    sink.write(T, ["post_id"], [{"post_id": 1}], origins=[origin("1000-0")])
    sink.write(T, ["post_id"], [{"post_id": 2}], origins=[origin("2000-0")])
    st = sink._store(T)
    assert st.done == {"1000-0", "2000-0"}
    sink.horizon("1500-0")
    assert st.done == {"2000-0"}
    # a new process whose horizon is set first never loads the older entries
    fresh = JsonlSink(tmp_path)
    fresh.horizon("1500-0")
    fresh.write(T, ["post_id"], [{"post_id": 3}], origins=[origin("3000-0")])
    assert fresh._store(T).done == {"2000-0", "3000-0"}


def test_equal_entry_ids_of_two_runs_streams_are_told_apart(tmp_path: Path) -> None:
    """On a Redis Cluster each run has its own stream, so entry ids repeat across runs: the
    drainer gives `<run>/<id>`; each is written once, versioned and forgotten by its id."""
    sink = JsonlSink(tmp_path, mode="append")
    for _ in range(2):  # the second time: a redelivery, skipped
        sink.write(T, ["post_id"], [{"post_id": 1}, {"post_id": 2}],
                   origins=[origin("r1/1000-1", "r1"), origin("r2/1000-1", "r2")])  # fmt: skip
    assert [(r["entry"], r["version"]) for r in iter_records(T, tmp_path)] == [
        ("r1/1000-1", 1000_000_001),
        ("r2/1000-1", 1000_000_001),
    ]
    sink.horizon("1500-0")
    assert sink._store(T).done == set()


def test_writes_without_origin_and_bad_items(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, fsync=False)
    sink.write(T, ["post_id"], [{"post_id": 1, "v": 1}])
    sink.write(T, ["post_id"], [{"post_id": 1, "v": 2}])
    assert read_items(T, tmp_path) == [{"post_id": 1, "v": 2}]
    with pytest.raises(PermanentSinkError, match="not JSON-serialisable"):
        sink.write(T, ["post_id"], [{"post_id": 2, "v": object()}])
    with pytest.raises(PermanentSinkError, match="no key field"):
        sink.write(T, ["post_id"], [{"id": 2}])
    with pytest.raises(ValueError, match="jsonl mode 'upsert'"):
        JsonlSink(tmp_path, mode="upsert")


def test_files_of_the_earlier_layout_are_taken_over(tmp_path: Path) -> None:
    """`<type>/<seq>-<created>.jsonl` files of wrapped records and commit lines become the
    type's file of items, their entries still known: a redelivered one is not written again."""
    folder = tmp_path / T
    folder.mkdir()
    rec = {"entry": "100-0", "run": "r1", "step": "feed", "task": "demo.h5.feed", "at": 1.0}
    old = [
        {**rec, "key": [1], "item": {"post_id": 1, "v": 1}},
        {**rec, "key": [2], "item": {"post_id": 2, "v": 1}},
        {"commit": ["100-0"], "n": 2, "at": 1.0},
        {**rec, "entry": "200-0", "key": [1], "item": {"post_id": 1, "v": 2}},
        {"commit": ["200-0"], "n": 1, "at": 2.0},
    ]
    (folder / "000001-20250101T120000Z.jsonl").write_bytes(
        b"".join(orjson.dumps(x) + b"\n" for x in old[:3])
    )
    (folder / "000002-20250101T130000Z.jsonl").write_bytes(
        b"".join(orjson.dumps(x) + b"\n" for x in old[3:]) + b'{"entry": "300-0", "ite'
    )
    assert read_items(T, tmp_path) == [{"post_id": 2, "v": 1}, {"post_id": 1, "v": 2}]
    assert [p.name for p in folder.glob("*.jsonl")] == [f"{T}.jsonl"]
    assert [(r["entry"], r["run"]) for r in iter_records(T, tmp_path)] == [
        ("100-0", "r1"), ("100-0", "r1"), ("200-0", "r1")
    ]  # fmt: skip
    sink = JsonlSink(tmp_path)
    sink.write(T, ["post_id"], [{"post_id": 1, "v": 2}], origins=[origin("200-0")])
    assert len(file_lines(tmp_path)) == 3
    assert sink.compact(T) == 1 and file_lines(tmp_path) == [{"post_id": 2, "v": 1},
                                                               {"post_id": 1, "v": 2}]  # fmt: skip


def test_a_damaged_journal_is_rebuilt_from_the_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = JsonlSink(tmp_path)
    for e in (1, 2):
        sink.write(T, ["post_id"], [{"post_id": e}], origins=[origin(f"{e}-0")])
    journal = tmp_path / T / ".journal"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0] + b"garbage\n" + b"".join(lines[1:]))
    with caplog.at_level(logging.WARNING):
        assert read_items(T, tmp_path) == [{"post_id": 1}, {"post_id": 2}]
    assert "journal is unreadable" in caplog.text
    JsonlSink(tmp_path).write(T, ["post_id"], [{"post_id": 3}], origins=[origin("3-0")])
    assert file_lines(tmp_path) == [{"post_id": 1}, {"post_id": 2}, {"post_id": 3}]


def test_a_writer_alone_appends_once_per_entry_and_never_compacts(tmp_path: Path) -> None:
    """`JsonlWriter` is the write path (store.py); compaction is the sink's (`_rewrite`)."""
    w = JsonlWriter(tmp_path, compact_after=0.0)
    w.write(T, ["post_id"], [{"post_id": 1, "likes": 1}], origins=[origin("100-0")])
    w.write(T, ["post_id"], [{"post_id": 1, "likes": 1}], origins=[origin("100-0")])  # again
    w.write(T, ["post_id"], [{"post_id": 1, "likes": 2}], origins=[origin("200-0")])
    w.settle()
    assert [x["likes"] for x in file_lines(tmp_path)] == [1, 2]
    sink = JsonlSink(tmp_path, compact_after=0.0)
    sink.settle()  # nothing written through this one yet
    assert sink.compact(T) == 1
    assert [x["likes"] for x in file_lines(tmp_path)] == [2]
