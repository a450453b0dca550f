"""The settings of each area beside the core `config.Settings`, and the tools that read them all.

base.py       ChaincrawlSettings: the base every settings class subclasses (errors, caching)
storage.py    outbox, sinks, routing
proxy.py      the proxy pool
browser.py    rendered pages
monitor.py    the exporter and alert rules
suite.py      variables only the test suite reads
sitevars.py   per-site variables (`site_env`)
envcheck.py   the unknown-variable check a worker runs at start
reference.py  the configuration reference (`python -m settings.reference`)
"""
