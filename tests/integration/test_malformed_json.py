"""A 200 answer whose JSON is broken is dead-lettered at its first fetch with the reason (a
refetch gets the same bytes): a real worker, the test site, the dead-letter store."""

from __future__ import annotations

import pytest

import chains
from chains import Chain, step
from monitor.deadletter import DeadLetterStore
from utils.redis import get_redis

pytestmark = pytest.mark.integration


def test_malformed_json_in_a_200_is_dead_lettered_without_a_refetch(
    start_worker, cc_env, test_site
) -> None:
    start_worker()
    before = test_site.hits["malformed"]
    run = chains.run(Chain("malformed", step("testsite.local.probe")),
                     seeds=[{"path": "/malformed", "as_json": True}])  # fmt: skip
    p = run.wait(timeout=60)
    s = p.steps["local.probe"]
    assert (s["failed"], s["retried"], s["succeeded"]) == (1, 0, 0)
    assert test_site.hits["malformed"] - before == 1
    (dl,) = DeadLetterStore(get_redis()).list(10, run=run.run_id)
    assert dl.error_type == "MalformedBody"
    assert "invalid JSON from http" in dl.error and "/malformed (HTTP 200, 19 bytes)" in dl.error
