"""Progress: what a run's end says, so that "complete" is not read as "every task succeeded";
seeds checked strictly before a run starts."""

from __future__ import annotations

import pytest

import chains
import sites
from chains.runner import Progress
from exceptions import ParamsError
from ledger.model import Chain, step
from ledger.state import COUNTERS


def progress(status: str, **counts: int) -> Progress:
    totals = {k: 0 for k in COUNTERS} | counts
    return Progress(run_id="r1", chain="c", status=status, steps={}, totals=totals,
                    outstanding=0, waiting=0, created=0.0, finished=1.0)  # fmt: skip


def test_a_complete_run_with_failed_tasks_is_not_ok() -> None:
    p = progress("done", dispatched=60, succeeded=10, failed=50)
    assert p.complete and p.ended
    assert p.failed == 50 and not p.ok and p.ending == "failed"
    d = p.as_dict()
    assert (d["complete"], d["ok"], d["failed"], d["ending"]) == (True, False, 50, "failed")


def test_items_refused_by_a_sink_make_a_complete_run_not_ok() -> None:
    p = progress("done", dispatched=1, succeeded=1, items=3, stored=2, store_failed=1)
    assert p.complete and not p.ok and p.ending == "failed"


def test_every_task_succeeded() -> None:
    p = progress("done", dispatched=2, succeeded=2, items=2, stored=2)
    assert p.ok and p.ending == "ok" and p.failed == 0


def test_cancelled_and_running_runs() -> None:
    assert progress("cancelled", dispatched=2, succeeded=1, cancelled=1).ending == "cancelled"
    running = progress("running", dispatched=2, succeeded=1)
    assert running.ending is None and not running.ok


# --- seeds: as strict as constants, checked before anything is recorded or sent ----------


def listing_chain() -> Chain:
    return Chain("seeds_t", step("testsite.local.listing"), lookup=sites.get_endpoint)


@pytest.mark.parametrize(
    ("seed", "says"),
    [
        (
            {"page": True},
            "seed 0: testsite.local.listing: field 'page': Input should be a valid integer (got true)",
        ),
        (
            {"page": "2"},
            "seed 0: testsite.local.listing: field 'page': Input should be a valid integer"
            ' (got "2")',
        ),
        ({"page": 1.5}, "field 'page'"),
        ({"pgae": 2}, "field 'pgae': unknown field; did you mean 'page'?"),
        ({"zzz": 2}, "field 'zzz': unknown field (fields: page, per)"),
    ],
)
def test_seeds_are_validated_strictly_with_a_did_you_mean(seed: dict, says: str) -> None:
    """`{"page": true}` used to fetch page 1 and `"2"` became 2; a typo had no hint. The
    check runs before Redis or the broker is touched: no run is recorded."""
    with pytest.raises(ParamsError) as err:
        chains.run(listing_chain(), seeds=[seed], check_workers=False)
    msg = str(err.value)
    assert says in msg and "\n" not in msg, msg


def test_a_later_bad_seed_is_named_by_its_index() -> None:
    with pytest.raises(ParamsError, match=r"^seed 1: .*'page'"):
        chains.run(listing_chain(), seeds=[{"page": 2}, {"page": "3"}], check_workers=False)


@pytest.mark.parametrize("seeds", [{"page": 1}, "page=1"])
def test_seeds_that_are_not_a_list_say_so(seeds: object) -> None:
    """A dict given as seeds used to iterate its keys: `seed 0: ... got str`."""
    with pytest.raises(ParamsError, match=r"seeds must be a list of parameter objects, got a"):
        chains.run(listing_chain(), seeds=seeds, check_workers=False)  # type: ignore[arg-type]
