"""Crawlee's own virtual environment for the benchmark, made from its lock file on first use.

    .venv/bin/python -m bench.crawlee_env        # make (or check) it; prints its python

Crawlee for Python pins versions of pydantic, psutil and others that need not agree with
chaincrawl's lock, so it gets a venv of its own: `var/bench/crawlee-venv`, installed with pip
from `requirements/bench-crawlee.txt` (made by `./control.sh lock` from
`requirements/bench-crawlee.in`). A stamp of the lock's hash in the venv tells a current venv
from a stale one; a changed lock rebuilds it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "bench-crawlee.txt"
VENV = ROOT / "var" / "bench" / "crawlee-venv"


class CrawleeUnavailable(RuntimeError):
    """The Crawlee venv could not be made; the message says what failed."""


def _stamp() -> str:
    return hashlib.sha1(LOCK.read_bytes()).hexdigest()[:12]


def python(venv: Path = VENV) -> Path:
    """The venv's interpreter, the venv made or remade from the lock first if needed."""
    exe = venv / "bin" / "python"
    stamp = venv / f".lock-{_stamp()}"
    if exe.exists() and stamp.exists():
        return exe
    print(f"(making {venv} from {LOCK.name}: about a minute, once)", file=sys.stderr, flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    for cmd in (
        [sys.executable, "-m", "venv", str(venv)],
        [str(exe), "-m", "pip", "install", "-q", "-r", str(LOCK)],
    ):
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode:
            tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-15:])
            raise CrawleeUnavailable(f"`{' '.join(cmd)}` exited {out.returncode}:\n{tail}")
    check = subprocess.run(
        [str(exe), "-c", "import crawlee.crawlers, parsel"],
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode:
        raise CrawleeUnavailable(f"crawlee does not import in {venv}:\n{check.stderr[-2000:]}")
    stamp.touch()
    return exe


def main() -> int:
    try:
        print(python())
    except CrawleeUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
