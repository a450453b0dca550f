"""The app API's request signature (reference implementation of the README algorithm)."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping

DEFAULT_SIGN_KEY = "demo-sign-key"


def _items(params: Mapping[str, object] | Iterable[tuple[str, object]]) -> list[tuple[str, str]]:
    pairs = params.items() if isinstance(params, Mapping) else params
    return sorted((str(k), str(v)) for k, v in pairs if k != "sign")


def sign(params: Mapping[str, object] | Iterable[tuple[str, object]], key: str) -> str:
    """hex(HMAC-SHA256(key, "k1=v1&k2=v2...")) cut to 32 chars; params sorted, `sign` left out."""
    msg = "&".join(f"{k}={v}" for k, v in _items(params))
    return hmac.new(key.encode(), msg.encode(), hashlib.sha256).hexdigest()[:32]


def signed(
    params: Mapping[str, object], key: str = DEFAULT_SIGN_KEY, ts: int | None = None
) -> dict[str, str]:
    """`params` plus `ts` (now unless given) and `sign`: ready to send as a query string."""
    out = {str(k): str(v) for k, v in params.items() if k != "sign"}
    out["ts"] = str(int(time.time()) if ts is None else ts)
    out["sign"] = sign(out, key)
    return out


def verify(
    params: Iterable[tuple[str, str]], key: str, skew_s: float, now: float | None = None
) -> str | None:
    """None when valid, else why not (the `detail` of a bad_sign answer)."""
    pairs = list(params)
    given = [v for k, v in pairs if k == "sign"]
    ts_values = [v for k, v in pairs if k == "ts"]
    if not given or not ts_values:
        return "missing ts or sign"
    try:
        ts = int(ts_values[0])
    except ValueError:
        return "ts is not an integer"
    if abs((time.time() if now is None else now) - ts) > skew_s:
        return "ts outside the allowed clock skew"
    if not hmac.compare_digest(given[0], sign(pairs, key)):
        return "signature mismatch"
    return None
