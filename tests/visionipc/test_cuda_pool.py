"""Pools in device memory (issue 32): ``create_buffers(..., memory="cuda")``.

Everywhere: the pool's flag on the wire and the refusals (a host client, an unknown
``memory=``, no device); the bookkeeping with a stand-in runtime where no device
exists (one process: the server's own clients borrow its pointer, as CUDA refuses to
reopen a process's own handle). Marked ``cuda``: across processes through CUDA IPC on
a real device (``pytest -m cuda``; tools/gpu_check.sh).
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cuda_helpers import HAVE_DEVICE, close_in_forked_child, device_bytes, fake_runtime  # noqa: F401  (a fixture)
from vipc_helpers import stamp, stamp_problem

from msgq.errors import ClosedError, InvalidArgumentError, IpcError
from visionipc import VisionIpcClient, VisionIpcServer, _visionipc, cuda
from visionipc.cuda.device_pool import DESCRIPTOR, MAGIC, VERSION
from visionipc.formats import layout

needs_device = pytest.mark.skipif(not HAVE_DEVICE, reason="no CUDA device")
no_device = pytest.mark.skipif(HAVE_DEVICE, reason="a CUDA device is present: the real tests run instead")
PEER = Path(__file__).resolve().parents[1] / "cuda_pool_peer.py"


# ------------------------------------------------------------------ everywhere


def test_a_host_client_refuses_a_stream_whose_frames_are_in_device_memory():
    """The flag travels in the attach reply: a client that reads host frames says why
    in one line instead of handing out the descriptor's bytes as pixels."""
    server = VisionIpcServer("devflag")
    server._server().create_buffers("road", 2, 64, 48, "nv12", pool_flags=_visionipc.POOL_IN_DEVICE_MEMORY)
    server.create_buffers("host", 2, 64, 48)
    server.start_listener()
    client = VisionIpcClient("devflag", "road", False)
    host = VisionIpcClient("devflag", "host", False)
    try:
        with pytest.raises(InvalidArgumentError, match=r"keeps its frames in GPU memory.*cuda=True") as e:
            client.connect(False)
        assert "\n" not in str(e.value) and client.last_error == str(e.value)
        assert host.connect(False) and host._native.pool_flags == 0
        with pytest.raises(InvalidArgumentError, match="unknown pool flags"):
            server._server().create_buffers("odd", 2, 64, 48, "nv12", pool_flags=2)
    finally:
        client.close()
        host.close()
        server.close()


def test_memory_must_be_host_or_cuda():
    server = VisionIpcServer("devmem")
    try:
        with pytest.raises(InvalidArgumentError, match='memory must be "host" or "cuda"'):
            server.create_buffers("road", 2, 64, 48, memory="gpu")
        assert server.streams() == []
        server.create_buffers("road", 2, 64, 48, memory="host")
        with pytest.raises(InvalidArgumentError, match="keeps its frames in host memory"):
            _ = server.get_buffer("road").device_array
    finally:
        server.close()


@no_device
def test_without_a_device_a_pool_in_device_memory_is_one_clear_refusal_and_nothing_is_made():
    server = VisionIpcServer("devnone")
    try:
        with pytest.raises(cuda.CudaUnavailableError) as e:
            server.create_buffers("road", 2, 64, 48, memory="cuda")
        assert "\n" not in str(e.value)
        assert server.streams() == []
        server.create_buffers("road", 2, 64, 48)  # the server still works for host pools
    finally:
        server.close()


# ------------------------------------------------------------------ bookkeeping (stand-in runtime)


@pytest.fixture
def device_served(fake_runtime):
    """A server with a pool in "device memory" (the stand-in's) and a cuda client of it."""
    fake_runtime.pageable_ok = True  # the copying send of host bytes copies from pageable memory
    server = VisionIpcServer("devpool")
    server.create_buffers("road", 3, 64, 48, memory="cuda")
    server.start_listener()
    client = VisionIpcClient("devpool", "road", False, cuda=True)
    assert client.connect(False)
    yield server, client
    client.close()
    server.close()


def _send_on_device(fake, server, frame_id):
    """The producer fills the buffer's device memory (a copy from a "device" array), then sends."""
    buf = server.get_buffer("road")
    image = np.empty(len(buf), np.uint8)
    stamp(image, frame_id)
    buf.copy_from_device(fake.device_array(image))
    server.send(buf, frame_id, frame_id * 10, 0)
    return buf


@no_device
def test_a_pool_in_device_memory_gives_device_frames_of_the_servers_memory(device_served, fake_runtime):
    server, client = device_served
    (allocated,) = [c[1] for c in fake_runtime.calls if c[0] == "malloc"]
    assert allocated == 3 * 8192  # one allocation, the host pool's slots (4608 bytes -> 8192)
    assert not any(c[0] == "register" for c in fake_runtime.calls)  # the host pixels are never pinned
    for i in range(1, 8):
        buf = _send_on_device(fake_runtime, server, i)
        frame = client.recv(1000)
        assert isinstance(frame, cuda.DeviceFrame) and frame.valid
        assert frame.ptr == buf.device_array.ptr  # the server's own memory: nothing was copied
        assert frame.frame_id == i and frame.timestamp_sof == i * 10 and frame.shape == (72, 64)
        assert stamp_problem(device_bytes(fake_runtime, frame)[: frame.geometry.size], i) is None
        assert frame.__cuda_array_interface__["data"] == (frame.ptr, False)
        assert frame.__dlpack_device__() == (2, 0)
    for idx in range(3):  # the host pool carries only the protocol (and buffer 0 the descriptor)
        pixels = np.frombuffer(server._server().view("road", idx), np.uint8)
        assert not pixels[DESCRIPTOR.size if idx == 0 else 0 :].any()


@no_device
def test_the_descriptor_is_in_buffer_0_and_a_frame_lease_keeps_its_buffer(device_served, fake_runtime):
    server, client = device_served
    buffer0 = np.frombuffer(server._server().view("road", 0), np.uint8)
    assert bytes(buffer0[:8]) == MAGIC and not buffer0[DESCRIPTOR.size :].any()
    _send_on_device(fake_runtime, server, 1)
    with client.recv(1000) as held:
        for i in range(2, 12):  # the producer races; the held buffer is never handed out
            assert _send_on_device(fake_runtime, server, i).idx != held._frame.idx
        assert held.valid
        assert stamp_problem(device_bytes(fake_runtime, held)[: held.geometry.size], 1) is None
    copied = client.recv(1000)
    while copied.frame_id != 11:  # frames 2-10 were overwritten meanwhile (3 buffers): the newest
        copied = client.recv(1000)
    out = fake_runtime.device_array(np.zeros(8192, np.uint8))
    dev = copied.to_device(out=out)  # device to device, under the frame's lease
    fake_runtime.complete(dev._event.handle)
    assert stamp_problem(device_bytes(fake_runtime, dev)[: copied.geometry.size], copied.frame_id) is None


@no_device
def test_the_copying_send_fills_device_memory_from_host_bytes_and_device_arrays(device_served, fake_runtime):
    server, client = device_served
    size = layout("nv12", 64, 48).size
    image = np.empty(size, np.uint8)
    stamp(image, 4)
    server.send("road", image.tobytes(), 4, 0, 0)
    server.send("road", image.tobytes(), 4, 0, 0)  # the second goes by the per-frame path: still the device
    got = client.recv(1000)
    fake_runtime.stream_sync(0)
    assert stamp_problem(device_bytes(fake_runtime, got)[:size], 4) is None
    stamp(image, 5)
    server.send("road", fake_runtime.device_array(image), 5, 0, 0)
    got = client.recv(1000)
    got = client.recv(1000) if got.frame_id == 4 else got
    assert got.frame_id == 5 and stamp_problem(device_bytes(fake_runtime, got)[:size], 5) is None
    with pytest.raises(InvalidArgumentError):
        server.send("road", b"short", 6, 0, 0)


@no_device
def test_device_frames_refuse_use_after_their_client_closed(device_served, fake_runtime):
    server, client = device_served
    _send_on_device(fake_runtime, server, 1)
    frame = client.recv(1000)
    plane = frame.y
    client.close()
    assert not frame.valid
    for use in (lambda: frame.__cuda_array_interface__, lambda: frame.__dlpack__(), plane.to_host):
        with pytest.raises(ClosedError, match="unmapped when its VisionIpcClient"):
            use()


@no_device
def test_a_restarted_server_with_a_pool_in_device_memory_is_followed(device_served, fake_runtime):
    server, client = device_served
    _send_on_device(fake_runtime, server, 1)
    first = client.recv(1000)
    server.close()
    again = VisionIpcServer("devpool")
    again.create_buffers("road", 3, 64, 48, memory="cuda")
    again.start_listener()
    try:
        deadline, frame = time.monotonic() + 10, None
        while frame is None or frame.frame_id != 9:
            assert time.monotonic() < deadline, "the client never picked the restarted server up"
            _send_on_device(fake_runtime, again, 9)
            frame = client.recv(100)
        assert frame._pool is not first._pool and stamp_problem(device_bytes(fake_runtime, frame)[:4608], 9) is None
        assert not first.valid  # its server freed its memory
        with pytest.raises(ClosedError):
            first.to_host()
    finally:
        client.close()
        again.close()


@no_device
def test_a_descriptor_overwritten_with_a_smaller_allocations_handle_is_refused(device_served, fake_runtime):
    """Buffer 0's pixels are writable by every admitted client (the reference's rule), so its
    descriptor may name another process's allocation: one smaller than the pool is refused
    (and closed again) before a frame could read past its end."""
    server, client = device_served
    handle, small = fake_runtime.foreign_allocation(3 * 8192 - 4096)
    forged = DESCRIPTOR.pack(MAGIC, VERSION, 0, fake_runtime.device_uuid(0), 3 * 8192, 8192, handle)
    buffer0 = np.frombuffer(server._server().view("road", 0), np.uint8)
    buffer0[: DESCRIPTOR.size] = np.frombuffer(forged, np.uint8)
    _send_on_device(fake_runtime, server, 1)
    with pytest.raises(IpcError, match=r"names an allocation of 20480 bytes at offset 0, not the pool's 24576"):
        client.recv(1000)
    assert ("ipc_open", handle) in fake_runtime.calls and ("ipc_close", small) in fake_runtime.calls


@no_device
def test_a_forked_child_never_touches_the_parents_device_pools(device_served, fake_runtime):
    server, client = device_served
    _send_on_device(fake_runtime, server, 1)
    client.recv(1000)
    assert close_in_forked_child(fake_runtime, client, server) == 0
    _send_on_device(fake_runtime, server, 2)
    assert client.recv(1000).frame_id == 2  # the parent's pool still works


# ------------------------------------------------------------------ on a device (pytest -m cuda)


def _peer(name, frames, first=1, width=640, height=480, count=8):
    proc = subprocess.Popen(
        [sys.executable, str(PEER), name, str(count), str(width), str(height), str(frames), str(first)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(PEER.parent), *sys.path])},
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _finish(proc):
    proc.stdin.close()
    assert proc.wait(30) == 0


def _receive(client, frames, last_id):
    """Receive until frame ``last_id``: (frames whose device bytes were checked, problems)."""
    checked, problems, deadline = 0, [], time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, f"frame {last_id} never came ({checked} checked)"
        frame = client.recv(1000)
        if frame is None:
            continue
        assert isinstance(frame, cuda.DeviceFrame)
        data = frame.to_host().reshape(-1)[: frame.geometry.size]
        if frame.valid:  # read under the lease: it must be exactly the producer's frame
            checked += 1
            problem = stamp_problem(data, frame.frame_id)
            if problem:
                problems.append(problem)
        if frame.frame_id == last_id:
            return checked, problems


@pytest.mark.cuda
@needs_device
def test_frames_cross_processes_in_device_memory_through_cuda_ipc():
    proc = _peer("devipc", 200)
    client = VisionIpcClient("devipc", "road", False, cuda=True)
    try:
        assert client.connect(True)
        checked, problems = _receive(client, 200, 200)
        assert problems == [] and checked >= 100
        assert proc.stdout.readline().strip() == "sent"
    finally:
        client.close()
        _finish(proc)


@pytest.mark.cuda
@needs_device
def test_a_client_follows_a_restarted_producer_to_its_new_device_pool():
    client = VisionIpcClient("devrestart", "road", False, cuda=True)
    try:
        for first in (1, 1001):
            proc = _peer("devrestart", 40, first)
            assert client.connect(True)
            checked, problems = _receive(client, 40, first + 39)
            assert problems == [] and checked >= 20
            _finish(proc)
    finally:
        client.close()


@pytest.mark.cuda
@needs_device
def test_a_held_device_frame_is_never_overwritten_while_the_producer_races():
    server = VisionIpcServer("devrace")
    server.create_buffers("road", 4, 1920, 1080, memory="cuda")
    server.start_listener()
    client = VisionIpcClient("devrace", "road", False, cuda=True)
    try:
        assert client.connect(False)
        size = layout("nv12", 1920, 1080).size
        image = np.empty(size, np.uint8)
        stamp(image, 1)
        server.send("road", image.tobytes(), 1, 0, 0)
        with client.recv(1000) as held:
            for i in range(2, 200):
                stamp(image, i)
                server.send("road", image.tobytes(), i, 0, 0)
            assert held.valid
            assert stamp_problem(held.to_host().reshape(-1)[:size], 1) is None
            copy = held.to_device()  # device to device under the lease
        assert stamp_problem(copy.to_host().reshape(-1)[:size], 1) is None
        client.close()
        with pytest.raises(ClosedError):
            held.to_host()
    finally:
        client.close()
        server.close()
