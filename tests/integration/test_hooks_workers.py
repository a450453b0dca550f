"""Every signal at every hook point, on real workers (tests/integration/hooksite/matrix.py).

One run of `hk.local.page` with one page per case: `control` continues everywhere, each other
case has one hook point say one signal. What each signal did is read from what the site
served, the items stored, the run's counters, the endpoint's metrics and the dead letters.
"""

from __future__ import annotations

import uuid
from typing import Any, cast

import pytest

import chains
from chains import Chain, step
from config import get_settings
from external_interface.storage.outbox import dead_key
from external_interface.storage.sinks.jsonl import iter_records
from monitor.deadletter import DeadLetterStore
from tests.conditions import wait_for
from tests.integration.hooksite import matrix  # noqa: F401 - the endpoint and hooks, here too
from tests.testsite.server import TestSite
from utils.redis import as_str, get_redis

pytestmark = pytest.mark.integration

POINTS = ("before_request", "after_response", "before_store", "after_store", "on_error")
SIGNALS = ("continue", "skip", "retry", "fail")
CASES = ["control"] + [f"{p}-{s}" for p in POINTS for s in SIGNALS]
WORKER_ENV = {
    "CHAINCRAWL_EXTRA_SITE_PACKAGES": "tests.testsite,tests.integration.hooksite",
    "CHAINCRAWL_BATCH": "1",  # an outbox entry per page: an after_store fail is its case's own
    "CHAINCRAWL_MAX_RETRIES": "2",
}


def test_every_signal_at_every_hook_point(start_worker: Any, test_site: TestSite) -> None:
    start_worker(concurrency=8, queues="hk", **WORKER_ENV)
    tag = uuid.uuid4().hex[:6]
    cases = {c: f"{c}.{tag}" for c in CASES}  # ids of their own: the site counts per id
    run = chains.run(Chain("hooks", step("hk.local.page")), [{"case": v} for v in cases.values()])
    p = run.wait(timeout=180)
    assert p.complete
    r = get_redis()
    s = get_settings()
    metrics = {
        as_str(k): int(v) for k, v in r.hgetall(s.key("metrics", "task", "hk.local.page")).items()
    }

    def m(field: str) -> int:
        return metrics.get(field, 0)

    def hits(case: str) -> int:
        return test_site.hits[f"detail:{cases[case]}"]

    def hook_calls(point: str, case: str) -> int:
        return int(r.get(s.key("hk", "calls", point, cases[case])) or 0)

    stored = {rec["item"]["case"] for rec in iter_records("hk.case") if rec["run"] == run.run_id}
    letters = {dl.params["case"]: dl for dl in DeadLetterStore(r, s).list(task="hk.local.page", run=run.run_id)}  # fmt: skip

    def ok(case: str) -> None:
        assert cases[case] in stored and cases[case] not in letters, case

    def skipped(case: str, fetched: int) -> None:
        assert cases[case] not in stored and cases[case] not in letters, case
        assert hits(case) == fetched, case
        assert m(f"skipped:{cases[case]}") == 1, case

    def failed(case: str, fetched: int, error: str = "HookFailed") -> None:
        dl = letters[cases[case]]
        assert dl.error_type == error and cases[case] not in stored, case
        if error == "HookFailed":
            assert f"said fail ({cases[case]})" in dl.error, dl.error
        assert hits(case) == fetched, case

    # no hook said anything: fetched once, stored, every after_store hook ran
    ok("control")
    assert hits("control") == 1
    for point in POINTS[:-1]:  # a hook that continues changes nothing
        ok(f"{point}-continue")
    # before_request: skip and fail send nothing; retry sends once, on the second attempt
    skipped("before_request-skip", fetched=0)
    ok("before_request-retry")
    assert (
        hits("before_request-retry") == 1
        and hook_calls("before_request", "before_request-retry") == 2
    )
    failed("before_request-fail", fetched=0)
    # after_response: the answer came, then the hook decided
    skipped("after_response-skip", fetched=1)
    ok("after_response-retry")
    assert hits("after_response-retry") == 2
    failed("after_response-fail", fetched=1)
    # before_store: a skip drops the item (the page succeeds), retry refetches, fail stores nothing
    assert cases["before_store-skip"] not in stored and cases["before_store-skip"] not in letters
    ok("before_store-retry")
    assert hits("before_store-retry") == 2
    failed("before_store-fail", fetched=1)
    # on_error: the first attempt fails by itself (ItemValidationError, policy fail)
    failed("on_error-continue", fetched=0, error="ItemValidationError")
    skipped("on_error-skip", fetched=0)
    ok("on_error-retry")
    assert hits("on_error-retry") == 1
    failed("on_error-fail", fetched=0)
    assert p.totals["retried"] == 4 == m("retried:HookRetry")  # the four retries, once each

    # after_store runs in the drainer, after every sink confirmed the item
    def after(field: str) -> int:
        fresh = r.hget(s.key("metrics", "task", "hk.local.page"), field)
        return int(fresh or 0)

    wait_for(lambda: after(f"after:{cases['control']}") >= 1, 30, "after_store on control")
    # a page's own counts reach Redis within the metrics flush interval
    wait_for(lambda: after(f"dropped:{cases['before_store-skip']}") == 1, 10, "the drop counted")
    assert after(f"after2:{cases['control']}") >= 1
    ok("after_store-skip")
    assert after(f"after_store_skipped:{cases['after_store-skip']}") == 1
    assert after(f"after2:{cases['after_store-skip']}") == 0  # the next hook was not called
    ok("after_store-retry")
    wait_for(lambda: hook_calls("after_store", "after_store-retry") >= 2, 30, "after_store again")
    wait_for(lambda: after(f"after:{cases['after_store-retry']}") >= 1, 30, "the retried hook")
    # fail: the entry goes to the outbox's dead letters with the reason; the run counts it
    dead = [
        {as_str(k): as_str(v) for k, v in f.items()}
        for _, f in cast("list[tuple[bytes, dict[bytes, bytes]]]", r.xrange(dead_key(s.key_prefix)))
    ]
    mine = [d for d in dead if d.get("run") == run.run_id]
    assert len(mine) == 1 and mine[0]["sink"] == "after_store"
    assert f"said fail ({cases['after_store-fail']})" in mine[0]["error"]
    assert p.totals["store_failed"] == 1
    # every hook's calls, time and signals are in the endpoint's metrics
    name = "tests.integration.hooksite.matrix.hk_before_request"
    wait_for(lambda: after(f"hook:before_request:{name}:calls") >= len(CASES) - 5, 10,
             "the hook's calls counted")  # fmt: skip
    assert after(f"hook:before_request:{name}:skip") == 1
    assert after(f"hook:before_request:{name}:retry") == 1
    assert after(f"hook:before_request:{name}:fail") == 1
    assert after(f"hook:before_request:{name}:us") > 0
