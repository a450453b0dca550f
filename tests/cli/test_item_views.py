"""`control.sh items` beyond JSON lines, as a user runs it: `--key K --history` from the JSONL
and postgres sinks, `--search` from postgres, `--format parquet --out DIR`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import pytest

from config import ROOT
from external_interface.storage.sinks.base import Origin, Policies
from external_interface.storage.sinks.jsonl import JsonlSink
from tests.external_interface.postgres_fixtures import pg_server, pg_url  # noqa: F401 - fixtures

T = "demo.post"  # the demo's Post declares history_fields likes, comments_count
ENTRIES = ["1700000000000-0", "1700000060000-0", "1700000120000-0"]


def post(pid: str, likes: int, title: str = "t", content: str = "") -> dict:
    return {"post_id": pid, "user_id": "u1", "user_name": "Ann", "title": title, "summary": "",
            "content": content, "likes": likes, "comments_count": 0, "created_at": 0}  # fmt: skip


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CHAINCRAWL_")}
    return {**base, "CHAINCRAWL_JSONL_DIR": str(tmp / "items"), "CHAINCRAWL_VAR_DIR": str(tmp),
            "CHAINCRAWL_SINKS": "jsonl", **extra}  # fmt: skip


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "cli", "items", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip


def test_history_and_parquet_from_the_jsonl_store(tmp_path: Path) -> None:
    s = JsonlSink(tmp_path / "items", fsync=False)
    for entry, likes in zip(ENTRIES, (3, 5, 8), strict=True):
        s.write(T, ["post_id"], [post("p1", likes)], origins=[Origin(entry, "r1", "f", "t")])
    env = env_for(tmp_path)
    out = cli(env, T, "--key", "p1", "--history")
    assert out.returncode == 0, out.stderr
    versions = [orjson.loads(x) for x in out.stdout.splitlines()]
    likes_history = [
        (v["value"], v["valid_from"], v["valid_to"]) for v in versions if v["field"] == "likes"
    ]
    assert likes_history == [
        (3, "2023-11-14T22:13:20+00:00", "2023-11-14T22:14:20+00:00"),
        (5, "2023-11-14T22:14:20+00:00", "2023-11-14T22:15:20+00:00"),
        (8, "2023-11-14T22:15:20+00:00", None),
    ]
    assert [v["value"] for v in versions if v["field"] == "comments_count"] == [0]
    bad = cli(env, T, "--history")
    assert bad.returncode == 2 and "--key VALUE" in bad.stderr
    pytest.importorskip("pyarrow")
    done = cli(env, T, "--format", "parquet", "--out", str(tmp_path / "pq"))
    assert done.returncode == 0, done.stderr
    assert "wrote 1 demo.post item(s)" in done.stderr
    assert [p.name for p in (tmp_path / "pq").iterdir()] == ["fetch_day=2023-11-14"]
    assert cli(env, T, "--format", "parquet").returncode == 2  # a dataset needs --out DIR


@pytest.mark.integration
def test_search_and_history_from_postgres(tmp_path: Path, pg_url: str) -> None:  # noqa: F811
    from external_interface.storage.sinks.postgres import PostgresSink

    p = Policies()
    p.set(T, track=("likes",), search=("title", "content"))
    s = PostgresSink(pg_url, policies=p)
    s.write(T, ["post_id"], [post("p1", 1, "Tomatoes", "grow them in pots"),
                             post("p2", 1, "Basil", "pesto and tomatoes")],
            origins=[Origin(ENTRIES[0], "r1", "f", "t")] * 2)  # fmt: skip
    s.write(T, ["post_id"], [post("p1", 4, "Tomatoes", "grow them in pots")],
            origins=[Origin(ENTRIES[1], "r2", "f", "t")])  # fmt: skip
    s.close()
    env = env_for(tmp_path, CHAINCRAWL_POSTGRES_URL=pg_url, CHAINCRAWL_SINKS="jsonl,postgres")
    found = cli(env, T, "--search", "tomatoes -pesto")
    assert found.returncode == 0, found.stderr
    assert [orjson.loads(x)["post_id"] for x in found.stdout.splitlines()] == ["p1"]
    hist = cli(env, T, "--key", "p1", "--history", "--from", "postgres")
    assert hist.returncode == 0, hist.stderr
    assert [orjson.loads(x)["value"] for x in hist.stdout.splitlines()
            if orjson.loads(x)["field"] == "likes"] == [1, 4]  # fmt: skip
    # the default: the type's first sink that keeps history (postgres comes after jsonl here)
    none = cli(env, T, "--key", "p1", "--history")
    assert none.returncode == 0 and "no history" in none.stderr
    nosearch = cli(env, "demo.user", "--search", "x")
    assert nosearch.returncode == 2 and "holds no item type 'demo.user'" in nosearch.stderr
