"""Everything one server process keeps between requests, hung off the aiohttp app."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from aiohttp import web

from demo.auth import Captchas, UseTracker
from demo.changes import ChangeModel, DemoClock, parse_classes, parse_hours
from demo.config import DemoConfig
from demo.data import Dataset
from demo.limits import RateLimiter
from demo.stats import Stats


@dataclass
class DemoState:
    config: DemoConfig
    data: Dataset = field(init=False)
    stats: Stats = field(init=False)
    limiter: RateLimiter = field(init=False)
    devices: UseTracker = field(init=False)
    sessions: UseTracker = field(init=False)
    captchas: Captchas = field(init=False)
    soft_fail_rng: random.Random = field(init=False)
    latency_rng: random.Random = field(init=False)
    mix_rendered: set[str] = field(init=False)  # the `mix` page types served for rendering
    clock: DemoClock = field(init=False)
    changes: ChangeModel | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        c = self.config
        self.data = Dataset(c.seed, c.users, c.posts_per_user, c.comments_per_post)
        self.stats = Stats(c.stats_window_s)
        self.limiter = RateLimiter(
            c.rate_limit_requests,
            c.rate_limit_window_s,
            c.rate_limit_ban_after,
            c.rate_limit_strike_window_s,
            c.rate_limit_ban_s,
        )
        self.devices = UseTracker(c.device_ban_rpm)
        self.sessions = UseTracker(c.session_ban_rpm)
        self.captchas = Captchas(c.captcha_length, c.captcha_ttl_s, c.seed)
        seed = c.seed if c.soft_fail_seed is None else c.soft_fail_seed
        self.soft_fail_rng = random.Random(f"{seed}/soft_fail")
        self.latency_rng = random.Random(f"{c.seed}/latency")
        self.mix_rendered = set(c.mix_rendered)
        self.clock = DemoClock(c.change_clock, c.change_start, c.change_clock_speed)
        if c.changes:
            model = ChangeModel(
                c.seed,
                parse_classes(c.change_classes),
                parse_hours(c.change_hours),
                c.change_quiet,
                c.change_start,
            )
            self.changes = model
            self.data.likes_gained = lambda n: model.count(n, self.clock.now())

    def reset(self) -> None:
        """Clear counters, windows and bans; keep registered devices, sessions and captchas."""
        self.stats.reset()
        self.limiter.reset()
        self.devices.reset()
        self.sessions.reset()


STATE = web.AppKey("demo_state", DemoState)


def state_of(request: web.Request) -> DemoState:
    return request.app[STATE]
