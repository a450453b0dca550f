"""One "worker" process for the throttle's site tests: threads fetch pages through the gate
with a throttle, report every answer to it, and come back later when told to wait, as the
base task does. Prints one JSON line: answers by status, pages done, Throttled count.

    python -m tests.scheduling.throttle_client REDIS_URL PREFIX URL PAGES THREADS [NAME=VALUE...]
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from typing import Any

from config import Settings
from exceptions import Throttled
from external_interface.fetch import FetchRequest, Urllib3Fetcher
from scheduling.gate import RedisGate
from scheduling.throttle import Throttle
from utils.redis import get_redis

SITE = "polite"


def main(argv: list[str]) -> None:
    redis_url, prefix, url, pages, threads = argv[:5]
    extra: dict[str, Any] = dict(a.split("=", 1) for a in argv[5:])  # Settings parses them
    s = Settings(redis_url=redis_url, key_prefix=prefix, throttle=True, **extra)
    client = get_redis(redis_url)
    throttle = Throttle(client, s)
    gate = RedisGate({}, settings=s, client=client, throttle=throttle)
    fetcher = Urllib3Fetcher()
    todo = list(range(int(pages)))
    lock = threading.Lock()
    statuses: Counter[int] = Counter()
    waits = 0

    def work() -> None:
        nonlocal waits
        while True:
            with lock:
                if not todo:
                    return
                todo.pop()
            while True:  # this page until it is answered 200
                try:
                    gate.before_request(SITE, f"{SITE}.web.page")
                except Throttled as exc:
                    with lock:
                        waits += 1
                    time.sleep(exc.retry_after)  # the task would be re-queued with it
                    continue
                resp = fetcher.fetch(FetchRequest("GET", url))
                ra = resp.headers.get("retry-after")
                throttle.feedback(SITE, resp.elapsed, resp.status, float(ra) if ra else None)
                with lock:
                    statuses[resp.status] += 1
                if resp.status == 200:
                    break

    pool = [threading.Thread(target=work) for _ in range(int(threads))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    throttle.flush()
    print(json.dumps({"statuses": {str(k): v for k, v in statuses.items()}, "waits": waits}))


if __name__ == "__main__":
    main(sys.argv[1:])
