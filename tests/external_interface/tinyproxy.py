"""tinyproxy with Basic credentials on a free port, for requests that need a tunnel.

The suite's own forward proxy (`demo.proxy_farm.ForwardProxy`) speaks absolute-URI HTTP only;
an https site (the demo's guarded front) needs CONNECT, which tinyproxy does. `needs_tinyproxy`
skips a test, naming the package, where tinyproxy is not installed (CI installs it).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Self

import pytest

from utils.servers import free_port, stop_process, wait_for_port

needs_tinyproxy = pytest.mark.skipif(
    shutil.which("tinyproxy") is None, reason="tinyproxy not installed (apt-get install tinyproxy)"
)


class Tinyproxy:
    """`with Tinyproxy("user", "pass") as p:` a proxy at `p.url` (credentials in it)."""

    def __init__(self, user: str, password: str, host: str = "127.0.0.1") -> None:
        self.user, self.password, self.host = user, password, host
        self.port = free_port(host)
        self._dir = Path(tempfile.mkdtemp(prefix="tinyproxy-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.user}:{self.password}@{self.host}:{self.port}"

    def start(self, timeout: float = 10) -> Self:
        conf = self._dir / "tinyproxy.conf"
        conf.write_text(
            f"Port {self.port}\nListen {self.host}\nTimeout 30\nMaxClients 100\n"
            f'LogLevel Connect\nLogFile "{self._dir / "log"}"\n'
            f"BasicAuth {self.user} {self.password}\nDisableViaHeader Yes\n"
        )
        out = open(self._dir / "out", "wb")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(["tinyproxy", "-d", "-c", str(conf)], stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            wait_for_port(self.port, self.host, timeout)
        except TimeoutError:
            said = (self._dir / "out").read_text(errors="replace")
            self.stop()
            raise RuntimeError(f"tinyproxy did not start: {said}") from None
        return self

    def tunnels(self) -> int:
        """CONNECT requests it received (authorized or not)."""
        log = self._dir / "log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return sum(1 for line in text.splitlines() if "): CONNECT " in line)

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
