"""A private RabbitMQ vhost for tests that run on the AMQP broker: the machine's RabbitMQ is
shared, so a test gets a vhost of its own (created with rabbitmqctl or the management API,
deleted afterwards) and never touches '/'. The `amqp_broker` fixture (tests/conftest.py)
yields its URL, or skips with the reason."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from settings.suite import get_suite_settings

AMQP_URL = get_suite_settings().test_amqp_url


def _add_vhost(vhost: str, user: str) -> list[str] | None:
    """Create the vhost with rabbitmqctl (directly, else `sudo -n`); the command used, or None."""
    exe = shutil.which("rabbitmqctl") or (
        "/usr/sbin/rabbitmqctl" if Path("/usr/sbin/rabbitmqctl").exists() else None
    )
    if exe is None:
        return None
    for prefix in ([], ["sudo", "-n"]):
        ctl = [*prefix, exe]
        try:
            r = subprocess.run([*ctl, "add_vhost", vhost], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            subprocess.run([*ctl, "set_permissions", "-p", vhost, user, ".*", ".*", ".*"],
                           check=True, capture_output=True, timeout=30)  # fmt: skip
            return ctl
    return None


class _Mgmt:
    """The RabbitMQ management HTTP API, where it is enabled (port 15672)."""

    def __init__(self, base: str, auth: tuple[str, str]) -> None:
        self.base, self.auth = base, auth

    @classmethod
    def find(cls) -> _Mgmt | None:
        import requests

        u = urlsplit(AMQP_URL)
        m = cls(f"http://{u.hostname or '127.0.0.1'}:15672/api",
                (u.username or "guest", u.password or "guest"))  # fmt: skip
        try:
            ok = requests.get(f"{m.base}/overview", auth=m.auth, timeout=3).status_code == 200
        except requests.RequestException:
            ok = False
        return m if ok else None

    def call(self, method: str, path: str, **kw: Any) -> None:
        import requests

        r = requests.request(method, f"{self.base}{path}", auth=self.auth, timeout=10, **kw)
        if r.status_code >= 400 and not (method == "DELETE" and r.status_code == 404):
            raise RuntimeError(
                f"RabbitMQ management {method} {path}: HTTP {r.status_code} {r.text}"
            )


def _amqp_reachable() -> bool:
    from kombu import Connection

    try:
        with Connection(AMQP_URL, connect_timeout=3) as c:
            c.ensure_connection(max_retries=1)
        return True
    except Exception:
        return False


@contextmanager
def private_vhost() -> Iterator[str]:
    """The broker URL of a fresh vhost of our own, deleted afterwards (skips with the reason)."""
    if not _amqp_reachable():
        pytest.skip(f"RabbitMQ not reachable at {AMQP_URL.split('@')[-1]}")
    user = urlsplit(AMQP_URL).username or "guest"
    vhost = f"cc-test-{uuid.uuid4().hex[:10]}"
    ctl = _add_vhost(vhost, user)
    mgmt = None if ctl else _Mgmt.find()
    if mgmt:
        mgmt.call("PUT", f"/vhosts/{vhost}")
        mgmt.call("PUT", f"/permissions/{vhost}/{user}",
                  json={"configure": ".*", "write": ".*", "read": ".*"})  # fmt: skip
    elif not ctl:
        pytest.skip(
            "RabbitMQ is reachable but neither rabbitmqctl nor the management API can create a "
            "private vhost; refusing to use the shared vhost '/'"
        )
    try:
        u = urlsplit(AMQP_URL)
        yield f"{u.scheme}://{u.netloc}/{vhost}"
    finally:
        if ctl:
            subprocess.run([*ctl, "delete_vhost", vhost], capture_output=True)
        elif mgmt:
            mgmt.call("DELETE", f"/vhosts/{vhost}")
