"""Reports from spawned children to the test, one pipe per child.

A ``multiprocessing.Queue`` shared by children is unsafe when a test SIGKILLs
one of them: a child killed while its feeder thread holds the queue's
cross-process write lock leaves it held, and every later ``put`` by any child
blocks forever. Here each child writes its own pipe, so a kill can break only
that pipe (the parent then sees its end of file)."""

import multiprocessing
import multiprocessing.connection
import queue
import time

SPAWN = multiprocessing.get_context("spawn")


class Reporter:
    """A child's end of its own pipe to the parent's ``Results``."""

    def __init__(self, conn):
        self._conn = conn

    def put(self, item):
        self._conn.send(item)  # no lock shared with any other process

    def close(self):
        self._conn.close()


class Results:
    """Reports of spawned children, one pipe per child (a ``Queue``'s ``put``,
    ``get``, ``empty`` for these tests). Pass it to ``start``, which gives the
    child a ``Reporter`` of its own. Killing one child can break only its own
    pipe (the parent then sees its end of file), never another child's reports."""

    def __init__(self):
        self._readers = []
        self._items = []

    def reporter(self):
        reader, writer = SPAWN.Pipe(duplex=False)
        self._readers.append(reader)
        return Reporter(writer)

    def _drain(self, timeout):
        for reader in multiprocessing.connection.wait(self._readers, timeout):
            try:
                self._items.append(reader.recv())
            except EOFError:  # that child is gone (exited, or was killed even mid-report)
                self._readers.remove(reader)
                reader.close()

    def get(self, timeout):
        deadline = time.monotonic() + timeout
        while not self._items:
            left = deadline - time.monotonic()
            if left <= 0 or not self._readers:
                raise queue.Empty
            self._drain(left)
        return self._items.pop(0)

    def empty(self):
        if not self._items and self._readers:
            self._drain(0)
        return not self._items

    def close(self):
        for reader in self._readers:
            reader.close()
        self._readers = []
