"""Sink implementations: `jsonl`, `mongo`, `postgres`, `http`, `kafka`.

Each module holds one sink class and imports only `sinks.base` (and `sinks.history`, the
versions of field history) of storage; `external_interface.storage.routing` names each by its
module path and imports it when that sink is first built. A sink imports its client library
(pymongo, psycopg, confluent-kafka) only when it is built, so an unused sink's need not be installed.
"""
