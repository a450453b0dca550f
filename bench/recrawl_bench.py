"""Re-crawls that follow change against a fixed interval, for the same budget.

    .venv/bin/python -m bench.recrawl_bench                        # 1,000 posts, 14 days, 3 seeds
    .venv/bin/python -m bench.recrawl_bench --posts 500 --days 7 --seeds 1
    .venv/bin/python -m bench.recrawl_bench --budget 3000 --alpha 0.75

Starts its own redis-server and a demo server with the change generator on (`changes`, a
manual clock: demo/README.md 9a), then runs simulated days in ticks (`--tick`, 5 minutes)
without a sleep: at each tick the driver moves the demo's clock and the scheduler's simulated
clock (`utils.clock.SimClock`) to the same time, and two schedulers fetch posts from the demo
over HTTP with the same budget of pages a day:

- fixed: every post every `posts / budget` days, its phase spread at random;
- adaptive: the change model (scheduling/recrawl), exactly as the workers run it: the keys the
  watch's history says are due, within its allowance (`History.dispatch`), their fetched likes
  marked in its dedup store and recorded as visits (`WatchStores.observe`, the outbox hook's code).

Both start from one full crawl (every post fetched once at the start, not counted). After
the warm-up (`--warmup`, 2 days) every fetch counts: *changes per fetch* is the share of fetches
whose likes differ from what that scheduler saw last; the *delay* of a change event (the
demo's own events, `demo.changes.ChangeModel`) is the time to the scheduler's first fetch of
that post after it, and an event no fetch followed before the end counts until the end. The
run is deterministic: the figures depend on the seed, not on how busy the machine is.
"""

from __future__ import annotations

import argparse
import bisect
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
import requests

from demo.changes import ChangeModel, parse_classes, parse_hours
from demo.config import DemoConfig
from demo.data import BASE_TS
from demo.testing import DemoServer
from scheduling.recrawl import Knobs, Watch, WatchStores
from scheduling.recrawl.model import DAY, HOUR
from utils.clock import SimClock
from utils.servers import RedisServer

H5_UA = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) Mobile/15E148 Safari/604.1"
PREFIX = "rb"


@dataclass
class Scheme:
    """One scheduler's fetches: per post the times it fetched and the likes it saw last."""

    name: str
    fetches: int = 0  # after the warm-up
    found: int = 0  # of them, a value other than the last one seen
    times: dict[str, list[float]] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)

    def saw(self, pid: str, t: float, likes: int, counted: bool) -> None:
        if counted:
            self.fetches += 1
            self.found += int(pid in self.last and self.last[pid] != likes)
        self.last[pid] = likes
        self.times.setdefault(pid, []).append(t)


@dataclass
class Result:
    seed: int
    fixed: Scheme
    adaptive: Scheme
    delay: dict[str, float]  # mean delay (hours) per scheme
    events: int
    days: float
    hot_hours: list[int]
    visits_by_class: dict[str, dict[float, float]]  # scheme -> class rate -> visits/post/day


def fetch(s: requests.Session, base: str, pid: str) -> int:
    r = s.get(f"{base}/h5/api/post/{pid}", headers={"User-Agent": H5_UA}, timeout=10)
    r.raise_for_status()
    return int(r.json()["data"]["likes"])


def ticks(start: float, end: float, step: float) -> Iterator[float]:
    t = start
    while t < end:
        yield t
        t += step


def run_once(args: argparse.Namespace, seed: int, redis_url: str) -> Result:
    users = args.posts // args.posts_per_user
    cfg = DemoConfig(
        size="tiny",
        users=users,
        posts_per_user=args.posts_per_user,
        comments_per_post=0,
        seed=seed,
        changes=True,
        change_clock="manual",
        change_classes=args.classes,
        change_hours=args.hours,
        change_quiet=args.quiet,
    )
    pids = [f"p{n}" for n in range(1, users * args.posts_per_user + 1)]
    truth = ChangeModel(
        seed, parse_classes(args.classes), parse_hours(args.hours), args.quiet, BASE_TS
    )
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    clock = SimClock(client, f"{PREFIX}:clock")
    budget = args.budget or 2.0 * len(pids)
    knobs = Knobs(
        budget=budget,
        min_interval=args.min_interval * 60,
        max_interval=args.max_interval * DAY,
        alpha=args.alpha,
    )
    watch = Watch("bench-posts", "demo", "demo.post", "post_id", "post_id", ("likes",), knobs)
    stores = WatchStores(client, PREFIX, watch)
    history = stores.history
    fixed, adaptive = Scheme("fixed"), Scheme("adaptive")
    rng = random.Random(seed)
    period = len(pids) / budget * DAY
    phase = {pid: rng.random() * period for pid in pids}
    start, warm, end = BASE_TS, BASE_TS + args.warmup * DAY, BASE_TS + args.days * DAY
    step = args.tick * 60
    with DemoServer(cfg) as demo, requests.Session() as s:

        def move(t: float) -> None:
            s.post(f"{demo.url}/admin/clock", json={"now": t}).raise_for_status()
            clock.set(t)

        move(start)
        first: list[dict[str, Any]] = [
            {"post_id": pid, "likes": fetch(s, demo.url, pid)} for pid in pids
        ]
        for it in first:  # one full crawl: both know every post
            fixed.saw(it["post_id"], start, it["likes"], False)
            adaptive.saw(it["post_id"], start, it["likes"], False)
        stores.observe(first, start)
        next_fixed = {pid: start + phase[pid] for pid in pids}
        for t in ticks(start + step, end, step):
            move(t)
            counted = t >= warm
            for pid in pids:
                if next_fixed[pid] <= t:
                    fixed.saw(pid, t, fetch(s, demo.url, pid), counted)
                    next_fixed[pid] += period
            sent, _ = history.dispatch(t)
            items: list[dict[str, Any]] = [
                {"post_id": pid, "likes": fetch(s, demo.url, pid)} for pid in sent
            ]
            for it in items:
                adaptive.saw(it["post_id"], t, it["likes"], counted)
            stores.observe(items, clock.now())
    hot = history.totals().profile.hot_hours()
    client.close()
    delays: dict[str, float] = {}
    events = 0
    for scheme in (fixed, adaptive):
        total, n = 0.0, 0
        for i, pid in enumerate(pids, start=1):
            times = scheme.times[pid]
            for e in truth.events(i, warm, end):
                k = bisect.bisect_left(times, e)
                total += (times[k] if k < len(times) else end) - e
                n += 1
        delays[scheme.name] = total / n / HOUR if n else 0.0
        events = n
    by_class: dict[str, dict[float, float]] = {}
    span = (end - warm) / DAY
    for scheme in (fixed, adaptive):
        per: dict[float, list[int]] = {}
        for i, pid in enumerate(pids, start=1):
            n = sum(1 for t in scheme.times[pid] if t >= warm)
            per.setdefault(truth.class_of(i).per_day, []).append(n)
        by_class[scheme.name] = {r: statistics.mean(v) / span for r, v in sorted(per.items())}
    return Result(seed, fixed, adaptive, delays, events, span, hot, by_class)


def report(results: list[Result], args: argparse.Namespace) -> None:
    print(
        f"\n{args.posts} posts, budget {args.budget or 2 * args.posts:g} pages/day, "
        f"{args.days:g} days ({args.warmup:g} of warm-up), tick {args.tick:g} min, "
        f"classes {args.classes!r}, busy hours {args.hours}, alpha {args.alpha}"
    )
    head = (
        f"{'seed':>4} {'scheme':<9} {'fetches':>8} {'per day':>8} {'changes':>8} "
        f"{'chg/fetch':>9} {'delay h':>8}  visits/post/day by class (changes/day)"
    )
    print(head)
    print("-" * len(head))
    ratios_hit, ratios_delay = [], []
    for r in results:
        for sch in (r.fixed, r.adaptive):
            classes = "  ".join(
                f"{rate:g}:{v:.2f}" for rate, v in r.visits_by_class[sch.name].items()
            )
            print(
                f"{r.seed:>4} {sch.name:<9} {sch.fetches:>8} {sch.fetches / r.days:>8.0f} "
                f"{sch.found:>8} {sch.found / sch.fetches:>9.3f} "
                f"{r.delay[sch.name]:>8.2f}  {classes}"
            )
        hit = (r.adaptive.found / r.adaptive.fetches) / (r.fixed.found / r.fixed.fetches)
        ratios_hit.append(hit)
        ratios_delay.append(r.delay["adaptive"] / r.delay["fixed"])
        print(
            f"{r.seed:>4} ratio     adaptive/fixed: changes per fetch {hit:.2f}x, delay "
            f"{ratios_delay[-1]:.2f}x ({r.events} change events; learned busy hours {r.hot_hours})"
        )
    print(
        f"\nmedian over {len(results)} seed(s): changes per fetch "
        f"{statistics.median(ratios_hit):.2f}x, delay {statistics.median(ratios_delay):.2f}x "
        f"(goal: >= 2x and <= 0.5x)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--posts", type=int, default=1000)
    p.add_argument("--posts-per-user", type=int, default=10)
    p.add_argument("--days", type=float, default=14.0)
    p.add_argument("--warmup", type=float, default=2.0, help="days not counted (learning)")
    p.add_argument("--tick", type=float, default=5.0, help="minutes between two looks")
    p.add_argument("--budget", type=float, default=0.0, help="pages a day (default 2 per post)")
    p.add_argument("--alpha", type=float, default=0.9)
    p.add_argument("--min-interval", type=float, default=10.0, help="minutes")
    p.add_argument("--max-interval", type=float, default=7.0, help="days")
    p.add_argument("--classes", default=DemoConfig.model_fields["change_classes"].default)
    p.add_argument("--hours", default=DemoConfig.model_fields["change_hours"].default)
    p.add_argument("--quiet", type=float, default=DemoConfig.model_fields["change_quiet"].default)
    p.add_argument("--seeds", type=int, default=3, help="runs, seeds 42, 43, ...")
    args = p.parse_args(argv)
    results = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, RedisServer(tmp, appendonly=False) as srv:
        for seed in range(42, 42 + args.seeds):
            results.append(run_once(args, seed, srv.url))
            print(f"seed {seed} done ({time.monotonic() - started:.0f}s)", flush=True)
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
