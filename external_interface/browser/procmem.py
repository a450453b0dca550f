"""The browser's processes and their memory, read from /proc (Linux).

Chromium is a tree of processes (browser, zygotes, renderers, GPU/network/utility services)
that map the same 200 MB binary and share much of their heap layout, so adding their RSS
counts the shared pages once per process and overstates the tree two to four times. The
memory ceiling is therefore checked against the sum of PSS (proportional set size,
`/proc/<pid>/smaps_rollup`): each shared page is split between the processes that map it, so
the sum is what the tree really holds. Where smaps_rollup is unreadable the RSS from
`/proc/<pid>/statm` stands in (an overestimate: recycling comes early, never late).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


def _pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()] if PROC.is_dir() else []


def _ppid(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name sits in parentheses and may contain spaces or ")": split at the last
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[1]) if len(fields) > 1 else None


def descendants(pid: int) -> list[int]:
    """Every living process below `pid` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for p in _pids():
        parent = _ppid(p)
        if parent is not None:
            children.setdefault(parent, []).append(p)
    out: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def cmdline(pid: int) -> list[str]:
    """The process's arguments. Chromium rewrites its own as one space-separated string (its
    process title), which is split back here."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    args = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
    if len(args) == 1 and " --" in args[0]:
        args = args[0].split(" ")
    return args


def browser_pids(root: int) -> list[int]:
    """Chromium browser processes (not renderers or helpers) below `root`: the ones without a
    `--type=` switch whose program name looks like Chrome or Chromium."""
    out = []
    for p in descendants(root):
        args = cmdline(p)
        if not args:
            continue
        name = os.path.basename(args[0]).lower()
        if ("chrom" in name or "chrome" in name) and not any(a.startswith("--type=") for a in args):
            out.append(p)
    return out


def memory_kb(pid: int) -> int:
    """PSS of one process in KiB (its RSS where smaps_rollup cannot be read; 0 if it is gone)."""
    try:
        for line in (PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int((PROC / str(pid) / "statm").read_text().split()[1]) * _PAGE_KB
    except (OSError, ValueError, IndexError):
        return 0


def tree_memory_mb(pid: int) -> float:
    """Memory of `pid` and every process below it, in MiB (sum of PSS)."""
    return sum(memory_kb(p) for p in [pid, *descendants(pid)]) / 1024


def tree_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of `pid` and every process below it, including what their
    exited children used once reaped (`cutime`/`cstime`): Chromium's zygote reaps the renderers
    it forked, so a recycled renderer's CPU stays counted."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            fields = (PROC / str(p) / "stat").read_text().rsplit(")", 1)[-1].split()
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        except (OSError, ValueError, IndexError):
            continue
    return total / ticks


def pids_with_arg(text: str) -> list[int]:
    """Processes whose command line contains `text` (a private directory's path finds the
    browsers a killed driver left behind)."""
    me = os.getpid()
    return [p for p in _pids() if p != me and any(text in a for a in cmdline(p))]


def kill(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)
