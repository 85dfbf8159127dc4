"""Helpers for the web-surface tests: vipc-foxglove as a child process with its URL and
token, its stderr collected in a thread, and a minimal WebSocket client on a plain socket
(so a test decides exactly when it reads: a stuck client never does, a slow one reads
one message at a time and answers a ping only when it reaches it, as a sequential client
such as websocket-client does)."""

import base64
import json
import os
import re
import socket
import struct
import threading
import time
import urllib.parse

from camera_helpers import CAMERA, start

from msgq.testing import unique_name

FOXGLOVE = "visionipc.apps.foxglove.bridge"


class Lines:
    """A child's stderr lines, collected in a thread."""

    def __init__(self, stream):
        self.lines = []
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream):
        for line in stream:
            self.lines.append(line)

    def wait_for(self, pattern, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = re.search(pattern, line)
                if match:
                    return match
            time.sleep(0.02)
        raise AssertionError(f"no line matching {pattern!r} in:\n{self.text()}")

    def join(self, timeout=10):
        self._thread.join(timeout)

    def text(self):
        return "".join(self.lines)


class Foxglove:
    """A synthetic camera and vipc-foxglove on it; ``url`` (ws://host:port/?token=...),
    ``port``, ``token``; ``err`` collects the bridge's stderr."""

    def __init__(self, *extra, width=96, height=64, fps=30, camera_args=()):
        self.name = unique_name("cam")
        self.camera = start(
            CAMERA, "--name", self.name, "--stream", "road", "--width", width, "--height", height, "--fps", fps,
            *camera_args,
        )  # fmt: skip
        self.bridge = start(FOXGLOVE, "--name", self.name, "--port", 0, *extra)
        self.err = Lines(self.bridge.stderr)
        self.url = self.err.wait_for(r"ws://\S+").group(0)
        parts = urllib.parse.urlsplit(self.url)
        self.port = parts.port
        self.token = urllib.parse.parse_qs(parts.query).get("token", [None])[0]

    def stop(self):
        """Stop both; the bridge's exit status."""
        for proc in (self.bridge, self.camera):
            if proc.poll() is None:
                proc.terminate()
        code = self.bridge.wait(30)
        self.camera.wait(30)
        self.err.join()
        return code

    def stats(self):
        import urllib.request

        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/stats", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.loads(r.read())


def rss_mb(pid) -> float:
    """Resident memory of ``pid`` (VmRSS of /proc/PID/status) in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


class RawWebSocket:
    """A WebSocket client on a plain blocking socket: ``status`` of the handshake
    (101 when accepted); ``read()`` one message (pings are answered when reached)."""

    def __init__(
        self, url, origin=None, subprotocols=("foxglove.sdk.v1", "foxglove.websocket.v1"), rcvbuf=None, timeout=10
    ):
        parts = urllib.parse.urlsplit(url)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((parts.hostname, parts.port))
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        key = base64.b64encode(os.urandom(16)).decode()
        head = [
            f"GET {path} HTTP/1.1",
            f"Host: {parts.hostname}:{parts.port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            f"Sec-WebSocket-Protocol: {', '.join(subprotocols)}",
        ]
        if origin:
            head.append(f"Origin: {origin}")
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        self._buf = b""
        response = self._until(b"\r\n\r\n").decode("latin-1")
        self.status = int(response.split()[1])
        self.body = b""
        if self.status != 101:
            length = re.search(r"(?i)content-length: *(\d+)", response)
            if length:
                self.body = self._exactly(int(length.group(1)))

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("the server closed the connection")
        self._buf += data

    def _until(self, marker):
        while marker not in self._buf:
            self._fill()
        head, _, self._buf = self._buf.partition(marker)
        return head

    def _exactly(self, n):
        while len(self._buf) < n:
            self._fill()
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def send(self, opcode, payload: bytes):
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def send_json(self, obj):
        self.send(1, json.dumps(obj).encode())

    def read(self):
        """The next text (str) or binary (bytes) message; pings are answered on the way."""
        while True:
            b0, b1 = self._exactly(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack(">H", self._exactly(2))
            elif n == 127:
                (n,) = struct.unpack(">Q", self._exactly(8))
            payload = self._exactly(n)
            if opcode == 9:
                self.send(10, payload)
            elif opcode == 8:
                raise EOFError(f"closed by the server: {payload[2:]!r}")
            elif opcode == 1:
                return payload.decode()
            elif opcode == 2:
                return payload

    def subscribe(self, topic, sub_id=1):
        """Read serverInfo and advertise, subscribe to ``topic``; its channel."""
        while True:
            msg = json.loads(self.read())
            if msg["op"] == "advertise":
                channel = next(c for c in msg["channels"] if c["topic"] == topic)
                self.send_json({"op": "subscribe", "subscriptions": [{"id": sub_id, "channelId": channel["id"]}]})
                return channel

    def read_data(self):
        """The next messageData: (subscription id, log time ns, payload)."""
        while True:
            msg = self.read()
            if isinstance(msg, bytes) and msg[0] == 1:
                sub_id, log_time = struct.unpack_from("<IQ", msg, 1)
                return sub_id, log_time, msg[13:]

    def close(self):
        self.sock.close()
