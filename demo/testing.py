"""`DemoServer`: the demo platform in a subprocess on a free port, for tests and benchmarks.

    with DemoServer(size="tiny", features=["login"]) as demo:
        requests.get(demo.url + "/pc/feed")
        demo.stats()["total"]

The server runs as `python -m demo --config <tmp.json>` with every setting written out, so
`DEMO_*` variables of the calling process cannot change it. It is stopped on exit, on
`stop()`, and at interpreter exit as a last resort.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

from demo.config import DemoConfig
from demo.guard.cert import make_certificates
from utils.servers import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent


class ServerProcess:
    """A test server running in a process of its own: its address, its log, stopping it, the
    context manager and its admin calls. Subclasses set `proc`, `_tmp` (the directory holding
    `server.log`), `host` and `port`, and implement `start()`; `bench.replay_site.ReplayServer`
    is the other one."""

    proc: subprocess.Popen[bytes] | None = None
    _tmp: Path | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"  # type: ignore[attr-defined]

    def url_for(self, path: str) -> str:
        return self.url + path

    @property
    def log_path(self) -> Path | None:
        return self._tmp / "server.log" if self._tmp else None

    def log(self) -> str:
        path = self.log_path
        return path.read_text(errors="replace") if path and path.exists() else ""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        atexit.unregister(self.stop)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _admin(self, method: str, path: str) -> dict[str, Any]:
        req = urllib.request.Request(
            self.url + path, method=method, data=b"" if method == "POST" else None
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def reset(self) -> None:
        """POST /admin/reset: zero counters, forget rate windows and bans."""
        self._admin("POST", "/admin/reset")


class DemoServer(ServerProcess):
    """Start/stop a demo server process; `.url`, `.stats()`, `.reset()`, `.expected()`."""

    def __init__(
        self,
        config: DemoConfig | None = None,
        *,
        port: int | None = None,
        startup_timeout: float = 20.0,
        guard: bool = False,
        **overrides: Any,
    ) -> None:
        base = (config or DemoConfig()).model_dump(mode="json")
        if overrides:
            unknown = set(overrides) - set(DemoConfig.model_fields)
            if unknown:
                raise TypeError(f"unknown DemoConfig fields: {', '.join(sorted(unknown))}")
            if "size" in overrides:
                for name in ("users", "posts_per_user", "comments_per_post"):
                    base.pop(name, None)  # let the new size fill what is not overridden
            base.update(overrides)
        self.config = DemoConfig(**base)
        self._fixed_port = port
        self.startup_timeout = startup_timeout
        self.guard = guard  # the guarded front too (TLS + HTTP/2, browsers only): `guard_url`
        self.guard_ca: Path | None = None  # the CA its certificate is signed by, to trust
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp: Path | None = None

    # --- addresses ----------------------------------------------------------------------
    @property
    def host(self) -> str:
        return self.config.host

    @property
    def port(self) -> int:
        return self.config.port

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> DemoServer:
        if self.proc is not None:
            return self
        self._tmp = Path(tempfile.mkdtemp(prefix="demo-server-"))
        atexit.register(self.stop)
        if self.guard:
            made = make_certificates(self._tmp / "guard")
            self.guard_ca = made.ca
            self.config = self.config.model_copy(
                update={
                    "guard_port": free_port(self.config.host),
                    "guard_cert": str(made.cert),
                    "guard_key": str(made.key),
                }
            )
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            port = self._fixed_port or free_port(self.config.host)
            self.config = self.config.model_copy(update={"port": port})
            if self._launch():
                return self
            if attempt == attempts - 1 or "address already in use" not in self.log().lower():
                break
        log = self.log()
        self.stop()
        raise RuntimeError(f"demo server did not become ready; its log:\n{log[-4000:]}")

    def _launch(self) -> bool:
        assert self._tmp is not None
        cfg_path = self._tmp / "config.json"
        cfg_path.write_text(json.dumps(self.config.model_dump(mode="json")))
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEMO_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        with open(self._tmp / "server.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "demo", "--config", str(cfg_path)],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as resp:
                    if resp.status == 200 and self._guard_listening():
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        return False

    def _guard_listening(self) -> bool:
        if self.config.guard_port is None:
            return True
        try:
            socket.create_connection((self.host, self.config.guard_port), timeout=1).close()
        except OSError:
            return False
        return True

    @property
    def guard_url(self) -> str:
        """The guarded front's base URL (`DemoServer(guard=True)`)."""
        if self.config.guard_port is None:
            raise RuntimeError("this demo server has no guarded front: DemoServer(guard=True)")
        return f"https://{self.host}:{self.config.guard_port}"

    # --- admin --------------------------------------------------------------------------
    def set_mix(self, rendered: list[str]) -> list[str]:
        """POST /admin/mix: which mix page types are filled by script from now on."""
        return self._admin("POST", "/admin/mix?rendered=" + ",".join(rendered))["rendered"]

    def stats(self, window: float | None = None, timestamps: bool = False) -> dict[str, Any]:
        """GET /admin/stats (see README "Admin")."""
        query = []
        if window is not None:
            query.append(f"window={window}")
        if timestamps:
            query.append("timestamps=1")
        return self._admin("GET", "/admin/stats" + ("?" + "&".join(query) if query else ""))

    def expected(self, app_page_size: int | None = None) -> dict[str, Any]:
        """expected_counts() for this server's sizes and page sizes."""
        return self.config.expected_counts(app_page_size)

    def __repr__(self) -> str:
        state = "running" if self.proc is not None else "stopped"
        return f"<DemoServer {self.url} {state}>"
