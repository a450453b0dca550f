"""Settings of the scheduling brain: change-driven re-crawls (`CHAINCRAWL_RECRAWL_*`) and
fleet-wide shares (`CHAINCRAWL_FLEET_*`).

Kept apart from `config.Settings` like the other areas. The fleet budget and its shares are
read by every worker (the gate and the resource pools obey them) and by `status` and the alert
evaluator; every process sharing a Redis must see the same values.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from settings.base import ChaincrawlSettings


class RecrawlSettings(ChaincrawlSettings):
    """`CHAINCRAWL_RECRAWL_*`: the change-driven scheduler (scheduling/recrawl)."""

    model_config = SettingsConfigDict(env_prefix="CHAINCRAWL_RECRAWL_")

    clock: str = Field(
        "wall",
        description="The clock re-crawl planning reads: `wall`, or `redis` (a simulated time "
        "held in the state store under `<prefix>:clock`, moved forward by a test or benchmark).",
    )
    refresh: float = Field(
        5.0,
        gt=0,
        description="Seconds a worker keeps its view of the watched item types before reading "
        "it again (a new `by_change` entry is picked up within this time).",
    )


class FleetSettings(ChaincrawlSettings):
    """`CHAINCRAWL_FLEET_*`: a fleet-wide budget shared between sites (scheduling/shares.py)."""

    model_config = SettingsConfigDict(env_prefix="CHAINCRAWL_FLEET_")

    budget: str = Field(
        "",
        description="The fleet-wide budget, `tasks=32, rate=40/s, cookie=16, proxy=20` (tasks "
        "in flight, requests per second, leases of a resource kind out at once), or a YAML file "
        "holding `budget:` and `shares:`. Empty: no fleet budget (each site has its own limits).",
    )
    shares: str = Field(
        "",
        description="Each site's weight and priority, `demo=1; news=2,priority=7` (weight 1 and "
        "the default priority when not given). A site not named takes no part in the fleet budget.",
    )
    want_ttl: float = Field(
        10.0,
        gt=0,
        description="Seconds a task refused by the fleet budget counts as waiting (its site's "
        "demand): longer than the countdown of a refused task.",
    )
    refresh: float = Field(
        0.5,
        gt=0,
        description="Seconds a worker reuses a site's rate share before reading it again.",
    )


def get_recrawl_settings() -> RecrawlSettings:
    return RecrawlSettings.current()


def get_fleet_settings() -> FleetSettings:
    return FleetSettings.current()
