"""`control.sh deadletter`: list, replay by run (as the README shows), purge with a selector
only, one line when Redis is unreachable."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.cli.conftest import control
from tests.cli.test_trigger import run_id, run_json
from utils.servers import free_port

pytestmark = pytest.mark.integration


def failed_run(env: dict[str, str], *codes: int) -> str:
    seeds = json.dumps([{"path": f"/status/{c}?{i}"} for i, c in enumerate(codes)])
    out = control("trigger", "cli_probe", seeds, "--timeout", "120", env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    return run_id(out.stdout)


def listed(rid: str, env: dict[str, str]) -> list[str]:
    out = control("deadletter", "list", "--run", rid, env=env)
    assert out.returncode == 0, out.stderr
    return re.findall(r"\b[0-9a-f]{32}\b", out.stdout)


def test_replay_by_run_then_purge_by_run(crawl: dict[str, str]) -> None:
    rid = failed_run(crawl, 404, 410)
    ids = listed(rid, crawl)
    assert len(ids) == 2  # full ids at 80 columns, in a pipe
    shown = control("deadletter", "list", "--run", rid, env=crawl).stdout
    assert f"NotFound: HTTP 404 for {crawl['TESTSITE_URL']}/status/404?0" in shown

    out = control("deadletter", "replay", "--run", rid, env=crawl)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "replayed 2 task(s)"
    deadline = time.monotonic() + 60
    while not run_json(rid, crawl)["ended"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run_json(rid, crawl)["failed"] == 2  # failed again: they are dead letters again
    assert len(listed(rid, crawl)) == 2

    out = control("deadletter", "purge", env=crawl)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "error: purge needs dead-letter ids or a selector: --run RUN_ID, --task TASK or --all"
    )
    assert len(listed(rid, crawl)) == 2

    out = control("deadletter", "purge", "--run", rid, env=crawl)
    assert out.returncode == 0 and out.stdout.strip() == "purged 2 dead letter(s)"
    assert listed(rid, crawl) == []


def test_purge_by_id_keeps_the_others(crawl: dict[str, str]) -> None:
    rid = failed_run(crawl, 404, 404)
    first, second = listed(rid, crawl)
    out = control("deadletter", "purge", first, env=crawl)
    assert out.returncode == 0 and out.stdout.strip() == "purged 1 dead letter(s)"
    assert listed(rid, crawl) == [second]
    assert control("deadletter", "replay", env=crawl).returncode == 2


@pytest.mark.parametrize("action", ["list", "replay", "purge"])
def test_unreachable_redis_is_one_line(crawl_env: dict[str, str], action: str) -> None:
    """A Redis URL nothing listens at: one error line at once, naming the URL, and exit status 5,
    no traceback (no wait: waiting is for a Redis that is loading or restarting)."""
    env = {**crawl_env, "CHAINCRAWL_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
           "CHAINCRAWL_REDIS_WAIT": "0.5"}  # fmt: skip
    out = control("deadletter", action, "--all", env=env)
    assert out.returncode == 5, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: Redis at redis://127.0.0.1:"), (
        out.stderr
    )
    assert "refused" in errors[0] and "Traceback" not in out.stderr
    assert "waiting" not in out.stderr


def test_the_list_title_says_how_many_of_which_run_are_shown() -> None:
    """`deadletter list --run R` showed 23 letters under "dead letters (37 in all)"."""
    from cli.deadletter import list_title

    assert list_title(37, 37, 50, None, None) == "dead letters (37 in all)"
    assert list_title(23, 37, 50, None, "d316") == "dead letters of run d316: 23 (37 in all)"
    assert list_title(0, 14, 50, None, "d316") == "dead letters of run d316: none (14 in all)"
    assert list_title(5, 37, 5, "jobs.pc.job", None) == (
        "dead letters of task jobs.pc.job: the newest 5 (37 in all; --limit N shows more)"
    )
    assert list_title(50, 120, 50, None, None) == (
        "dead letters: the newest 50 (120 in all; --limit N shows more)"
    )
