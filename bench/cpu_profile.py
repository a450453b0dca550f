"""Where a chaincrawl worker's CPU goes per page: py-spy over a real crawl, grouped by phase.

    .venv/bin/python -m bench.cpu_profile                       # ~2000 pages, gevent(16), no latency
    .venv/bin/python -m bench.cpu_profile --pageset heavy       # the shop's 8-50 KB pages
    .venv/bin/python -m bench.cpu_profile --proto nometrics     # with bench/proto.py switches
    .venv/bin/python -m bench.cpu_profile --latency-ms 250 --pages 1300   # latency-bound
    .venv/bin/python -m bench.cpu_profile -P gevent -c 256 --latency-ms 100 --pages 3000  # lat100x256
    .venv/bin/python -m bench.cpu_profile --scrapy              # the Scrapy baseline, by library
    .venv/bin/python -m bench.cpu_profile --analyze FILE.raw    # re-read a saved profile

The worker runs under `py-spy record --gil --nonblocking -f raw` (spawned by py-spy: attaching
with --pid does not find this interpreter's version). `--gil` keeps only samples of the thread
holding the GIL, so samples are CPU time of Python code in any thread (plus C code called with
the GIL held: lxml, hiredis, orjson, pydantic-core). Samples of worker start-up, imports and
idle waiting (no task thread, consumer loop or outbox drainer on the stack) are left out, except
the gevent hub's (its loop, greenlet switches and timeouts are that pool's own cost); the
phase shares are then scaled to the CPU ms/page measured with psutil over the crawl, so the
table reads "ms of worker CPU per page". The raw file (collapsed stacks) opens in
speedscope.app or flamegraph.pl.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from config import DEFAULT_POOL

ROOT = Path(__file__).resolve().parent.parent
PYSPY = str(Path(sys.executable).with_name("py-spy"))

PROJECT = {
    "base_task",
    "config",
    "worker",
    "exceptions",
    "chains",
    "external_interface",
    "ledger",
    "lifecycle",
    "settings",
    "broker",
    "monitor",
    "scheduling",
    "sites",
    "utils",
    "bench",
    "demo",
}
STDLIB_LABELS = {
    "json": "json (stdlib)",
    "logging": "logging",
    "socket": "socket I/O",
    "selectors": "socket I/O",
    "ssl": "socket I/O",
    "select": "socket I/O",
    "http": "http.client",
    "threading": "threads & locks",
    "queue": "threads & locks",
    "concurrent": "threads & locks",
    "asyncio": "asyncio",
}

_FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def parse_raw(path: Path) -> list[tuple[str, list[tuple[str, str]], int]]:
    """[(thread name, [(function, file), ...root first], samples)] from py-spy raw output."""
    out = []
    held = ""  # a stack whose frame name held a line break, up to it
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        stack, _, n = (held + line).rpartition(" ")
        if not n.isdigit():  # the stack goes on on the next line
            held += line + " "
            continue
        held = ""
        parts = stack.split(";")
        has_thread = parts[0].startswith("thread (")
        thread = parts[0].partition(":")[2].strip() if has_thread else ""
        frames = []
        for f in parts[1:] if has_thread else parts:
            m = _FRAME.match(f)
            frames.append((m["fn"], m["file"]) if m else (f, ""))
        out.append((thread, frames, int(n)))
    return out


def library(file: str) -> str:
    top = file.split("/", 1)[0].removesuffix(".py")
    if file.startswith("bench/proto.py"):
        return "chaincrawl (prototype code)"
    if top in PROJECT:
        return "chaincrawl" if top not in ("bench", "demo") else "bench code"
    if top.startswith("<"):
        return "stdlib"
    if "/" in file or top in _THIRD_PARTY:
        return top if top in _THIRD_PARTY or not _is_stdlib(top) else "stdlib:" + top
    return "stdlib:" + top


_THIRD_PARTY = {
    "celery",
    "kombu",
    "redis",
    "requests",
    "urllib3",
    "parsel",
    "lxml",
    "pydantic",
    "pydantic_core",
    "vine",
    "billiard",
    "click",
    "cssselect",
    "w3lib",
    "scrapy",
    "twisted",
    "orjson",
    "hiredis",
    "charset_normalizer",
    "idna",
    "certifi",
    "gevent",
    "itemadapter",
    "queuelib",
    "zope",
    "attr",
    "protego",
    "tldextract",
}


def _is_stdlib(top: str) -> bool:
    return top in sys.stdlib_module_names


def leaf_library(frames: list[tuple[str, str]]) -> str:
    """The library a sample's CPU belongs to: the leaf's, or for generic stdlib leaves (not
    json/logging/sockets/threads) the nearest caller outside the stdlib."""
    for _fn, file in reversed(frames):
        lib = library(file)
        if not lib.startswith("stdlib"):
            return lib
        top = file.split("/", 1)[0].removesuffix(".py")
        if top in STDLIB_LABELS:
            return STDLIB_LABELS[top]
    return "stdlib"


def _has(frames: list[tuple[str, str]], *needles: str) -> bool:
    return any(any(n in fn or n in file for n in needles) for fn, file in frames)


Rule = tuple[str, Callable[[str, list[tuple[str, str]]], bool]]
CONSUMER = ("asynloop", "synloop")  # the consumer's loop: threads / gevent and solo pools
# a task's stack root: the threads pool's work item, or gevent's task greenlet, whose stack
# starts at celery's apply_timeout (a greenlet's first frame has no caller)
TASK_ROOT = ("_WorkItem.run", "apply_timeout")

PHASES: list[Rule] = [
    # the outbox drainer thread: items from the stream to the JSONL sink, counted stored
    ("outbox drainer thread (XREADGROUP, JSONL sink, ack script)",
     lambda t, f: _has(f, "outbox/") and not _has(f, *TASK_ROOT, *CONSUMER)),
    # consumer loop: MainThread's asynloop (threads) or the synloop (gevent, solo)
    ("consumer: task-received events", lambda t, f: _has(f, *CONSUMER) and _has(f, "EventDispatcher")),
    ("consumer: 'Task received' log line", lambda t, f: _has(f, *CONSUMER) and _has(f, "logging/")),
    ("consumer: hand-off to the thread pool",
     lambda t, f: _has(f, *CONSUMER) and _has(f, "on_apply", "ThreadPoolExecutor.submit", "apply_async (celery/concurrency")),
    ("consumer: receive + decode + QoS (BRPOP, JSON, base64, Request, unacked index)",
     lambda t, f: _has(f, *CONSUMER) and _has(f, "on_readable", "_brpop_read", "_receive_callback", "on_task_received")),
    ("consumer: ack (QoS pipeline: MULTI ZREM HDEL EXEC)",
     lambda t, f: _has(f, *CONSUMER) and _has(f, "Message.ack", "basic_ack", "QoS.ack")),
    ("consumer: event loop, timers, other", lambda t, f: _has(f, *CONSUMER)),
    # background threads
    ("metrics flush thread (aggregated HINCRBYs)", lambda t, f: _has(f, "Aggregator._loop")),
    # the task thread
    ("child dispatch: plan + raw envelopes + one pipeline", lambda t, f: _has(f, "Publisher.publish")),
    ("child dispatch: other (staged children read back)", lambda t, f: _has(f, "Committer.stage", "Committer.publish")),
    ("fetch (the fetcher: pycurl's transfer, or urllib3 / http.client)",
     lambda t, f: _has(f, "Fetcher.fetch")),
    # the pycurl fetcher on gevent: libcurl's sockets and timer driven from the hub's loop
    ("fetch, libcurl's multi on the hub's loop (curl_gevent)",
     lambda t, f: _has(f, "curl_gevent.py")),
    ("parse (decode, lxml tree, 3 CSS fields + links)",
     lambda t, f: _has(f, "workload.py", "Response.selector", "Response.text", "Response.css")),
    ("commit: EVALSHA pipeline (a batch's commits together; tail: + metrics)",
     lambda t, f: _has(f, "RunState.commit", "run_commits", "send_commits")),
    ("begin: redelivery check, delivery count (one pipeline per batch)",
     lambda t, f: _has(f, "RunState.begin")),
    ("items -> outbox entries, children (model_dump, fan-out, orjson)",
     lambda t, f: _has(f, "outbox_entries", "SiteTask._kids", "_fingerprint")),
    ("endpoint code: Item/Link models (pydantic), urljoin", lambda t, f: _has(f, "bench/site/")),
    ("outputs collected from the endpoint (type checks, deadline check)",
     lambda t, f: _has(f, "SiteTask._collect")),
    ("params validation (pydantic)", lambda t, f: _has(f, "validate_params")),
    ("rate gate (admit, release, plan)", lambda t, f: _has(f, "RedisGate", "get_gate")),
    ("Context, metrics objects", lambda t, f: _has(f, "Context.__init__", "TaskMetrics", "aggregate", "CpuMeter")),
    ("celery request context (push_request, current app and task lookups)",
     lambda t, f: _has(f, *TASK_ROOT, "_run_batch") and _has(f, "push_request", "_get_request", "_get_current_object", "_get_current_app", "_LocalStack")),
    ("tracer: task-started/succeeded events", lambda t, f: _has(f, *TASK_ROOT) and _has(f, "EventDispatcher", "send_event")),
    ("tracer: 'Task succeeded' log line", lambda t, f: _has(f, *TASK_ROOT) and _has(f, "logging/")),
    ("tracer: ack (QoS pipeline: ZREM/HDEL)",
     lambda t, f: _has(f, *TASK_ROOT) and _has(f, "Message.ack", "basic_ack", "QoS.ack", "ack_log_error")),
    ("task scaffolding: the batch loop, run_page, side-by-side greenlets",
     lambda t, f: _has(f, "_run_batch")),
    ("tracer & task bookkeeping (celery)", lambda t, f: _has(f, *TASK_ROOT)),
    # gevent: the hub's loop (libev callbacks, greenlet switches, Timeout expiry); a sample with
    # the GIL held and no Python frame in the unnamed main thread is the hub in C code
    ("gevent hub: event loop, switches, timeouts",
     lambda t, f: (not f and not t) or _has(f, "gevent/hub.py")),
]  # fmt: skip


def classify(
    stacks: Iterable[tuple[str, list[tuple[str, str]], int]], rules: list[Rule]
) -> tuple[Counter[str], Counter[str], Counter[str], int]:
    """(samples per phase, per library, per leaf function, samples left out as start-up/idle)."""
    phases: Counter[str] = Counter()
    libs: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    skipped = 0
    for thread, frames, n in stacks:
        for name, pred in rules:  # noqa: B007 - `name` is read after the loop
            if pred(thread, frames):
                break
        else:
            name = "-"
        if name.startswith("-"):  # start-up, idle: not part of the per-page cost
            skipped += n
            continue
        phases[name] += n
        libs[leaf_library(frames)] += n
        fn, file = frames[-1] if frames else ("?", "")
        leaves[f"{fn} ({file})"] += n
    return phases, libs, leaves, skipped


SCRAPY_PHASES: list[Rule] = [
    ("-start-up (imports, crawler set-up)", lambda t, f: _has(f, "_find_and_load", "create_crawler")),
    ("parse (lxml tree, 3 CSS fields + links)", lambda t, f: _has(f, "workload.py", "TextResponse.selector", "TextResponse.text")),
    ("spider output: items + requests (scraper, spider middlewares)", lambda t, f: _has(f, "scraper.py", "spidermw.py")),
    ("feed export (JSON lines)", lambda t, f: _has(f, "feedexport.py", "exporters.py")),
    ("download: HTTP/1.1 client (twisted.web, downloader middlewares)", lambda t, f: _has(f, "downloader/", "http11.py", "twisted/web")),
    ("scheduler + dupefilter (fingerprints)", lambda t, f: _has(f, "scheduler.py", "dupefilters.py", "request_fingerprint", "fingerprint")),
    ("engine + reactor/event loop (asyncio, twisted)", lambda t, f: _has(f, "engine.py", "asyncio", "twisted")),
    ("other", lambda t, f: not _has(f, "_find_and_load")),
]  # fmt: skip


def report(
    raw: Path,
    cpu_ms_per_page: float | None,
    rules: list[Rule] = PHASES,
    title: str = "chaincrawl worker",
) -> dict[str, Any]:
    phases, libs, leaves, skipped = classify(parse_raw(raw), rules)
    total = sum(phases.values())
    scale = (cpu_ms_per_page or 0) / total if total else 0
    out: dict[str, Any] = {
        "title": title,
        "samples": total,
        "skipped_samples": skipped,
        "cpu_ms_per_page": cpu_ms_per_page,
        "phases": [],
        "libraries": [],
        "leaves": [],
    }
    for key, counter in (("phases", phases), ("libraries", libs), ("leaves", leaves)):
        for name, n in counter.most_common(40 if key == "leaves" else None):
            out[key].append({"name": name, "share": n / total, "ms_per_page": n * scale})
    return out


def print_report(rep: dict[str, Any], top_leaves: int = 25) -> None:
    ms = rep["cpu_ms_per_page"]
    print(
        f"\n== {rep['title']}: {rep['samples']} samples in the crawl "
        f"({rep['skipped_samples']} start-up/idle left out)"
        + (f", {ms:.2f} ms CPU/page measured" if ms else "")
    )
    for key, label in (
        ("phases", "phase"),
        ("libraries", "library (leaf)"),
        ("leaves", "leaf function"),
    ):
        rows = rep[key][:top_leaves] if key == "leaves" else rep[key]
        print(f"\n  {label:<78} {'share':>6} {'ms/page':>8}")
        for r in rows:
            print(f"  {r['name'][:78]:<78} {100 * r['share']:5.1f}% {r['ms_per_page']:8.3f}")


def pyspy_prefix(out: Path, rate: int = 200) -> list[str]:
    return [
        PYSPY,
        "record",
        "--gil",
        "--nonblocking",
        "-t",
        "-r",
        str(rate),
        "-f",
        "raw",
        "-o",
        str(out),
        "--",
    ]


def profile_chaincrawl(
    pages: int,
    proto: str,
    outdir: Path,
    pool: str = DEFAULT_POOL,
    concurrency: int = 16,
    latency_ms: int = 0,
    pageset: str = "light",
) -> dict[str, Any]:
    """One worker under py-spy crawls a page set of `bench.pagesets` (after its warm-up)."""
    from bench.chaincrawl_bench import ChaincrawlBench
    from bench.pagesets import PAGESETS

    ps = PAGESETS[pageset].build(pages=pages)
    tag = (proto.replace(",", "+") or "baseline") + f"-{ps.name}"
    raw = outdir / f"chaincrawl-{tag}.raw"
    env = {"BENCH_PROTO": proto} if proto else {}
    app = "bench.tuned_worker" if proto else "worker"
    with ps.serve(latency_ms) as site, ChaincrawlBench() as b:
        b.start_workers(1, pool, concurrency, app, env, prefix=pyspy_prefix(raw))
        b.warm_up(site.url_for(ps.warmup.target), ps.warmup.kind)
        site.reset()
        timeout = 120 + ps.expected_pages / 5 + 20 * latency_ms / 1000
        m = b.measure(site.url_for(ps.seed.target), ps.seed.kind, timeout)
        got = int(site.stats()["total"])
        b.stop_workers()  # py-spy writes the file when the worker exits
    if got != ps.expected_pages or m["totals"]["stored"] != ps.expected_pages:
        raise RuntimeError(
            f"expected {ps.expected_pages} pages and items, got {got} requests, "
            f"{m['totals']['stored']} items stored"
        )
    cpu_ms = 1000 * sum(m["per_worker_cpu_s"]) / got
    rep = report(raw, cpu_ms, title=f"chaincrawl worker ({tag})")
    rep["raw"] = str(raw)
    rep["run"] = {
        "pages": got,
        "wall_s": m["wall_s"],
        "cpu_ms_per_page": cpu_ms,
        "redis_cpu_ms_per_page": 1000 * m["redis_cpu_s"] / got,
        "redis_calls": m["redis_calls"],
    }
    return rep


def profile_scrapy(
    pages: int,
    outdir: Path,
    concurrency: int = 16,
    config: str | None = None,
    latency_ms: int = 0,
    pageset: str = "light",
) -> dict[str, Any]:
    """Scrapy (a `bench.scrapy_spider` configuration, Scrapy-best by default) under py-spy."""
    from bench.pagesets import PAGESETS
    from bench.scrapy_spider import BEST
    from bench.systems import PeerProcess

    ps = PAGESETS[pageset].build(pages=pages)
    raw = outdir / f"scrapy-{ps.name}.raw"
    argv = [
        *pyspy_prefix(raw),
        sys.executable,
        "-m",
        "bench.scrapy_spider",
        "--config",
        config or BEST,
    ]
    with ps.serve(latency_ms) as site:
        peer = PeerProcess(argv, outdir / "scrapy.log")
        try:
            peer.crawl(site.url_for(ps.warmup.target), ps.warmup.kind, concurrency, 300)
            site.reset()
            res = peer.crawl(site.url_for(ps.seed.target), ps.seed.kind, concurrency, 1800)
            got = int(site.stats()["total"])
        finally:
            peer.close()  # py-spy writes the file when Scrapy exits
    res["cpu_ms_per_page"] = 1000 * res["cpu_s"] / got
    rep = report(raw, res["cpu_ms_per_page"], SCRAPY_PHASES, "scrapy")
    rep["raw"] = str(raw)
    rep["run"] = res
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="py-spy profile of the per-page CPU")
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--proto", default="", help="BENCH_PROTO flags (bench/proto.py)")
    ap.add_argument("--scrapy", action="store_true", help="profile the Scrapy baseline instead")
    ap.add_argument("-P", "--pool", default=DEFAULT_POOL, help="worker pool (gevent, threads)")
    ap.add_argument("--latency-ms", type=int, default=0, help="demo server's added latency")
    ap.add_argument(
        "-c",
        "--concurrency",
        type=int,
        default=16,
        help="task slots (chaincrawl) or CONCURRENT_REQUESTS (Scrapy)",
    )
    ap.add_argument(
        "--config",
        default=None,
        help="bench.scrapy_spider configuration for --scrapy (default: its BEST)",
    )
    ap.add_argument(
        "--pageset",
        default="light",
        help="page set of bench.pagesets: light (demo pc), shop, heavy",
    )
    ap.add_argument("--out", type=Path, default=None, help="directory for raw profiles + JSON")
    ap.add_argument("--analyze", type=Path, default=None, help="only summarise a raw file")
    ap.add_argument("--cpu-ms", type=float, default=None, help="with --analyze: ms/page to scale")
    a = ap.parse_args(argv)
    if a.analyze:
        rules = SCRAPY_PHASES if "scrapy" in a.analyze.name else PHASES
        print_report(report(a.analyze, a.cpu_ms, rules, a.analyze.stem))
        return 0
    outdir = a.out or Path(tempfile.mkdtemp(prefix="bench-profile-"))
    outdir.mkdir(parents=True, exist_ok=True)
    if a.scrapy:
        rep = profile_scrapy(a.pages, outdir, a.concurrency, a.config, a.latency_ms, a.pageset)
    else:
        rep = profile_chaincrawl(
            a.pages, a.proto, outdir, a.pool, a.concurrency, a.latency_ms, a.pageset
        )
    print_report(rep)
    if "redis_calls" in rep.get("run", {}):
        pages = rep["run"]["pages"] or 1
        calls = {
            k: v / pages
            for k, v in rep["run"]["redis_calls"].items()
            if k not in ("hgetall", "llen", "info")
        }
        print(f"\n  Redis commands per page (progress polling excluded): {sum(calls.values()):.1f}")
        print(
            "  "
            + ", ".join(
                f"{k} {v:.2f}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v >= 0.05
            )
        )
    (outdir / f"{Path(rep['raw']).stem}.json").write_text(json.dumps(rep, indent=1))
    print(f"\n  raw profile: {rep['raw']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
