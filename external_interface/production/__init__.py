"""Production chains that refill resource pools, one package per site, plus the vault that
hands a freshly made secret from one step to the next without putting it in a message.

Importing this package registers every site's endpoints (on the `resources` queue), chains,
producers (`pool.register_producer`), ban rules, signers and user-agent sets. The cookie and
device modules import it, so any process that lends cookies or devices knows how to make them.
"""

from __future__ import annotations

from external_interface.production import demo  # noqa: F401
