"""`control.sh restart`: stop the workers and what `control.sh` started next to them, start the
workers with the options given, and bring back what was stopped.

`stop --keep-redis` then `start` used to leave the demo site, Flower, beat and the monitor
stopped. Restart notes which of them run (and the command line each was started with, from
`/proc`), stops everything but Redis, starts the workers, then starts each of them again as
it was. Workers it starts crawl the demo site where it runs (`DEMO_BASE_URL`): the one brought
back, or the one the old workers were told.
"""

from __future__ import annotations

import argparse
import os

from cli import procs

BROUGHT_BACK = ("demo-site", "beat", "monitor", "flower")  # in this order (flower last: workers up)


def cmd_restart(a: argparse.Namespace) -> None:
    from cli.__main__ import cmd_start, cmd_stop

    s = procs.settings()
    again = {
        name: procs.process_cmd(pid)
        for name, pid in procs.running("", s).items()
        if name in BROUGHT_BACK
    }
    old_workers = list(procs.running("worker-", s).values())
    demo_url = procs.process_env(old_workers[0]).get("DEMO_BASE_URL") if old_workers else None
    if "demo-site" in again:
        demo_url = procs.demo_url_of(again["demo-site"]) or demo_url
    if demo_url and "DEMO_BASE_URL" not in os.environ:
        os.environ["DEMO_BASE_URL"] = demo_url  # reaches the workers started below
    cmd_stop(argparse.Namespace(timeout=120.0, keep_redis=True))
    cmd_start(a)
    back = []
    for name in BROUGHT_BACK:
        if name not in again:
            continue
        if name == "flower":  # its credentials come from the settings, not the command line
            procs.start_flower(s)
        elif again[name]:
            procs.start_bg(name, again[name], s)
        back.append(name)
    if back:
        print(f"brought back: {', '.join(back)}" + (f" (demo site {demo_url})" if demo_url else ""))
