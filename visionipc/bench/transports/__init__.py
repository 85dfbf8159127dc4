"""The transports ``vipc-bench`` compares. Each module defines a ``Producer`` and a
``Consumer`` with the same small interface, so the runner treats them alike.

Producer(state, tag, w, h, nbuf, nclients):
    ``prefault()`` touch every buffer before a flat-out run;
    ``accept()``   between the "bound" and "ready" barriers: wait for the clients;
    ``check()``    after "ready": every client is attached;
    ``send(fid, fill) -> ns`` publish frame ``fid`` (stamped with it; ``fill``:
                   write the whole frame first); returns the CLOCK_MONOTONIC send time;
    ``end()``      the end marker; ``close()``.
Consumer(state, tag, w, h, conflate):
    ``recv() -> (fid, sent_ns, recv_ns, view_ns, intact) | "end" | None`` (timeout):
    ``view_ns`` is when the client holds a numpy view of the frame; ``intact``
    says the frame's stamp matches the announced frame id; ``close()``.

A module may also define ``after_run(run)``: called once every worker is gone,
it removes what its library keeps by design beyond its last user.

Every frame is NV12; the first 8 bytes of its pixels carry the frame id.
"""

import importlib
import os
import struct
import types
from typing import TYPE_CHECKING, Iterable, Optional, Tuple, Union

from visionipc.bench import reference
from visionipc.bench.workers import State as State  # the Producer's and Consumer's state

if TYPE_CHECKING:
    import numpy as np

END = (1 << 63) - 1  # frame id of the end marker
FID = struct.Struct("<Q")  # the stamp at the start of every frame's pixels
HDR = struct.Struct("<QQ")  # frame id, send time (ns): pyzmq header part, futex page, iceoryx2 frame head
RECV_TIMEOUT_MS = 5000  # only there so that a lost frame cannot hang a run
# what Consumer.recv() gives: (fid, sent_ns, recv_ns, view_ns, intact), "end", or None (timeout)
Received = Union[Tuple[int, int, int, int, bool], str, None]

# name -> (module, what it is, the package it needs or a function saying why it cannot run)
TRANSPORTS = {
    "visionipc": (
        "vipc",
        "visionipc: server.get_buffer() written in place, server.send(buf), client.recv().array",
        None,
    ),
    "visionipc-handoff": (
        "vipc_handoff",
        "visionipc zero-copy with VisionIpcServer(wake='handoff'): send wakes one sleeping client, it wakes the rest",
        None,
    ),
    "visionipc-get": (
        "vipc_get",
        "visionipc zero-copy stamped before get_buffer() (the producer's whole per-frame path), not before send(buf)",
        None,
    ),
    "visionipc-copy": (
        "vipc_copy",
        "visionipc, the reference's copying send: server.send(stream, frame) copies into a free buffer",
        None,
    ),
    "reference": (
        "reference",
        "commaai/msgq VisionIPC (the reference, built from source, VIPC_REFERENCE_MSGQ): copying send",
        reference.unavailable,
    ),
    "pyzmq": ("zmq_bytes", "pyzmq ipc:// XPUB_NODROP sending the frame bytes (copy=False), np.frombuffer", "zmq"),
    "shm+pipe": (
        "shm_pipe",
        "multiprocessing.shared_memory ring + slot index over a Unix socket pipe, no protection",
        None,
    ),
    "msgq": (
        "msgq_msg",
        "plain msgq: a 64-byte ring message (frame id, send time) received as bytes; no frame",
        None,
    ),
    "futex": (
        "futex",
        "bare futex wake-up (ctypes syscall, shared mmap): the floor of a sleeping receiver; no frame",
        None,
    ),
    "iceoryx2": (
        "iox2",
        "iceoryx2 publish-subscribe Slice[c_uint8] loaned and written in place + Event wake-up",
        "iceoryx2",
    ),
    "visionipc-cuda": (
        "vipc_cuda",
        "visionipc client with cuda=True: frame.to_device(out=) from the pool's registered pages (GPU)",
        lambda: None if _cuda_available() else "no CUDA device (visionipc.cuda.available() is False)",
    ),
    "visionipc-cuda-pool": (
        "vipc_cuda_pool",
        'visionipc pool in device memory (create_buffers(memory="cuda")): DeviceFrames through CUDA IPC, no copy (GPU)',
        lambda: _cuda_pool_unavailable(),  # defined below
    ),
    "naive-cuda": ("cuda_naive", "cupy.asarray(frame.array): pageable host memory to the GPU", "cupy"),
    "pinned-staging": (
        "cuda_pinned",
        "np.copyto into a pinned buffer, then an async host-to-device copy (CuPy)",
        "cupy",
    ),
}


def _cuda_available() -> bool:
    from visionipc import cuda

    return cuda.available()


def _cuda_pool_unavailable() -> Optional[str]:
    """visionipc-cuda-pool's producer writes its frames with CuPy (as a GPU producer's kernels would)."""
    if not _cuda_available():
        return "no CUDA device (visionipc.cuda.available() is False)"
    try:
        importlib.import_module("cupy")
    except ImportError:
        return "cupy not installed (its producer writes the frames on the GPU with CuPy)"
    return None


HANDOFF = "visionipc-handoff"  # VisionIpcServer(wake="handoff"): the report gives it the 8-client targets too
# Variants measured only when named in --transports (the default matrix stays as long as it was).
# the GPU rows need a GPU; visionipc-get is the producer's side of issue 36
ON_REQUEST = (HANDOFF, "visionipc-get", "visionipc-cuda", "visionipc-cuda-pool", "naive-cuda", "pinned-staging")


def load(name: str) -> types.ModuleType:
    """The transport's module (raises ImportError when its package is missing)."""
    return importlib.import_module(f"visionipc.bench.transports.{TRANSPORTS[name][0]}")


def after_run(names: Iterable[str], run: str) -> None:
    """Let each transport that ran remove what its library keeps by design
    after its last user has gone (an optional ``after_run(run)`` of its module),
    before the runner counts what the run left in /dev/shm as leaks."""
    for name in names:
        hook = getattr(load(name), "after_run", None)
        if hook is not None:
            hook(run)


def unavailable(name: str) -> Optional[str]:
    """None if ``name`` can run here, else why not."""
    need = TRANSPORTS[name][2]
    if need is None:
        return None
    if callable(need):
        return need()
    try:
        importlib.import_module(need)
    except ImportError:
        return f"{need} not installed"
    return None


def nv12(w: int, h: int) -> Tuple[int, Tuple[int, int]]:
    """(size in bytes, array shape) of an NV12 frame as visionipc lays it out."""
    from visionipc import layout

    g = layout("nv12", w, h)
    return g.size, (h * 3 // 2, g.stride)


def stamp(frame: "np.ndarray", fid: int, fill: bool) -> None:
    """A camera's frame for a copying send: every byte written when ``fill``, then the stamp."""
    if fill:
        frame.fill(fid & 0xFF)
    FID.pack_into(frame, 0, fid)  # type: ignore[arg-type]  # an ndarray is a buffer (numpy's stubs: from 3.12)


def shm_name(tag: str) -> str:
    """Names of this run's files in /dev/shm: removed by the runner if a worker dies."""
    return f"vipcb{os.environ.get('VIPC_BENCH_RUN', os.getpid())}_{tag}"
