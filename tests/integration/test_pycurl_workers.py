"""The pycurl fetcher on real workers: the three-step chain with every request through it,
on the gevent pool (its transfers driven by the hub's loop) and on threads."""

from __future__ import annotations

import pytest

import chains
from external_interface.fetch.curl import installed
from tests.integration.test_chain_runs import expect_deep
from tests.testsite import chains as tchains

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not installed(), reason="pycurl cannot be imported (requirements/runtime.txt)"
    ),
]


@pytest.mark.parametrize("pool", ["gevent", "threads"])
def test_the_three_step_chain_fetched_through_pycurl(start_worker, pool: str) -> None:
    start_worker(pool=pool, concurrency=4, CHAINCRAWL_FETCHER="pycurl")
    p = chains.run(tchains.deep(), seeds=[{"page": 1}]).wait(timeout=90)
    assert p.complete and p.totals["failed"] == 0
    expect_deep(p)
