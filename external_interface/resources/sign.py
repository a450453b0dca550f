"""Request signatures: a per-site signer registry and the `sign` provider.

The provider runs last (after every other provider changed the request) and lets the site's
signer add its parameters. A site registers its signer factory when its modules load (workers
load every site at start):

    signers.add("demo", lambda site: HmacQuerySigner(sign_key("demo", DEFAULT)))

Keys come from env `CHAINCRAWL_SIGN_KEY_<SITE>` (never from task arguments), falling back to
the default the site module registered (for the demo: its documented `demo-sign-key`).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from config import SITE_VARS, site_env
from exceptions import ConfigError
from external_interface.resources.base import Outcome, OutgoingRequest, TaskState, providers
from utils.registry import Registry


class Signer(Protocol):
    def sign(self, req: OutgoingRequest, now: float | None = None) -> None: ...


def sign_key(site: str, default: str | None = None) -> str:
    key = site_env("sign_key", site) or default
    if not key:
        raise ConfigError(f"no sign key for site {site}: set {SITE_VARS['sign_key'].name(site)}")
    return key


def query_pairs(url: str, params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every query parameter the server will decode: the URL's own query plus `params`, as
    strings the way `requests` sends them (None dropped, sequences repeated)."""
    pairs = parse_qsl(urlsplit(url).query, keep_blank_values=True)
    for k, v in params.items():
        values: Iterable[Any] = v if isinstance(v, list | tuple) else [v]
        for x in values:
            if x is None:
                continue
            pairs.append((str(k), x.decode() if isinstance(x, bytes) else str(x)))
    return pairs


class HmacQuerySigner:
    """hex(HMAC(key, "k1=v1&k2=v2")) over all query parameters sorted by name then value, the
    signature itself left out, cut to `length` hex chars; adds a unix-seconds timestamp first."""

    def __init__(
        self,
        key: str,
        *,
        ts_param: str = "ts",
        sign_param: str = "sign",
        length: int = 32,
        digest: Callable[..., Any] = hashlib.sha256,
    ) -> None:
        self._key = key.encode()
        self.ts_param, self.sign_param = ts_param, sign_param
        self.length, self.digest = length, digest

    def __repr__(self) -> str:
        return f"HmacQuerySigner(ts={self.ts_param!r}, sign={self.sign_param!r})"

    def signature(self, pairs: Iterable[tuple[str, str]]) -> str:
        msg = "&".join(f"{k}={v}" for k, v in sorted(p for p in pairs if p[0] != self.sign_param))
        return hmac.new(self._key, msg.encode(), self.digest).hexdigest()[: self.length]

    def sign(self, req: OutgoingRequest, now: float | None = None) -> None:
        req.params.pop(self.sign_param, None)
        req.params[self.ts_param] = str(int(time.time() if now is None else now))
        req.params[self.sign_param] = self.signature(query_pairs(req.url, req.params))


signers: Registry[Callable[[str], Signer]] = Registry("signer")


class SignProvider:
    """Signs every request of a site with that site's signer (it must be registered)."""

    kind = "sign"

    def __init__(self, site: str, platform: str = "", signer: Signer | None = None) -> None:
        self.site, self.platform = site, platform
        self._signer = signer

    @property
    def signer(self) -> Signer:
        if self._signer is None:
            if self.site not in signers:
                raise ConfigError(
                    f"endpoint of site {self.site} wants 'sign' but no signer is registered"
                )
            self._signer = signers.get(self.site)(self.site)
        return self._signer

    def prepare(self, req: OutgoingRequest, task: TaskState) -> None:
        self.signer.sign(req)

    def feedback(self, req: OutgoingRequest, outcome: Outcome, task: TaskState) -> None:
        return None


providers.add("sign", lambda site, platform: SignProvider(site, platform))
