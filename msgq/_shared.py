"""Private helpers every msgq and visionipc object shares (one definition each).

``Closeable``: the resource lifecycle. A subclass defines ``close()`` (idempotent,
safe after a fork and from ``__del__``) and gets ``with obj:`` and a best-effort
close at garbage collection.
"""


class Closeable:
    """``with obj:`` closes at the end of the block; an object dropped without
    ``close()`` is closed when it is collected (errors there are swallowed: the
    interpreter may be shutting down)."""

    __slots__ = ()

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
