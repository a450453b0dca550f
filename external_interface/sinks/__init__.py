"""Sink implementations: `jsonl`, `mongo`, `http`, `kafka`.

Each module holds one sink class; `external_interface.storage` registers a factory per name and
imports a module only when its sink is configured, so an unused sink's client library (pymongo,
confluent-kafka) need not be installed.
"""
