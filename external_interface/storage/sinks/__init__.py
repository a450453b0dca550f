"""Sink implementations: `jsonl`, `mongo`, `postgres`, `http`, `kafka`.

Each module holds one sink class and imports only `sinks.base` (and `sinks.history`, the
versions of field history) of storage;
`external_interface.storage.routing` registers a factory per name. A sink imports its client library
(pymongo, psycopg, confluent-kafka) only when it is built, so an unused sink's need not be installed.
"""
