"""utils.outage: the lines a command run by hand (the CLI, the outbox's views) prints while
Redis does not answer, defined once for both; an error's first line."""

from __future__ import annotations

import pytest
import redis

from utils.outage import first_line, stderr_notify
from utils.redis import hostport

WAIT = "(up to 30s: CHAINCRAWL_REDIS_WAIT)"


def test_the_startup_node_away_then_back(capsys: pytest.CaptureFixture[str]) -> None:
    notify = stderr_notify("127.0.0.1:6379", 30)
    notify(redis.ConnectionError("Connection refused.\nsecond line"))
    notify(None)
    assert capsys.readouterr().err.splitlines() == [
        f"Redis at 127.0.0.1:6379 does not answer (Connection refused.), waiting… {WAIT}",
        "Redis at 127.0.0.1:6379 answers again",
    ]


def test_a_cluster_names_the_node_that_failed(capsys: pytest.CaptureFixture[str]) -> None:
    notify = stderr_notify("127.0.0.1:7000", 30)
    notify(redis.ConnectionError("Error 111 connecting to 127.0.0.1:7002. Connection refused."))
    notify(None)
    assert capsys.readouterr().err.splitlines() == [
        "Redis at 127.0.0.1:7002 does not answer (Error 111 connecting to 127.0.0.1:7002. "
        f"Connection refused.), waiting… {WAIT}",
        "Redis Cluster answers again (127.0.0.1:7002 failed over, or back)",
    ]


def test_a_loading_redis_is_said_so(capsys: pytest.CaptureFixture[str]) -> None:
    stderr_notify("h:1", 30)(redis.BusyLoadingError("Redis is loading the dataset in memory"))
    assert capsys.readouterr().err == f"Redis at h:1 is loading, waiting… {WAIT}\n"


def test_first_line_is_one_line_or_the_type() -> None:
    assert first_line(redis.ResponseError("  ERR one\ntwo\n")) == "ERR one"
    assert first_line(redis.TimeoutError()) == "TimeoutError"


def test_hostport_of_a_plain_and_a_cluster_url() -> None:
    assert hostport("redis://:s3cret@example.org:6380/0") == ("example.org", 6380)
    assert hostport("redis://") == ("127.0.0.1", 6379)
    assert hostport("redis+cluster://u:p%40ss@10.0.0.1:7001,10.0.0.2:7002") == ("10.0.0.1", 7001)
