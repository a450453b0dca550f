"""The HTTP API sink against a local aiohttp server that fails on demand."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from external_interface.storage.sinks.base import Origin, PermanentSinkError, SinkError
from external_interface.storage.sinks.http import HttpSink
from tests.external_interface.sink_servers import RecordingApi

T = "demo.post"


@pytest.fixture
def api() -> Iterator[RecordingApi]:
    with RecordingApi() as server:
        yield server


def test_retries_with_backoff_then_succeeds(api: RecordingApi) -> None:
    api.fail_first = 2
    sink = HttpSink(api.url, retries=4, backoff=0.05, token="s3cret")
    items = [{"post_id": i, "$odd.key": i} for i in range(3)]
    sink.write(T, ["post_id"], items, origins=[Origin("100-0", "r1", "feed", "t")] * 3)
    assert api.attempts == 3
    (body,) = api.bodies
    assert body["type"] == T and body["key_fields"] == ["post_id"]
    assert body["items"] == items  # JSON carries any field name: nothing to sanitise
    assert body["origins"][0] == {"entry": "100-0", "run": "r1", "step": "feed", "task": "t"}
    assert api.headers[0]["Authorization"] == "Bearer s3cret"
    assert len(api.headers[0]["Idempotency-Key"]) == 32
    # the same chunk sent again carries the same idempotency key; the receiver upserts
    sink.write(T, ["post_id"], items, origins=[Origin("100-0", "r1", "feed", "t")] * 3)
    assert api.headers[1]["Idempotency-Key"] == api.headers[0]["Idempotency-Key"]
    assert len(api.items(T)) == 3
    sink.close()


def test_batches(api: RecordingApi) -> None:
    sink = HttpSink(api.url, batch=2)
    sink.write(T, ["post_id"], [{"post_id": i} for i in range(5)])
    assert [len(b["items"]) for b in api.bodies] == [2, 2, 1]
    sink.close()


def test_gives_up_with_a_transient_error(api: RecordingApi) -> None:
    api.down = True
    sink = HttpSink(api.url, retries=3, backoff=0.01)
    with pytest.raises(SinkError) as info:
        sink.write(T, ["post_id"], [{"post_id": 1}])
    assert not isinstance(info.value, PermanentSinkError)
    assert api.attempts == 3 and "503" in str(info.value)
    sink.close()


def test_refused_data_is_permanent(api: RecordingApi) -> None:
    api.down, api.status = True, 422
    sink = HttpSink(api.url, retries=3, backoff=0.01)
    with pytest.raises(PermanentSinkError):
        sink.write(T, ["post_id"], [{"post_id": 1}])
    assert api.attempts == 1  # no point retrying
    sink.close()


def test_connection_refused_is_transient() -> None:
    from utils.servers import free_port

    sink = HttpSink(f"http://127.0.0.1:{free_port()}/items", retries=2, backoff=0.01, timeout=1)
    with pytest.raises(SinkError):
        sink.write(T, ["post_id"], [{"post_id": 1}])
    sink.close()
