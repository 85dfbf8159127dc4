"""A stand-in for the CUDA runtime (``visionipc.cuda._runtime.Runtime``) where no device
exists, for the CPU-side tests of visionipc.cuda's bookkeeping (tests/visionipc/test_cuda*.py);
on a GPU machine those tests skip and the real ones run."""

import ctypes
import os
import threading
import types

import numpy as np
import pytest

from visionipc import cuda
from visionipc.cuda import _runtime

HAVE_DEVICE = cuda.available()


class FakeRuntime:
    """The CUDA runtime's calls as visionipc.cuda makes them, on the CPU: "device
    memory" is numpy arrays, a copy happens when its event is completed (by the
    test, or by event_sync), and every call is logged."""

    def __init__(self):
        self.calls, self.registered, self.memory = [], {}, {}
        self.foreign = {}  # IPC handle -> allocation, of "other processes" (foreign_allocation)
        self.pending = {}  # event -> [copies recorded on it]
        self.queued = []  # copies submitted, not yet bound to an event
        self.next_handle = 1000
        self.lock = threading.Lock()
        self.pageable_ok = False  # a copy from unregistered host memory is a test failure unless allowed

    def _handle(self):
        self.next_handle += 16
        return self.next_handle

    def device_count(self):
        return 1

    def set_device(self, device):
        self.calls.append(("set_device", device))

    def pointer_device(self, ptr):
        self.calls.append(("pointer_device", ptr))
        return 0 if any(base <= ptr < base + a.nbytes for base, a in self.memory.items()) else None

    def host_register(self, ptr, size, read_only=False):
        assert ptr not in self.registered, "registered twice"
        assert ptr % os.sysconf("SC_PAGESIZE") == 0
        self.registered[ptr] = size
        self.calls.append(("register", ptr, size))

    def host_unregister(self, ptr):
        del self.registered[ptr]
        self.calls.append(("unregister", ptr))

    def malloc(self, size):
        a = np.zeros(size, np.uint8)
        self.memory[a.ctypes.data] = a
        self.calls.append(("malloc", size))
        return a.ctypes.data

    def free(self, ptr):  # cudaFree waits for the device, so pending copies land first
        for event in list(self.pending):
            self.complete(event)
        self.memory.pop(ptr, None)

    def memset(self, ptr, value, size):
        self.memory[ptr][:size] = value
        self.calls.append(("memset", size))

    def device_uuid(self, device):
        return b"fake-gpu-uuid-00"

    def ipc_get_handle(self, ptr):
        self.calls.append(("ipc_get_handle", ptr))
        return ptr.to_bytes(8, "little") * 8

    def ipc_open(self, handle):
        """Only another process's allocation (``foreign``, made by the test) opens: the tests'
        pools are this process's, which CUDA does not reopen."""
        assert handle in self.foreign, "a pool of this process was opened through CUDA IPC"
        self.calls.append(("ipc_open", handle))
        return self.foreign[handle]

    def ipc_close(self, ptr):
        assert ptr in self.foreign.values(), "a pool of this process was closed through CUDA IPC"
        self.calls.append(("ipc_close", ptr))

    def allocation_range(self, ptr):
        return next((b, a.nbytes) for b, a in self.memory.items() if b <= ptr < b + a.nbytes)

    def foreign_allocation(self, size):
        """An allocation as another process would export it: ``(handle, ptr)``."""
        ptr = self.malloc(size)
        handle = b"foreign!" + ptr.to_bytes(8, "little") * 7
        self.foreign[handle] = ptr
        return handle, ptr

    def stream_create(self):
        return self._handle()

    def stream_destroy(self, stream):
        self.calls.append(("stream_destroy", stream))

    def event_create(self):
        return self._handle()

    def event_destroy(self, event):
        self.calls.append(("event_destroy", event))

    def memcpy_async(self, dst, src, size, kind, stream):
        if kind == _runtime.HOST_TO_DEVICE and not self.pageable_ok:
            assert any(b <= src and src + size <= b + n for b, n in self.registered.items()), "pageable source"
        self.queued.append((dst, src, size))

    def memcpy2d_async(self, dst, dpitch, src, spitch, width, height, kind, stream):
        self.queued.extend((dst + r * dpitch, src + r * spitch, width) for r in range(height))

    def event_record(self, event, stream):
        with self.lock:
            self.pending.setdefault(event, []).extend(self.queued)
            self.queued = []

    def complete(self, event):
        """The device finishes the copies of ``event``: the bytes land now ("device
        memory" here is host memory at real addresses, so a copy is a memmove)."""
        with self.lock:
            for dst, src, size in self.pending.pop(event, []):
                ctypes.memmove(dst, src, size)

    def stream_sync(self, stream):
        with self.lock:
            queued, self.queued = self.queued, []
        for dst, src, size in queued:
            ctypes.memmove(dst, src, size)

    def device_array(self, data: np.ndarray):
        """An object with __cuda_array_interface__ over a copy of ``data`` in "device memory"."""
        ptr = self.malloc(data.nbytes)
        self.memory[ptr][:] = data.reshape(-1).view(np.uint8)
        cai = {"shape": data.shape, "typestr": data.dtype.str, "data": (ptr, False), "version": 3}
        return types.SimpleNamespace(__cuda_array_interface__=cai)

    def event_done(self, event):
        return event not in self.pending

    def event_sync(self, event):
        self.calls.append(("event_sync", event))
        self.complete(event)

    def stream_wait_event(self, stream, event):
        self.calls.append(("stream_wait_event", stream, event))


@pytest.fixture
def fake_runtime(monkeypatch):
    if HAVE_DEVICE:
        pytest.skip("a CUDA device is present: the real tests run instead")
    fake = FakeRuntime()
    monkeypatch.setattr(_runtime, "runtime", lambda: fake)
    return fake


def device_bytes(fake, device_frame):
    base = next(b for b, a in fake.memory.items() if b <= device_frame.ptr < b + a.nbytes)
    return fake.memory[base][device_frame.ptr - base :]


def close_in_forked_child(fake, *objects):
    """Fork; the child closes ``objects`` (inherited: each forgets without a CUDA call) and
    exits 0 if the stand-in saw no call meanwhile (3 if it did, 4 if closing raised)."""
    before = list(fake.calls)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            for obj in objects:
                obj.close()
            code = 0 if fake.calls == before else 3
        except BaseException:  # noqa: BLE001
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status)
