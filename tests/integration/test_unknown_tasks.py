"""A task the workers do not know (an endpoint added while they run): the trigger refuses it
naming the task and the workers; sent anyway, the worker fails it at once, naming the fix, and
the sweeper does not re-send it."""

from __future__ import annotations

import time
from typing import ClassVar

import pytest

import chains
from base_task import Context, Item, Outputs, Params, endpoint
from broker.workers import TaskSets
from chains import Chain, step
from cli.deadletter import replay
from config import get_settings
from exceptions import WorkersOutdated
from ledger.state import RunState
from monitor.deadletter import DeadLetterStore
from tests.testsite.server import PER_PAGE
from utils.redis import get_redis

pytestmark = pytest.mark.integration

FRESH = "testsite.local.fresh_only_in_the_client"


class FreshParams(Params):
    entry_id: str


class Fresh(Item):
    item_type: ClassVar[str] = "testsite.fresh"
    key_fields: ClassVar[tuple[str, ...]] = ("entry_id",)
    entry_id: str


@endpoint(FreshParams, items=[Fresh], name=FRESH)  # defined here only: no worker imports it
def fresh(ctx: Context, p: FreshParams) -> Outputs:
    yield Fresh(entry_id=p.entry_id)


def chain() -> Chain:
    return Chain(
        "testsite_fresh",
        step("testsite.local.listing", options={"max_pages": 1}).then(
            step(FRESH, entry_id="entry_id")
        ),
    )


SWEEP = {"CHAINCRAWL_SWEEP_INTERVAL": "0.5", "CHAINCRAWL_SWEEP_STALL": "1"}


def test_the_trigger_refuses_a_chain_a_live_worker_does_not_know(start_worker) -> None:
    w = start_worker(name="outdated", **SWEEP)
    r = get_redis()
    live = TaskSets(r).live()
    mine = [n for n in live if n.startswith("outdated")]
    assert mine and "testsite.local.listing" in live[mine[0]].tasks
    assert FRESH not in live[mine[0]].tasks
    before = r.zcard(RunState(r).recent_key)
    with pytest.raises(WorkersOutdated) as err:
        chains.run(chain(), seeds=[{}])
    assert err.value.tasks == [FRESH] and mine[0] in err.value.workers
    assert f"restart the workers so they load {FRESH}" in str(err.value)
    assert r.zcard(RunState(r).recent_key) == before  # nothing recorded, nothing sent
    w.stop()
    assert not [n for n in TaskSets(r).live() if n.startswith("outdated")]  # left at stop


def test_a_task_sent_anyway_fails_at_once_naming_the_fix_and_is_not_re_sent(
    start_worker,
) -> None:
    w = start_worker(name="outdated", **SWEEP)
    r = get_redis()
    sets = TaskSets(r)
    unknown_before = sets.unknown_total()
    ch = chain()
    root, child = (s.id for s in ch.root.walk())
    run = chains.run(ch, seeds=[{}], check_workers=False)
    p = run.wait(timeout=30)
    assert p.status == "done" and p.outstanding == 0, p.as_dict()
    assert p.steps[root]["succeeded"] == 1
    assert p.steps[child]["dispatched"] == p.steps[child]["failed"] == PER_PAGE
    assert sets.unknown_total() - unknown_before == PER_PAGE
    dls = DeadLetterStore(r, get_settings()).list(run=run.run_id)
    assert len(dls) == PER_PAGE
    assert all(d.error_type == "NotRegistered" and d.task == FRESH for d in dls)
    assert f"restart the workers so they load {FRESH}" in dls[0].error
    time.sleep(3)  # several sweep intervals past the stall: nothing is re-sent
    assert run.progress().totals["resent"] == 0
    assert "Received unregistered task" in w.text()
    assert replay(all_=True, run=run.run_id) == 0  # the workers still lack it: kept, not sent
    assert len(DeadLetterStore(r, get_settings()).list(run=run.run_id)) == PER_PAGE
