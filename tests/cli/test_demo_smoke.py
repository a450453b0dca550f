"""The README's first command, as a user runs it: `./control.sh demo`, then `./control.sh stop`.

Runs in its own var/ directory with its own embedded-Redis, Flower and demo ports, so it
neither sees nor disturbs anything else on the machine. The embedded Redis it starts is
private (docs/security.md): a generated password the CLI and the workers read from
`var/redis.secret`, refused to a client without it, off every command line, and files only
their owner reads.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import redis
import requests

from cli import UserError, procs
from cli.demo import check_browser
from config import ROOT, reset_settings
from tests.external_interface.browser_fixtures import needs_browser
from utils.servers import free_port


def own_env(tmp_path) -> dict[str, str]:
    """The user's environment, without this suite's settings, on a var/ and ports of its own."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CHAINCRAWL_", "DEMO_", "FLOWER_")) and k not in ("REDIS_URL", "BROKER_URL", "TESTSITE_URL")}  # fmt: skip
    env.update(
        CHAINCRAWL_VAR_DIR=str(tmp_path / "var"),
        CHAINCRAWL_EMBEDDED_REDIS_PORT=str(free_port()),
        CHAINCRAWL_FLOWER_PORT=str(free_port()),
        COLUMNS="160",
    )
    return env


@pytest.mark.integration
def test_control_sh_demo_runs_the_demo_crawl_and_stop_stops_everything(tmp_path) -> None:
    env = own_env(tmp_path)
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
        printed = set(re.findall(re.escape(str(tmp_path)) + r"[^\s)(,]*", text))
        assert any(p.endswith("/demo.post/demo.post.jsonl") for p in printed), printed
        assert all(os.path.exists(p) for p in printed), [
            p for p in printed if not os.path.exists(p)
        ]
        secret = (tmp_path / "var" / "flower.secret").read_text().strip()
        assert secret and secret not in text  # the password is in a file, never printed
        check_embedded_redis_is_private(
            tmp_path / "var", int(env["CHAINCRAWL_EMBEDDED_REDIS_PORT"]), text
        )
    finally:
        stop = subprocess.run([str(ROOT / "control.sh"), "stop"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=180)  # fmt: skip
    assert stop.returncode == 0, stop.stdout + stop.stderr
    for name in ("worker-w1", "flower", "demo-site", "embedded redis"):
        assert name in stop.stdout
    assert not list((tmp_path / "var" / "run").glob("*.pid"))


@needs_browser
@pytest.mark.integration
def test_control_sh_demo_runs_the_chain_with_a_rendered_list(tmp_path) -> None:
    env = own_env(tmp_path)
    cmd = [str(ROOT / "control.sh"), "demo", "--chain", "demo_js", "--size", "tiny",
           "--port", str(free_port()), "--workers", "1", "--no-flower"]  # fmt: skip
    try:
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
        text = out.stdout + out.stderr
        assert out.returncode == 0, text[-4000:]
        assert "chain" in text and "demo_js" in text
        assert "80 of 80 produced" in text  # 5 users, 15 posts, 60 comments: as demo_social
        assert "items demo.comment" in text and "60 (the demo site has 60)" in text
    finally:
        stop = subprocess.run([str(ROOT / "control.sh"), "stop"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=180)  # fmt: skip
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert not list((tmp_path / "var" / "run").glob("*.pid"))


def test_a_chain_with_rendered_steps_says_what_to_install_without_a_browser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHAINCRAWL_BROWSER_EXECUTABLE", "/nonexistent/chromium")
    reset_settings()
    try:
        with pytest.raises(UserError, match=r"demo_js renders pages .*demo\.js\.more.*apt-get"):
            check_browser("demo_js")
        check_browser("demo_social")  # nothing rendered: nothing needed
    finally:
        monkeypatch.undo()
        reset_settings()


def check_embedded_redis_is_private(var: Path, port: int, printed: str) -> None:
    """The Redis the demo ran on wants the generated password, which only var/ holds."""
    password = (var / "redis.secret").read_text().strip()
    assert len(password) >= 32 and password not in printed
    logs = sorted((var / "log").glob("*.log"))  # workers, Flower, the demo site
    assert logs and not [f.name for f in logs if password.encode() in f.read_bytes()]
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port).ping()
    assert redis.Redis(port=port, password=password).ping()
    pid = (var / "redis" / "redis.pid").read_text().strip()
    assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(var / "redis") == 0o700
    assert mode(var / "redis.secret") == mode(var / "secret.key") == 0o600
    files = list((var / "redis").iterdir())
    assert "appendonly.aof" in {f.name for f in files}
    assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}


@pytest.mark.integration
def test_demo_on_another_port_and_restart_crawl_the_right_site_and_bring_back_what_ran(
    tmp_path,
) -> None:
    """`demo --port A`, then `demo --port B` with its workers still running: the workers that
    were told A are restarted and the crawl reads B; `restart` then brings back the demo site
    (at B) and Flower, and its workers still crawl B."""
    env = own_env(tmp_path)

    def control(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(ROOT / "control.sh"), *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=420)  # fmt: skip

    a, b = free_port(), free_port()
    run = tmp_path / "var" / "run"
    try:
        out = control(
            "demo", "--size", "tiny", "--port", str(a), "--workers", "1", "--concurrency", "4"
        )
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        out = control("demo", "--size", "tiny", "--port", str(b), "--workers", "1", "--concurrency", "4",
                      "--no-flower")  # fmt: skip
        text = out.stdout + out.stderr
        assert out.returncode == 0, text[-3000:]
        assert f"restarting worker-w1: they crawl http://127.0.0.1:{a}" in " ".join(text.split())
        assert "80 of 80 produced" in text
        worker = procs.alive(run / "worker-w1.pid")
        assert worker and procs.process_env(worker)["DEMO_BASE_URL"] == f"http://127.0.0.1:{b}"

        out = control("restart", "--workers", "1", "-c", "2")
        assert out.returncode == 0, out.stdout + out.stderr
        flower_log = tmp_path / "var" / "log" / "flower.log"
        said = flower_log.read_text(errors="replace")[-3000:] if flower_log.exists() else "no log"
        assert "brought back: demo-site, flower" in out.stdout, (
            out.stdout + "\nflower.log:\n" + said
        )
        assert requests.get(f"http://127.0.0.1:{b}/healthz", timeout=5).ok
        assert procs.port_open("127.0.0.1", int(env["CHAINCRAWL_FLOWER_PORT"]))
        worker = procs.alive(run / "worker-w1.pid")
        assert worker and procs.process_env(worker)["DEMO_BASE_URL"] == f"http://127.0.0.1:{b}"
    finally:
        control("stop", "--timeout", "20")
