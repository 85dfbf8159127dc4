"""iceoryx2 (``pip install iceoryx2``): a publish-subscribe service of ``Slice[c_uint8]``
frames (subscriber buffer 2, safe overflow: the oldest unread sample is dropped),
the producer loans a sample, writes (frame id, send time) into it in place and sends
it, then notifies an Event service; each subscriber waits on its Event listener,
takes the sample and makes a numpy view of its payload (held until the next one)."""

import ctypes
import glob
import os
import time
from typing import Callable

from visionipc.bench.transports import END, HDR, RECV_TIMEOUT_MS, Received, State, nv12, shm_name

# Every file iceoryx2 makes in /dev/shm starts with this run's prefix, and its
# node and service directories live in the run's temporary IPC directory:
# nothing lands in the machine-wide defaults (iox2_*, /tmp/iceoryx2).
PREFIX_TAG = "iox2_"


def _config(state):
    import iceoryx2 as iox2

    cfg = iox2.config.default()
    cfg.global_cfg.prefix = iox2.FileName.new(shm_name(PREFIX_TAG))
    cfg.global_cfg.root_path = iox2.Path.new(os.path.join(state["ipc_dir"], "iceoryx2") + "/")
    return cfg


def after_run(run: str) -> None:
    """iceoryx2 keeps one management segment per prefix (``*.global_mgmt``)
    after its last node is gone, by design; with the run's own prefix it is
    this run's to remove, once every worker has exited."""
    for path in glob.glob(f"/dev/shm/vipcb{run}_{PREFIX_TAG}*.global_mgmt"):
        os.unlink(path)


def _services(state, tag, nclients):
    import iceoryx2 as iox2

    iox2.set_log_level_from_env_or(iox2.LogLevel.Error)
    node = iox2.NodeBuilder.new().config(_config(state)).create(iox2.ServiceType.Ipc)
    name = iox2.ServiceName.new(f"vipcbench/{shm_name(tag)}")
    pubsub = (
        node.service_builder(name)
        .publish_subscribe(iox2.Slice[ctypes.c_uint8])
        .max_publishers(1)
        .max_subscribers(max(2, nclients))
        .subscriber_max_buffer_size(2)
        .history_size(0)
        .enable_safe_overflow(True)
        .open_or_create()
    )
    event = node.service_builder(name).event().max_listeners(max(2, nclients)).open_or_create()
    return iox2, node, pubsub, event


class Producer:
    def __init__(self, state: State, tag: str, w: int, h: int, nbuf: int, nclients: int) -> None:
        self.size = nv12(w, h)[0]
        self.iox2, self.node, self.pubsub, self.event = _services(state, tag, nclients)
        self.pub = self.pubsub.publisher_builder().initial_max_slice_len(self.size).create()
        self.notifier = self.event.notifier_builder().create()
        self.nclients = nclients

    def prefault(self) -> None:
        pass

    def accept(self) -> None:
        pass

    def check(self) -> None:
        self.pub.update_connections()

    def send(self, fid: int, fill: bool, now: Callable[[], int] = time.monotonic_ns) -> int:
        sample = self.pub.loan_slice_uninit(self.size)
        ptr = sample.payload().as_ptr()
        if fill:
            ctypes.memset(ptr, fid & 0xFF, self.size)
        ts = now()
        ctypes.memmove(ptr, HDR.pack(fid, ts), HDR.size)
        sample.assume_init().send()
        self.notifier.notify()
        return ts

    def end(self) -> None:
        self.send(END, False)

    def close(self) -> None:
        self.notifier = self.pub = self.event = self.pubsub = self.node = None


class Consumer:
    def __init__(self, state: State, tag: str, w: int, h: int, conflate: bool) -> None:
        import numpy as np

        self.np = np
        self.size, self.shape = nv12(w, h)
        self.iox2, self.node, self.pubsub, self.event = _services(state, tag, 2)
        self.sub = self.pubsub.subscriber_builder().create()
        self.listener = self.event.listener_builder().create()
        self.timeout = self.iox2.Duration.from_millis(RECV_TIMEOUT_MS)
        self.held = None

    def recv(self, now: Callable[[], int] = time.monotonic_ns) -> Received:
        self.held = None  # give the previous sample back before taking the next
        deadline = time.monotonic() + RECV_TIMEOUT_MS / 1000
        while True:
            sample = self.sub.receive()
            if sample is not None:
                break
            if time.monotonic() > deadline:
                return None
            self.listener.timed_wait(self.timeout)
        tr = now()
        ptr = sample.payload().as_ptr()
        # a ctypes array: a buffer numpy's stubs do not name
        view = self.np.frombuffer((ctypes.c_uint8 * self.size).from_address(ptr), self.np.uint8).reshape(self.shape)  # type: ignore[call-overload]
        tv = now()
        self.held = sample  # the view does not keep the sample alive: hold it until the next recv
        fid, ts = HDR.unpack_from(view)  # type: ignore[arg-type]  # an ndarray is a buffer (numpy's stubs: from Python 3.12)
        if fid == END:
            return "end"
        return fid, ts, tr, tv, True

    def close(self) -> None:
        self.held = self.listener = self.event = self.sub = self.pubsub = self.node = None
