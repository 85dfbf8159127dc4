"""visionipc: the producer writes the stamp in place into ``get_buffer().array``."""

import time
from typing import TYPE_CHECKING, Any, Callable, Tuple

from visionipc.bench.transports import END, FID, RECV_TIMEOUT_MS, Received, State
from visionipc.bench.workers import BenchError

if TYPE_CHECKING:
    from visionipc.frame import VisionBuf


class Producer:
    WAKE = "all"  # how send() wakes sleeping clients (VisionIpcServer's wake=)

    def __init__(self, state: State, tag: str, w: int, h: int, nbuf: int, nclients: int) -> None:
        from visionipc import VisionIpcServer

        self.server = VisionIpcServer(f"vb{tag}", wake=self.WAKE)
        self.server.create_buffers("s", nbuf, w, h, "nv12")
        self.server.start_listener()
        self.nbuf, self.nclients = nbuf, nclients
        self._get, self._send = self.server.get_buffer, self.server.send

    def prefault(self) -> None:
        for _ in range(self.nbuf):  # no client yet: these frames reach nobody
            buf = self._get("s")
            buf.array.fill(0)
            self._send(buf, frame_id=0, timestamp_eof=0)

    def accept(self) -> None:
        pass  # a client's connect() returns once the server registered it

    def check(self) -> None:
        got = self.server.num_clients("s")
        if got != self.nclients:
            raise BenchError(f"visionipc server sees {got} clients, expected {self.nclients}")

    def send(
        self,
        fid: int,
        fill: bool,
        now: Callable[[], int] = time.monotonic_ns,
        pack: Callable[..., None] = FID.pack_into,
    ) -> int:
        buf = self._get("s")
        arr = buf.array  # numpy view into the pool: written in place
        if fill:
            arr.fill(fid & 0xFF)
        pack(arr, 0, fid)
        ts = now()
        self._send(buf, frame_id=fid, timestamp_eof=ts)
        return ts

    def readers_woken(self) -> int:
        """Sleeping clients this server's own system calls have woken so far."""
        return self.server.readers_woken("s")

    def end(self) -> None:
        buf = self._get("s")
        FID.pack_into(buf.array, 0, END)  # type: ignore[arg-type]  # an ndarray is a buffer (numpy's stubs: from Python 3.12)
        self._send(buf, frame_id=END, timestamp_eof=0)

    def close(self) -> None:
        self.server.close()


class Consumer:
    CUDA = False  # VisionIpcClient's cuda= (the GPU consumers of vipc_cuda.py)

    def __init__(self, state: State, tag: str, w: int, h: int, conflate: bool) -> None:
        from visionipc import VisionIpcClient

        self.client = VisionIpcClient(f"vb{tag}", "s", conflate=conflate, cuda=self.CUDA)
        deadline = time.monotonic() + 20
        while not self.client.connect(blocking=False):
            if time.monotonic() > deadline:
                raise BenchError(f"visionipc client could not connect to vb{tag}")
            time.sleep(0.01)
        self._recv = self.client.recv

    def recv(
        self, now: Callable[[], int] = time.monotonic_ns, unpack: Callable[..., Tuple[Any, ...]] = FID.unpack_from
    ) -> Received:
        f = self._recv(RECV_TIMEOUT_MS)
        tr = now()
        if f is None:
            return None
        arr = f.array  # the numpy view an application works with
        tv = now()
        fid = f.frame_id
        if fid == END:
            return "end"
        stamp = unpack(arr)[0]  # read the pixels first, then check the frame is still there
        intact = stamp == fid and f.valid
        tv = self.consume(f, tv)
        return fid, f.timestamp_eof, tr, tv, intact

    def consume(self, frame: "VisionBuf", view_ns: int) -> int:
        """What the consumer does with the frame once it has its view; returns when the
        frame is where the consumer wants it (the host view: nothing more to do)."""
        return view_ns

    def close(self) -> None:
        self.client.close()
