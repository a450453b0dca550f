"""Output piped into a reader that stops early (`| head`) ends quietly: no `BrokenPipeError`
traceback, whatever the command. The reader here closes its end before the command writes,
so the first write meets the closed pipe every time (with `head`, only when it is faster)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from config import ROOT


def closed_reader(*cmd: str) -> tuple[int, str]:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(60), err


@pytest.mark.parametrize(
    "args", [("config", "--list"), ("chains",), ("--help",), ("runs", "--help")]
)
def test_a_closed_pipe_ends_a_command_quietly(args: tuple[str, ...]) -> None:
    rc, err = closed_reader(sys.executable, "-m", "cli", *args)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert rc == 0, err


def test_control_sh_help_into_a_closed_pipe_is_quiet() -> None:
    rc, err = closed_reader(str(ROOT / "control.sh"), "--help")
    assert err == "" and rc == 0, err
