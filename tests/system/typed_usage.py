"""Code a user writes against msgq and visionipc, checked (not run) by
``mypy --strict`` in test_typing.py: the call forms the docs show type-check,
and what comes back has the type written here (assert_type)."""

from typing import List, Optional, Set, Union

import numpy as np
from typing_extensions import assert_type

import msgq
from msgq.testing import isolated_prefix, unique_topic
from visionipc import VisionBuf, VisionIpcClient, VisionIpcServer, VisionStreamType, available_streams, layout
from visionipc.ordered import OrderedFrameClient, OrderedFrameWriter


def messaging() -> None:
    with isolated_prefix() as prefix:
        assert_type(prefix, str)
        topic = unique_topic()
        pub, sub = msgq.pub_sock(topic), msgq.sub_sock(topic, timeout=100)
        pub.send(b"bytes")
        pub.send(np.zeros(4, np.uint8))  # any C-contiguous buffer
        with pub.loan(4) as view:
            view[:] = b"abcd"
        assert_type(sub.receive(), Optional[bytes])
        assert_type(sub.receive_batch(16, timeout=0), List[bytes])
        assert_type(msgq.drain_sock_raw(sub), List[bytes])
        for message in sub:
            assert_type(message, bytes)
        poller = msgq.Poller()
        poller.registerSocket(sub)
        assert_type(poller.poll(10), List[msgq.SubSocket])
        handle = msgq.fake_event_handle(topic, enable=True)
        handle.recv_ready_event.set()
        queue = msgq.BroadcastQueue(n_readers=1)
        queue.enqueue({"frame": np.zeros(4)})
        reader = msgq.BroadcastQueue.create_from_handle(queue.handle, rank=0)
        reader.dequeue(timeout=1.0)
        producer = msgq.OrderedProducer(topic + "o", 16, 64)
        with producer.reserve() as reservation:
            assert_type(reservation.data, memoryview)
        assert_type(msgq.OrderedReader(topic + "o").recv(1.0).data, bytes)


def frames() -> None:
    server = VisionIpcServer("camerad")
    server.create_buffers(VisionStreamType.ROAD, 4, 64, 48)
    buf = server.get_buffer(VisionStreamType.ROAD)
    assert_type(buf.y, np.ndarray)
    server.send(buf, 1, 2, 3)  # the reference's positional form
    server.send(buf, frame_id=1, timestamp_sof=2, timestamp_eof=3)
    server.send(VisionStreamType.ROAD, bytes(layout("nv12", 64, 48).size), 1)  # the copying send
    client = VisionIpcClient("camerad", VisionStreamType.ROAD, conflate=True)
    assert_type(client.connect(blocking=False), bool)
    assert_type(client.width, Optional[int])
    frame = client.recv(timeout_ms=100)
    assert_type(frame, Optional[VisionBuf])
    if frame is not None:
        with frame:
            assert_type(frame.frame_id, int)
    assert_type(available_streams("camerad"), Set[Union[int, str]])
    writer = OrderedFrameWriter("camerad", "ordered", 64, 48)
    writer.send(writer.get_buffer(), timestamp_sof=0, timestamp_eof=0)
    assert_type(OrderedFrameClient("camerad", "ordered").recv(100), Optional[VisionBuf])
