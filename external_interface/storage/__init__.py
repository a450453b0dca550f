"""Where items go once a page committed them (docs/storage.md).

routing.py  which sinks each item type goes to, and the sink registry
outbox/     the drainer: committed items from the Redis stream to the sinks, exactly once
sinks/      the sinks: jsonl, mongo, postgres, http, kafka; field history (`history.py`)
export.py   items out of the JSONL store, as JSON Lines or CSV (`control.sh items`)
columnar.py items out of the JSONL store as a Parquet dataset (`--format parquet`)
"""
