from __future__ import annotations

from chains import define, step

define("sched_ping", step("sched.local.ping"))
define("sched_slow", step("sched.local.slow"))
