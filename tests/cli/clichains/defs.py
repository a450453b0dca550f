from __future__ import annotations

from chains import define, step

# one page per seed: `{"path": "/status/404"}` fails for good, `{"path": "/detail/x"}` succeeds
define("cli_probe", step("testsite.local.probe"))

# one listing page per seed: seeds are checked strictly (`{"page": "2"}` is refused)
define("cli_listing", step("testsite.local.listing"))

# rows (`li.row`) of any page by URL: a page without them is counted empty and warned
define("cli_rows", step("testsite.local.rows"))
