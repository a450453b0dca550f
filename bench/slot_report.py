"""Where a latency-bound crawl's time goes, from the fetch-slot timings of `BENCH_PROTO=slots`.

    python -m bench.chaincrawl_bench --latency-ms 250 --pages 1300 -c 20 \\
        --app bench.tuned_worker --proto slots          # with CHAINCRAWL_FETCH_SLOTS=16
    python -m bench.slot_report /tmp/slots-*.txt

Prints the requests' own time (asked for a slot .. response read), the slots' occupancy over the
steady middle of the run, how many requests waited for a slot meanwhile, and the moments at
the start and the end when fewer than all but one slot were busy (the bench's warm-up crawl
of a few pages comes first), with the URLs fetched last:
a tail of pages fetched one after the other (a batch running its pages in one slot) shows
there (docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    asked: float
    took: float
    done: float
    released: float
    url: str


def read(paths: list[str]) -> list[Row]:
    rows = []
    for path in paths:
        with open(path) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 4:
                    a, t, d, r = map(float, parts[:4])
                    rows.append(Row(a, t, d, r, parts[4] if len(parts) > 4 else ""))
    return sorted(rows, key=lambda r: r.took)


def level(rows: list[Row], start: str, end: str, lo: float, hi: float) -> float:
    """Mean number of rows between their `start` and `end` times over [lo, hi)."""
    total = 0.0
    for r in rows:
        a, b = max(getattr(r, start), lo), min(getattr(r, end), hi)
        if b > a:
            total += b - a
    return total / (hi - lo) if hi > lo else 0.0


def report(rows: list[Row], slots: int, step: float = 0.05) -> str:
    if not rows:
        return "no requests recorded"
    t0, t1 = min(r.asked for r in rows), max(r.released for r in rows)
    own = [r.done - r.took for r in rows]
    lo, hi = t0 + 0.1 * (t1 - t0), t0 + 0.9 * (t1 - t0)
    out = [
        f"requests {len(rows)} over {t1 - t0:.2f} s: {len(rows) / (t1 - t0):.1f}/s",
        f"request time ms: median {statistics.median(own) * 1e3:.1f}, mean "
        f"{statistics.mean(own) * 1e3:.1f}, max {max(own) * 1e3:.1f}",
        f"steady middle (10-90 %): slots busy {level(rows, 'took', 'released', lo, hi):.2f} of "
        f"{slots}, waiting for one {level(rows, 'asked', 'took', lo, hi):.2f}",
    ]
    thin = []
    t = t0
    while t < t1:
        busy = sum(1 for r in rows if r.took <= t < r.released)
        if busy < slots - 1 and not lo <= t < hi:
            thin.append(f"{t - t0:.2f}s:{busy}")
        t += step
    out.append(f"fewer than {slots - 1} busy (time:busy): {' '.join(thin) or 'never'}")
    out.append("fetched last:")
    for r in sorted(rows, key=lambda r: r.released)[-8:]:
        out.append(f"  {r.took - t0:8.3f} .. {r.released - t0:8.3f}  {r.url}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="slots-<pid>.txt files of one run")
    ap.add_argument("--slots", type=int, default=16, help="the run's fetch slots")
    a = ap.parse_args(argv)
    print(report(read(a.files), a.slots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
