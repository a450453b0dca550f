"""Kafka sink (confluent-kafka): one message per item, keyed by the item's unique key.

UNTESTED AGAINST A REAL BROKER: none can run on the development machines. The tests cover the
message layout and that an unreachable broker becomes a `SinkError` (so items wait in the outbox).

- Topic: `CHAINCRAWL_KAFKA_TOPIC_PREFIX` + item type (`chaincrawl.demo.post`).
- Key: the JSON array of the key values; value: `{"item": {...}, "origin": {...}}`;
  header `entry`: the outbox entry id.
- The producer is idempotent (`enable.idempotence`, `acks=all`), so its own retries never
  duplicate. `write` returns only when every message is acknowledged (`flush`).

Exactly once: not in Kafka itself (that needs transactions tied to the consumer of our stream).
A redelivered outbox entry (crash between the broker's ack and our XACK) is produced again, so
delivery is at least once; consumers get effectively-once by keying on the message key (a
log-compacted topic keeps the latest value per key) or by skipping `entry` headers they have seen.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from exceptions import ConfigError
from external_interface.storage.sinks.base import (
    Origin,
    PermanentSinkError,
    SinkError,
    key_values,
    safe_name,
)
from settings.storage import get_storage_settings

if TYPE_CHECKING:
    from config import Settings


class KafkaSink:
    """Produces items to a topic per type and waits for the broker's acknowledgements."""

    name = "kafka"

    def __init__(
        self,
        bootstrap: str,
        *,
        topic_prefix: str = "chaincrawl.",
        timeout: float = 10.0,
        config: dict[str, Any] | None = None,
    ) -> None:
        try:
            from confluent_kafka import Producer
        except ImportError as e:  # optional dependency
            raise ConfigError("the kafka sink needs `pip install confluent-kafka`") from e
        if not bootstrap:
            raise ConfigError("the kafka sink needs CHAINCRAWL_KAFKA_BOOTSTRAP")
        self.topic_prefix = topic_prefix
        self.timeout = timeout
        conf = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
            "linger.ms": 20,
            "message.timeout.ms": int(timeout * 1000),
            "client.id": "chaincrawl",
            "logger": logging.getLogger("chaincrawl.kafka"),  # not librdkafka's raw stderr
        }
        conf.update(config or {})
        self.producer = Producer(conf)
        self._lock = threading.Lock()  # one batch in flight at a time: flush() is per producer

    @classmethod
    def from_settings(cls, settings: Settings) -> KafkaSink:
        ss = get_storage_settings()
        return cls(
            ss.kafka_bootstrap,
            topic_prefix=ss.kafka_topic_prefix,
            timeout=ss.kafka_timeout,
        )

    def topic(self, item_type: str) -> str:
        return self.topic_prefix + safe_name(item_type)

    def messages(
        self,
        item_type: str,
        key_fields: list[str],
        items: list[dict[str, Any]],
        origins: Sequence[Origin] | None = None,
    ) -> list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]]:
        """(topic, key, value, headers) per item."""
        origins = list(origins) if origins is not None else [Origin()] * len(items)
        topic = self.topic(item_type)
        out = []
        try:
            for item, o in zip(items, origins, strict=True):
                key = orjson.dumps(list(key_values(item, key_fields)))
                value = orjson.dumps(
                    {
                        "item": item,
                        "origin": {"entry": o.entry, "run": o.run, "step": o.step, "task": o.task},
                    },
                    option=orjson.OPT_NON_STR_KEYS,
                )
                out.append((topic, key, value, [("entry", o.entry.encode())]))
        except TypeError as e:
            raise PermanentSinkError(f"kafka: item is not JSON-serialisable: {e}", self.name) from e
        return out

    def write(
        self,
        item_type: str,
        key_fields: list[str],
        items: list[dict[str, Any]],
        *,
        origins: Sequence[Origin] | None = None,
    ) -> None:
        from confluent_kafka import KafkaError, KafkaException

        msgs = self.messages(item_type, key_fields, items, origins)
        errors: list[Any] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        with self._lock:
            try:
                for topic, key, value, headers in msgs:
                    self.producer.produce(
                        topic, value=value, key=key, headers=headers, on_delivery=delivered
                    )
                    self.producer.poll(0)
                left = self.producer.flush(self.timeout)
            except (KafkaException, BufferError) as e:
                self._purge()
                raise SinkError(f"kafka {item_type}: {e}", self.name) from e
            if left or errors:
                self._purge()
                first = errors[0] if errors else f"{left} message(s) unacknowledged"
                if (
                    errors
                    and getattr(errors[0], "code", lambda: None)() == KafkaError.MSG_SIZE_TOO_LARGE
                ):
                    raise PermanentSinkError(f"kafka {item_type}: {first}", self.name)
                raise SinkError(f"kafka {item_type}: {first}", self.name)

    def _purge(self) -> None:
        """Drop what is still queued, so the drainer's retry does not send it twice."""
        try:
            self.producer.purge(in_queue=True, in_flight=False)
            self.producer.flush(0)
        except Exception:  # best effort
            pass

    def close(self) -> None:
        self.producer.flush(self.timeout)
