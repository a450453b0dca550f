"""The alerts' notification channel: a webhook POST per notice, retried until it is taken."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson
import requests

from monitor.alert_rules import AlertConfig

log = logging.getLogger("chaincrawl.alerts")

Poster = Callable[[str, Mapping[str, Any], Mapping[str, str], float], None]


def post_json(
    url: str, payload: Mapping[str, Any], headers: Mapping[str, str], timeout: float
) -> None:
    resp = requests.post(
        url,
        json=payload,
        timeout=timeout,
        headers={"User-Agent": "chaincrawl-alerts", **headers},
    )
    if resp.status_code >= 300:
        raise RuntimeError(f"webhook answered HTTP {resp.status_code}")


def webhook_host(url: str) -> str:
    """The webhook as a log line may name it: its URL may hold a token."""
    u = urlsplit(url)
    return (
        f"{u.scheme}://{u.hostname}{':' + str(u.port) if u.port else ''}"  # no credentials, no path
    )


def deliver(client: Any, queue: str, cfg: AlertConfig, post: Poster = post_json) -> int:
    """POST the notifications queued at `queue` in order; a failure stops this round and
    retries later (`cfg.max_attempts` in all)."""
    sent = 0
    if not cfg.webhook:
        client.delete(queue)  # log-only configuration: the log line was the notice
        return 0
    while True:
        raw = client.lpop(queue)
        if raw is None:
            return sent
        note = orjson.loads(raw)
        attempts = int(note.pop("attempts", 0))
        try:
            post(cfg.webhook, note, cfg.headers, cfg.timeout)
            sent += 1
        except Exception as exc:
            attempts += 1
            if attempts >= cfg.max_attempts:
                log.error(
                    "alert webhook %s failed %d times; dropping notice: %s (%s)",
                    webhook_host(cfg.webhook),
                    attempts,
                    note.get("summary"),
                    exc,
                )
                continue
            log.warning(
                "alert webhook %s failed (attempt %d): %s",
                webhook_host(cfg.webhook),
                attempts,
                exc,
            )
            client.lpush(queue, orjson.dumps({**note, "attempts": attempts}))
            return sent
