"""msgq-bridge: carry topics between this machine's shared memory and ZeroMQ TCP.

``msgq-bridge out TOPIC...`` subscribes to local topics and republishes each
on a ZeroMQ PUB socket bound at ``tcp://ADDR:zmq_port(TOPIC)``; a subscriber
on another machine (our ``zmq`` backend, or a plain pyzmq SUB socket) then
receives it. ``msgq-bridge in TOPIC... --from HOST`` does the reverse: it
subscribes to ``tcp://HOST:zmq_port(TOPIC)`` and republishes into local
shared-memory topics. Every message is one ZeroMQ frame holding exactly the
payload bytes.

The local publisher is never slowed down: the ring never waits for readers,
and on the network side each remote subscriber has a bounded queue
(``--hwm`` messages); when any remote subscriber's queue is full, the message
is dropped (for every remote subscriber, so the stream each one sees has the
same gaps) and counted. If the bridge itself falls a whole ring behind, its
subscriber skips ahead and counts ``local_resets``. ``-v`` prints both.
ZeroMQ reconnects on its own (heartbeats detect dead peers), and a local
publisher that restarts, even with another segment size, is picked up by the
bridge's subscriber.

Memory stays bounded whatever a peer sends: ``in`` sets ZeroMQ's maximum
message size (``ZMQ_MAXMSGSIZE``) to the largest message its local topic can
hold, so a larger one is never buffered: ZeroMQ drops that peer's connection
(and reconnects), and at most ``--hwm`` messages of that size wait.
"""

import argparse
import contextlib
import logging
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, TextIO, Tuple

from msgq import add_version_flag, sockets
from msgq import curve as msgq_curve
from msgq.cli import parse_args
from msgq.errors import IpcError, MessageTooLargeError, MultiplePublishersError
from msgq.names import current_prefix, validate_name, zmq_port
from msgq.schemas import MAX_BODY_BYTES, announcement, from_announcement, set_topic_schema, topic_schema
from msgq.tooling import ZMQ_HEADROOM, CappedConnection, ensure_descriptors

Log = Callable[[str], None]

POLL_MS = 100  # longest wait before the loop checks for a stop request (and for a reconnect due)
BATCH = 256  # messages moved per socket per turn, so one busy topic cannot starve the others
HEARTBEAT_MS = 1000
HEARTBEAT_TIMEOUT_MS = 3000

EPILOG = """\
examples:
  # machine A: publish the local topics carState and gpsLocation on the network
  msgq-bridge out carState gpsLocation --bind 0.0.0.0
  # machine B: receive them into B's shared memory, where local subscribers read them
  msgq-bridge in carState gpsLocation --from machine-a.local

Ports are zmq_port(TOPIC) (msgq.names), which depends on MSGQ_PREFIX: both
machines must use the same prefix. Without --curve the stream is not
encrypted or authenticated: bind to a trusted interface. With --curve DIR
(a keys directory: python -m msgq.curve DIR) `out` admits only the client
keys in DIR/authorized and `in` presents DIR's client key; all encrypted.
"""


class _TopicStats:
    __slots__ = ("topic", "messages", "bytes", "drops", "subscribers", "local")

    def __init__(self, topic: str, local: Optional[sockets.SubSocket] = None) -> None:
        self.topic = topic
        self.local = local  # out: the bridge's own subscriber, whose resets are data it lost
        self.messages = 0
        self.bytes = 0
        self.drops = 0
        self.subscribers: Optional[int] = None  # remote subscribers (out: known from subscription messages)


class _Stopper:
    """SIGINT / SIGTERM ask the loop to stop; the loop checks at least every POLL_MS."""

    def __init__(self) -> None:
        self.stop = False
        self._saved: Dict[int, Any] = {}  # signal -> its previous handler
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._saved[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.stop = True

    def restore(self) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)


def _zmq() -> Any:
    try:
        import zmq
    except ImportError:
        raise SystemExit("msgq-bridge needs pyzmq: pip install 'visionipc[zmq]'") from None
    return zmq


def _tune(zmq: Any, sock: Any, hwm: int) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    # ZMTP heartbeats: a peer that vanished without closing (cable pulled, host
    # down) is noticed and the connection re-established.
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)


class _Reporter:
    def __init__(self, stats: List[_TopicStats], every: float, direction: str, stream: TextIO) -> None:
        self.stats = stats
        self.every = every
        self.direction = direction
        self.stream = stream
        self.next_at = time.monotonic() + every if every > 0 else None
        self.last = {s.topic: (0, 0) for s in stats}
        self.last_t = time.monotonic()

    def maybe_report(self) -> None:
        if self.next_at is None or time.monotonic() < self.next_at:
            return
        now = time.monotonic()
        seconds = max(now - self.last_t, 1e-9)
        for s in self.stats:
            m0, b0 = self.last[s.topic]
            subs = "" if s.subscribers is None else f" remote_subscribers={s.subscribers}"
            if s.local is not None:
                subs += f" local_resets={s.local.resets}"
            self.stream.write(
                f"msgq-bridge {self.direction} {s.topic}: {(s.messages - m0) / seconds:.1f} msg/s "
                f"{(s.bytes - b0) / seconds / 1e3:.1f} kB/s total={s.messages} drops={s.drops}{subs}\n"
            )
            self.last[s.topic] = (s.messages, s.bytes)
        self.stream.flush()
        self.last_t = now
        self.next_at = now + self.every


def _context(n_sockets: int) -> Tuple[Any, Any]:
    """``(zmq, a new context)``. libzmq aborts the process when it runs out of
    descriptors: refused first, before pyzmq is even imported."""
    ensure_descriptors(f"{n_sockets} ZeroMQ sockets", ZMQ_HEADROOM + 2 * n_sockets)
    zmq = _zmq()
    return zmq, zmq.Context()


def _close_context(ctx: Any) -> None:
    msgq_curve.stop_authenticator(ctx)
    ctx.destroy(linger=0)  # also closes a socket whose setup failed half-way


def run_out(
    topics: Sequence[str],
    bind: str,
    hwm: int,
    verbose_every: float,
    stopper: _Stopper,
    log: Log,
    curve: Optional[str] = None,
) -> int:
    """Local shared-memory topics -> ZeroMQ PUB sockets."""
    zmq, ctx = _context(len(topics))
    ctx_msgq = sockets.Context(backend="msgq")  # the local side is shared memory, whatever MSGQ_BACKEND says
    poller = sockets.Poller()
    routes: List[Tuple[sockets.SubSocket, Any, _TopicStats]] = []  # (subscriber, zmq socket, stats)
    try:
        for topic in topics:
            pub = ctx.socket(zmq.XPUB)
            _tune(zmq, pub, hwm)
            # Counted drops instead of PUB's silent ones: a full queue makes the
            # non-blocking send fail with EAGAIN. Every (un)subscription is
            # passed up, so the bridge knows how many remote subscribers it has.
            pub.setsockopt(zmq.XPUB_NODROP, 1)
            pub.setsockopt(zmq.XPUB_VERBOSER, 1)
            if curve:
                msgq_curve.make_server(pub, curve)
            endpoint = f"tcp://{bind}:{zmq_port(topic)}"
            try:
                pub.bind(endpoint)
            except zmq.ZMQError as exc:
                pub.close(0)
                log(f"cannot bind {endpoint} for {topic!r}: {exc}")
                return 1
            sub = sockets.SubSocket()
            sub.connect(ctx_msgq, topic)
            poller.registerSocket(sub)
            stats = _TopicStats(topic, local=sub)
            stats.subscribers = 0
            routes.append((sub, pub, stats))
            log(f"{topic} -> {endpoint}")
        by_sub = {id(sub): (sub, pub, stats) for sub, pub, stats in routes}
        reporter = _Reporter([r[2] for r in routes], verbose_every, "out", sys.stderr)
        while not stopper.stop:
            for sub in poller.poll(POLL_MS):
                _, pub, stats = by_sub[id(sub)]
                for msg in sub.receive_batch(BATCH, 0):
                    try:
                        pub.send(msg, zmq.NOBLOCK, copy=len(msg) < 65536)
                        stats.messages += 1
                        stats.bytes += len(msg)
                    except zmq.Again:
                        stats.drops += 1
            for _, pub, stats in routes:
                _count_subscriptions(zmq, pub, stats)
            reporter.maybe_report()
        return 0
    finally:
        for sub, pub, _ in routes:
            sub.close()
            pub.close(0)
        _close_context(ctx)


def _count_subscriptions(zmq: Any, pub: Any, stats: _TopicStats) -> None:
    """Take the (un)subscriptions waiting on ``pub``; a new subscriber gets the topic's
    declared schema (msgq.schemas: a two-frame announcement, which `in` declares on its side)."""
    joined, subscribers = False, stats.subscribers
    assert subscribers is not None  # run_out's topics count them from 0
    while True:
        try:
            event = pub.recv(zmq.NOBLOCK)
        except zmq.Again:
            break
        if event[:1] == b"\x01":
            subscribers += 1
            joined = True
        elif event[:1] == b"\x00":
            subscribers = max(0, subscribers - 1)
        stats.subscribers = subscribers
    if joined:
        try:
            schema = topic_schema(stats.topic)
        except IpcError:  # a schema file that is not ours: nothing to carry
            schema = None
        if schema is not None:
            with contextlib.suppress(zmq.Again):
                pub.send_multipart(announcement(schema), zmq.NOBLOCK)


class _Incoming:
    """One topic of ``in``: a SUB connected to the remote publisher (a
    :class:`msgq._zmq_capped.CappedConnection`: messages capped at the largest the
    local topic can hold, the connection made again after the peer closed it) and
    the local publisher."""

    def __init__(
        self,
        zmq: Any,
        ctx: Any,
        ctx_msgq: sockets.Context,
        topic: str,
        host: str,
        hwm: int,
        segment_size: int,
        curve: Optional[str],
    ) -> None:
        self.stats = _TopicStats(topic)
        self.sub: Any = None
        self.link: Optional[CappedConnection] = None
        self.pub = sockets.PubSocket()
        self.pub.connect(ctx_msgq, topic, segment_size)
        try:
            self.sub = ctx.socket(zmq.SUB)
            _tune(zmq, self.sub, hwm)
            self.sub.setsockopt(zmq.SUBSCRIBE, b"")
            if curve:
                msgq_curve.make_client(self.sub, curve)
            endpoint = f"tcp://{host}:{zmq_port(topic)}"
            # The cap also lets the largest schema announcement in (a schema may be larger than the
            # topic's largest message): a larger message is refused by libzmq, which closes the
            # connection, and one the topic cannot hold is dropped when republished (counted, logged).
            cap = max(self.pub.max_message_size, MAX_BODY_BYTES)
            self.link = link = CappedConnection(zmq, self.sub, endpoint, cap)
        except BaseException:
            self.close()
            raise
        self.monitor, self.endpoint = link.monitor, endpoint

    @property
    def open_link(self) -> CappedConnection:
        assert self.link is not None, "used after close()"
        return self.link

    def reconnect_if_due(self, now: float, log: Log) -> None:
        link = self.open_link
        if link.reconnect_if_due(now) and link.reconnects == 1:
            log(
                f"{self.endpoint} closed its connection ({self.stats.topic!r}: the peer went away, or "
                f"sent a message over {link.max_size} bytes, which is refused); reconnecting"
            )

    def close(self) -> None:
        """Idempotent."""
        if self.link is not None:
            self.link.close_monitor()
        if self.sub is not None:
            self.sub.close(0)
        self.sub = self.link = None
        self.pub.close()


def run_in(
    topics: Sequence[str],
    host: str,
    hwm: int,
    segment_size: int,
    verbose_every: float,
    stopper: _Stopper,
    log: Log,
    curve: Optional[str] = None,
) -> int:
    """ZeroMQ SUB sockets -> local shared-memory topics."""
    zmq, ctx = _context(2 * len(topics))  # a SUB and its connection monitor each
    ctx_msgq = sockets.Context(backend="msgq")
    poller = zmq.Poller()
    routes: Dict[Any, _Incoming] = {}  # zmq SUB -> _Incoming
    monitors: Dict[Any, _Incoming] = {}  # its monitor -> _Incoming
    warned: Set[str] = set()
    opened: List[_Incoming] = []
    route: Optional[_Incoming]
    try:
        for topic in topics:
            route = _Incoming(zmq, ctx, ctx_msgq, topic, host, hwm, segment_size, curve)
            opened.append(route)
            routes[route.sub], monitors[route.monitor] = route, route
            poller.register(route.sub, zmq.POLLIN)
            poller.register(route.monitor, zmq.POLLIN)
            log(f"{route.endpoint} -> {topic}")
        reporter = _Reporter([r.stats for r in routes.values()], verbose_every, "in", sys.stderr)
        while not stopper.stop and routes:
            for sock, _ in poller.poll(POLL_MS):
                if sock in monitors:
                    monitors[sock].open_link.closed()
                    continue
                route = routes.get(sock)
                if route is None:
                    continue  # unregistered in this round
                pub, stats = route.pub, route.stats
                for _ in range(BATCH):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    if len(frames) != 1:  # not a msgq message (one frame of payload): a schema?
                        try:
                            schema = from_announcement(frames)
                        except IpcError as exc:
                            schema = None
                            log(f"{stats.topic!r}: {exc} from {route.endpoint}: ignored")
                        if schema is not None:
                            set_topic_schema(stats.topic, schema)
                        else:
                            stats.drops += 1
                        continue
                    try:
                        pub.send(frames[0])
                    except MessageTooLargeError as exc:
                        stats.drops += 1
                        if stats.topic not in warned:
                            warned.add(stats.topic)
                            log(f"dropping messages of {stats.topic!r}: {exc}")
                        continue
                    except MultiplePublishersError:
                        # A local publisher took the topic over: it wins; stop forwarding it.
                        log(f"another local publisher took over {stats.topic!r}; no longer forwarding it")
                        poller.unregister(sock)
                        poller.unregister(route.monitor)
                        del routes[sock], monitors[route.monitor]
                        route.close()
                        break
                    stats.messages += 1
                    stats.bytes += len(frames[0])
                    route.open_link.working()  # the next closed connection waits the shortest back-off
            now = time.monotonic()
            for route in routes.values():
                route.reconnect_if_due(now, log)
            reporter.maybe_report()
        if not stopper.stop:
            log("local publishers took over every topic; nothing left to forward")
            return 1
        return 0
    finally:
        for route in opened:
            route.close()
        _close_context(ctx)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="msgq-bridge",
        description="Forward msgq topics between this machine's shared memory and ZeroMQ TCP "
        "(one frame per message, on port zmq_port(TOPIC)).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="direction", metavar="{out,in}", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("topics", nargs="+", metavar="TOPIC", help="topic names")
    common.add_argument(
        "--hwm", type=int, default=1000, help="messages queued per remote peer before dropping (default: 1000)"
    )
    common.add_argument(
        "--curve",
        metavar="DIR",
        help="authenticate and encrypt with ZeroMQ CURVE using the keys directory DIR (python -m msgq.curve DIR)",
    )
    common.add_argument("-v", "--verbose", action="store_true", help="print statistics to stderr periodically")
    common.add_argument(
        "--stats-interval", type=float, default=5.0, metavar="S", help="seconds between -v statistics (default: 5)"
    )
    out = sub.add_parser(
        "out",
        parents=[common],
        help="local shared-memory topics -> ZeroMQ PUB sockets",
        description="Publish local topics on tcp://ADDR:zmq_port(TOPIC).",
    )
    out.add_argument(
        "--bind",
        default="*",
        metavar="ADDR",
        help="interface address to bind (default: * = all interfaces; 127.0.0.1 for this machine only)",
    )
    inn = sub.add_parser(
        "in",
        parents=[common],
        help="ZeroMQ publishers on HOST -> local shared-memory topics",
        description="Subscribe to tcp://HOST:zmq_port(TOPIC) and republish into local topics.",
    )
    inn.add_argument("--from", dest="host", required=True, metavar="HOST", help="host running `msgq-bridge out`")
    inn.add_argument(
        "--segment-size",
        type=int,
        default=0,
        metavar="BYTES",
        help="ring size of local topics the bridge creates (default: the existing size, or 1 MiB)",
    )
    add_version_flag(parser)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parse_args(parser, argv, config=True)
    try:
        current_prefix()
        topics = list(dict.fromkeys(validate_name(t) for t in args.topics))
    except IpcError as exc:
        parser.error(str(exc))
    if args.hwm < 1:
        parser.error("--hwm must be at least 1")
    if args.curve:
        try:  # the keys this side needs, checked before anything starts
            if args.direction == "out":
                msgq_curve.check_server_dir(args.curve)
            else:
                msgq_curve.check_client_dir(args.curve)
        except (IpcError, ImportError) as exc:
            parser.error(str(exc))
    every = args.stats_interval if args.verbose else 0

    log = logging.getLogger("msgq-bridge").info  # msgq.cli's one format: "msgq-bridge: text"

    stopper = _Stopper()  # before any socket exists, so a stop request never leaves a segment behind
    try:
        if args.direction == "out":
            return run_out(topics, args.bind, args.hwm, every, stopper, log, args.curve)
        return run_in(topics, args.host, args.hwm, args.segment_size, every, stopper, log, args.curve)
    except KeyboardInterrupt:
        return 0
    except IpcError as exc:
        log(f"{exc}")
        return 1
    finally:
        stopper.restore()


if __name__ == "__main__":
    sys.exit(main())
