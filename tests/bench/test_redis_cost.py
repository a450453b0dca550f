"""bench.redis_cost: a small crawl with real workers and the broker apart reports a page's
calls, commands and CPU, and with the sink down the outbox's bytes an item; entries of a
batch are merged (more items than entries)."""

from __future__ import annotations

import json
import shutil

import pytest

from bench import redis_cost

pytestmark = pytest.mark.integration


def test_a_small_crawl_reports_a_pages_cost_and_the_backlog(capsys) -> None:
    assert redis_cost.main(["--pages", "300", "--backlog"]) == 0
    text = capsys.readouterr().out
    crawl = json.loads(text.splitlines()[0])
    assert crawl["pages"] == crawl["stored"] > 250 and crawl["failed"] == 0
    out = json.loads(text[text.index("{\n") :])
    assert 0 < out["calls_per_page"] < out["commands_per_page"]
    assert out["calls_by_command_per_page"]["evalsha"] > 0  # the commit script, counted once
    assert out["commands_in_scripts_per_page"] > 0
    assert out["redis_process_us_per_page"] > 0 and out["broker_redis_us_per_page"] > 0
    assert out["cpu_share_per_master"] == [1.0] and out["busiest_master_vs_mean"] == 1.0
    backlog = out["outbox_backlog"]
    assert backlog["items_waiting"] == crawl["stored"]  # one item a page, none stored
    assert backlog["items_per_entry"] > 1  # a batch's entries of one step and type: one
    assert backlog["bytes_per_item"] > backlog["item_json_bytes"] > 0


@pytest.mark.skipif(not shutil.which("valgrind") or not shutil.which("callgrind_control"),
                    reason="needs valgrind (callgrind)")  # fmt: skip
def test_callgrind_counts_the_state_stores_instructions_over_the_measured_crawl(capsys) -> None:
    assert redis_cost.main(["--pages", "200", "--no-calls", "--callgrind"]) == 0
    text = capsys.readouterr().out
    out = json.loads(text[text.index("{\n") :])
    # a page's commit, drain and bookkeeping: tens of thousands of instructions, not the
    # server's start-up (uninstrumented) nor a count per call
    assert 20_000 < out["redis_instructions_per_page"] < 1_000_000
    assert "redis_process_us_per_page" not in out  # meaningless under valgrind
