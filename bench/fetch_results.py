"""bench.fetch_clients' figures: one timed run of a client (`Sample`), a client's runs on one
page set (`Result`), and the table it prints."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Sample:
    """One timed run of one client on one page set."""

    requests: int
    pages: int
    bytes: int
    chars: int
    cpu: float  # seconds
    wall: float
    instructions: int = 0  # under `--callgrind`: user-space instructions of the run

    @property
    def instr_per_req(self) -> float:
        return self.instructions / self.requests

    @property
    def cpu_us(self) -> float:
        return self.cpu / self.requests * 1e6

    @property
    def wall_us(self) -> float:
        return self.wall / self.requests * 1e6


@dataclass
class Result:
    client: str
    pageset: str
    samples: list[Sample] = field(default_factory=list)


def table(results: list[Result], skipped: list[str]) -> str:
    """The figures: per page set and client, CPU µs per request (min/median/max), wall µs per
    request (median), and the CPU median's ratio to the project's fetcher."""
    lines = [
        f"{'set':6} {'client':14} {'cpu us/req min':>14} {'median':>8} {'max':>8} "
        f"{'wall us/req':>11} {'cpu vs project':>14} {'pages':>6} {'KB/page':>8}"
    ]
    counted = any(s.instructions for r in results for s in r.samples)
    if counted:
        lines[0] += f" {'instr/req':>10} {'vs project':>10}"
    base = {
        r.pageset: statistics.median(s.cpu_us for s in r.samples)
        for r in results
        if r.client == "project"
    }
    ibase = {
        r.pageset: statistics.median(s.instr_per_req for s in r.samples)
        for r in results
        if r.client == "project" and counted
    }
    for r in results:
        cpu = sorted(s.cpu_us for s in r.samples)
        wall = statistics.median(s.wall_us for s in r.samples)
        med = statistics.median(cpu)
        ratio = f"{med / base[r.pageset]:.2f}x" if base.get(r.pageset) else "-"
        last = r.samples[-1]
        kb = last.bytes / max(1, last.pages) / 1024
        line = (
            f"{r.pageset:6} {r.client:14} {cpu[0]:14.1f} {med:8.1f} {cpu[-1]:8.1f} "
            f"{wall:11.1f} {ratio:>14} {last.pages:6d} {kb:8.1f}"
        )
        if counted:
            ins = statistics.median(s.instr_per_req for s in r.samples)
            iratio = f"{ins / ibase[r.pageset]:.2f}x" if ibase.get(r.pageset) else "-"
            line += f" {ins / 1000:9.0f}k {iratio:>10}"
        lines.append(line)
    lines += [f"{'-':6} {n:14} skipped: not installed" for n in skipped]
    return "\n".join(lines)
