"""The Kafka sink. No broker can run here: only the message layout and the outage path."""

from __future__ import annotations

import time

import orjson
import pytest

from external_interface.storage.sinks.base import Origin, PermanentSinkError, SinkError
from utils.servers import free_port

pytest.importorskip("confluent_kafka")

from external_interface.storage.sinks.kafka import KafkaSink


def test_message_layout() -> None:
    sink = KafkaSink(f"127.0.0.1:{free_port()}", topic_prefix="cc.", timeout=0.5)
    item = {"post_id": 1, "lang": "en", "a.b": 2}
    origin = Origin("100-0", "r1", "feed", "demo.h5.feed")
    (msg,) = sink.messages("demo.post", ["post_id", "lang"], [item], [origin])
    topic, key, value, headers = msg
    assert topic == "cc.demo.post"
    assert orjson.loads(key) == [1, "en"]
    assert orjson.loads(value) == {
        "item": {"post_id": 1, "lang": "en", "a.b": 2},
        "origin": {"entry": "100-0", "run": "r1", "step": "feed", "task": "demo.h5.feed"},
    }
    assert headers == [("entry", b"100-0")]
    with pytest.raises(PermanentSinkError):
        sink.messages("demo.post", ["post_id"], [{"lang": "en"}])


def test_unreachable_broker_is_a_transient_error() -> None:
    sink = KafkaSink(f"127.0.0.1:{free_port()}", timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(SinkError) as info:
        sink.write("demo.post", ["post_id"], [{"post_id": 1}], origins=[Origin("100-0")])
    assert not isinstance(info.value, PermanentSinkError)
    assert time.monotonic() - t0 < 10
    sink.close()
