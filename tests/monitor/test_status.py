"""The status snapshot, its rendering, the CLI, and masked task arguments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import orjson
from rich.console import Console

from cli import status as cli_status
from config import ROOT
from ledger.state import RunState
from monitor import health
from monitor import snapshot as msnap
from monitor import status as ms
from tests.conditions import wait_for
from tests.monitor.conftest import record

CHAIN = {
    "name": "shop_chain",
    "root": {"id": "web.listing", "task": "shop.web.listing",
             "then": [{"id": "web.detail", "task": "shop.web.detail", "map": {"id": "id"}}]},
}  # fmt: skip


def make_run(rds, mon, rid: str = "run1") -> None:
    state = RunState(rds, mon)
    state.create_run(rid, "shop_chain", orjson.dumps(CHAIN), 5)
    state.add_dispatched(rid, "web.listing", 4)
    state.add_dispatched(rid, "web.detail", 10)
    rds.hset(state.counters_key(rid), mapping={
        "web.listing:succeeded": 4, "web.detail:succeeded": 5, "web.detail:failed": 1,
        "succeeded": 9, "failed": 1, "items": 30, "stored": 20,
    })  # fmt: skip


def test_snapshot_has_everything_status_shows(rds, mon) -> None:
    record(rds, mon, "shop.web.listing", ok=6, failed=2, retried=1, error="Banned", latency=0.2)
    make_run(rds, mon)
    health.report(rds, health.PoolHealth("cookie:shop", size=0, bans=2, produced=5), mon)
    rds.rpush(f"{mon.key_prefix}:q:shop", b"x", b"y")
    snap = msnap.snapshot(mon, rds, workers_timeout=None)
    json.dumps(snap)  # JSON-ready
    assert {"processes", "workers", "queues", "active_runs", "dead_letters", "outbox", "tasks",
            "sites", "pools", "alerts"} <= set(snap)  # fmt: skip
    t = snap["tasks"]["shop.web.listing"]
    assert (t["succeeded"], t["failed"], t["retried"]) == (6, 2, 1)
    assert t["fail_rate"] == 0.25 and t["retry_rate"] == round(1 / 9, 4)
    assert t["errors"] == {"failed": {"Banned": 2}, "retried": {"Banned": 1}}
    assert 0.1 < t["latency_p95"] <= 0.25
    assert snap["sites"]["shop"]["failed"] == 2
    assert snap["queues"]["shop"] == 2
    [run] = snap["active_runs"]
    assert run["run_id"] == "run1" and run["steps"]["web.detail"]["dispatched"] == 10
    assert snap["pools"][0]["name"] == "cookie:shop" and snap["pools"][0]["size"] == 0


def test_render_draws_bars_tables_and_rates(rds, mon) -> None:
    record(rds, mon, "shop.web.listing", ok=6, failed=2)
    make_run(rds, mon)
    health.report(rds, health.PoolHealth("cookie:shop", size=0), mon)
    snap = msnap.snapshot(mon, rds, workers_timeout=None)
    snap["workers"] = {"w1@host": {"active": 1, "tasks": [{"name": "shop.web.detail"}]}}
    snap["alerts"] = [{"rule": "pool_empty", "subject": "cookie:shop", "value": 0}]
    console = Console(record=True, width=160, color_system=None)
    console.print(cli_status.render(snap, cli_status.recent_rates(None, snap)))
    text = console.export_text()
    for needle in ("workers", "w1@host", "shop.web.detail", "queues", "run run1", "web.detail",
                   "6/10", "25.0%", "cookie:shop", "alerts firing: 1", "pool_empty"):  # fmt: skip
        assert needle in text, needle
    assert "━" in text  # the progress bars


def test_recent_rates_use_the_difference() -> None:
    a = {"tasks": {"t": {"succeeded": 10, "failed": 0}}}
    b = {"tasks": {"t": {"succeeded": 12, "failed": 2}, "u": {"succeeded": 0, "failed": 0}}}
    r = cli_status.recent_rates(a, b)
    assert r["t"] == {"finished": 4, "fail_rate": 0.5} and r["u"]["fail_rate"] is None


def test_bucket_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.1, 0), (0.2, 50), (0.4, 100), (float("inf"), 100)]
    assert ms.bucket_quantile(0.5, buckets) == 0.2
    q = ms.bucket_quantile(0.75, buckets)
    assert q is not None and abs(q - 0.3) < 1e-9
    assert ms.bucket_quantile(0.5, [(float("inf"), 0)]) is None


def test_task_arguments_are_masked_for_events_and_flower() -> None:
    params = {"user_id": "u1", "cookie": "sid=abc123", "nested": {"api_token": "t0k", "n": 3},
              "proxy_url": "http://bob:hunter2@10.0.0.1:8080", "page": 2,
              "next": "http://x.test/p?token=zzz", "Password": "pw", "empty_token": ""}  # fmt: skip
    meta = {"run": "r1", "step": "web.listing", "prio": 5, "session": "s", "x_sign": "sg"}
    text = ms.task_argsrepr(params, meta)
    for secret in ("abc123", "t0k", "hunter2", "zzz", "'pw'", "'s'", "'sg'"):
        assert secret not in text, secret
    for shown in ("'user_id': 'u1'", "'page': 2", "'n': 3", "'run': 'r1'", "'step': 'web.listing'",
                  "'cookie': '***'", "'empty_token': ''"):  # fmt: skip
        assert shown in text, shown
    assert len(ms.task_argsrepr({"x": "y" * 5000}, {})) <= 1100
    assert not ms.is_secret_key("design") and not ms.is_secret_key("page")


def _env(mon) -> dict[str, str]:
    return {**os.environ, "CHAINCRAWL_REDIS_URL": mon.redis_url, "CHAINCRAWL_KEY_PREFIX": mon.key_prefix,
            "CHAINCRAWL_VAR_DIR": str(mon.var_dir)}  # fmt: skip


def test_control_status_json(rds, mon) -> None:
    record(rds, mon, "shop.web.listing", ok=3, failed=1)
    make_run(rds, mon)
    out = subprocess.run([sys.executable, "-m", "cli", "status", "--json"], cwd=ROOT, env=_env(mon),
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    assert snap["tasks"]["shop.web.listing"]["failed"] == 1
    assert snap["active_runs"][0]["run_id"] == "run1"
    assert snap["workers"] == {}  # asked, nobody answered on this prefix


# `python -m cli ARGS` with SIGINT handled as in a terminal (KeyboardInterrupt). A process started
# with SIGINT ignored (a CI job run in the background by a non-interactive shell: POSIX ignores
# SIGINT in its asynchronous commands) passes that on, and Python then leaves it ignored: the
# watch would never see the test's Ctrl-C.
_CLI_WITH_CTRL_C = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from cli.__main__ import main; sys.exit(main(sys.argv[1:]))"
)


def test_control_status_watch_redraws_until_interrupted(rds, mon, tmp_path) -> None:
    make_run(rds, mon)
    # a pipe, but told it is an interactive terminal: frames stream out as they are drawn
    env = {**_env(mon), "COLUMNS": "140", "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1",
           "NO_COLOR": "1"}  # fmt: skip
    err_path = tmp_path / "stderr"
    with err_path.open("wb") as err_file:
        p = subprocess.Popen([sys.executable, "-c", _CLI_WITH_CTRL_C, "status", "--watch", "--interval", "0.2"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err_file)  # fmt: skip
    seen = bytearray()

    def read() -> None:  # the only reader of stdout (stderr goes to a file)
        while chunk := p.stdout.read1(65536):  # type: ignore[union-attr]
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # redrawn, not just drawn
        wait_for(lambda: seen.count(b"run run1") >= 2, 120, "two frames of the watch")
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
        reader.join(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = err_path.read_text(errors="replace")
    assert p.returncode in (0, 130), err
    assert seen.count(b"run run1") >= 2 and b"queues" in seen


def test_status_main_is_ready_for_control_sh(rds, mon, monkeypatch, capsys) -> None:
    """What `control.sh status --json --no-workers` runs once cli/__main__ delegates to main()."""
    import argparse

    from config import reset_settings
    from utils.redis import reset_clients

    for k, v in _env(mon).items():
        if k.startswith("CHAINCRAWL_"):
            monkeypatch.setenv(k, v)
    reset_settings()
    reset_clients()
    try:
        make_run(rds, mon)
        args = argparse.Namespace(json=True, watch=False, interval=1.0, inspect_timeout=0.5,
                                  no_workers=True)  # fmt: skip
        cli_status.main(args)
        snap = json.loads(capsys.readouterr().out)
        assert snap["workers"] is None and snap["active_runs"][0]["run_id"] == "run1"
    finally:
        monkeypatch.undo()
        reset_settings()
        reset_clients()


def test_monitor_command_registers_like_the_other_groups() -> None:
    import argparse

    from cli import monitoring

    p = argparse.ArgumentParser()
    monitoring.register(p.add_subparsers(dest="command"))
    a = p.parse_args(["monitor", "check", "--port", "9999", "--alerts", "x.yaml"])
    assert (a.action, a.port, a.alerts, a.fn) == ("check", 9999, "x.yaml", monitoring.dispatch)
    assert p.parse_args(["monitor"]).action == "start"


def test_recent_runs_filters_by_chain_and_status_across_pages(rds, mon) -> None:
    """`control.sh runs --chain C --status S`: the newest matches, however far back they are
    (read 200 at a time; runs whose records expired are skipped and dropped from the index)."""
    from ledger.state import RunState
    from monitor.status import recent_runs

    state = RunState(rds, mon)
    for i in range(450):
        rid = f"r{i:03d}"
        state.create_run(rid, "shop" if i % 150 == 0 else "news", b"{}", 5)
        rds.zadd(state.recent_key, {rid: 1000 + i})
    state.pause("r150")
    for i in range(220, 450):  # the newest 230 expired: a whole first page of 200 is gone
        rds.delete(state.run_key(f"r{i:03d}"))
    assert [r["run_id"] for r in recent_runs(rds, mon, 2)] == ["r219", "r218"]
    assert [r["run_id"] for r in recent_runs(rds, mon, 10, chain="shop")] == ["r150", "r000"]
    got = recent_runs(rds, mon, 10, chain="shop", status="paused")
    assert [(r["run_id"], r["status"]) for r in got] == [("r150", "paused")]
    assert rds.zcard(state.recent_key) == 450 - 230
