"""ledger.runs: a run id names one run; reusing it must not reopen a finished run."""

from __future__ import annotations

import pytest
import redis

from config import Settings
from exceptions import ParamsError
from ledger.state import RunState


@pytest.fixture
def state(rds: redis.Redis, redis_url: str, key_prefix: str) -> RunState:
    return RunState(rds, Settings(redis_url=redis_url, key_prefix=key_prefix))


def test_a_taken_run_id_is_refused_and_its_run_left_as_it_was(state: RunState) -> None:
    state.create_run("nu-run-1", "c", b"{}", 5)
    state.r.hset(state.run_key("nu-run-1"), "status", "done")
    with pytest.raises(ParamsError, match=r"run_id 'nu-run-1' is taken by a run \(done\)"):
        state.create_run("nu-run-1", "other", b"{}", 5)
    info = state.r.hgetall(state.run_key("nu-run-1"))
    assert info[b"status"] == b"done" and info[b"chain"] == b"c"


@pytest.mark.parametrize("rid", ["has space", "a{b}", "x:y", "", "z" * 65])
def test_a_run_id_that_cannot_name_keys_is_refused(
    state: RunState, rid: str, key_prefix: str
) -> None:
    before = set(state.r.scan_iter(f"{key_prefix}*"))
    with pytest.raises(ParamsError, match="letters, digits"):
        state.create_run(rid, "c", b"{}", 5)
    assert set(state.r.scan_iter(f"{key_prefix}*")) == before  # nothing recorded
