"""Server-side state of the login and device protocols: captchas, sessions, devices."""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass, field

from demo import captcha
from demo.limits import SlidingWindow

MAX_PENDING_CAPTCHAS = 100_000


@dataclass
class _Holder:
    """A session or device: who it is, its recent uses, whether it is banned."""

    name: str
    uses: SlidingWindow = field(default_factory=lambda: SlidingWindow(60.0))
    banned: bool = False


class UseTracker:
    """Registered tokens with a per-minute use limit (`rpm`, 0 = unlimited) that bans."""

    def __init__(self, rpm: int) -> None:
        self.rpm = rpm
        self.holders: dict[str, _Holder] = {}
        self.bans_total = 0

    def add(self, token: str, name: str) -> None:
        self.holders[token] = _Holder(name)

    def use(self, token: str | None, now: float) -> str:
        """Count one use; the verdict is "ok", "unknown" or "banned"."""
        holder = self.holders.get(token) if token else None
        if holder is None:
            return "unknown"
        if holder.banned:
            return "banned"
        if holder.uses.add(now) > self.rpm > 0:
            holder.banned = True
            self.bans_total += 1
            return "banned"
        return "ok"

    def reset(self) -> None:
        """Forget uses and bans, keep the registrations."""
        for holder in self.holders.values():
            holder.banned = False
            holder.uses.clear()
        self.bans_total = 0

    def summary(self, list_limit: int = 1000) -> dict[str, object]:
        banned = [t for t, h in self.holders.items() if h.banned]
        return {
            "registered": len(self.holders),
            "banned": len(banned),
            "bans_total": self.bans_total,
            "ids": list(self.holders)[:list_limit],
            "banned_ids": banned[:list_limit],
        }


class Captchas:
    """Single-use challenges with a time to live."""

    def __init__(self, length: int, ttl_s: float, seed: int) -> None:
        self.length = length
        self.ttl_s = ttl_s
        self.rng = random.Random(f"{seed}/captcha")
        self.pending: dict[str, tuple[str, float]] = {}

    def issue(self, now: float) -> tuple[str, str]:
        """(captcha_id, answer)."""
        if len(self.pending) >= MAX_PENDING_CAPTCHAS:
            self.pending = {k: v for k, v in self.pending.items() if v[1] > now}
            while len(self.pending) >= MAX_PENDING_CAPTCHAS:
                self.pending.pop(next(iter(self.pending)))
        cid = secrets.token_hex(8)
        answer = captcha.random_answer(self.rng, self.length)
        self.pending[cid] = (answer, now + self.ttl_s)
        return cid, answer

    def check(self, cid: str, answer: str, now: float) -> bool:
        """True if right; the captcha is consumed either way."""
        entry = self.pending.pop(cid, None)
        return entry is not None and entry[1] > now and entry[0] == answer.strip()


def new_token(prefix: str = "") -> str:
    return prefix + secrets.token_hex(16 if not prefix else 8)
