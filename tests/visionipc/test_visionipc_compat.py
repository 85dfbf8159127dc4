"""commaai msgq's own VisionIPC tests (msgq/visionipc/tests/test_visionipc.py),
rewritten against our package through the reference's import path."""

import random
from typing import cast

import numpy as np
import pytest

from msgq.visionipc import VisionBuf, VisionIpcClient, VisionIpcServer, VisionStreamType, get_endpoint_name


class TestVisionIpc:
    def setup_method(self):
        self.server = None
        self.client = None

    def teardown_method(self):
        if self.client:
            self.client.close()
        if self.server:
            self.server.close()

    def setup_vipc(self, name, *stream_types, num_buffers=1, width=100, height=100, conflate=False):
        if self.server:
            self.server.close()
        if self.client:
            self.client.close()
        self.server = VisionIpcServer(name)
        for stream_type in stream_types:
            self.server.create_buffers(stream_type, num_buffers, width, height)
        self.server.start_listener()
        if stream_types:
            self.client = VisionIpcClient(name, stream_types[0], conflate)
            assert self.client.connect(True)
        else:
            self.client = None
        return self.server, self.client

    def test_connect(self):
        self.setup_vipc("camerad", VisionStreamType.VISION_STREAM_ROAD)
        assert self.client.is_connected()

    def test_available_streams(self):
        for k in range(4):
            stream_types = set(random.choices(list(VisionStreamType), k=k))
            self.setup_vipc("camerad", *stream_types)
            assert VisionIpcClient.available_streams("camerad", True) == stream_types

    def test_buffers(self):
        width, height, num_buffers = 100, 200, 5
        self.setup_vipc(
            "camerad", VisionStreamType.VISION_STREAM_ROAD, num_buffers=num_buffers, width=width, height=height
        )
        assert self.client.width == width
        assert self.client.height == height
        assert self.client.buffer_len > 0
        assert self.client.num_buffers == num_buffers

    def test_send_single_buffer(self):
        self.setup_vipc("camerad", VisionStreamType.VISION_STREAM_ROAD)
        buf = np.zeros(self.client.buffer_len, dtype=np.uint8)
        buf.view("<i4")[0] = 1234
        self.server.send(VisionStreamType.VISION_STREAM_ROAD, buf, frame_id=1337)
        recv_buf = self.client.recv()
        assert isinstance(recv_buf, VisionBuf)
        assert np.frombuffer(recv_buf.data, "<i4")[0] == 1234
        assert self.client.frame_id == 1337

    def test_no_conflate(self):
        self.setup_vipc("camerad", VisionStreamType.VISION_STREAM_ROAD)
        buf = np.zeros(self.client.buffer_len, dtype=np.uint8)
        self.server.send(VisionStreamType.VISION_STREAM_ROAD, buf, frame_id=1)
        self.server.send(VisionStreamType.VISION_STREAM_ROAD, buf, frame_id=2)
        assert self.client.recv() is not None and self.client.frame_id == 1
        assert self.client.recv() is not None and self.client.frame_id == 2
        assert self.client.recv() is None

    def test_conflate(self):
        self.setup_vipc("camerad", VisionStreamType.VISION_STREAM_ROAD, conflate=True)
        buf = np.zeros(self.client.buffer_len, dtype=np.uint8)
        self.server.send(VisionStreamType.VISION_STREAM_ROAD, buf, frame_id=1)
        self.server.send(VisionStreamType.VISION_STREAM_ROAD, buf, frame_id=2)
        assert self.client.recv() is not None and self.client.frame_id == 2
        assert self.client.recv() is None

    def test_server_no_start_listener(self):
        server = VisionIpcServer("test_no_start")
        server.create_buffers(VisionStreamType.VISION_STREAM_ROAD, 1, 100, 100)
        server.close()

    def test_connect_fail(self):
        client = VisionIpcClient("nonexistent_server", VisionStreamType.VISION_STREAM_ROAD, False)
        assert not client.connect(False)
        client.close()

    def test_recv_timeout(self):
        self.setup_vipc("camerad", VisionStreamType.VISION_STREAM_ROAD)
        assert self.client.recv(100) is None

    def test_data_correctness(self):
        self.setup_vipc("camerad", VisionStreamType.VISION_STREAM_ROAD)
        data_pattern = np.arange(self.client.buffer_len, dtype=np.uint8)
        self.server.send(VisionStreamType.VISION_STREAM_ROAD, data_pattern.copy(), frame_id=123)
        recv_buf = self.client.recv()
        assert np.array_equal(recv_buf.data, data_pattern)
        assert recv_buf.data == memoryview(data_pattern)
        recv_buf.data[0] = 255  # frames are shared and writable, as in the reference
        assert recv_buf.data[0] == 255

    def test_data_is_a_writable_memoryview_of_the_whole_buffer(self):
        # the reference's VisionBuf.data is a memoryview since commaai/msgq #688 ("replace numpy with memoryview")
        self.setup_vipc("camerad", VisionStreamType.VISION_STREAM_ROAD)
        data_pattern = np.arange(self.client.buffer_len, dtype=np.uint8)
        self.server.send(VisionStreamType.VISION_STREAM_ROAD, data_pattern.tobytes(), frame_id=5)
        recv_buf = self.client.recv()
        data = recv_buf.data
        assert isinstance(data, memoryview)
        assert (data.format, data.itemsize, data.ndim, data.nbytes) == ("B", 1, 1, self.client.buffer_len)
        assert not data.readonly and data.c_contiguous
        assert data == memoryview(data_pattern) and data == data_pattern.tobytes()
        assert data != memoryview(np.zeros_like(data_pattern))
        assert data.tobytes() == bytes(data) == data_pattern.tobytes()

    def test_writes_through_data_are_seen_through_array_and_the_other_way(self):
        self.setup_vipc("camerad", VisionStreamType.VISION_STREAM_ROAD, width=64, height=32)
        self.server.send(VisionStreamType.VISION_STREAM_ROAD, bytes(self.client.buffer_len), frame_id=1)
        recv_buf = self.client.recv()
        stride = self.client.stride
        recv_buf.data[stride + 3] = 77  # row 1, column 3 of the Y plane
        recv_buf.data[-2:] = b"\x05\x06"  # the last chroma bytes
        assert recv_buf.array[1, 3] == 77 and recv_buf.y[1, 3] == 77
        assert recv_buf.array[-1, -2:].tolist() == [5, 6]
        recv_buf.array[0, 0] = 9
        assert recv_buf.data[0] == 9
        assert np.shares_memory(recv_buf.array, np.frombuffer(recv_buf.data, np.uint8))  # zero-copy both ways

    def test_data_of_a_server_buffer_is_writable_and_is_what_clients_get(self):
        self.setup_vipc("camerad", VisionStreamType.VISION_STREAM_ROAD)
        buf = self.server.get_buffer(VisionStreamType.VISION_STREAM_ROAD)
        assert isinstance(buf.data, memoryview) and not buf.data.readonly
        buf.data[:4] = b"abcd"
        self.server.send(buf, frame_id=3)
        recv_buf = self.client.recv()
        assert recv_buf.data[:4] == b"abcd" and recv_buf.data[:4].tobytes() == b"abcd"

    def test_concurrency(self):
        self.setup_vipc("camerad", VisionStreamType.VISION_STREAM_ROAD)
        client2 = VisionIpcClient("camerad", VisionStreamType.VISION_STREAM_ROAD, False)
        assert client2.connect(True)
        buf = np.zeros(self.client.buffer_len, dtype=np.uint8)
        self.server.send(VisionStreamType.VISION_STREAM_ROAD, buf, frame_id=999)
        check1, check2 = self.client.recv(), client2.recv()
        assert check1 is not None and check1.data is not None
        assert check2 is not None and check2.data is not None
        assert self.client.frame_id == 999 and client2.frame_id == 999
        client2.close()

    def test_invalid_inputs(self):
        self.client = VisionIpcClient("camerad", cast(VisionStreamType, 9999), False)
        assert not self.client.connect(False)
        with pytest.raises(TypeError):
            VisionIpcClient("camerad", VisionStreamType.VISION_STREAM_ROAD, False, cl_context="invalid")


def test_endpoint_names_and_stream_enum_match_the_reference():
    assert get_endpoint_name("camerad", VisionStreamType.VISION_STREAM_WIDE_ROAD) == "visionipc_camerad_2"
    assert [int(t) for t in VisionStreamType] == [0, 1, 2, 3]
    assert VisionStreamType.ROAD is VisionStreamType.VISION_STREAM_ROAD
