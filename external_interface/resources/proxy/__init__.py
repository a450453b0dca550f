"""Proxies: a global pool scored by every request, a channel pool per site lending them
exclusively, validators, harvesters, and the providers the fetch layer calls (docs/proxy.md).

    models.py    ProxyAddress, Event, classify, the pure score rule next_score
    pool.py      GlobalPool: the three indexes, URLs, the raw queue, atomic scoring (pool.lua)
    select.py    Selector (haipproxy's relaxing selection), Rotation (round-robin / greedy)
    channel.py   ChannelPool: a site's proxies on the lease engine; settle()
    judge.py     judge_outcome, ban_hold: what an answer says about the proxy, for a site
    validate.py  ProxyChecker, ProxyValidator, SiteValidator
    sources.py   harvesters: PageSource, FileSource, ApiSource; harvest()
    provider.py  the providers registered in external_interface.resources.base.providers
    tasks.py     Celery tasks on the `resources` queue, PROXY_BEAT_SCHEDULE (the worker imports it)

Importing this package registers the providers.
"""

from __future__ import annotations

from external_interface.resources.proxy.channel import (
    ChannelPool,
    ProxyLease,
    channel_stats,
    channels,
    settle,
)
from external_interface.resources.proxy.judge import avoided_proxies, ban_hold, judge_outcome
from external_interface.resources.proxy.models import (
    Event,
    ProxyAddress,
    classify,
    next_score,
    redact,
)
from external_interface.resources.proxy.pool import GlobalPool, ProxyKeys
from external_interface.resources.proxy.provider import (
    ChannelProxyProvider,
    RotationProxyProvider,
    make_provider,
    reset_providers,
)
from external_interface.resources.proxy.select import Rotation, Selection, Selector
from settings.proxy import ProxySettings

__all__ = [
    "ChannelPool",
    "ChannelProxyProvider",
    "Event",
    "GlobalPool",
    "ProxyAddress",
    "ProxyKeys",
    "ProxyLease",
    "ProxySettings",
    "Rotation",
    "RotationProxyProvider",
    "Selection",
    "Selector",
    "avoided_proxies",
    "ban_hold",
    "channel_stats",
    "channels",
    "classify",
    "judge_outcome",
    "make_provider",
    "next_score",
    "redact",
    "reset_providers",
    "settle",
]
