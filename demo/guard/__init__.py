"""The guarded front: the platform over TLS and HTTP/2, answering only clients that look like
the browser their user agent names (demo/README.md, "The guarded front").

    hello.py    the TLS ClientHello's traits (GREASE, record_size_limit, ALPN)
    verdict.py  the judgement: handshake, HTTP/2 SETTINGS and pseudo-headers, header order
    front.py    the server (h2 on asyncio), forwarding what passes to the platform
    cert.py     a CA and a server certificate made on the spot
"""
