"""A lossless broadcast queue: one writer, N readers known at creation (cpp/broadcast/README.md).

Every reader gets every message, in order, exactly once. Messages travel
through a shared-memory ring of chunks (``cpp/broadcast``): the writer reuses
a chunk only after every reader has consumed it, so a slow reader slows the
writer down instead of losing messages. A message larger than a chunk
travels in an overflow file of its own (``msgq/_overflow.py``: an
owner-only directory, kept until every reader has it, so a reader that dies
and comes back under its rank loses nothing whatever the size); readers on
other hosts get every message over ZeroMQ TCP (optionally authenticated and
encrypted with CURVE: :mod:`msgq.curve`). Readers find the queue through a small picklable
:class:`BroadcastHandle`::

    q = BroadcastQueue(n_readers=2)                  # the writer
    handle = q.handle                                # pickle it to the readers
    r = BroadcastQueue.create_from_handle(handle, 0) # reader 0, in any process
    q.enqueue({"frame": np.zeros((480, 640))})       # pickle protocol 5, buffers out of band
    obj = r.dequeue(timeout=1.0)                     # TimeoutError after 1 s

The writer logs a warning naming the readers it waits for every
``warn_interval`` seconds; ``shutdown()`` (from any side) ends every wait with
:class:`~msgq.errors.QueueShutdownError` once the readers have drained what
was written before it.
"""

# By role (issue 35): what both ends share and the factory, the writer, a reader.
from msgq._broadcast_queue import DEFAULT_MAX_MESSAGE_BYTES as DEFAULT_MAX_MESSAGE_BYTES
from msgq._broadcast_queue import BroadcastHandle, BroadcastQueue, queue_basename
from msgq._broadcast_reader import BroadcastQueueReader
from msgq._broadcast_writer import DEFAULT_CHUNK_BYTES as DEFAULT_CHUNK_BYTES
from msgq._broadcast_writer import DEFAULT_MAX_CHUNKS as DEFAULT_MAX_CHUNKS
from msgq._broadcast_writer import DEFAULT_WARN_INTERVAL as DEFAULT_WARN_INTERVAL
from msgq._broadcast_writer import BroadcastQueueWriter

for _public in (BroadcastHandle, BroadcastQueue, BroadcastQueueReader, BroadcastQueueWriter, queue_basename):
    _public.__module__ = __name__  # their names as before the split (pickles of a handle, reprs, docs)

__all__ = ["BroadcastQueue", "BroadcastQueueWriter", "BroadcastQueueReader", "BroadcastHandle", "queue_basename"]
