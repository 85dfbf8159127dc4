"""What the command-line tools of msgq and visionipc use from the library beyond its
sockets and queues, public so that no application imports a private module (and so
that your tools can use the same pieces):

- :func:`printable`: text from other programs and users made safe to print (control
  characters and bytes that are not UTF-8 escaped: a hostile name cannot move the
  cursor or fake a line);
- :func:`scoped_env`: environment variables set for a block and restored after;
- :func:`ensure_descriptors`, :data:`ZMQ_HEADROOM`: refuse to start ZeroMQ work with too
  few file descriptors left (libzmq aborts the process instead of failing);
- :class:`CappedConnection`: a ZeroMQ SUB connection whose messages are capped
  (``ZMQ_MAXMSGSIZE``) and that reconnects after a peer broke the cap;
- :func:`segment_stats`: a topic ring's counters, publisher and readers read from its
  file (``segment_stats(directory, file_name) -> dict``; what ``msgq-top`` shows).
"""

from msgq._descriptors import ZMQ_HEADROOM, DescriptorsExhaustedError, ensure_descriptors
from msgq._msgq import segment_stats
from msgq._printable import printable
from msgq._shared import scoped_env
from msgq._zmq_capped import CappedConnection

__all__ = [
    "printable",
    "scoped_env",
    "ensure_descriptors",
    "ZMQ_HEADROOM",
    "DescriptorsExhaustedError",
    "CappedConnection",
    "segment_stats",
]
