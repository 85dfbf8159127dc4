"""Who the web surfaces answer (issue 31, items 2, 3 and 7), on real processes and sockets:
a page of another site (real headless Chromium, and plain requests with its Origin) gets
no frames from vipc-foxglove or vipc-view, even when it knows the token, unless its origin
is allowed with --allow-origin; another local user (``nobody``) gets 401, not frames;
without the token nobody does; a WebSocket client sending thousands of hostile messages
costs a few escaped log lines; disconnecting logs no AttributeError.

Before (2d8d5c3): a client announcing Origin http://evil.example got 91 JPEG frames in 3 s;
user nobody got /snapshot/road.jpg (200) and a live subscription; one WebSocket client made
vipc-foxglove write 11,000 lines in 0.65 s with raw escapes and forged lines, and every
disconnect logged AttributeError: 'Subscriptions' object has no attribute 'on_unsubscribe'."""

import http.client
import http.server
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest
from camera_helpers import reap
from test_view import browser  # noqa: F401  (the headless Chromium fixture)
from view_helpers import VIEW, Output, Producer, ViewProcess
from web_helpers import Foxglove, RawWebSocket

from msgq.testing import unique_name

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-P", "-c"]


@pytest.fixture(autouse=True)
def _no_process_left():
    yield
    reap()


def _frames(url, origin=None, count=3, timeout=10):
    """(handshake status, frames of /road received) for a client announcing ``origin``."""
    ws = RawWebSocket(url, origin=origin, timeout=timeout)
    if ws.status != 101:
        return ws.status, 0, ws.body.decode()
    ws.subscribe("/road")
    for _ in range(count):
        ws.read_data()
    ws.close()
    return 101, count, ""


def test_foxglove_answers_only_its_own_origin_and_allowed_ones():
    fox = Foxglove("--allow-origin", "https://app.foxglove.dev")
    try:
        for origin in ("http://evil.example", "https://app.foxglove.dev.evil.example", "null"):
            status, frames, body = _frames(fox.url, origin)
            assert (status, frames) == (403, 0), origin
            assert "--allow-origin" in body
        assert _frames(fox.url, "https://app.foxglove.dev")[:2] == (101, 3)
        assert _frames(fox.url, f"http://127.0.0.1:{fox.port}")[:2] == (101, 3)  # its own origin
        assert _frames(fox.url)[:2] == (101, 3)  # not a browser
        # the Foxglove app link is printed because that origin is allowed
        fox.err.wait_for(r"open in Foxglove: https://app\.foxglove\.dev/~/view\?ds=foxglove-websocket&ds\.url=ws%3A")
        assert fox.stats()["refused"]["foreign_origin"] == 3
    finally:
        assert fox.stop() == 0


def test_foxglove_without_the_token_is_refused_and_no_auth_opts_out():
    fox = Foxglove()
    try:
        bare = fox.url.split("?")[0]
        for url in (bare, bare + "?token=wrong", bare + "?token="):
            status, frames, body = _frames(url)
            assert (status, frames) == (401, 0) and "--no-auth" in body, url
        assert _frames(fox.url)[:2] == (101, 3)
        assert RawWebSocket(fox.url, subprotocols=("other.v1",)).status == 400  # not a Foxglove client
        for subprotocol in ("foxglove.websocket.v1", "foxglove.sdk.v1"):  # either is spoken
            ws = RawWebSocket(fox.url, subprotocols=(subprotocol,))
            assert ws.status == 101 and json.loads(ws.read())["op"] == "serverInfo"
            ws.close()
    finally:
        assert fox.stop() == 0
    fox = Foxglove("--no-auth")
    try:
        assert "token" not in fox.url
        assert _frames(fox.url)[:2] == (101, 3)
    finally:
        assert fox.stop() == 0


def _live(stats):
    return "road" in stats["streams"] and stats["streams"]["road"]["live"]


def test_vipc_view_refuses_other_sites_pages_and_requests_without_the_token():
    name = unique_name("cam")
    with (
        Producer(name, ["road"], 160, 120),
        ViewProcess("--name", name, "--allow-origin", "http://ok.example", "--allow-origin", "null") as view,
    ):
        view.wait_for(_live, what="road live")
        assert view.get("/snapshot/road.jpg")[0] == 200
        own = {"Origin": view.url, "Sec-Fetch-Site": "same-origin"}
        assert view.get("/snapshot/road.jpg", headers=own)[0] == 200
        assert view.get("/stats", headers={"Origin": "http://ok.example", "Sec-Fetch-Site": "cross-site"})[0] == 200
        assert view.get("/stats", headers={"Origin": "null"})[0] == 200  # a window loaded from a file
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Dest": "image", "Sec-Fetch-Mode": "no-cors"},  # an <img>
        ):
            status, _, body = view.get("/snapshot/road.jpg", headers=headers)
            assert status == 403 and b"--allow-origin" in body, headers
        for path in ("/", "/stats", "/snapshot/road.jpg", "/stream/road.mjpg", "/snapshot/road.jpg?token=nope"):
            status, _, body = view.get(path, token=False)
            assert status == 401 and b"--no-auth" in body, path
        # the token in the URL once; the cookie for the page's own requests after that
        status, headers, _ = view.get(f"/?token={view.token}", token=False)
        cookie = headers["Set-Cookie"].split(";")[0]
        assert status == 200 and "HttpOnly" in headers["Set-Cookie"] and "SameSite=Strict" in headers["Set-Cookie"]
        assert view.get("/stats", token=False, headers={"Cookie": cookie})[0] == 200
        port = int(view.url.rsplit(":", 1)[1])
        for path, shown in (  # tokens that are not UTF-8
            (b"/stats", b"Authorization: Bearer \xff\xfe"),
            (b"/stats", b"Cookie: " + cookie.split("=")[0].encode() + b"=\xff"),
            (b"/stats?token=%ff", b"X: y"),
        ):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + shown + b"\r\n\r\n")
                assert sock.recv(100).startswith(b"HTTP/1.1 401 "), shown
        stats = view.stats()
        assert stats["refused"]["foreign_origin"] == 3 and stats["refused"]["no_token"] == 8
    with Producer(name, ["road"], 160, 120), ViewProcess("--name", name, "--no-auth") as view:
        assert view.token is None
        view.wait_for(_live, what="road live")
        assert view.get("/snapshot/road.jpg", token=False)[0] == 200


class _EvilSite:
    """A page of another origin (http://localhost:PORT, the tools are at 127.0.0.1) that
    tries to read the frames with the right token: a Foxglove WebSocket and an <img>."""

    PAGE = """<!doctype html><title>evil</title><script>
      window.result = {open: false, messages: 0, closed: false, img: "pending"};
      const ws = new WebSocket(FOX_URL, ["foxglove.sdk.v1", "foxglove.websocket.v1"]);
      ws.binaryType = "arraybuffer";
      ws.onopen = () => { window.result.open = true; };
      ws.onmessage = (e) => {
        window.result.messages++;
        if (typeof e.data === "string") {
          const m = JSON.parse(e.data);
          if (m.op === "advertise")
            ws.send(JSON.stringify({op: "subscribe", subscriptions: [{id: 1, channelId: m.channels[0].id}]}));
        }
      };
      ws.onclose = () => { window.result.closed = true; };
      const img = new Image();
      img.onload = () => { window.result.img = "loaded"; };
      img.onerror = () => { window.result.img = "error"; };
      img.src = VIEW_SNAPSHOT;
    </script>"""

    def __init__(self):
        site = self
        self.page = ""

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(site.page.encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://localhost:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def targets(self, fox_url, view_snapshot):
        self.page = self.PAGE.replace("FOX_URL", json.dumps(fox_url)).replace(
            "VIEW_SNAPSHOT", json.dumps(view_snapshot)
        )

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _result(browser, until, timeout=15):  # noqa: F811
    deadline = time.monotonic() + timeout
    while True:
        result = browser.execute_script("return window.result")
        if until(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


def test_a_page_of_another_site_in_chromium_reads_no_frames(browser):  # noqa: F811
    name = unique_name("cam")
    site = _EvilSite()
    with Producer(name, ["road"], 160, 120), ViewProcess("--name", name) as view:
        snapshot = f"{view.url}/snapshot/road.jpg?token={view.token}"  # it even knows the tokens
        fox = Foxglove()
        try:
            site.targets(fox.url, snapshot)
            browser.get(site.origin + "/")
            result = _result(browser, lambda r: r["closed"] and r["img"] != "pending")
            assert result == {"open": False, "messages": 0, "closed": True, "img": "error"}, result
            assert fox.stats()["refused"]["foreign_origin"] == 1
            assert view.stats()["refused"]["foreign_origin"] == 1
        finally:
            assert fox.stop() == 0
        # the same page, its origin allowed (as https://app.foxglove.dev would be): frames arrive
        fox = Foxglove("--allow-origin", site.origin)
        try:
            site.targets(fox.url, snapshot)
            browser.get(site.origin + "/")
            result = _result(browser, lambda r: r["messages"] >= 5)
            assert result["open"] and result["messages"] >= 5, result  # serverInfo, advertise, frames
        finally:
            assert fox.stop() == 0
            site.close()


def _nobody(code, timeout=60):
    proc = subprocess.run(
        AS_NOBODY + [textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return proc.stdout


NOBODY_GETS = """
import http.client, sys
for path, headers in {requests!r}:
    conn = http.client.HTTPConnection("127.0.0.1", {port}, timeout=10)
    conn.request("GET", path, headers=headers)
    r = conn.getresponse()
    r.read()
    print(r.status)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv (as in CI)")
def test_another_local_user_gets_401_not_frames():
    name = unique_name("cam")
    ws_headers = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Protocol": "foxglove.websocket.v1",
    }
    with Producer(name, ["road"], 160, 120), ViewProcess("--name", name) as view:
        port = int(view.url.rsplit(":", 1)[1])
        requests = [("/snapshot/road.jpg", {}), ("/stream/road.mjpg", {}), ("/", {}), ("/stats", {})]
        requests.append(("/snapshot/road.jpg", {"Authorization": "Bearer guess"}))
        assert _nobody(NOBODY_GETS.format(requests=requests, port=port)).split() == ["401"] * 5
        view.wait_for(_live, what="road live")
        assert view.get("/snapshot/road.jpg")[0] == 200  # the owner, with the token
        # the token is nowhere another user can read it
        with open(f"/proc/{view.proc.pid}/cmdline", "rb") as f:
            assert view.token.encode() not in f.read()
        assert "PermissionError" in _nobody(f"open('/proc/{view.proc.pid}/environ').read()")
    fox = Foxglove()
    try:
        out = _nobody(NOBODY_GETS.format(requests=[("/", ws_headers), ("/stats", {})], port=fox.port))
        assert out.split() == ["401", "401"], out
        assert _frames(fox.url)[:2] == (101, 3)
    finally:
        assert fox.stop() == 0


def test_hostile_websocket_messages_cost_a_few_escaped_lines_and_disconnects_log_no_error():
    fox = Foxglove()
    forged = "\x1b[2J\x1b[31mred\nvipc-foxglove: FORGED line\r\n"
    hostile = [
        forged,
        json.dumps({"op": forged}),
        json.dumps({"op": "subscribe", "subscriptions": [{"id": forged, "channelId": 1}]}),
        json.dumps({"op": "subscribe", "subscriptions": [{"id": 7, "channelId": 999}]}),
        json.dumps({"op": "unsubscribe", "subscriptionIds": [forged]}),
        "[]",
    ]
    try:
        start = time.monotonic()
        sent = 0
        for _ in range(20):  # 20 connections, each sending until the server closes it
            ws = RawWebSocket(fox.url)
            try:
                for i in range(500):
                    ws.send(1, hostile[i % len(hostile)].encode())
                    ws.send(2, b"\x01binary")
                    sent += 2
            except OSError:
                pass
            ws.close()
        for _ in range(5):  # subscribe, read, unsubscribe, go away
            ws = RawWebSocket(fox.url)
            ws.subscribe("/road", sub_id=3)
            ws.read_data()
            ws.send_json({"op": "unsubscribe", "subscriptionIds": [3]})
            ws.close()
        elapsed = time.monotonic() - start
        assert _frames(fox.url)[:2] == (101, 3)  # still serving
    finally:
        assert fox.stop() == 0
    text = fox.err.text()
    print(f"{sent} hostile messages in {elapsed:.1f} s -> {len(fox.err.lines)} lines of stderr")
    assert len(fox.err.lines) < 60, text
    assert "\x1b" not in text and "\r" not in text
    assert not any(line.startswith("vipc-foxglove: FORGED") for line in fox.err.lines), text
    assert "\\x1b[2J" in text  # what the peer sent is shown, escaped
    assert "Traceback" not in text and "AttributeError" not in text, text


UNIX_CONNECT = """
import socket
try:
    socket.socket(socket.AF_UNIX).connect({path!r})
    print("CONNECTED")
except OSError as e:
    print(type(e).__name__)
"""


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.socket_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv (as in CI)")
def test_vipc_view_on_a_unix_socket_answers_its_owner_without_a_token_and_nobody_else():
    name = unique_name("cam")
    folder = tempfile.mkdtemp(prefix="vipc-view-")
    os.chmod(folder, 0o755)  # anyone may look for the socket: only its own mode keeps them out
    path = os.path.join(folder, "view.sock")
    try:
        with Producer(name, ["road"], 160, 120):
            proc = subprocess.Popen([VIEW, "--name", name, "--http", f"unix:{path}"], stdout=subprocess.PIPE, text=True)
            out = Output(proc)
            try:
                out.wait_for(rf"serving unix:{re.escape(path)} \(owner only: mode 600")
                assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
                conn = _UnixHTTP(path)
                conn.request("GET", "/stats")
                response = conn.getresponse()
                assert response.status == 200 and json.loads(response.read())["server"] == name
                conn.close()
                refused = _nobody(UNIX_CONNECT.format(path=path))
                assert refused.strip() == "PermissionError", refused
            finally:
                proc.send_signal(signal.SIGINT)
                assert proc.wait(15) == 0
        assert not os.path.exists(path)  # removed at exit
    finally:
        shutil.rmtree(folder, ignore_errors=True)
