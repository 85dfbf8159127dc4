"""Applications built on the msgq library: ``msgq-top`` (top.py, diagnostics.py)
and ``msgq-bridge`` (bridge.py). The library never imports them."""
