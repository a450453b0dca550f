"""The three documented hook examples (docs/hooks.md) on real workers against the demo platform:
a URL completed from the id the task carried, posts under a business rule dropped, stored
posts counted per business unit. Their code in the docs is the code run here."""

from __future__ import annotations

import collections
import re
import time
from pathlib import Path
from typing import Any

import pytest

import chains
from chains import Chain, step
from config import ROOT, get_settings
from demo.data import Dataset
from demo.testing import DemoServer
from external_interface.storage.sinks.jsonl import iter_records
from tests.integration.hooksite import news
from utils.redis import as_str, get_redis

pytestmark = pytest.mark.integration

SOURCE = Path(news.__file__)
EXAMPLE = re.compile(r"^# example: (.+?)\n(.*?)\n# end$", re.DOTALL | re.MULTILINE)


def examples() -> dict[str, str]:
    return {m.group(1): m.group(2).strip() for m in EXAMPLE.finditer(SOURCE.read_text())}


def test_the_docs_show_the_examples_that_run() -> None:
    doc = (ROOT / "docs" / "hooks.md").read_text()
    found = examples()
    assert len(found) == 3
    for title, code in found.items():
        assert code in doc, f"docs/hooks.md lacks the code of the example {title!r}"


def test_the_three_examples_on_real_workers(start_worker: Any) -> None:
    with DemoServer(size="small") as demo:
        start_worker(concurrency=8, queues="news", NEWS_URL=demo.url,
                     CHAINCRAWL_EXTRA_SITE_PACKAGES="tests.testsite,tests.integration.hooksite")  # fmt: skip
        data = Dataset(42, 20, 5, 5)
        posts = [data.post(f"p{n}") for n in range(1, 101)]
        run = chains.run(Chain("news", step("news.h5.post")), [{"post_id": p.id} for p in posts])  # type: ignore[union-attr]
        progress = run.wait(timeout=120)
        assert progress.ok
        # 1. every task carried an id; every request went to the post's API URL
        assert demo.stats()["by_endpoint"].get("h5.post") == 100
    # 2. the posts under the rule were dropped and counted, the others stored
    keep = {p.id for p in posts if p.likes >= news.MIN_LIKES}  # type: ignore[union-attr]
    assert 0 < len(keep) < 100
    stored = [r["item"] for r in iter_records("news.post") if r["run"] == run.run_id]
    assert {it["post_id"] for it in stored} == keep
    r, s = get_redis(), get_settings()
    key = s.key("metrics", "task", "news.h5.post")

    def metrics() -> dict[str, int]:
        return {as_str(k): int(v) for k, v in r.hgetall(key).items()}

    deadline = time.monotonic() + 20
    want = collections.Counter(it["topic"] for it in stored)
    while time.monotonic() < deadline:  # the drainer's hooks and the metrics flush: seconds
        got = metrics()
        if got.get("dropped:unpopular") == 100 - len(keep) and all(
            got.get(f"topic:{t}", 0) >= n for t, n in want.items()
        ):
            break
        time.sleep(0.2)
    got = metrics()
    assert got.get("dropped:unpopular") == 100 - len(keep)
    # 3. the stored posts counted per topic (at least once each: the drainer may repeat a batch)
    assert {t: got.get(f"topic:{t}", 0) for t in want} == dict(want)
    print(f"\nstored {len(keep)} of 100 posts; per topic: {dict(want)}")
