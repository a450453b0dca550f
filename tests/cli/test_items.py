"""`control.sh items` as a user runs it: JSON lines that `| head` cuts quietly, CSV to a file,
one run's items, the list of types, a misspelled type."""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import orjson
import pytest

from config import ROOT
from external_interface.storage.sinks.base import Origin
from external_interface.storage.sinks.jsonl import JsonlSink

T = "shop.product"
N = 20_000  # ~1 MB of lines: far more than a pipe holds, so the writer meets the closed pipe


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # set the venv up first, so its messages (when the lock files changed) are not in the way
    subprocess.run([str(ROOT / "control.sh"), "setup"], cwd=ROOT, capture_output=True, check=True)
    root = tmp_path_factory.mktemp("store")
    sink = JsonlSink(root / "items", fsync=False)
    items = [{"sku": f"s{i}", "title": f"Product {i}", "price": i / 4} for i in range(N)]
    sink.write(T, ["sku"], items, origins=[Origin("100-0", "r1", "list", "shop.pc.list")] * N)
    sink.write(T, ["sku"], [{"sku": "s1", "title": "Renamed", "price": 9.5}],
               origins=[Origin("200-0", "r2", "list", "shop.pc.list")])  # fmt: skip
    return {**{k: v for k, v in os.environ.items() if not k.startswith("CHAINCRAWL_JSONL")},
            "CHAINCRAWL_JSONL_DIR": str(root / "items"), "CHAINCRAWL_VAR_DIR": str(root / "var")}  # fmt: skip


def sh(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_json_lines_cut_by_head_end_quietly(env: dict[str, str]) -> None:
    out = sh(f"./control.sh items {T} | head -n 3", env)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored"
    assert [orjson.loads(x) for x in out.stdout.splitlines()] == [
        {"sku": "s0", "title": "Product 0", "price": 0.0},
        {"sku": "s2", "title": "Product 2", "price": 0.5},
        {"sku": "s3", "title": "Product 3", "price": 0.75},
    ]
    whole = sh(f"./control.sh items {T} | wc -l", env)
    assert whole.stdout.strip() == str(N) and whole.stderr == ""


def test_csv_to_a_file_and_one_run(env: dict[str, str], tmp_path: Path) -> None:
    target = tmp_path / "products.csv"
    out = sh(f"./control.sh items {T} --format csv --out {target}", env)
    assert out.returncode == 0, out.stderr
    assert f"wrote {N} {T} item(s) to {target}" in out.stderr and out.stdout == ""
    rows = list(csv.DictReader(target.open(newline="")))
    assert len(rows) == N and rows[-1] == {"sku": "s1", "title": "Renamed", "price": "9.5"}
    run = sh(f"./control.sh items {T} --run r2", env)
    assert [orjson.loads(x) for x in run.stdout.splitlines()] == [
        {"sku": "s1", "title": "Renamed", "price": 9.5}
    ]
    every = sh(f"./control.sh items {T} --all --format csv | wc -l", env)
    assert every.stdout.strip() == str(N + 2)  # header + every stored line


def test_types_listed_and_a_misspelled_one_named(env: dict[str, str]) -> None:
    listing = sh("./control.sh items", env)
    assert listing.returncode == 0
    name, count, files = listing.stdout.strip().split("\t")
    assert (name, count) == (T, str(N)) and files.endswith(f"{T}/{T}.jsonl")
    assert Path(files).is_file()
    bad = sh("./control.sh items shop.prodcut", env)
    assert bad.returncode == 2
    assert "unknown item type 'shop.prodcut'; did you mean 'shop.product'?" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_format_follows_the_out_file_s_extension(env: dict[str, str], tmp_path: Path) -> None:
    out = sh(f"./control.sh items {T} -o {tmp_path / 'x.csv'}", env)
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader((tmp_path / "x.csv").open(newline="")))
    assert len(rows) == N and rows[0] == {"sku": "s0", "title": "Product 0", "price": "0.0"}
    out = sh(f"./control.sh items {T} -o {tmp_path / 'x.ndjson'} --limit 2", env)
    assert out.returncode == 0, out.stderr
    assert orjson.loads((tmp_path / "x.ndjson").read_text().splitlines()[0])["sku"] == "s0"
    bad = sh(f"./control.sh items {T} -o {tmp_path / 'x.txt'}", env)
    assert bad.returncode == 2 and not (tmp_path / "x.txt").exists()
    assert bad.stderr.strip().startswith("error: --out ") and "names no format" in bad.stderr
    both = sh(f"./control.sh items {T} -o {tmp_path / 'y.csv'} --format jsonl", env)
    assert both.returncode == 2 and "says csv but --format says jsonl" in both.stderr
    assert not (tmp_path / "y.csv").exists()
    named = sh(f"./control.sh items {T} -o {tmp_path / 'export'} --format csv", env)
    assert named.returncode == 0 and (tmp_path / "export").read_text().startswith("sku,")


def test_a_run_that_stored_nothing_is_an_error(env: dict[str, str], tmp_path: Path) -> None:
    out = sh(f"./control.sh items {T} --run nope -o {tmp_path / 'n.csv'}", env)
    assert out.returncode == 2, out.stderr
    assert "run nope stored no items" in out.stderr and "./control.sh runs" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "n.csv").exists()


def test_a_run_that_stored_only_other_types_names_them(env: dict[str, str], tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "items", fsync=False)
    sink.write(T, ["sku"], [{"sku": "a"}], origins=[Origin("1-0", "r1", "list", "shop.pc.list")])
    sink.write("shop.review", ["id"], [{"id": 1}],
               origins=[Origin("2-0", "r9", "reviews", "shop.pc.reviews")])  # fmt: skip
    out = sh(
        f"./control.sh items {T} --run r9", {**env, "CHAINCRAWL_JSONL_DIR": str(tmp_path / "items")}
    )
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip() == f"error: run r9 stored no {T} items (it stored shop.review)"
