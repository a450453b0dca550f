"""demo secure: the pc pages behind the guarded front, which answers browsers only.

The guarded front (demo/README.md, "The guarded front") serves the platform over TLS and
HTTP/2 and refuses (403, `{"error": "fingerprint"}`) a client whose handshake, HTTP/2 frames
or headers are not those of the browser its user agent names: urllib3 and requests are
refused whatever user agent they send. These endpoints send through the impersonating
fetcher (`fetcher="impersonate"`), so the lent user agent's browser is what the site sees.
`DEMO_GUARD_URL` says where the front is; its certificate's CA is `CHAINCRAWL_CA_BUNDLE`.
"""

from __future__ import annotations

import os
from typing import Any

from base_task import Context, Response
from sites.demo import check_html

FETCHER = "impersonate"


def guard_url() -> str:
    """Where the guarded front lives (`python -m demo --guard-port 8743`)."""
    return os.environ.get("DEMO_GUARD_URL", "https://127.0.0.1:8743").rstrip("/")


def get_guarded(ctx: Context, path: str, **params: Any) -> Response:
    """A pc page through the guarded front, or the typed error of what came back (a refused
    fingerprint is a 403: `Forbidden`)."""
    resp = ctx.get(guard_url() + path, params=params or None, ok_statuses=(401,))
    check_html(resp)
    return resp
