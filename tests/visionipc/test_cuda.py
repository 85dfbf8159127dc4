"""visionipc.cuda and DLPack (issue 32).

Everywhere: host frames through DLPack (numpy, without a copy); without a CUDA
device, ``cuda=True`` is one clear refusal and the client still works; the lease
bookkeeping of ``to_device`` with the copy's completion played by a stand-in
runtime (only where no device exists: on a GPU machine the real tests below
cover it). Marked ``cuda``: the real thing on a device (``pytest -m cuda``;
``tools/gpu_check.sh`` runs them), skipped elsewhere with the reason "no CUDA device".
"""

import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest
from cuda_helpers import HAVE_DEVICE, FakeRuntime, close_in_forked_child, device_bytes, fake_runtime  # noqa: F401  (a fixture)
from vipc_helpers import stamp, stamp_problem

from msgq.errors import ClosedError, InvalidArgumentError, IpcError
from visionipc import VisionIpcClient, VisionIpcServer, cuda
from visionipc.cuda import _runtime

needs_device = pytest.mark.skipif(not HAVE_DEVICE, reason="no CUDA device")
no_device = pytest.mark.skipif(HAVE_DEVICE, reason="a CUDA device is present: the real tests run instead")
FORMATS = ("nv12", "i420", "gray8", "rgb8", "raw16")


@pytest.fixture
def served():
    """served(fmt, count, w, h, cuda) -> (server, connected client); closed afterwards."""
    made = []

    def make(fmt="nv12", count=4, width=64, height=48, cuda=False, name="gpu"):
        server = VisionIpcServer(name)
        server.create_buffers("road", count, width, height, fmt)
        server.start_listener()
        client = VisionIpcClient(name, "road", False, cuda=cuda)
        made.append((server, client))
        assert client.connect(False)
        return server, client

    yield make
    for server, client in made:
        client.close()
        server.close()


def _restart_under(server, client):
    """The client receives a frame, its server is replaced by a new one of the same name:
    ``(new server, the client's first frame from it, frame id 9)``."""
    publish(server, 1)
    client.recv(1000)
    server.close()
    again = VisionIpcServer("gpu")
    again.create_buffers("road", 4, 64, 48)
    again.start_listener()
    deadline, frame = time.monotonic() + 10, None
    while frame is None or frame.frame_id != 9:
        assert time.monotonic() < deadline, "the client never picked the restarted server up"
        publish(again, 9)
        frame = client.recv(100)
    return again, frame


def publish(server, frame_id):
    buf = server.get_buffer("road")
    stamp(buf.data, frame_id)
    server.send(buf, frame_id, frame_id * 10, frame_id * 10 + 1)
    return buf


# ------------------------------------------------------------------ host DLPack (everywhere)


@pytest.mark.parametrize("fmt", FORMATS)
def test_numpy_from_dlpack_shares_the_pool_without_a_copy(served, fmt):
    server, client = served(fmt)
    publish(server, 7)
    frame = client.recv(1000)
    assert frame.__dlpack_device__() == (1, 0)  # CPU: the pool is not registered with CUDA
    seen = np.from_dlpack(frame)
    assert seen.shape == frame.array.shape and seen.dtype == frame.array.dtype
    assert np.shares_memory(seen, frame.array)
    buf = server.get_buffer("road")  # the server writes another buffer; ours is leased
    stamp(buf.data, 8)
    assert stamp_problem(frame.data, 7) is None
    frame.data[8] = 99  # a write through the pool shows in the DLPack view: one set of bytes
    assert seen.reshape(-1).view(np.uint8)[8] == 99 if fmt != "raw16" else seen.view(np.uint8).reshape(-1)[8] == 99


def test_a_dlpack_view_keeps_the_pool_mapped_after_the_client_and_server_close(served):
    server, client = served("gray8")
    publish(server, 3)
    seen = np.from_dlpack(client.recv(1000))
    client.close()
    server.close()
    assert stamp_problem(seen.reshape(-1), 3) is None  # still mapped: no crash, the same bytes


def test_to_device_without_cuda_is_a_clear_refusal(served):
    server, client = served()
    publish(server, 1)
    with pytest.raises(InvalidArgumentError, match=r"cuda=True"):
        client.recv(1000).to_device()


# ------------------------------------------------------------------ refusals without a device


@no_device
def test_cuda_true_without_a_device_says_so_in_one_line_and_cuda_false_still_works(served):
    with pytest.raises(cuda.CudaUnavailableError) as info:
        VisionIpcClient("gpu", "road", False, cuda=True)
    message = str(info.value)
    assert "CUDA is unavailable" in message and "\n" not in message
    assert isinstance(info.value, IpcError)
    server, client = served(cuda=False)
    publish(server, 5)
    assert stamp_problem(client.recv(1000).data, 5) is None
    assert cuda.available() is False


def test_without_cuda_bindings_the_refusal_names_the_extra():
    code = (
        "import sys; sys.modules['cuda'] = None\n"
        "from visionipc import VisionIpcClient, cuda\n"
        "try:\n"
        "    VisionIpcClient('x', 'road', cuda=True)\n"
        "except cuda.CudaUnavailableError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'visionipc[cuda]'" in out.stdout


@pytest.mark.parametrize("bad", ["0", 1.5, None])
def test_a_cuda_argument_that_is_not_a_device_is_refused(bad):
    with pytest.raises((InvalidArgumentError, cuda.CudaUnavailableError)):
        _runtime.resolve_device(FakeRuntime(), bad)


def test_a_device_ordinal_out_of_range_is_refused():
    with pytest.raises(InvalidArgumentError, match=r"CUDA device 3 does not exist \(this machine has 1: 0..0\)"):
        _runtime.resolve_device(FakeRuntime(), 3)


# ------------------------------------------------------------------ lease bookkeeping (stand-in runtime)


@no_device
def test_the_pool_is_registered_once_per_mapping_and_unregistered_before_it_goes(served, fake_runtime):
    server, client = served(cuda=True)
    publish(server, 1)
    frame = client.recv(1000)
    registered = [c for c in fake_runtime.calls if c[0] == "register"]
    assert len(registered) == 1
    address, length = registered[0][1:]
    assert address <= frame.as_array().ctypes.data and frame.as_array().ctypes.data + len(frame) <= address + length
    assert frame.__dlpack_device__() == (3, 0)  # CUDA-host: a kernel may read it over the link
    assert np.shares_memory(np.from_dlpack(frame), frame.array)
    for i in range(2, 6):
        publish(server, i)
        client.recv(1000)
    assert len([c for c in fake_runtime.calls if c[0] == "register"]) == 1
    client.close()
    assert fake_runtime.registered == {}
    assert ("unregister", address) in fake_runtime.calls


@no_device
def test_a_restarted_servers_pool_is_registered_and_the_old_one_unregistered(served, fake_runtime):
    server, client = served(cuda=True)
    again, frame = _restart_under(server, client)
    try:
        kinds = [c[0] for c in fake_runtime.calls if c[0] in ("register", "unregister")]
        assert kinds == ["register", "unregister", "register"]
        assert len(fake_runtime.registered) == 1
    finally:
        client.close()
        again.close()


@no_device
def test_the_read_lease_is_held_until_the_copy_has_completed(served, fake_runtime):
    server, client = served(count=3, cuda=True)
    publish(server, 1)
    frame = client.recv(1000)
    dev = frame.to_device()
    assert not dev.ready
    assert dev.shape == frame.array.shape and dev.frame_id == 1 and dev.timestamp_sof == 10
    # While the copy is in flight the server never hands out the frame's buffer...
    for i in range(2, 8):
        buf = server.get_buffer("road")
        assert buf.idx != frame.idx
        stamp(buf.data, i)
        server.send(buf, i, 0, 0)
    # ...and the next receive, which drops the lease, first waits for the copy.
    done = threading.Timer(0.3, lambda: fake_runtime.complete(dev._event.handle))
    done.start()
    started = time.monotonic()
    client.recv(1000)
    assert time.monotonic() - started >= 0.25 or dev.ready
    done.join()
    assert dev.ready
    assert stamp_problem(device_bytes(fake_runtime, dev)[: len(frame)], 1) is None


@no_device
def test_the_end_of_a_with_block_waits_for_the_copy_before_releasing(served, fake_runtime):
    server, client = served(count=3, cuda=True)
    publish(server, 1)
    with client.recv(1000) as frame:
        dev = frame.to_device()
    assert any(c[0] == "event_sync" for c in fake_runtime.calls)
    assert dev.ready and stamp_problem(device_bytes(fake_runtime, dev)[: len(frame)], 1) is None
    host = dev.to_host()  # back through a device-to-host copy
    assert host.shape == frame.array.shape and stamp_problem(host.reshape(-1), 1) is None
    assert np.array_equal(dev.y.to_host(), frame.y) and np.array_equal(dev.uv.to_host(), frame.uv)  # strided planes


@no_device
def test_out_reuses_a_callers_device_buffer_and_is_checked(served, fake_runtime):
    server, client = served(cuda=True)
    publish(server, 1)
    frame = client.recv(1000)
    mine = fake_runtime.malloc(len(frame))
    mallocs = sum(c[0] == "malloc" for c in fake_runtime.calls)

    class Out:
        def __init__(self, ptr, n, strides=None, readonly=False):
            self.__cuda_array_interface__ = {
                "shape": (n,), "typestr": "|u1", "data": (ptr, readonly), "version": 3, "strides": strides,
            }  # fmt: skip

    dev = frame.to_device(out=Out(mine, len(frame)))
    assert dev.ptr == mine and sum(c[0] == "malloc" for c in fake_runtime.calls) == mallocs  # nothing allocated
    dev.synchronize()
    assert stamp_problem(fake_runtime.memory[mine][: len(frame)], 1) is None
    with pytest.raises(InvalidArgumentError, match="holds 10 bytes"):
        frame.to_device(out=Out(mine, 10))
    with pytest.raises(InvalidArgumentError, match="read-only"):
        frame.to_device(out=Out(mine, len(frame), readonly=True))
    with pytest.raises(InvalidArgumentError, match="host memory"):
        frame.to_device(out=Out(frame.as_array().ctypes.data, len(frame)))
    with pytest.raises(InvalidArgumentError, match="__cuda_array_interface__"):
        frame.to_device(out=np.zeros(len(frame), np.uint8))


@no_device
def test_the_per_frame_path_asks_the_driver_only_for_the_copy_and_its_event(served, fake_runtime):
    # At a camera's pace each driver call costs tens of µs (BENCHMARKS.md, H200): where
    # out= lives is asked once per pointer, the device made current once per thread.
    server, client = served(cuda=True)
    out = fake_runtime.device_array(np.zeros(64 * 64 * 3 // 2 + 4096, np.uint8))
    ptr = out.__cuda_array_interface__["data"][0]
    publish(server, 1)
    client.recv(1000).to_device(out=out).synchronize()  # maps and registers the pool, checks out=
    before = len(fake_runtime.calls)
    for fid in range(2, 7):
        publish(server, fid)
        frame = client.recv(1000)
        frame.to_device(out=out).synchronize()
        assert stamp_problem(fake_runtime.memory[ptr][: len(frame)], fid) is None
    calls = [c[0] for c in fake_runtime.calls[before:]]
    assert calls == ["event_sync"] * 5  # no set_device, no pointer_device
    seen = []
    worker = threading.Thread(target=lambda: seen.append(frame.to_device(out=out).synchronize()))
    worker.start()
    worker.join()
    assert seen == [None] and [c[0] for c in fake_runtime.calls].count("set_device") >= 2  # a new thread sets it
    cai = {"shape": (len(frame),), "typestr": "|u1", "data": (frame.as_array().ctypes.data, False), "version": 3}
    with pytest.raises(InvalidArgumentError, match="host memory"):  # a pointer not seen before is still checked
        frame.to_device(out=types.SimpleNamespace(__cuda_array_interface__=cai))


@no_device
def test_device_frames_speak_both_protocols_with_plane_views(served, fake_runtime):
    server, client = served("nv12", cuda=True)
    publish(server, 1)
    dev = client.recv(1000).to_device(stream=77)
    cai = dev.__cuda_array_interface__
    assert cai["shape"] == (72, 64) and cai["typestr"] == "|u1" and cai["stream"] == 77 and cai["version"] == 3
    assert dev.__dlpack_device__() == (2, 0)
    dev.__dlpack__(stream=5)
    assert ("stream_wait_event", 5, dev._event.handle) in fake_runtime.calls  # the consumer's stream waits
    y, uv = dev.y, dev.uv
    assert y.shape == (48, 64) and uv.shape == (24, 32, 2) and uv.ptr == dev.ptr + dev.geometry.uv_offset
    with pytest.raises(InvalidArgumentError):
        dev.u  # noqa: B018 - the property raises


@no_device
def test_a_frame_whose_buffer_was_reused_is_not_copied(served, fake_runtime):
    server, client = served(count=2, cuda=True)
    publish(server, 1)
    old = client.recv(1000)
    for i in range(2, 6):
        publish(server, i)
        client.recv(1000)
    with pytest.raises(IpcError, match="no longer in its buffer"):
        old.to_device()


@no_device
def test_close_finishes_copies_and_frees_the_stream_and_events(served, fake_runtime):
    server, client = served(cuda=True)
    publish(server, 1)
    dev = client.recv(1000).to_device()
    client.close()
    assert dev.ready  # close waited for it
    kinds = [c[0] for c in fake_runtime.calls]
    assert kinds.index("event_sync") < kinds.index("unregister") < kinds.index("stream_destroy")
    with pytest.raises(ClosedError):
        client.recv(10)


@no_device
def test_a_forked_child_never_touches_the_parents_registration(served, fake_runtime):
    server, client = served(cuda=True)
    publish(server, 1)
    client.recv(1000)
    assert close_in_forked_child(fake_runtime, client) == 0
    assert fake_runtime.registered  # the parent's registration stands


# ------------------------------------------------------------------ on a device (pytest -m cuda)


def _framework():
    for name in ("torch", "cupy"):
        try:
            return __import__(name)
        except ImportError:
            continue
    pytest.skip("neither PyTorch nor CuPy is installed to take a DLPack device array")


@pytest.mark.cuda
@needs_device
@pytest.mark.parametrize("fmt", FORMATS)
def test_device_frames_hold_exactly_what_the_producer_wrote(served, fmt):
    server, client = served(fmt, width=640, height=480, cuda=True)
    for i in range(1, 20):
        publish(server, i)
        frame = client.recv(1000)
        dev = frame.to_device()
        assert stamp_problem(dev.to_host().reshape(-1).view(np.uint8)[: len(frame)], i) is None
        assert frame.__dlpack_device__() == (3, 0)


@pytest.mark.cuda
@needs_device
def test_out_allocates_nothing_per_frame_and_a_framework_takes_the_result(served):
    server, client = served(width=1920, height=1080, cuda=True)
    publish(server, 1)
    out = cuda.empty(len(client.recv(1000)))
    for i in range(2, 50):
        publish(server, i)
        dev = client.recv(1000).to_device(out=out)
        assert dev.ptr == out.ptr
    assert stamp_problem(dev.to_host().reshape(-1)[: dev.geometry.size], 49) is None
    xp = _framework()
    taken = xp.from_dlpack(dev)  # waits for the copy on the consumer's stream
    host = taken.cpu().numpy() if xp.__name__ == "torch" else xp.asnumpy(taken)
    assert stamp_problem(host.reshape(-1)[: dev.geometry.size], 49) is None


@pytest.mark.cuda
@needs_device
def test_registration_follows_a_restarted_server(served):
    server, client = served(cuda=True)
    again, frame = _restart_under(server, client)
    try:
        assert frame.__dlpack_device__() == (3, 0)
        assert stamp_problem(frame.to_device().to_host().reshape(-1)[: len(frame)], 9) is None
    finally:
        client.close()
        again.close()


@no_device
def test_a_cuda_server_registers_each_pool_and_publishes_a_device_frame_once_it_landed(fake_runtime):
    server = VisionIpcServer("gpuprod", cuda=True)
    server.create_buffers("road", 3, 64, 48, "nv12")
    server.create_buffers("rgb", 3, 50, 20, "rgb8")  # stride 192 > 150: rows copied without the padding
    server.start_listener()
    assert len(fake_runtime.registered) == 2
    client = VisionIpcClient("gpuprod", "road", False)
    rgb_client = VisionIpcClient("gpuprod", "rgb", False)
    try:
        assert client.connect(False) and rgb_client.connect(False)
        buf = server.get_buffer("road")
        assert buf.__dlpack_device__() == (3, 0)
        image = np.zeros(len(buf), np.uint8)
        stamp(image, 5)
        buf.copy_from_device(fake_runtime.device_array(image))
        assert stamp_problem(buf.data, 5) is not None  # not landed yet: the copy is asynchronous
        server.send(buf, 5, 0, 0)  # waits for the copy's event, then publishes
        assert any(c[0] == "event_sync" for c in fake_runtime.calls)
        assert stamp_problem(client.recv(1000).data, 5) is None

        rgb = server.get_buffer("rgb")
        picture = np.arange(20 * 50 * 3, dtype=np.uint32).astype(np.uint8).reshape(20, 50, 3)
        rgb.copy_from_device(fake_runtime.device_array(picture))
        server.send(rgb, 1, 0, 0)
        assert np.array_equal(rgb_client.recv(1000).array, picture)

        wrong = server.get_buffer("road")
        with pytest.raises(InvalidArgumentError, match="does not fit"):
            wrong.copy_from_device(fake_runtime.device_array(np.zeros(100, np.uint8)))
        with pytest.raises(InvalidArgumentError, match="host memory"):
            wrong.copy_from_device(types.SimpleNamespace(__cuda_array_interface__=image.__array_interface__))
        assert client.recv(50) is None  # nothing new: the refused buffer was never sent
    finally:
        client.close()
        rgb_client.close()
        server.close()
    assert fake_runtime.registered == {}


def test_copy_from_device_without_cuda_is_a_clear_refusal():
    server = VisionIpcServer("nocuda")
    server.create_buffers("road", 2, 64, 48)
    try:
        with pytest.raises(InvalidArgumentError, match=r"cuda=True"):
            server.get_buffer("road").copy_from_device(object())
    finally:
        server.close()


@pytest.mark.cuda
@needs_device
def test_a_gpu_producer_publishes_frames_it_holds_in_device_memory(served):
    """A frame to the device and back: client 1 copies it up, a cuda server takes it
    from the device into its pool, client 2 receives exactly the producer's bytes."""
    server, client = served(width=1280, height=720, cuda=True)
    gpu_server = VisionIpcServer("gpuprod2", cuda=True)
    gpu_server.create_buffers("road", 4, 1280, 720)
    gpu_server.start_listener()
    reader = VisionIpcClient("gpuprod2", "road", False)
    try:
        assert reader.connect(False)
        for i in range(1, 30):
            publish(server, i)
            on_device = client.recv(1000).to_device()
            buf = gpu_server.get_buffer("road")
            buf.copy_from_device(on_device)
            gpu_server.send(buf, i, 0, 0)
            assert stamp_problem(reader.recv(1000).data, i) is None
    finally:
        reader.close()
        gpu_server.close()
