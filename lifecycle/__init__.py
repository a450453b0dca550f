"""The machinery under the endpoint contract (`base_task`): what a page passes through.

endpoints.py  parameter and item schemas, the registry of endpoints, queues and routes
context.py    `Context`: requests, rendered pages, follow-ups, log and deadline of a page
runtime.py    what a worker process keeps between pages (`Runtime`), requeue pauses
commits.py    a finished page's outbox entries and child tasks, and their commit: one round
              trip per page or per batch
batch.py      the batch task: several pages in one broker message
live.py       one endpoint, once, live, outside the broker (`control.sh parse` and `shell`)
unknown.py    a task this worker does not know: dead-lettered, never dropped
"""
