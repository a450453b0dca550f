"""Settings whose values the workers would refuse or fail on, found before anything starts.

`config` lists them beside the misspelled names (exit 2): a limits entry that is no rate
(`CHAINCRAWL_LIMITS`, `CHAINCRAWL_DEFAULT_LIMITS`), a sink no factory is registered under
(`CHAINCRAWL_SINKS`, a per-type rule). `start`, which imports no site package itself (one that
exits at import would end it), warns of a sink unknown to the built-in ones before it starts
a worker: a worker whose drainer cannot build its sinks logs the error and stores nothing,
and its runs wait in `storing`.
"""

from __future__ import annotations

import contextlib

from exceptions import ChainCrawlError


def value_problems() -> list[str]:
    """One line per setting whose value cannot be used, each naming the variable (`config`).
    The site packages are imported first (a site may register a sink or route its types); one
    that fails to import is the workers' to report, and the checks go on without it."""
    import sites
    from scheduling.limits import effective_limits

    with contextlib.suppress(Exception, SystemExit):
        sites.sites()
    out = []
    try:
        effective_limits()
    except (ChainCrawlError, ValueError) as exc:
        out.append(str(exc))
    return out + sink_problems()


def sink_problems() -> list[str]:
    """The sink setting's problem, if any, against the sinks registered so far (`start`'s
    check, before any site package is imported: the built-in sinks)."""
    from external_interface.storage.routing import check_sinks

    try:
        check_sinks()
    except ChainCrawlError as exc:
        return [str(exc)]
    return []
