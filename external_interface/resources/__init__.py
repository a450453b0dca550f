"""What is lent to each request: providers, the pools they lend from, and the rules that judge
what an answer says about each resource (docs/resources.md).

    base.py        the provider interface the fetch layer calls around every request, the registry
    lease.py       the lease engine under every pool (lease.lua); the leases in flight
    pool.py        per-site pools of cookies and device ids on the lease engine (produce.lua);
                   PoolProvider, the providers' checkout; producers
    cookie.py      the `cookie` provider
    device_id.py   the `device_id` provider
    user_agent.py  the `user_agent` provider
    sign.py        request signatures: signers per site, the `sign` provider
    captcha.py     captcha recognizers and the `captcha` provider
    accounts.py    site accounts for login chains
    vault.py       a short-lived hand-off for secrets between production steps
    reseal.py      re-sealing every secret kept in Redis with the current key (reseal.lua)
    rules.py       ban rules: what a response says about each member lent for it
    health.py      the health record every pool reports
    proxy/         the proxy pool, its channels per site, validators and harvesters
"""
