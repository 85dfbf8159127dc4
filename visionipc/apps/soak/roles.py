"""The soak's child processes: publishers, subscribers, a VisionIPC server and
its clients, each checking what it receives and reporting JSON lines."""

import gc
import json
import os
import random
import struct
import sys
import time
import zlib
from typing import Any, Callable, Dict, List, Optional, Set, TypedDict


class RoleSpec(TypedDict, total=False):
    """What the orchestrator hands a role (``--spec``, JSON); each role reads its own keys."""

    topic: str
    seed: int
    stop: str  # the flag file whose existence asks the role to stop
    conflate: bool
    hold_s: float


Record = Dict[str, Any]  # one JSON line a role reports

HEADER = struct.Struct("<QQII")  # epoch, sequence number, body length, CRC-32 of the body
TOPICS = {  # name -> (segment_size, largest body, pause between bursts in s)
    "firehose": (16384, 2000, 0.002),
    "mixed": (256 * 1024, 100_000, 0.02),
}
VIPC_SERVER, VIPC_STREAM = "soakcam", "road"
STOP_GRACE_S = 20.0


# ----------------------------------------------------------------- children


def _stop_requested(path: str) -> bool:
    return os.path.exists(path)


def open_fds() -> Set[str]:
    """The names of this process's open descriptors (leak checks at the end of a role and of the run)."""
    return set(os.listdir("/proc/self/fd"))


def _emit(record: Record) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _emit_final(record: Record, fds_before: Set[str], errors: Optional[List[str]] = None) -> None:
    """A role's last record, after it closed everything: the descriptors it
    leaked and (for a receiving role) the first errors and their count."""
    gc.collect()
    if errors is not None:
        record.update(errors=errors[:20], error_count=len(errors))
    _emit({**record, "leaked_fds": sorted(open_fds() - fds_before)})


def role_publisher(spec: RoleSpec) -> int:
    import msgq

    rng = random.Random(spec["seed"])
    segment_size, largest, pause = TOPICS[spec["topic"]]
    fds_before = open_fds()
    pub = msgq.pub_sock(spec["topic"], segment_size=segment_size)
    largest = min(largest, pub.max_message_size - HEADER.size)
    epoch = rng.getrandbits(63)
    _emit({"ready": True, "epoch": epoch})
    seq = sent_bytes = 0
    next_reclaim = time.monotonic()
    while not _stop_requested(spec["stop"]):
        for _ in range(rng.randint(1, 20)):
            size = rng.choice((rng.randint(0, 64), rng.randint(0, 1024), rng.randint(0, largest)))
            body = rng.randbytes(size)
            pub.send(HEADER.pack(epoch, seq, size, zlib.crc32(body)) + body)
            seq += 1
            sent_bytes += size
        if time.monotonic() >= next_reclaim:
            _ = pub.num_readers  # reclaims the slots of dead readers
            next_reclaim = time.monotonic() + 0.5
        time.sleep(rng.uniform(0, pause))
    readers = pub.num_readers  # subscribers have all left by now: dead slots reclaimed, live ones released
    pub.close()
    _emit_final({"sent": seq, "bytes": sent_bytes, "epoch": epoch, "readers_at_end": readers}, fds_before)
    return 0


def role_subscriber(spec: RoleSpec) -> int:
    import msgq

    conflate = spec["conflate"]
    fds_before = open_fds()
    sub = msgq.sub_sock(spec["topic"], timeout=100, conflate=conflate)
    _emit({"ready": True})
    errors: List[str] = []
    epochs: List[int] = []
    received = nbytes = gaps = 0
    last_seq, last_resets = 0, 0  # last_seq: read only once an epoch was seen
    while not _stop_requested(spec["stop"]):
        msg = sub.receive()
        if msg is None:
            continue
        resets = sub.resets
        if len(msg) < HEADER.size:
            errors.append(f"message of {len(msg)} bytes has no header")
            continue
        epoch, seq, size, crc = HEADER.unpack_from(msg)
        body = memoryview(msg)[HEADER.size :]
        if len(body) != size or zlib.crc32(body) != crc:
            errors.append(f"torn message: epoch {epoch} seq {seq}")
            continue
        if not epochs or epoch != epochs[-1]:
            if epoch in epochs:
                errors.append(f"epoch {epoch} came back after a newer publisher")
            elif epochs and seq != 0 and resets == last_resets and not conflate:
                errors.append(f"restarted publisher: first {seq} messages lost without a reset")
            epochs.append(epoch)
        elif seq <= last_seq:
            errors.append(f"out of order: seq {seq} after {last_seq}")
        elif seq != last_seq + 1:
            gaps += seq - last_seq - 1
            if resets == last_resets and not conflate:
                errors.append(f"{seq - last_seq - 1} messages lost before seq {seq} without a reset")
        last_seq, last_resets = seq, resets
        received += 1
        nbytes += len(msg)
    resets = sub.resets
    sub.close()
    record = {"received": received, "bytes": nbytes, "resets": resets, "skipped": gaps, "epochs": epochs}
    _emit_final(record, fds_before, errors)
    return 0


def _stamp(data: memoryview, frame_id: int) -> None:
    """``data``: a frame's whole buffer (``frame.data``, a writable memoryview)."""
    import numpy as np

    pixels = np.frombuffer(data, np.uint8)
    pixels[:] = frame_id % 251
    pixels[:8] = np.frombuffer(struct.pack("<Q", frame_id), np.uint8)


def _stamp_problem(data: memoryview, frame_id: int) -> Optional[str]:
    import numpy as np

    pixels = np.frombuffer(data, np.uint8)
    head = struct.unpack("<Q", bytes(pixels[:8]))[0]
    if head != frame_id:
        return f"frame {frame_id}: header says {head}"
    if np.count_nonzero(pixels[8:] != frame_id % 251):
        return f"frame {frame_id}: pixels of another frame"
    return None


def role_server(spec: RoleSpec) -> int:
    from visionipc import VisionIpcServer

    rng = random.Random(spec["seed"])
    srv = VisionIpcServer(VIPC_SERVER)
    srv.create_buffers(VIPC_STREAM, 6, 320, 240, "nv12")
    srv.start_listener()
    _emit({"ready": True, "server_id": srv.server_id})
    frame_id = 0
    while not _stop_requested(spec["stop"]):
        frame_id += 1
        buf = srv.get_buffer(VIPC_STREAM)
        _stamp(buf.data, frame_id)
        srv.send(buf, frame_id=frame_id, timestamp_sof=frame_id, timestamp_eof=frame_id)
        time.sleep(rng.uniform(0.001, 0.02))
    deadline = time.monotonic() + 5  # clients have left; their hang-ups reach the listener thread
    while srv.num_clients(VIPC_STREAM) and time.monotonic() < deadline:
        time.sleep(0.01)
    clients = srv.num_clients(VIPC_STREAM)
    srv.close()
    _emit({"sent": frame_id, "clients_at_end": clients})
    return 0


def role_client(spec: RoleSpec) -> int:
    from visionipc import VisionIpcClient

    fds_before = open_fds()
    client = VisionIpcClient(VIPC_SERVER, VIPC_STREAM, spec["conflate"])
    while not client.connect(False):
        if _stop_requested(spec["stop"]):
            break
        time.sleep(0.02)
    _emit({"ready": True})
    errors: List[str] = []
    server_ids: List[int] = []
    frames = invalid = 0
    last_frame = 0
    while not _stop_requested(spec["stop"]):
        frame = client.recv(100)
        if frame is None:
            continue
        server_id = client.server_id  # it connected above
        if not server_ids or server_ids[-1] != server_id:
            server_ids.append(server_id)
            last_frame = 0
        with frame:  # leased: the producer must not reuse this buffer meanwhile
            if spec["hold_s"]:
                time.sleep(spec["hold_s"])  # a kill now lands mid-frame
            problem = _stamp_problem(frame.data, frame.frame_id)
            valid = frame.valid
        if not valid:
            invalid += 1  # overwritten and told so: allowed
        elif problem:
            errors.append(f"torn frame reported valid: {problem}")
        if frame.frame_id <= last_frame:
            errors.append(f"frame {frame.frame_id} after {last_frame}")
        last_frame = frame.frame_id
        frames += 1
    client.close()
    _emit_final({"frames": frames, "invalid": invalid, "server_ids": server_ids}, fds_before, errors)
    return 0


ROLES: Dict[str, Callable[[RoleSpec], int]] = {
    "publisher": role_publisher,
    "subscriber": role_subscriber,
    "server": role_server,
    "client": role_client,
}
