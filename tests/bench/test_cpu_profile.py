"""bench/cpu_profile.py's phase rules on stacks of both pools' shapes."""

from __future__ import annotations

from pathlib import Path

from bench.cpu_profile import PHASES, classify, parse_raw

# py-spy raw lines (root first); a gevent greenlet's stack starts at its own first frame
RAW = """\
thread (10): ThreadPoolExecutor-0_1;_WorkItem.run (concurrent/futures/thread.py:58);fetch (external_interface/fetch/http.py:10);Urllib3Fetcher.fetch (external_interface/fetch/http.py:200) 5
thread (9): MainThread;asynloop (celery/worker/loops.py:97);on_readable (kombu/transport/redis.py:1) 3
thread (10): ThreadPoolExecutor-0_1 7
thread (20);apply_timeout (celery/concurrency/gevent.py:34);apply_target (celery/concurrency/base.py:30);Request.acknowledge (celery/worker/request.py:1);Message.ack (kombu/message.py:1) 2
thread (20);apply_timeout (celery/concurrency/gevent.py:34);apply_target (celery/concurrency/base.py:30);trace_task (celery/app/trace.py:1) 4
thread (20);main (celery/__main__.py:14);synloop (celery/worker/loops.py:120);_brpop_read (kombu/transport/redis.py:1) 6
thread (20);Hub.run (gevent/hub.py:647) 8
thread (20);Hub.run (gevent/hub.py:647);HubMulti._ready (external_interface/fetch/curl_gevent.py:82) 12
thread (20) 9
thread (20);main (celery/__main__.py:14);_find_and_load (<frozen importlib._bootstrap>:1176) 11
"""


def test_phases_of_threads_and_gevent_stacks(tmp_path: Path) -> None:
    raw = tmp_path / "p.raw"
    raw.write_text(RAW)
    phases, _libs, _leaves, skipped = classify(parse_raw(raw), PHASES)
    by = {name.split(":")[0].split(" (")[0]: n for name, n in phases.items()}
    assert by["fetch"] == 5
    assert by["consumer"] == 3 + 6  # asynloop (threads) and synloop (gevent) alike
    assert by["tracer"] == 2  # the ack, from a gevent task greenlet
    assert by["tracer & task bookkeeping"] == 4
    assert by["fetch, libcurl's multi on the hub's loop"] == 12  # the pycurl fetcher's
    assert by["gevent hub"] == 8 + 9  # Hub.run, and the unnamed main thread in C code
    # a named pool thread with no Python frame is idle, and imports are start-up
    assert skipped == 7 + 11
