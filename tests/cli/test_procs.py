"""cli.procs: stopping a named process leaves nothing of it in var/run."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from cli.procs import run_dir, stop_named
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
