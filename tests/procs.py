"""Background processes the tests start (workers, beat, drainers): logged, awaited, killed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Self

from config import ROOT


class LoggedProc:
    """A process of ours logging to a file; `ready_marker` in the log means it is up."""

    ready_marker = b" ready."

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.fh = open(log, "wb")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env={**os.environ, **env}, stdout=self.fh, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 60) -> Self:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_marker in self.log.read_bytes():
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.log.name} exited {self.proc.returncode}:\n{self.text()[-3000:]}"
                )
            time.sleep(0.05)
        raise TimeoutError(f"{self.log.name} not ready in {timeout}s:\n{self.text()[-3000:]}")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole process group: no warm shutdown, nothing released."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 5) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.fh.close()
