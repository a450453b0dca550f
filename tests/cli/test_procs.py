"""cli.procs: stopping a named process leaves nothing of it in var/run; a started server is
up once it listens itself (not another process on its port)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cli import StartFailed
from cli.procs import listens, run_dir, start_bg, stop_named, wait_listening
from config import Settings


def test_stop_takes_the_pid_file_and_the_log_offset_with_the_process(tmp_path: Path) -> None:
    s = Settings(var_dir=tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    threading.Thread(target=proc.wait, daemon=True).start()  # reaped as it dies, as by init
    try:
        (run_dir(s) / "worker1.pid").write_text(str(proc.pid))
        (run_dir(s) / "worker1.logpos").write_text("0")
        (run_dir(s) / "worker2.pid").write_text("999999999")  # died long ago: files still go
        (run_dir(s) / "worker2.logpos").write_text("7")
        assert stop_named("worker", s, timeout=10) == ["worker1"]
        assert proc.wait(timeout=10) is not None
        assert sorted(p.name for p in run_dir(s).iterdir()) == []
    finally:
        proc.kill()


_SERVE = (
    "import socket, sys, time; s = socket.socket(); "
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('listening', flush=True); "
    "time.sleep(120)"
)


def test_a_server_is_up_once_it_listens_itself(tmp_path: Path) -> None:
    s = Settings(var_dir=tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pid = start_bg("srv", [sys.executable, "-c", _SERVE, str(port)], s)
    try:
        wait_listening("srv", pid, "127.0.0.1", port, s, 60)
        assert listens(pid, port) is True
        assert listens(pid, port + 1 if port < 65535 else port - 1) is False
    finally:
        stop_named("srv", s, 10)


def test_a_server_whose_port_another_process_holds_is_said_not_to_start(tmp_path: Path) -> None:
    """The other process answers on the port, but the one started failed to bind and exited:
    not up, and the error says why (its log) and that the port is someone else's."""
    s = Settings(var_dir=tmp_path)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        pid = start_bg("srv", [sys.executable, "-c", _SERVE, str(port)], s)
        with pytest.raises(StartFailed) as got:
            wait_listening("srv", pid, "127.0.0.1", port, s, 60)
    said = str(got.value)
    assert "srv exited before it listened" in said and "another process listens" in said, said
    assert "Address already in use" in said, said


def test_stop_names_the_runs_left_unfinished(tmp_path: Path, monkeypatch, capsys) -> None:
    """A stop in the middle of a run says the run is not finished and goes on at the next
    start, instead of a bare "stopped:" line; a Redis that does not answer is not waited for."""
    import argparse

    import redis

    from cli import __main__ as cli_main
    from cli.procs import unfinished_runs
    from config import reset_settings
    from ledger.state import RunState
    from utils.servers import RedisServer

    server = RedisServer(tmp_path / "redis").start()
    try:
        monkeypatch.setenv("CHAINCRAWL_REDIS_URL", server.url)
        monkeypatch.setenv("CHAINCRAWL_VAR_DIR", str(tmp_path / "var"))
        reset_settings()
        s = Settings(var_dir=tmp_path / "var", redis_url=server.url)
        state = RunState(redis.Redis.from_url(server.url), s)
        assert unfinished_runs(s) == []
        state.r.sadd(state.active_key, "4de898fb1ce34067")
        assert unfinished_runs(s) == ["4de898fb1ce34067"]
        cli_main.cmd_stop(argparse.Namespace(timeout=5, keep_redis=True))
        out = capsys.readouterr().out
        assert "stopped: nothing was running\n" in out
        assert "not finished: 1 run(s) (4de898fb1ce34067); their tasks wait in the broker" in out
    finally:
        server.kill()
        monkeypatch.undo()
        reset_settings()
    assert unfinished_runs(Settings(var_dir=tmp_path, redis_url="redis://127.0.0.1:1/0")) == []
