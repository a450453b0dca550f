"""Sink implementations: `jsonl`, `mongo`, `http`, `kafka`.

Each module holds one sink class and imports only `sinks.base` of storage;
`external_interface.storage.routing` registers a factory per name. A sink imports its client library
(pymongo, confluent-kafka) only when it is built, so an unused sink's need not be installed.
"""
