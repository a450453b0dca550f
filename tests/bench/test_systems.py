"""Every system of bench.compare crawls exactly the pages and items it should: the small page set
(105 pages) crawled twice by the same warm processes, each crawl checked by `compare.check`
(the page server's requests and distinct pages, the system's items and pages handled)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

# bench.compare runs the Scrapy baseline: without the bench extras (a checkout set up by
# `./control.sh setup` alone) these tests skip instead of failing at collection
pytest.importorskip("scrapy", reason="the bench extras: pip install -r requirements/bench.txt")

from bench import crawlee_env, revisions
from bench.compare import SCENARIOS, timed_run
from bench.pagesets import PAGESETS, PageSet
from bench.systems import ChaincrawlSystem, build

pytestmark = pytest.mark.integration

SMALL = SCENARIOS["small"]


@pytest.fixture(scope="module")
def small() -> PageSet:
    return PAGESETS["small"].build()


@pytest.fixture(scope="module")
def site(small: PageSet) -> Iterator[object]:
    with small.serve() as s:
        yield s


def _crawl_twice(key: str, small: PageSet, site: object, tmp_path: Path) -> list[dict]:
    system = build(key, 8, tmp_path)
    try:
        system.start(site, small)
        # warm: the second crawl in the same processes must fetch every page again, once
        runs = [timed_run(system, site, small, SMALL, start=False) for _ in range(2)]
    finally:
        system.close()
    for r in runs:
        assert r["pages"] == r["items"] == small.expected_pages == 105
        assert r["cpu_s"] > 0 and r["wall_s"] > 0
    return runs


def test_floor(small: PageSet, site: object, tmp_path: Path) -> None:
    _crawl_twice("floor", small, site, tmp_path)
    _crawl_twice("floor-threads3", small, site, tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("scrapy") is None,
                    reason="Scrapy not installed (pip install -r requirements/bench.txt)")  # fmt: skip
@pytest.mark.parametrize("config", ["defaults", "broad-lean-epoll"])
def test_scrapy(config: str, small: PageSet, site: object, tmp_path: Path) -> None:
    runs = _crawl_twice(f"scrapy:{config}", small, site, tmp_path)
    assert runs[0]["config"] == config


@pytest.mark.skipif(not (crawlee_env.VENV / "bin" / "python").exists(),
                    reason="no Crawlee venv: make it with `.venv/bin/python -m bench.crawlee_env`")  # fmt: skip
def test_crawlee(small: PageSet, site: object, tmp_path: Path) -> None:
    runs = _crawl_twice("crawlee", small, site, tmp_path)
    assert runs[0]["failed"] == 0


def test_chaincrawl_counts_workers_and_redis(small: PageSet, site: object, tmp_path: Path) -> None:
    runs = _crawl_twice("chaincrawl", small, site, tmp_path)
    parts = runs[0]["cpu_parts_ms_per_page"]
    # redis-server spends about 10 ms on these 105 pages, one tick of the kernel's CPU clock
    # (/proc counts in 10 ms ticks): its part may read 0; the workers' never does
    assert set(parts) == {"workers", "redis"} and parts["workers"] > 0 and parts["redis"] >= 0
    assert runs[0]["cpu_ms_per_page"] == pytest.approx(sum(parts.values()))


@pytest.mark.parametrize("key", ["chaincrawl-impersonate", "chaincrawl-pycurl"])
def test_a_fetcher_row_sets_its_workers_fetcher(key: str, tmp_path: Path) -> None:
    system = build(key, 16, tmp_path, task_slots=20)
    assert isinstance(system, ChaincrawlSystem)
    name = key.removeprefix("chaincrawl-")
    assert system.env == {"CHAINCRAWL_FETCH_SLOTS": "16", "CHAINCRAWL_FETCHER": name}
    assert system.label.endswith(f" {name}")


def test_another_revisions_workers_crawl_from_its_own_tree(
    small: PageSet, site: object, tmp_path: Path
) -> None:
    """`chaincrawl@REV`: the workers run the exported tree of REV (here HEAD), exact counts."""
    system = build("chaincrawl@HEAD", 8, tmp_path)
    assert isinstance(system, ChaincrawlSystem) and system.root is not None
    assert (system.root / "base_task.py").exists() and (system.root / ".exported").exists()
    try:
        system.start(site, small)
        assert system.bench is not None
        assert {psutil.Process(w.pid).cwd() for w in system.bench.workers} == {str(system.root)}
        r = timed_run(system, site, small, SMALL, start=False)
    finally:
        system.close()
    assert r["pages"] == r["items"] == small.expected_pages


def test_an_unknown_revision_is_named() -> None:
    with pytest.raises(ValueError, match="chaincrawl@no-such-rev: no such commit"):
        revisions.resolve("no-such-rev")
