"""`control.sh trigger` against the live workers' task sets: refused in one line when a live
worker lacks a task of the chain or none consumes its queue (unless --wait-for-workers),
sent with a warning when no worker is up."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import redis

from broker.workers import TaskSets
from config import Settings
from ledger.state import RunState
from monitor.alerts import Evaluator, parse_config
from tests.cli.conftest import control as cli_control
from tests.conditions import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def env(redis_url: str, key_prefix: str, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "CHAINCRAWL_REDIS_URL": redis_url, "CHAINCRAWL_KEY_PREFIX": key_prefix,
            "CHAINCRAWL_VAR_DIR": str(tmp_path / "var")}  # fmt: skip


def control(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return cli_control(*args, env=env, timeout=120)


def test_trigger_refuses_a_chain_a_live_worker_does_not_know(
    env: dict[str, str], rds: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    s = Settings(redis_url=redis_url, key_prefix=key_prefix)
    TaskSets(rds, s).publish("old@host", ["demo.h5.feed"], [])  # started before the others
    out = control("trigger", "demo_social", "--no-wait", env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: live worker(s) old@host do not know task(s) ")
    assert "demo.h5.user_info" in line and "restart the workers so they load" in line
    assert rds.zcard(RunState(rds, s).recent_key) == 0  # nothing recorded


def test_trigger_warns_of_site_code_changed_after_the_workers_started(
    env: dict[str, str], rds: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    """An endpoint edited while the workers run seemed to do nothing (they run the code they
    loaded; `parse` runs the file as it is): `trigger` names the file and the workers of this
    machine that predate it, and sends the run all the same."""
    import chains

    s = Settings(redis_url=redis_url, key_prefix=key_prefix)
    tasks = [st.task for st in chains.get_chain("demo_social").root.walk()]
    TaskSets(rds, s).publish("old@here", tasks, [], started=1.0)  # loaded before any edit
    TaskSets(rds, s).publish("new@here", tasks, [], started=time.time() + 3600)
    out = control("trigger", "demo_social", "--no-wait", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    said = " ".join(out.stdout.split())  # rich may wrap the line
    assert "warning: sites/demo/" in said
    assert "changed after worker(s) old@here started: they run the code they loaded then" in said
    assert "(./control.sh restart loads it)" in said and "new@here" not in said
    assert rds.zcard(RunState(rds, s).recent_key) == 1


def test_trigger_without_workers_warns_and_sends(
    env: dict[str, str], rds: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    out = control("trigger", "demo_social", "--no-wait", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "warning: no worker is up yet" in out.stdout
    s = Settings(redis_url=redis_url, key_prefix=key_prefix)
    assert rds.zcard(RunState(rds, s).recent_key) == 1


def test_trigger_refuses_a_chain_whose_queue_no_live_worker_consumes(
    env: dict[str, str], rds: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    """A real worker that does not consume the chain's queue (a site added after it started):
    refused in one line naming the fix, unless --wait-for-workers; then the queue_unserved
    alert fires for the waiting messages."""
    s = Settings(redis_url=redis_url, key_prefix=key_prefix)
    out = control("start", "--workers", "1", "-c", "2", "--pool", "threads", "--name", "uq",
                  "--queues", "resources,default", env=env)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    try:  # its task set is published at worker_ready, next to its " ready." line
        wait_for(lambda: TaskSets(rds, s).live(), timeout=60, what="the worker's task set")
        out = control("trigger", "demo_social", "--no-wait", env=env)
        assert out.returncode == 2, out.stdout + out.stderr
        [line] = out.stderr.strip().splitlines()
        assert line.startswith("error: no live worker consumes queue(s) demo (demo.app.detail, ")
        assert "restart the workers: ./control.sh restart" in line
        assert "--wait-for-workers" in line and "nothing was sent" in line
        assert rds.zcard(RunState(rds, s).recent_key) == 0

        out = control("trigger", "demo_social", "--no-wait", "--wait-for-workers", env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "warning: no live worker consumes queue(s) demo" in out.stdout
        assert rds.zcard(RunState(rds, s).recent_key) == 1

        rule = {"name": "queue_unserved", "kind": "queue_unserved", "above": 0, "for": 0}
        ev = Evaluator(rds, parse_config({"rules": [rule]}), s)
        [t] = [t for t in ev.tick(force=True) or [] if t.subject == "demo"]
        assert t.action == "fire" and "no live worker consumes it" in t.summary
    finally:
        control("stop", "--timeout", "20", "--keep-redis", env=env)
