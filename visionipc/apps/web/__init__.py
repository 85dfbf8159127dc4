"""One policy for every web surface of visionipc (vipc-view, vipc-foxglove, any later one).

- ``policy``: who is answered: Host (DNS rebinding), Origin (other sites' pages), the
  owner's per-run token (``?token=...``, then a cookie).
- ``flags``: ``--allow-host``, ``--allow-origin``, ``--no-auth``, ``--max-connections``.
- ``listener``: how many and how long: a connection limit that closes the oldest idle or
  half-open connection for a new one, header and idle timeouts, accept errors backed off
  and logged once.
- ``peerlog``: what is said about peers: escaped, one line each, rate-limited.

A surface builds its aiohttp application with ``middlewares=[guard.middleware,
policy.middleware]`` and runs it with ``listener.start_site``; per-client queues that keep
only the newest frames are the surface's own (vipc-view: feed.py; vipc-foxglove: hub.py).
"""
