"""bench/fetch_clients.py counts what it says: every client reads the right pages and bytes,
the server answered exactly the requests counted, and the table has a row per client (or a
"skipped" one). No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import fetch_clients as fc
from bench.replay_site import Page, ReplayServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
N = 20
SETS = fc.site_pages(size=50)  # one category of each shop: 211 pages per set


@pytest.fixture(scope="module")
def site() -> Iterator[ReplayServer]:
    pages: dict[str, Page] = {t: p for s in SETS.values() for t, p in s.items()}
    with ReplayServer(pages) as server:
        yield server


def test_every_client_reads_the_pages_and_bytes_counted(site: ReplayServer) -> None:
    names, skipped = fc.available(list(fc.CLIENTS))
    assert "project" in names and "urllib3" in names
    site.reset()
    results = fc.measure(site.url, SETS, names, N, repeat=2, warmup=5)
    assert {(r.client, r.pageset) for r in results} == {(n, s) for n in names for s in SETS}
    for r in results:
        want = fc.expected_bytes(SETS[r.pageset], N)
        assert len(r.samples) == 2
        for s in r.samples:
            assert (s.requests, s.pages, s.bytes) == (N, N, want), r.client
            assert s.chars > 0 and s.cpu > 0
    stats = site.stats()
    assert stats["total"] == len(names) * (5 + 2 * N * len(SETS))  # warm-up + timed
    assert stats["unknown"] == 0
    table = fc.table(results, skipped).splitlines()
    assert len(table) == 1 + len(results) + len(skipped)
    for n in names:
        assert sum(1 for line in table if line.split()[1] == n) == len(SETS)


def test_decoding_is_the_content_types_charset() -> None:
    body = "crème brûlée".encode("cp1252")
    assert fc.decode(body, "text/html; charset=windows-1252") == "crème brûlée"
    assert fc.decode("café".encode(), "text/html") == "café"  # no charset: UTF-8


def test_a_client_not_installed_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(fc.CLIENTS, "pycurl", (fc.PycurlClient, False))
    names, skipped = fc.available(["project", "pycurl"])
    assert (names, skipped) == (["project"], ["pycurl"])
    assert fc.table([], skipped).splitlines()[-1].split()[1:] == [
        "pycurl",
        "skipped:",
        "not",
        "installed",
    ]


def test_main_prints_a_row_per_client_and_checks_its_counts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert fc.main(["--requests", str(N), "--repeat", "1", "--pages", "50"]) == 0
    out = capsys.readouterr().out.splitlines()
    names, skipped = fc.available(list(fc.CLIENTS))
    rows = [line.split() for line in out[2:]]
    assert len(rows) == len(names) * len(SETS) + len(skipped)
    assert {r[1] for r in rows if r[0] in SETS} == set(names)
    assert all(r[6] == "1.00x" for r in rows if r[1] == "project")


def test_gevent_runs_in_its_own_process() -> None:
    """`--gevent N` patches its process at start: the same counts from N greenlets."""
    cmd = [sys.executable, "-m", "bench.fetch_clients", "--gevent", "4", "--requests", str(N)]
    clients = ["project", "urllib3", "pycurl", "curlfetcher", "curlfetcher-tp"]
    cmd += ["--repeat", "1", "--pages", "50", "--clients", ",".join(clients)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "gevent, 4 greenlets" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert {r[1] for r in rows} <= set(clients)
    assert len(rows) == len(clients) * len(SETS) or any("skipped:" in r for r in rows)


def test_gevent_refused_in_an_unpatched_process() -> None:
    with pytest.raises(SystemExit):
        fc.main(["--gevent", "4", "--requests", "1"])


def test_instructions_are_columns_only_when_counted() -> None:
    """`--callgrind` samples carry instructions: the table adds them, and their ratio."""
    sample = fc.Sample(10, 10, 1000, 1000, cpu=0.01, wall=0.02)
    plain = [fc.Result("project", "shop", [sample])]
    assert "instr/req" not in fc.table(plain, [])
    counted = [
        fc.Result("project", "shop", [fc.Sample(10, 10, 1000, 1000, 0.01, 0.02, 9_000_000)]),
        fc.Result("pycurl", "shop", [fc.Sample(10, 10, 1000, 1000, 0.01, 0.02, 1_800_000)]),
    ]
    lines = fc.table(counted, []).splitlines()
    assert "instr/req" in lines[0]
    assert lines[1].split()[-2:] == ["900k", "1.00x"]
    assert lines[2].split()[-2:] == ["180k", "0.20x"]
