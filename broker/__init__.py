"""The message broker and recovering what it loses: the Celery app's broker side and the patches
and records that bring a lost or stranded message back.

    app.py          the Celery app factory from settings: queues, routes, priorities, orjson
    workers.py      the live workers' task sets (heartbeat) and the task ids refused as unknown
    kombu_guard.py  patches to kombu's Redis transport: a malformed payload or a dropped
                    connection does not end the consumer (checked against kombu's source)
    owners.py       who holds each unacknowledged message: a dead worker's come back in seconds
    drops.py        a dropped broker connection has the sweeper check every run
"""
