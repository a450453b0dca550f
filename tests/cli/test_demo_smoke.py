"""The README's first command, as a user runs it: `./control.sh demo`, then `./control.sh stop`.

Runs in its own var/ directory with its own embedded-Redis, Flower and demo ports, so it
neither sees nor disturbs anything else on the machine.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from config import ROOT
from utils.servers import free_port

pytestmark = pytest.mark.integration


def test_control_sh_demo_runs_the_demo_crawl_and_stop_stops_everything(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CHAINCRAWL_", "DEMO_", "FLOWER_")) and k not in ("REDIS_URL", "BROKER_URL", "TESTSITE_URL")}  # fmt: skip
    env.update(
        CHAINCRAWL_VAR_DIR=str(tmp_path / "var"),
        CHAINCRAWL_EMBEDDED_REDIS_PORT=str(free_port()),
        CHAINCRAWL_FLOWER_PORT=str(free_port()),
        COLUMNS="160",
    )
    demo_port = str(free_port())
    cmd = [
        str(ROOT / "control.sh"),
        "demo",
        "--size",
        "tiny",
        "--port",
        demo_port,
        "--workers",
        "1",
    ]
    try:
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
        text = out.stdout + out.stderr
        assert out.returncode == 0, text[-4000:]
        assert "80 of 80 produced" in text
        assert "items demo.comment" in text and "60 (the demo site has 60)" in text
        assert "pages/s" in text and "flower" in text
        secret = (tmp_path / "var" / "flower.secret").read_text().strip()
        assert secret and secret not in text  # the password is in a file, never printed
    finally:
        stop = subprocess.run([str(ROOT / "control.sh"), "stop"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=180)  # fmt: skip
    assert stop.returncode == 0, stop.stdout + stop.stderr
    for name in ("worker-w1", "flower", "demo-site", "embedded redis"):
        assert name in stop.stdout
    assert not list((tmp_path / "var" / "run").glob("*.pid"))
