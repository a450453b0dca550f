"""The modules a page passes through, read off the call path of a real crawl (the table of
docs/architecture.md's "The modules a page passes through"):

    .venv/bin/python -m bench.page_path            # the defaults: gevent, jsonl, no resources
    .venv/bin/python -m bench.page_path --json     # the same as JSON

One catalog page of the `small` page set (bench/pagesets.py) is the root of a chain run: it
yields an item and 20 child tasks (the products). Every setting is its default (politeness
on: per-site limits, the adaptive throttle, robots.txt), the sink jsonl, no resources; a first
run warms both processes up, the second is the one read. This process triggers the run under
`sys.setprofile` (the client side); one real `celery worker` (the default pool) runs the
pages with this module as its Celery app, which installs the same hook in the worker before
it consumes. Every Python function call into a file of the checkout is recorded with the
greenlet or thread that made it; the Lua scripts a call path runs are read off the `EVALSHA`
and `EVAL` commands it sends (the sha matched to the scripts loaded in the process, a script
or an EVAL's body to the `.lua` files whose code it holds). The worker records two windows after it is ready: an idle
one (as long as the crawl's) and the crawl itself, each dumped by SIGUSR2. Reported:

- trigger: every checkout file `chains.run()` calls into, in order of first call;
- page: the files called by the task greenlet that ran the root page's last attempt (from
  the message's arrival to its ack): the root task is the run's one task at the chain's root
  step (the worker's `task_prerun` signal names each greenlet's task, run and step), and on
  a busy machine it may wait for a limit or a lease and run again, so its last attempt, the
  one that committed, is read whatever the load;
- consumer: the files the consumer called in the crawl window and not in the idle one (the
  message taken off the broker);
- store: the drainer thread's files in the crawl window and not in the idle one (the outbox
  read, the sink written, the entries acknowledged).

A module that is only imported is not counted, only one with a function that runs: the
worker's start-up and the warm-up run fall in windows that are dropped, and a module imported
inside a window read (its `<module>` code the only code of it that ran) is left out. What is
counted is the files with code executed for the page.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
_ROOT = str(ROOT) + os.sep
_VENV = str(ROOT / ".venv") + os.sep
_THIS = str(Path(__file__).resolve())
OUT_ENV = "PAGE_PATH_OUT"
IMPORT_ONLY = frozenset({"<module>"})  # a module's own code: it ran because it was imported
DEFAULTS_OFF = (
    "CHAINCRAWL_DEFAULT_LIMITS",
    "CHAINCRAWL_THROTTLE",
    "CHAINCRAWL_ROBOTS",
)  # the worker's dump file prefix (this module as the Celery app)


class Recorder:
    """A profile hook: per greenlet (or thread), the checkout files it calls into, in order,
    and the sha of every script it runs."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, str], int] = {}
        self.funcs: dict[tuple[int, str], set[str]] = {}
        self.roots: dict[int, str] = {}
        self.shas: dict[int, list[str]] = {}
        self.tasks: dict[int, list[dict[str, Any]]] = {}  # the Celery tasks a greenlet ran
        self.alive: dict[int, Any] = {}  # each greenlet recorded, held: its id not reused
        self.n = 0
        self.off = False  # while a take reads the scripts: the recorder's own calls
        from utils.wire import RUN, STEP

        self._meta_keys = (RUN, STEP)  # a task message's run id and step, in its meta
        self._current: Any = None
        try:
            from greenlet import getcurrent

            self._current = getcurrent
        except ImportError:  # pragma: no cover - greenlet comes with gevent
            self._current = threading.current_thread

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or self.off:
            return
        code = frame.f_code
        f = code.co_filename
        if f.endswith("redis/client.py") and code.co_name in ("execute_command",):
            args = frame.f_locals.get("args") or ()
            if args and str(args[0]).upper() in ("EVALSHA", "EVAL") and len(args) > 1:
                # EVALSHA names a loaded script by its sha; EVAL sends the body itself
                self.shas.setdefault(id(self._current()), []).append(str(args[1]))
            return
        if not f.startswith(_ROOT) or f.startswith(_VENV) or f == _THIS:
            return
        g = id(self._current())
        key = (g, f)
        if key in self.seen:
            self.funcs[key].add(code.co_name)
            return
        self.funcs[key] = {code.co_name}
        self.n += 1
        self.seen[key] = self.n
        if g not in self.roots:
            self.alive[g] = self._current()
            bottom = frame
            while bottom.f_back is not None:
                bottom = bottom.f_back
            self.roots[g] = (
                f"{threading.current_thread().name} {_rel(bottom.f_code.co_filename)}:"
                f"{bottom.f_code.co_name} {_rel(f)}:{code.co_name}"
            )

    def task_started(self, task_id: str, wire: Any) -> None:
        """A Celery task starts in this greenlet (the worker's `task_prerun`): its id, and
        the run and step its message's meta names."""
        meta = wire if isinstance(wire, dict) else {}
        run, step = self._meta_keys
        cur = self._current()
        self.alive.setdefault(id(cur), cur)
        self.tasks.setdefault(id(cur), []).append(
            {"id": task_id, "run": meta.get(run, ""), "step": meta.get(step, ""), "state": ""}
        )

    def task_ended(self, task_id: str, state: str, retval: Any) -> None:
        """Its end (`task_postrun`): SUCCESS with `run_page`'s outcome, or RETRY (a wait or a
        retry: the same task id runs again as a new message)."""
        for t in reversed(self.tasks.get(id(self._current()), [])):
            if t["id"] == task_id:
                t["state"] = state or ""
                t["outcome"] = retval if isinstance(retval, str) else ""
                break

    def install(self) -> None:
        sys.setprofile(self.hook)
        threading.setprofile(self.hook)

    def take(self) -> dict[str, Any]:
        """What was recorded since the last take, by greenlet: its root frame, its files in
        order of first call, its scripts."""
        self.off = True
        try:
            return self._take()
        finally:
            self.off = False

    def _take(self) -> dict[str, Any]:
        seen, roots, shas, funcs = self.seen, self.roots, self.shas, self.funcs
        tasks = self.tasks
        self.seen, self.roots, self.shas, self.funcs = {}, {}, {}, {}
        self.tasks, self.alive = {}, {}
        by: dict[int, list[tuple[int, str]]] = {}
        for (g, f), n in seen.items():
            if funcs[(g, f)] <= IMPORT_ONLY:  # imported in the window, no function of it ran
                continue
            by.setdefault(g, []).append((n, _rel(f)))
        scripts = loaded_scripts()
        files = lua_files()
        for sent in {x for xs in shas.values() for x in xs} - scripts.keys():
            if "\n" in sent or " " in sent:  # an EVAL's body, not a sha
                scripts[sent] = script_files(sent, files)
        return {
            str(g): {
                "root": roots.get(g, "?"),
                "first": min(n for n, _ in files),
                "files": [f for _, f in sorted(files)],
                "funcs": {
                    _rel(f): sorted(funcs[(g, f)])
                    for (gg, f) in seen
                    if gg == g and not funcs[(g, f)] <= IMPORT_ONLY
                },
                "scripts": sorted({s for sha in shas.get(g, []) for s in scripts.get(sha, [sha])}),
                "tasks": tasks.get(g, []),
            }
            for g, files in by.items()
        }


def _rel(f: str) -> str:
    return f[len(_ROOT) :] if f.startswith(_ROOT) else f


def lua_files() -> dict[str, str]:
    """Every `.lua` file of the checkout, its includes expanded, by path."""
    from utils.lua import script

    out = {}
    for p in ROOT.rglob("*.lua"):
        if _VENV in str(p) or "/var/" in str(p):
            continue
        out[_rel(str(p))] = script(str(p), p.name)
    return out


def loaded_scripts() -> dict[str, list[str]]:
    """sha -> the `.lua` files whose text a script loaded in this process holds."""
    from redis.commands.core import Script

    files = lua_files()
    out: dict[str, list[str]] = {}
    for obj in gc.get_objects():
        if isinstance(obj, Script):
            src = obj.script if isinstance(obj.script, str) else bytes(obj.script).decode()
            out[obj.sha] = script_files(src, files)
    return out


def _code_lines(text: str) -> str:
    """A script's text without its comment and blank lines: a caller may send it so (EVAL
    sends the whole body each call), and the file is still the one it runs."""
    return "\n".join(
        line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("--")
    )


def script_files(src: str, files: dict[str, str]) -> list[str]:
    """The `.lua` files (of `files`, path -> text) whose code the script `src` holds; a
    fragment another script includes is listed with it, the script itself first."""
    body = _code_lines(src)
    names = [n for n, text in files.items() if (code := _code_lines(text)) and code in body]
    names.sort(key=lambda n: -len(files[n]))
    return names or ["(inline script)"]


# -- the worker side: this module as its Celery app ------------------------------------------
if os.environ.get(OUT_ENV):
    _recorder = Recorder()
    _dumps = [0]

    def _dump(signum: int, frame: Any) -> None:
        _dumps[0] += 1
        data = _recorder.take()
        Path(f"{os.environ[OUT_ENV]}.{_dumps[0]}.json").write_text(json.dumps(data))

    signal.signal(signal.SIGUSR2, _dump)
    from celery import signals as _signals

    def _prerun(task_id: str = "", args: Any = (), **_: Any) -> None:
        _recorder.task_started(task_id, args[1] if len(args) > 1 else None)

    def _postrun(task_id: str = "", state: str = "", retval: Any = None, **_: Any) -> None:
        _recorder.task_ended(task_id, state, retval)

    _signals.task_prerun.connect(_prerun, weak=False)
    _signals.task_postrun.connect(_postrun, weak=False)
    _recorder.install()
    from worker import app

    __all__ = ["app"]


# -- the driver ------------------------------------------------------------------------------
def _wait_file(path: Path, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            time.sleep(0.2)
            result: dict[str, Any] = json.loads(path.read_text())
            return result
        time.sleep(0.1)
    raise TimeoutError(f"no dump {path}")


def _files_of(window: dict[str, Any], root_has: str) -> list[str]:
    out: list[str] = []
    for g in window.values():
        if root_has in g["root"]:
            out += [f for f in g["files"] if f not in out]
    return out


def _funcs_of(greenlets: Any) -> dict[str, list[str]]:
    """file -> the functions of it that ran, over the greenlets given."""
    out: dict[str, set[str]] = {}
    for g in greenlets:
        for f, fs in g["funcs"].items():
            out.setdefault(f, set()).update(fs)
    return {f: sorted(fs) for f, fs in out.items()}


def _scripts_of(window: dict[str, Any], root_has: str) -> list[str]:
    return sorted({s for g in window.values() if root_has in g["root"] for s in g["scripts"]})


def read_path(pool: str | None = None) -> dict[str, Any]:
    from bench.pagesets import PAGESETS
    from utils import environ

    ps = PAGESETS["small"].build(pages=21)  # one catalog page and its 20 products
    # the defaults as shipped, whatever this process's environment says (the tests' turns
    # politeness off): put back when the crawl is read
    saved = {name: os.environ.pop(name, None) for name in DEFAULTS_OFF}
    try:
        return _read_path(ps, pool)
    finally:
        environ.restore(saved)


def _read_path(ps: Any, pool: str | None) -> dict[str, Any]:
    from bench.chaincrawl_bench import ChaincrawlBench
    from config import DEFAULT_POOL

    with ps.serve() as site, ChaincrawlBench() as b:
        for name in DEFAULTS_OFF:  # the benchmark's overrides dropped: the defaults, as shipped
            b.env.pop(name, None)
        out = b.workdir / "path"
        (w,) = b.start_workers(1, pool or DEFAULT_POOL, 16, "bench.page_path", {OUT_ENV: str(out)})
        url = site.url_for(ps.seed.target)
        seeds = [{"url": url, "kind": ps.seed.kind}]
        from chains import run

        chain = b.chain(ps.seed.kind)
        rec = Recorder()
        # a first run warms both sides (clients, scripts, gates, connections made once)
        b.run_chain(seeds, timeout=120)
        time.sleep(2)
        os.kill(w.pid, signal.SIGUSR2)  # drop what start-up and the warm-up recorded
        _wait_file(Path(f"{out}.1.json"))
        t0 = time.monotonic()
        rec.install()
        handle = run(chain, seeds=seeds, priority=5)
        sys.setprofile(None)
        threading.setprofile(None)
        trigger = rec.take()
        progress = handle.wait(timeout=120)
        crawl_s = time.monotonic() - t0
        time.sleep(1)
        os.kill(w.pid, signal.SIGUSR2)  # the crawl window
        crawl = _wait_file(Path(f"{out}.2.json"))
        time.sleep(max(2.0, crawl_s + 1))
        os.kill(w.pid, signal.SIGUSR2)  # an idle window at least as long
        idle = _wait_file(Path(f"{out}.3.json"))
        if progress.totals.get("stored") != ps.expected_pages:
            raise RuntimeError(f"expected {ps.expected_pages} items stored: {progress.totals}")
    tasks = [
        g
        for g in crawl.values()
        if "celery/concurrency/" in g["root"] or "batch.py:entry" in g["root"]
    ]
    pages = [  # pages of their own (not batch entries), in the order they ran
        g for g in tasks if "base_task.py" in g["files"] and "lifecycle/batch.py" not in g["files"]
    ]
    page, attempts = root_page(pages, handle.run_id, chain.root.id)
    batch = [
        f
        for g in tasks
        if "lifecycle/batch.py" in g["files"]
        for f in g["files"]
        if f not in page["files"]
    ]
    trig = [f for g in sorted(trigger.values(), key=lambda g: g["first"]) for f in g["files"]]
    drainer = [g for g in crawl.values() if g["root"].startswith("outbox-drainer ")]
    store = [f for g in drainer for f in g["files"]]
    # the consumer: the main greenlet and the hub's callbacks (message in, ack out), less what
    # the same greenlets call while the worker is idle; periodic threads are listed apart
    periodic = ("run-sweeper ", "owner-heartbeat ", "metrics-flush ", "task-set-beat ")
    idle_files = {
        f for g in idle.values() if not g["root"].startswith(periodic) for f in g["files"]
    }
    others = [g for g in crawl.values() if g not in tasks and g not in drainer]
    consumer = [
        f
        for g in others
        if not g["root"].startswith(periodic)
        for f in g["files"]
        if f not in idle_files and f not in page["files"]
    ]
    background = {
        g["root"].split(" ")[0]: g["files"] for g in others if g["root"].startswith(periodic)
    }
    return {
        "pool": pool or DEFAULT_POOL,
        "trigger": {
            "files": trig,
            "scripts": sorted({s for g in trigger.values() for s in g["scripts"]}),
            "funcs": _funcs_of(trigger.values()),
        },
        "page": {
            "files": page["files"],
            "scripts": page["scripts"],
            "root": page["root"],
            "funcs": page["funcs"],
            "task": page["tasks"][-1],
            "attempts": attempts,
        },
        "consumer": {
            "files": list(dict.fromkeys(consumer)),
            "funcs": _funcs_of(g for g in others if not g["root"].startswith(periodic)),
        },
        "store": {
            "files": store,
            # less what it runs idle too (its periodic claim of entries left by a dead drainer)
            "scripts": [
                x for x in _scripts_of(crawl, "drainer") if x not in _scripts_of(idle, "drainer")
            ],
            "funcs": _funcs_of(drainer),
        },
        "batch": {"files": list(dict.fromkeys(batch))},
        "background": background,
        "windows": {"crawl": crawl, "idle": idle, "trigger": trigger},
    }


def root_page(pages: list[dict[str, Any]], run_id: str, step: str) -> tuple[dict[str, Any], int]:
    """The root page's last attempt, and how many attempts the window holds. The root task is
    the one task of the run at its root step (one seed); on a busy machine it may wait for a
    limit or a lease (a Celery retry: the same task id, a new message, a new greenlet) before
    the attempt that commits. Its last attempt is the one read, whatever ran before it; it
    must have ended in success."""
    ids = {t["id"] for g in pages for t in g["tasks"] if t["run"] == run_id and t["step"] == step}
    if len(ids) != 1:
        raise RuntimeError(f"expected one root task of run {run_id} at step {step!r}: {ids}")
    (tid,) = ids
    runs = sorted(
        (g for g in pages if any(t["id"] == tid for t in g["tasks"])), key=lambda g: g["first"]
    )
    page = runs[-1]
    if len(page["tasks"]) != 1 or page["tasks"][0]["state"] != "SUCCESS":
        raise RuntimeError(f"the root task's last attempt did not succeed alone: {page['tasks']}")
    return page, len(runs)


def bottom_layer(f: str) -> bool:
    """L0 of docs/architecture.md's layers: config.py, settings/, exceptions.py, utils/."""
    return f in ("config.py", "exceptions.py") or f.startswith(("settings/", "utils/"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-P", "--pool", default=None, help="the worker's pool (default: the default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = read_path(args.pool)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    files: set[str] = set()
    scripts: set[str] = set()
    for stage in ("trigger", "page", "consumer", "store"):
        part = res[stage]
        files.update(part["files"])
        scripts.update(part.get("scripts", []))
        above = [f for f in part["files"] if not bottom_layer(f)]
        below = [f for f in part["files"] if bottom_layer(f)]
        print(f"{stage}: {', '.join(above)}")
        if below:
            print(f"  bottom layer: {', '.join(below)}")
        if part.get("scripts"):
            print(f"  scripts: {', '.join(part['scripts'])}")
    if res["batch"]["files"]:
        print(f"a batch message adds: {', '.join(res['batch']['files'])}")
    up = sorted(f for f in files if not bottom_layer(f))
    print(
        f"{len(files)} Python files ({len(up)} above the bottom layer, {len(files) - len(up)} in "
        f"it), {len(scripts)} Lua files ({res['pool']} pool)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
