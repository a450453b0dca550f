"""Two sites sharing one fleet budget (tests/scheduling/test_fleet_workers.py): the slow
endpoint's request under the names of sites `alpha` and `beta`, each on its site's queue."""

from __future__ import annotations

from base_task import endpoint
from tests.scheduling.schedsite.local.slow import SlowDone, SlowParams, slow

alpha = endpoint(SlowParams, items=[SlowDone], name="alpha.local.work")(slow.spec.fn)
beta = endpoint(SlowParams, items=[SlowDone], name="beta.local.work")(slow.spec.fn)
