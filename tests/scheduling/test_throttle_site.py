"""The throttle shared by worker processes, measured at a local site: the target concurrency
holds whatever the number of threads, and 429 + Retry-After slow the crawl without failing it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from config import Settings
from scheduling.throttle import Throttle
from tests.polite_site import PoliteSite

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def crawl(redis_url: str, prefix: str, url: str, pages: int, procs: int, threads: int,
          **settings: object) -> list[dict]:  # fmt: skip
    """`procs` client processes (tests/scheduling/throttle_client.py) at once; their reports."""
    extra = [f"{k}={v}" for k, v in settings.items()]
    cmd = [sys.executable, "-m", "tests.scheduling.throttle_client", redis_url, prefix, url,
           str(pages), str(threads), *extra]  # fmt: skip
    running = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
               for _ in range(procs)]  # fmt: skip
    reports = []
    for p in running:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def test_target_concurrency_holds_across_processes(redis_url: str, key_prefix: str,
                                                   polite_site: PoliteSite) -> None:  # fmt: skip
    """2 processes x 8 threads on a site answering in 200 ms, target concurrency 2: after the
    first answers the site sees about 2 requests in flight, not 16."""
    polite_site.reset()
    polite_site.limit_rate = 10**6
    t0 = time.monotonic()
    reports = crawl(redis_url, key_prefix, f"{polite_site.url}/limited?ms=200", 25, 2, 8,
                    throttle_start_delay=0.02, throttle_target_concurrency=2)  # fmt: skip
    elapsed = time.monotonic() - t0
    assert sum(r["statuses"].get("200", 0) for r in reports) == 50
    arrivals = sorted(polite_site.arrivals)
    start = arrivals[0][0]
    early = max(n for t, n in arrivals if t - start < 0.3)
    settled = [n for t, n in arrivals if t - start > 1.0]
    print(
        f"\n{elapsed:.1f}s; in flight at arrival: first 0.3 s max {early}, after 1 s max "
        f"{max(settled)} mean {sum(settled) / len(settled):.2f} (target 2)"
    )
    assert early >= 4  # the start delay let a burst through before latency was known
    assert max(settled) <= 4 and sum(settled) / len(settled) <= 3.0
    state = Throttle(redis.Redis.from_url(redis_url),
                     Settings(redis_url=redis_url, key_prefix=key_prefix)).state("polite")  # fmt: skip
    assert state is not None and 0.08 <= state["delay"] <= 0.15  # 0.2 s / 2


def test_429_and_retry_after_slow_the_crawl_without_failing_it(
    redis_url: str, key_prefix: str, polite_site: PoliteSite
) -> None:
    """The site allows 5 requests a second and answers 429 + Retry-After: 1 beyond; the
    throttle wants 50/s from the latency. Every page ends answered; the workers back off
    together, so 429s stay a small share of the answers."""
    polite_site.reset()
    polite_site.limit_rate, polite_site.retry_after = 5, "1"
    try:
        t0 = time.monotonic()
        reports = crawl(redis_url, key_prefix, f"{polite_site.url}/limited?ms=20", 15, 2, 4,
                        throttle_start_delay=0.05)  # fmt: skip
        elapsed = time.monotonic() - t0
    finally:
        polite_site.limit_rate = 5
    ok = sum(r["statuses"].get("200", 0) for r in reports)
    limited = sum(r["statuses"].get("429", 0) for r in reports)
    waits = sum(r["waits"] for r in reports)
    state = Throttle(redis.Redis.from_url(redis_url),
                     Settings(redis_url=redis_url, key_prefix=key_prefix)).state("polite")  # fmt: skip
    print(f"\n{ok} pages in {elapsed:.1f}s, {limited} answers 429, {waits} waits; {state}")
    assert ok == 30  # nothing failed
    assert state is not None and state["backoffs"] >= 1
    assert waits >= 1  # Retry-After paused the site: requests were told to come back
    # one backoff per overshoot, then the floor holds: 9 of 39 answers here on an idle machine
    assert limited <= ok / 2
