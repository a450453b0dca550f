"""The machinery under the endpoint contract (`base_task`): what a page passes through.

page.py       one page from its begin to its commit or failure (`run_page`)
policy.py     `decide`: a failed page's retry, wait, skip or fail (a pure function)
endpoints.py  parameter and item schemas, the registry of endpoints, queues and routes
context.py    `Context`: requests, rendered pages, follow-ups, log and deadline of a page
guards.py     `need`/`need_int`, and a page that yielded nothing (`empty`, `must_yield`)
hooks.py      the site author's lifecycle hooks (before_request ... on_error) and their signals
adaptive.py   `render="auto"`: an endpoint run on a fetched page, a rendered one, or both
runtime.py    what a worker process keeps between pages (`Runtime`), requeue pauses
commits.py    a finished page's outbox entries and child tasks, and their commit (`Committer`):
              one round trip per page or per batch
batch.py      the batch task: several pages in one broker message
lost.py       a message whose state is on a lost slot range: parked, not requeued
live.py       one endpoint, once, live, outside the broker (`control.sh parse` and `shell`)
unknown.py    a task this worker does not know: dead-lettered, never dropped
"""
