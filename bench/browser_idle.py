"""What an idle browser costs, and what closing it gives back.

    .venv/bin/python -m bench.browser_idle                # --pages 20 --idle-close 5

Starts a demo server (small) on a free port and one `BrowserPool` like a worker's, renders
`--pages` of the demo's JavaScript post pages, then measures the memory (PSS, MB) of this
process and of the driver's process tree (the driver, Playwright's Node.js server, Chromium
and its helpers) while the browser sits idle, waits for the idle close (`--idle-close`
seconds, CHAINCRAWL_BROWSER_IDLE_CLOSE's role) and measures again.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo.testing import DemoServer
from external_interface.browser import BrowserPool, PoolConfig, RenderRequest, procmem
from settings.browser import BrowserSettings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=20)
    ap.add_argument("--idle-close", type=float, default=5.0)
    a = ap.parse_args(argv)
    cfg = PoolConfig.from_settings(BrowserSettings(contexts=1, idle_close=a.idle_close))
    pool = BrowserPool(cfg)
    with DemoServer(size="small") as demo:
        for i in range(a.pages):
            pool.render(
                RenderRequest(
                    demo.url_for(f"/js/post/p{i + 1}"), wait_for="article[data-state=ready]"
                )
            )
        driver = pool.driver_pid
        assert driver is not None
        time.sleep(1.0)  # settled, not yet closed
        browser_mb = procmem.tree_memory_mb(driver)
        parts = len(procmem.descendants(driver)) + 1
        renderers_mb = (
            sum(
                procmem.memory_kb(p)
                for p in procmem.descendants(driver)
                if "--type=renderer" in procmem.cmdline(p)
            )
            / 1024
        )
        me_mb = procmem.memory_kb(os.getpid()) / 1024
        deadline = time.monotonic() + a.idle_close + 30
        while pool.driver_pid is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        closed = pool.driver_pid is None
        after_mb = procmem.tree_memory_mb(driver) if not closed else 0.0
    print(
        f"after {a.pages} rendered pages, idle: driver tree {browser_mb:.0f} MB PSS in "
        f"{parts} processes, of which the pages' renderers {renderers_mb:.0f} MB and the fixed "
        f"part (driver, Node.js, browser, helpers) {browser_mb - renderers_mb:.0f} MB; "
        f"this process {me_mb:.0f} MB"
    )
    print(
        f"idle close after {a.idle_close:.0f} s: {'closed' if closed else 'NOT closed'}, "
        f"driver tree now {after_mb:.0f} MB: {browser_mb - after_mb:.0f} MB given back"
    )
    pool.close()
    return 0 if closed else 1


if __name__ == "__main__":
    sys.exit(main())
