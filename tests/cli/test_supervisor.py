"""cli.supervisor: a worker that exits by itself is restarted (back-off, cap), a stop is not.

The policy tests run the supervisor on small Python children; the last test runs a real
worker under `control.sh start` (python -m cli start) and SIGKILLs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from config import ROOT
from utils.servers import RedisServer

FAST = ["--backoff", "0.05", "--max-backoff", "0.1"]


def supervisor(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.supervisor", "--name", "worker-t1", *args]


def child(code: str) -> list[str]:
    return ["--", sys.executable, "-c", code]


def wait_for(cond: Callable[[], object], timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise TimeoutError(f"not within {timeout}s: {what}")


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")  # a zombie is dead
    except FileNotFoundError:
        return True


def pids(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(x) for x in path.read_text().split() if x.isdigit()]


def test_a_crashing_child_is_restarted_with_backoff_up_to_the_cap(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    code = f"import os, sys; open({str(runs)!r}, 'a').write(f'{{os.getpid()}}\\n'); sys.exit(3)"
    out = subprocess.run(
        supervisor("--start-grace", "0", "--max-restarts", "3", *FAST, *child(code)),
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 3, out.stdout + out.stderr
    assert len(set(pids(runs))) == 4  # the first run and 3 restarts
    assert out.stdout.count("exited with code 3") == 4
    assert out.stdout.count("restarting in") == 3
    assert "restart 3 of at most 3" in out.stdout and "giving up" in out.stdout


def test_a_clean_exit_is_not_restarted_and_a_failed_start_is_tried_a_few_times(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    write = f"import os, sys; open({str(runs)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
    ok = subprocess.run(supervisor("--start-grace", "0", *FAST, *child(write + "sys.exit(0)")),
                        cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert ok.returncode == 0 and "exited normally; not restarting" in ok.stdout
    assert len(pids(runs)) == 1
    bad = subprocess.run(supervisor(*FAST, *child(write + "sys.exit(2)")),  # default grace 10 s
                         cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2, bad.stdout
    assert len(pids(runs)) == 1 + 3  # the default: 3 starts in all
    assert bad.stdout.count("before it was ready; starting it again") == 2
    assert "start 3 of at most 3" in bad.stdout and "3 failed start(s): giving up" in bad.stdout


def test_a_start_failure_once_is_followed_by_a_working_start(tmp_path: Path) -> None:
    """A worker that dies during start-up (a Redis still loading, a flaky import) is started
    again with back-off; once ready, it is supervised as usual."""
    runs, log = tmp_path / "runs", tmp_path / "worker.log"
    code = (
        "import os, sys, time\n"
        f"f = {str(runs)!r}\n"
        "n = len(open(f).read().split()) if os.path.exists(f) else 0\n"
        "open(f, 'a').write(f'{os.getpid()}\\n')\n"
        "if n == 0: sys.exit(5)\n"
        "print('w1 ready.', flush=True)\n"
        "time.sleep(60)\n"
    )
    with open(log, "ab") as out:
        sup = subprocess.Popen([*supervisor("--ready-marker", " ready.", *FAST), *child(code)],
                               cwd=ROOT, stdout=out)  # fmt: skip
    try:
        wait_for(lambda: "ready." in log.read_text(), what="the second start got ready")
        assert sup.poll() is None and len(pids(runs)) == 2
        assert "exited with code 5" in log.read_text() and "start 2 of at most 3" in log.read_text()
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        if sup.poll() is None:
            sup.kill()


def test_the_ready_marker_tells_a_start_failure_from_a_crash(tmp_path: Path) -> None:
    """With `--ready-marker` (what `control.sh start` passes), a run that exits before
    logging the marker is a start failure, however long it ran; one that exits after it is
    a crash and is restarted, however soon."""
    runs, log = tmp_path / "runs", tmp_path / "worker.log"
    log.write_bytes(b"an old ready. line from a previous start\n")  # the log is appended to
    write = f"import os, sys; open({str(runs)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
    cmd = supervisor("--ready-marker", " ready.", "--max-restarts", "1", "--start-attempts",
                     "1", *FAST)  # fmt: skip
    with open(log, "ab") as out:
        failed = subprocess.run([*cmd, *child(write + "sys.exit(4)")], cwd=ROOT, stdout=out,
                                timeout=60)  # fmt: skip
    assert failed.returncode == 4 and len(pids(runs)) == 1
    assert "before it was ready; 1 failed start(s): giving up" in log.read_text()
    with open(log, "ab") as out:
        crashed = subprocess.run(
            [*cmd, *child(write + "print('w1 ready.', flush=True); sys.exit(4)")],
            cwd=ROOT, stdout=out, timeout=60,
        )  # fmt: skip
    assert crashed.returncode == 4 and len(pids(runs)) == 3  # one restart, then the cap
    assert "restart 1 of at most 1" in log.read_text() and "giving up" in log.read_text()


def test_the_ready_marker_is_read_from_the_child_s_own_log_with_ready_log(
    tmp_path: Path,
) -> None:
    """redis-server writes its "Ready to accept connections" to its own --logfile, not to
    stdout: with `--ready-log` that file (from its size at the start) tells a crash, which is
    restarted, from a start failure; an earlier run's marker in it does not count."""
    runs, own = tmp_path / "runs", tmp_path / "own.log"
    own.write_text("an old Ready line from a previous start\n")
    write = f"import os, sys; open({str(runs)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
    ready = f"open({str(own)!r}, 'a').write('Ready\\n'); "
    cmd = supervisor("--ready-marker", "Ready", "--ready-log", str(own), "--max-restarts", "1",
                     "--start-attempts", "1", *FAST)  # fmt: skip
    failed = subprocess.run([*cmd, *child(write + "sys.exit(4)")], cwd=ROOT, timeout=60,
                            capture_output=True, text=True)  # fmt: skip
    assert failed.returncode == 4 and len(pids(runs)) == 1
    assert "1 failed start(s): giving up" in failed.stdout, failed.stdout
    crashed = subprocess.run([*cmd, *child(write + ready + "sys.exit(4)")], cwd=ROOT,
                             timeout=60, capture_output=True, text=True)  # fmt: skip
    assert crashed.returncode == 4 and len(pids(runs)) == 3  # one restart, then the cap
    assert "restart 1 of at most 1" in crashed.stdout, crashed.stdout


def test_sigterm_is_passed_on_and_stops_without_restart(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    code = (
        "import os, signal, sys, time\n"
        f"f = {str(runs)!r}\n"
        "def term(*a):\n"
        "    open(f, 'a').write('term\\n'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "open(f, 'a').write(f'{os.getpid()}\\n')\n"
        "while True: time.sleep(0.1)\n"
    )
    sup = subprocess.Popen(supervisor("--start-grace", "0", *FAST, *child(code)), cwd=ROOT,
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(lambda: pids(runs), what="the child started")
        # killed by itself (not by a stop): restarted
        os.kill(pids(runs)[0], signal.SIGKILL)
        wait_for(lambda: len(pids(runs)) == 2, what="the restart")
        sup.send_signal(signal.SIGTERM)
        out, _ = sup.communicate(timeout=30)
    finally:
        if sup.poll() is None:
            sup.kill()
    assert sup.returncode == 0, out
    assert runs.read_text().count("term") == 1  # the worker got the SIGTERM (warm shutdown)
    assert len(pids(runs)) == 2  # and was not started again
    assert "killed by signal 9" in out and "stopped (code 0)" in out


def test_a_killed_supervisor_takes_its_child_along(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    code = f"import os, time; open({str(runs)!r}, 'a').write(f'{{os.getpid()}}\\n'); time.sleep(60)"
    sup = subprocess.Popen(supervisor(*FAST, *child(code)), cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: pids(runs), what="the child started")
        sup.kill()
        sup.wait(10)
        wait_for(lambda: gone(pids(runs)[0]), timeout=10, what="the child to die with it")
    finally:
        for pid in pids(runs):
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.integration
def test_control_sh_start_restarts_a_worker_that_dies(tmp_path: Path) -> None:
    """`control.sh start` workers run under the supervisor: a worker SIGKILLed (or one that
    exits on an unrecoverable broker error) comes back by itself; `control.sh stop` stops it
    for good."""
    server = RedisServer(tmp_path / "redis").start()
    env = {
        **os.environ,
        "CHAINCRAWL_REDIS_URL": server.url,
        "CHAINCRAWL_BROKER_URL": server.url,
        "CHAINCRAWL_KEY_PREFIX": "sup",
        "CHAINCRAWL_VAR_DIR": str(tmp_path / "var"),
        "CHAINCRAWL_SINKS": "jsonl",
        "CHAINCRAWL_PROVIDERS": "user_agent=noop,device_id=noop,sign=noop,cookie=noop",
    }
    cli = [sys.executable, "-m", "cli"]
    log = tmp_path / "var" / "log" / "worker-w1.log"
    pidfile = tmp_path / "var" / "run" / "worker-w1.pid"
    try:
        start = subprocess.run([*cli, "start", "--workers", "1", "-c", "2", "--queues", "default"],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert start.returncode == 0, start.stdout + start.stderr
        sup = int(pidfile.read_text())
        (worker,) = children(sup)
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: log.read_text(errors="replace").count(" ready.") == 2, timeout=90,
                 what="the worker restarted")  # fmt: skip
        text = log.read_text(errors="replace")
        assert f"pid {worker} killed by signal 9" in text and "restarting in" in text
        (again,) = children(sup)
        assert again != worker
    finally:
        stop = subprocess.run([*cli, "stop", "--keep-redis", "--timeout", "60"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        server.kill()
    assert stop.returncode == 0 and "worker-w1" in stop.stdout, stop.stdout + stop.stderr
    assert not pidfile.exists()
    wait_for(lambda: gone(again), timeout=30, what="the worker stopped")
    assert "stopped (code 0)" in log.read_text(errors="replace")


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


CRASHING_SITE = """
import os, pathlib
count = pathlib.Path(os.environ["CRASH_COUNT"])
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
if n < int(os.environ["CRASH_TIMES"]):
    raise SystemExit(f"crashsite refuses to import (start {n + 1})")
"""  # an exception would be a broken module, skipped (sites/__init__.py); exit ends the worker


def crashing_env(tmp_path: Path, url: str, times: int) -> dict[str, str]:
    """A worker environment whose site package exits at import the first `times` times."""
    (tmp_path / "pkgs" / "crashsite").mkdir(parents=True)
    (tmp_path / "pkgs" / "crashsite" / "__init__.py").write_text(CRASHING_SITE)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "pkgs"), str(ROOT)]),
        "CHAINCRAWL_EXTRA_SITE_PACKAGES": "crashsite",
        "CRASH_COUNT": str(tmp_path / "count"),
        "CRASH_TIMES": str(times),
        "CHAINCRAWL_REDIS_URL": url,
        "CHAINCRAWL_BROKER_URL": url,
        "CHAINCRAWL_KEY_PREFIX": "sup",
        "CHAINCRAWL_VAR_DIR": str(tmp_path / "var"),
        "CHAINCRAWL_SINKS": "jsonl",
        "CHAINCRAWL_PROVIDERS": "user_agent=noop,device_id=noop,sign=noop,cookie=noop",
    }


@pytest.mark.integration
@pytest.mark.parametrize("times", [1, 99])
def test_control_sh_start_retries_a_worker_that_dies_at_start_up(
    tmp_path: Path, times: int
) -> None:
    """A worker whose site package exits at import is started again; `start` waits for a
    ready line of this start only (an earlier start's line in the appended log does not
    count), and fails with exit 1 and the worker's own log lines once the tries run out."""
    server = RedisServer(tmp_path / "redis").start()
    env = {**crashing_env(tmp_path, server.url, times), "CHAINCRAWL_WORKER_START_ATTEMPTS": "2",
           "CHAINCRAWL_REQUEST_TIMEOT": "3"}  # fmt: skip
    (tmp_path / "var" / "log").mkdir(parents=True)
    (tmp_path / "var" / "log" / "worker-w1.log").write_text("[old] celery@x ready.\n")
    cli = [sys.executable, "-m", "cli"]
    try:
        start = subprocess.run([*cli, "start", "--workers", "1", "-c", "2", "--queues", "default",
                                "--pool", "threads"], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=240)  # fmt: skip
    finally:
        stop = subprocess.run([*cli, "stop", "--keep-redis", "--timeout", "60"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        server.kill()
    log = (tmp_path / "var" / "log" / "worker-w1.log").read_text(errors="replace")
    assert "before it was ready; starting it again" in log
    if times == 1:
        assert start.returncode == 0, start.stdout + start.stderr
        assert "workers ready: worker-w1" in start.stdout and log.count(" ready.") == 2
        # a misspelled setting named once the workers are up (the site imported by them only)
        assert "warning: CHAINCRAWL_REQUEST_TIMEOT is not a chaincrawl setting" in start.stderr
        assert "worker-w1" in stop.stdout
    else:
        assert start.returncode == 1, start.stdout + start.stderr
        err = start.stderr
        assert "worker-w1 did not start (tried 2 time(s)" in err, err
        assert "crashsite refuses to import (start 2)" in err, err
        assert "[old]" not in err  # this start's lines only
        assert "2 failed start(s): giving up" in log
        assert (tmp_path / "count").read_text() == "2"
    assert not list((tmp_path / "var" / "run").glob("*.pid"))
