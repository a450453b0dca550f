"""Site accounts for login chains: read from configuration, handed out round-robin.

Accounts never travel in task arguments, items or logs: the login step asks `pick(site)` for
one at run time. Sources, first found wins:

1. env `CHAINCRAWL_ACCOUNTS_<SITE>`: `user:pass,user2:pass2` or a JSON object `{"user": "pass"}`
2. a file `<var_dir>/accounts/<site>.json` (JSON object) or `<site>.txt` (`user:pass` per line,
   `#` comments), so secrets can live outside the environment with 0600 permissions
3. defaults a site module registered with `register_defaults` (the demo's documented accounts)

Rotation is shared by every worker (a Redis counter); an account the site refused
(`disable`) is skipped for a while.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from config import get_settings, site_env
from exceptions import ConfigError
from utils.redis import get_redis


@dataclass(frozen=True)
class Account:
    username: str
    password: str = field(repr=False)

    def __str__(self) -> str:  # what logs may show
        return self.username


_defaults: dict[str, Callable[[], dict[str, str]]] = {}


def register_defaults(site: str, fn: Callable[[], dict[str, str]]) -> None:
    _defaults[site] = fn


def _parse(text: str) -> dict[str, str]:
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ConfigError("accounts JSON must be an object of user -> password")
        return {str(k): str(v) for k, v in data.items()}
    out = {}
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part or part.startswith("#"):
            continue
        user, sep, pw = part.partition(":")
        if not sep or not user:
            raise ConfigError("accounts must look like user:password (the entry is not shown)")
        out[user.strip()] = pw
    return out


def load(site: str, var_dir: Path | None = None) -> list[Account]:
    """Every configured account of `site`, in a stable order."""
    raw = site_env("accounts", site)
    table: dict[str, str] = {}
    if raw:
        table = _parse(raw)
    else:
        base = Path(var_dir or get_settings().var_dir) / "accounts"
        for name in (f"{site}.json", f"{site}.txt"):
            p = base / name
            if p.is_file():
                table = _parse(p.read_text())
                break
        else:
            if site in _defaults:
                table = _defaults[site]()
    return [Account(u, p) for u, p in table.items()]


class Accounts:
    """Round-robin over a site's accounts, skipping disabled ones; shared through Redis."""

    def __init__(
        self,
        site: str,
        *,
        rds: redis.Redis | None = None,
        prefix: str | None = None,
        accounts: list[Account] | None = None,
        disable_for: float = 600.0,
    ) -> None:
        self.site = site
        self._rds = rds
        self.prefix = prefix if prefix is not None else get_settings().key_prefix
        self._accounts = accounts
        self.disable_for = disable_for
        self.base = f"{self.prefix}:accounts:{site}"

    @property
    def rds(self) -> redis.Redis:
        return self._rds if self._rds is not None else get_redis()

    @property
    def all(self) -> list[Account]:
        if self._accounts is None:
            self._accounts = load(self.site)
        return self._accounts

    def pick(self) -> Account:
        """The next usable account; ConfigError when none is configured or all are disabled."""
        accts = self.all
        if not accts:
            raise ConfigError(
                f"no accounts for site {self.site}: set CHAINCRAWL_ACCOUNTS_{self.site.upper()} "
                f"or write var/accounts/{self.site}.json"
            )
        start = int(self.rds.incr(f"{self.base}:rr")) - 1
        pipe = self.rds.pipeline(transaction=False)
        for a in accts:
            pipe.exists(f"{self.base}:disabled:{a.username}")
        disabled = pipe.execute()
        for i in range(len(accts)):
            j = (start + i) % len(accts)
            if not disabled[j]:
                return accts[j]
        raise ConfigError(f"every account of site {self.site} was refused recently")

    def disable(self, account: Account, reason: str = "refused") -> None:
        """Skip an account for `disable_for` seconds (the site refused its credentials)."""
        self.rds.set(f"{self.base}:disabled:{account.username}", reason, ex=int(self.disable_for))
