"""What every HTTP fetcher sends the same way: the URL with its query, the body's encoding,
and error text without a proxy's credentials."""

from __future__ import annotations

import json as stdjson
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode


def full_url(url: str, params: Mapping[str, Any] | None = None) -> str:
    """The URL a request goes to: `params` (None values left out) appended to its query."""
    if params:
        query = urlencode([(k, v) for k, v in params.items() if v is not None], doseq=True)
        if query:
            url += ("&" if "?" in url else "?") + query
    return url


def encode_body(data: Any, json: Any) -> tuple[Any, str | None]:
    """The body as requests would send it, and the Content-Type it implies (None: the
    caller's own): `json` serialized, a mapping or a list of pairs form-encoded, bytes or
    text as they are."""
    if json is not None and data is None:
        return stdjson.dumps(json, allow_nan=False).encode(), "application/json"
    if isinstance(data, Mapping | list | tuple):
        pairs = list(data.items()) if isinstance(data, Mapping) else data
        return urlencode(pairs, doseq=True), "application/x-www-form-urlencoded"
    return data, None


def short_error(exc: BaseException) -> str:
    """Exception text without URLs' credentials (proxy URLs may carry user:pass)."""
    return re.sub(r"//[^/@\s]+@", "//***@", str(exc))[:200]
