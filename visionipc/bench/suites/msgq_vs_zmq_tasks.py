"""What the workers of the msgq vs pyzmq benchmark (``visionipc.bench.suites.msgq_vs_zmq``)
run: the transports' set-up and the timed tasks, one publisher and one subscriber task
per measurement.

Every task: ctl.barrier("bound") once its publishers exist, then create the
subscribers and wait until its publishers see theirs, ctl.barrier("ready"),
then the timed part. Only set-up goes through the transports; the timed loops
call the sockets' own methods."""

import os
import resource
import time
from itertools import repeat
from typing import Any, Dict, List, Optional, Tuple

from visionipc.bench.pubsub import (
    END,
    MsgqSockets,
    Send,
    ZmqSockets,
    busy_latency_loop,
    flat_send,
    latency_loop,
    paced_send,
    publishing,
    send_end_markers,
    subscribing,
)
from visionipc.bench.pubsub import STAMP as _Q
from visionipc.bench.workers import BenchError, Control, State

MSGQ_TIMEOUT_MS = 5000  # receive timeouts: only there so that a lost message cannot hang a run


class MsgqTransport(MsgqSockets):
    kind = "msgq"

    def __init__(self, state: State, spin_us: Optional[int] = None) -> None:
        super().__init__()
        self.spin_us = spin_us

    def pub(self, topic: str, segment_size: int) -> Any:
        return self.msgq.pub_sock(topic, segment_size=segment_size)

    def sub(self, topic: str, segment_size: int) -> Any:
        s = self.msgq.sub_sock(topic, timeout=MSGQ_TIMEOUT_MS, segment_size=segment_size)
        if self.spin_us is not None:
            s.spin_us = self.spin_us
        return s

    def set_timeout(self, sub: Any, ms: int) -> None:
        sub.setTimeout(ms)


class ZmqTransport(ZmqSockets):
    """pyzmq over ``ipc://`` in the run's folder; XPUB_NODROP for the lossless variant."""

    kind = "zmq"

    def __init__(self, state: State, nodrop: bool = True) -> None:
        import zmq

        if "zmq_ctx" not in state:
            state["zmq_ctx"] = zmq.Context()
        super().__init__(state["zmq_ctx"], nodrop=nodrop, timeout_ms=MSGQ_TIMEOUT_MS)
        self.dir = state["ipc_dir"]

    def url(self, topic: str) -> str:
        return f"ipc://{self.dir}/{topic}"

    def set_timeout(self, sub: Any, ms: int) -> None:
        sub.setsockopt(self.zmq.RCVTIMEO, ms)


class ReferenceTransport:
    """commaai/msgq's own Python sockets (the reference, built from source:
    ``visionipc.bench.reference``), with the same segment sizes as ours. It counts no
    readers: a subscriber is registered once its ``connect`` returned, which the "ready"
    barrier orders before the first send. Its ``send`` takes ``bytes`` only."""

    kind = "reference"

    def __init__(self, state: State) -> None:
        from visionipc.bench import reference

        self.ipc = reference.load("ipc")
        if "ref_ctx" not in state:
            state["ref_ctx"] = self.ipc.Context()
        self.ctx = state["ref_ctx"]

    def pub(self, topic: str, segment_size: int) -> Any:
        s = self.ipc.PubSocket()
        s.connect(self.ctx, topic, segment_size=segment_size)
        return s

    def sub(self, topic: str, segment_size: int) -> Any:
        s = self.ipc.SubSocket()
        s.connect(self.ctx, topic, segment_size=segment_size)
        s.setTimeout(MSGQ_TIMEOUT_MS)
        return s

    def set_timeout(self, sub: Any, ms: int) -> None:
        sub.setTimeout(ms)

    def wait_subscribed(self, pub: Any, timeout: float = 20.0) -> None:
        pass  # see the class: the barrier orders it

    def close(self, *socks: Any) -> None:
        pass  # its sockets close when collected


TRANSPORTS = {"msgq": MsgqTransport, "zmq": ZmqTransport, "reference": ReferenceTransport}


def make_transport(state: State, spec: Dict[str, Any]) -> Any:
    spec = dict(spec)
    return TRANSPORTS[spec.pop("kind")](state, **spec)


def _send_bytes(t: Any, pub: Any) -> Send:
    """``pub``'s send, for a buffer the task reuses (the reference's takes ``bytes`` only)."""
    if t.kind != "reference":
        return pub.send

    def send_copy(b: Any, send: Send = pub.send) -> Any:
        return send(bytes(b))

    return send_copy


def worker_setup(state: State) -> None:
    state["ipc_dir"] = os.environ["BENCH_IPC_DIR"]


def worker_teardown(state: State) -> None:
    ctx = state.pop("zmq_ctx", None)
    if ctx is not None:
        ctx.destroy(linger=0)


def task_latency_pub(
    ctl: Control,
    state: State,
    transport: Dict[str, Any],
    topic: str,
    size: int,
    segment_size: int,
    count: int,
    warmup: int,
    interval_us: int,
) -> Dict[str, Any]:
    t = make_transport(state, transport)
    with publishing(ctl, t, t.pub(topic, segment_size)) as (pub, _):
        paced_send(_send_bytes(t, pub), size, warmup + count, interval_us)
    return {}


def _ctx_switches() -> Tuple[int, int, int]:
    """(voluntary, involuntary context switches, ns spent runnable but waiting
    for a CPU) of this whole process, all its threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    run_delay = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run_delay += int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        run_delay = -1
    return ru.ru_nvcsw, ru.ru_nivcsw, run_delay


def task_latency_sub(
    ctl: Control,
    state: State,
    transport: Dict[str, Any],
    topic: str,
    size: int,
    segment_size: int,
    busy: bool,
    warmup: int,
) -> Dict[str, Any]:
    t = make_transport(state, transport)
    with subscribing(ctl, t, lambda: t.sub(topic, segment_size)) as sub:
        cs0 = _ctx_switches()
        lat: List[int] = []
        if t.kind != "zmq":
            recv, nonblocking, Again = sub.receive, True, ()
        else:
            recv, nonblocking, Again = sub.recv, t.zmq.NOBLOCK, t.zmq.Again
        if busy:
            how = busy_latency_loop(recv, nonblocking, lat, MSGQ_TIMEOUT_MS, Again)
        else:
            how = latency_loop(recv, lat, Again)
        resets = getattr(sub, "resets", 0)  # the reference does not count them
        cs1 = _ctx_switches()
    # Context switches of the whole subscriber process (pyzmq's I/O thread too):
    # involuntary ones are preemptions by other work on its CPU.
    return {
        "samples": lat[warmup:],
        "ended": how,
        "resets": resets,
        "voluntary_cs": cs1[0] - cs0[0],
        "involuntary_cs": cs1[1] - cs0[1],
        "run_delay_ms": (cs1[2] - cs0[2]) * 1e-6 if cs0[2] >= 0 else None,
    }


def task_rtt_ping(
    ctl: Control,
    state: State,
    transport: Dict[str, Any],
    size: int,
    segment_size: int,
    count: int,
    warmup: int,
    tag: str,
) -> Dict[str, Any]:
    t = make_transport(state, transport)
    with publishing(ctl, t, t.pub(f"{tag}ping", segment_size), lambda: t.sub(f"{tag}pong", segment_size)) as (pub, sub):
        buf = bytearray(size)
        pack, unpack, send, now = _Q.pack_into, _Q.unpack_from, _send_bytes(t, pub), time.monotonic_ns
        rtt: List[int] = []
        app = rtt.append
        recv = sub.recv if t.kind == "zmq" else sub.receive  # a pyzmq timeout raises zmq.Again
        for _ in repeat(None, warmup + count):
            pack(buf, 0, now())
            send(buf)
            m = recv()
            tr = now()
            if m is None:
                raise BenchError("pong timed out")
            app(tr - unpack(m)[0])
        pack(buf, 0, END)
        send(buf)
    return {"samples": rtt[warmup:]}


def task_rtt_echo(
    ctl: Control, state: State, transport: Dict[str, Any], size: int, segment_size: int, tag: str
) -> Dict[str, Any]:
    t = make_transport(state, transport)
    with publishing(ctl, t, t.pub(f"{tag}pong", segment_size), lambda: t.sub(f"{tag}ping", segment_size)) as (pub, sub):
        unpack, send = _Q.unpack_from, pub.send
        echoed = 0
        recv, Again = (sub.recv, t.zmq.Again) if t.kind == "zmq" else (sub.receive, ())
        try:
            while True:
                m = recv()
                if m is None or unpack(m)[0] < 0:
                    break
                send(m)
                echoed += 1
        except Again:
            pass
    return {"echoed": echoed}


def task_thr_send(
    ctl: Control,
    state: State,
    transport: Dict[str, Any],
    topic: str,
    size: int,
    segment_size: int,
    count: int,
    credit_window: int,
    lossy: bool,
) -> Dict[str, Any]:
    """Flat out. With ``credit_window`` (msgq lossless), never more than that
    many messages ahead of the receiver's last ack."""
    t = make_transport(state, transport)
    open_ack = (lambda: t.sub(f"{topic}ack", 0)) if credit_window else None
    with publishing(ctl, t, t.pub(topic, segment_size), open_ack) as (pub, ack):
        send = pub.send
        stalls = 0
        cs0 = _ctx_switches()
        if credit_window:
            payload, now = bytes(size), time.monotonic_ns
            t0 = now()
            batch, unpack = ack.receive_batch, _Q.unpack_from
            acked = sent = 0
            chunk = max(1, min(256, credit_window))
            while sent < count:
                room = min(acked + credit_window, count) - sent
                if room <= 0:
                    stalls += 1
                    b = batch(1024, MSGQ_TIMEOUT_MS)
                    if not b:
                        raise BenchError("no ack from the receiver")
                    acked = unpack(b[-1])[0]
                    continue
                k = min(room, chunk)
                for _ in repeat(None, k):
                    send(payload)
                sent += k
                b = batch(1024, 0)
                if b:
                    acked = unpack(b[-1])[0]
            send_s = (now() - t0) * 1e-9
        else:
            send_s = flat_send(send, size, count)
        cs1 = _ctx_switches()
        if lossy:
            # The receiver stops at the first end marker it sees; a lossy
            # transport may drop some, so send a few.
            send_end_markers(send, b"\xff", 20, 0.005)
    return {
        "sent": count,
        "send_s": send_s,
        "stalls": stalls,
        "voluntary_cs": cs1[0] - cs0[0],
        "involuntary_cs": cs1[1] - cs0[1],
    }


def task_thr_recv(
    ctl: Control,
    state: State,
    transport: Dict[str, Any],
    topic: str,
    batch_receive: bool,  # the receiver's own; the others are task_thr_send's
    size: int,
    segment_size: int,
    count: int,
    credit_window: int,
    lossy: bool,
) -> Dict[str, Any]:
    t = make_transport(state, transport)
    ack_pub: Any = t.pub(f"{topic}ack", 0) if credit_window else None
    sub = None
    try:
        ctl.barrier("bound")
        sub = t.sub(topic, segment_size)
        if credit_window:
            t.wait_subscribed(ack_pub)
        ctl.barrier("ready")
        cs0 = _ctx_switches()
        now = time.monotonic_ns
        got = first = 0
        t_first = t_last = None
        timed_out = False
        if t.kind != "zmq" and lossy and not batch_receive:  # the reference's only way (no receive_batch)
            recv = sub.receive
            m = recv()
            if m is None:
                raise BenchError("nothing received")
            t_first = now()
            got = first = 1
            while m is not None and len(m) != 1:
                m = recv()
                got += 1
            timed_out = m is None
            got -= 1  # the end marker, or the None of a timeout
            t_last = now()
            resets = getattr(sub, "resets", 0)
        elif t.kind == "msgq":
            if batch_receive:
                batch = sub.receive_batch
                ack_every = max(1, credit_window // 4) if credit_window else 0
                next_ack = ack_every
                send_ack: Any = ack_pub.send if ack_pub else None
                pack = _Q.pack
                b = batch(1024, MSGQ_TIMEOUT_MS)
                t_first = now()
                while b:
                    if lossy and len(b[-1]) == 1:  # end marker(s)
                        got += sum(1 for m in b if len(m) != 1)
                        break
                    got += len(b)
                    if not first:
                        first = got
                    if credit_window and got >= next_ack:
                        send_ack(pack(got))
                        next_ack = got + ack_every
                    if not lossy and got >= count:
                        break
                    b = batch(1024, MSGQ_TIMEOUT_MS)
                else:
                    timed_out = True
                t_last = now()
            else:
                recv = sub.receive
                ack_every = max(1, credit_window // 4)
                pack = _Q.pack
                if recv() is None:
                    raise BenchError("nothing received")
                t_first = now()
                got = first = 1
                while got < count:
                    k = min(ack_every - got % ack_every, count - got)
                    for _ in repeat(None, k):
                        if recv() is None:
                            timed_out = True
                            break
                    if timed_out:
                        break
                    got += k
                    if got % ack_every == 0:
                        ack_pub.send(pack(got))
                t_last = now()
            resets = sub.resets
        else:
            zmq = t.zmq
            recv = sub.recv
            try:
                m = recv()
                t_first = now()
                got = first = 1
                if lossy:
                    while len(m) != 1:
                        m = recv()
                        got += 1
                    got -= 1  # the end marker
                else:
                    for _ in repeat(None, count - 1):
                        recv()
                    got = count
            except zmq.Again:
                timed_out = True
            t_last = now()
            resets = 0
        cs1 = _ctx_switches()
        ctl.barrier("done")
    finally:
        t.close(sub, ack_pub)
    span = (t_last - t_first) * 1e-9 if t_first and t_last else float("nan")
    rate = (got - first) / span if span and span > 0 and got > first else float("nan")
    return {
        "received": got,
        "rate": rate,
        "span_s": span,
        "resets": resets,
        "timed_out": timed_out,
        "voluntary_cs": cs1[0] - cs0[0],
        "involuntary_cs": cs1[1] - cs0[1],
        "run_delay_ms": (cs1[2] - cs0[2]) * 1e-6 if cs0[2] >= 0 else None,
    }


def task_idle_pub(
    ctl: Control, state: State, transport: Dict[str, Any], topic: str, warm_messages: int
) -> Dict[str, Any]:
    t = make_transport(state, transport)
    with publishing(ctl, t, t.pub(topic, 0)) as (pub, _):
        for _ in range(warm_messages):  # recent traffic, so an adaptive spin is primed
            pub.send(b"x" * 64)
            time.sleep(0.0001)
        ctl.barrier("idle")  # keep the publisher alive while the subscriber idles
    return {}


def task_idle_sub(
    ctl: Control, state: State, transport: Dict[str, Any], topic: str, warm_messages: int, idle_ms: int
) -> Dict[str, Any]:
    t = make_transport(state, transport)
    with subscribing(ctl, t, lambda: t.sub(topic, 0)) as sub:
        recv = sub.recv if t.kind == "zmq" else sub.receive
        for _ in range(warm_messages):
            if recv() is None:
                break
        ctl.barrier("idle")
        t.set_timeout(sub, idle_ms)
        c0, w0 = time.process_time(), time.monotonic()
        try:
            m = recv()
        except Exception:  # zmq.Again: the expected timeout
            m = None
        c1, w1 = time.process_time(), time.monotonic()
    return {"cpu_s": c1 - c0, "wall_s": w1 - w0, "got_message": m is not None}
