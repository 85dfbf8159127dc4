"""The installable C++ library, used the way a C++ project uses it.

Once per session (module fixture): ``cmake --install`` of the already built
tree (build/dev, from tools/setup.sh) into a fresh prefix, then one CMake
project outside the source tree builds the C++ examples (examples/cpp) and the
compatibility suite (cpp/tests/compat) with ``find_package(visionipc)``. The
tests then run C++ -> Python and Python -> C++ and check every frame, run the
reference's test scenarios in C++, and check that those programs use only the
reference's public headers (they compile against commaai/msgq's own headers).
"""

import fcntl
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from repo import BUILD_TIMEOUT, ROOT

BUILD = ROOT / "build"
PREFIX = BUILD / "cpp-install-prefix"
CONSUMER_BUILD = BUILD / "cpp-install-consumer"
REFERENCE = os.environ.get("VIPC_REFERENCE_MSGQ", "/work/ref/msgq")  # commaai/msgq checkout (headers only)


def _run(cmd, timeout=240, **kw):
    proc = subprocess.run(
        [str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, **kw
    )
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-6000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed():
    """The prefix holding a fresh install, and the consumer project built against it."""
    BUILD.mkdir(exist_ok=True)
    with open(BUILD / ".cpp-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        dev = BUILD / "dev"
        if not (dev / "CMakeCache.txt").exists():
            pytest.fail("build/dev is missing: run tools/setup.sh first")
        _run(["cmake", "--build", dev, "--target", "visionipc", "visionipc_static"], timeout=BUILD_TIMEOUT)
        shutil.rmtree(PREFIX, ignore_errors=True)
        _run(["cmake", "--install", dev, "--prefix", PREFIX])
        # One project outside the tree: the examples and the compatibility suite.
        project = CONSUMER_BUILD / "src"
        project.mkdir(parents=True, exist_ok=True)
        (project / "CMakeLists.txt").write_text(
            "cmake_minimum_required(VERSION 3.20)\n"
            "project(visionipc_consumer LANGUAGES CXX)\n"
            f'add_subdirectory("{ROOT}/examples/cpp" examples)\n'
            f'add_subdirectory("{ROOT}/cpp/tests/compat" compat)\n'
            f'add_subdirectory("{ROOT}/cpp/tests/api" api)\n'
        )
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        _run(
            [
                "cmake",
                "-S",
                project,
                "-B",
                CONSUMER_BUILD / "out",
                *gen,
                f"-DCMAKE_PREFIX_PATH={PREFIX}",
                "-DCMAKE_BUILD_TYPE=Release",
            ]
        )
        _run(["cmake", "--build", CONSUMER_BUILD / "out", "-j2"], timeout=BUILD_TIMEOUT)
    return CONSUMER_BUILD / "out"


def _find(root, name):
    found = sorted(p for p in root.rglob(name))
    assert found, f"nothing named {name} under {root}"
    return found[0]


def test_the_install_has_headers_both_libraries_a_cmake_package_and_pkg_config(installed):
    include = _find(PREFIX, "vipc.h").parent.parent
    for header in (
        "vipc/vipc.h",
        "vipc/topic.h",
        "vipc/frames.h",
        "msgq/ipc.h",
        "msgq/visionipc/visionipc_client.h",
        "msgq/visionipc/visionipc_server.h",
        "msgq/visionipc/visionbuf.h",
        "msgq/visionipc/visionipc.h",
    ):
        assert (include / header).is_file(), header
    headers = {p.name for p in include.rglob("*.h")}
    assert not headers & {"layout.h", "files.h", "pool.h", "segment.h", "guard.h"}, "internal headers leaked"
    shared = _find(PREFIX, "libvisionipc.so")
    assert os.path.realpath(shared).endswith("/libvisionipc.so.0.1")  # the one file, named by its soname
    assert "SONAME" in _run(["objdump", "-p", shared]) and "libvisionipc.so.0.1" in _run(["objdump", "-p", shared])
    exported = _run(["nm", "-DC", "--defined-only", shared])
    assert "vipc::Publisher::send" in exported and "VisionIpcClient::recv" in exported and "vipc::Error" in exported
    for internal in ("vipc::common::", "vipc::msgq::", "vipc::visionipc::", "vipc::api::"):
        assert internal not in exported, f"libvisionipc.so exports internals ({internal})"
    assert _find(PREFIX, "libvisionipc.a").is_file()
    assert _find(PREFIX, "visionipc-config.cmake").is_file()
    pc = _find(PREFIX, "visionipc.pc")
    env = dict(os.environ, PKG_CONFIG_PATH=str(pc.parent))
    flags = _run(["pkg-config", "--cflags", "--libs", "visionipc"], env=env).split()
    assert f"-I{include}" in [f.replace("/lib/pkgconfig/../..", "") for f in map(os.path.normpath, flags)] or any(
        os.path.realpath(f[2:]) == os.path.realpath(include) for f in flags if f.startswith("-I")
    )
    assert any(os.path.realpath(f[2:]) == os.path.realpath(shared.parent) for f in flags if f.startswith("-L"))


def test_the_pip_install_ships_the_same_cmake_package_and_headers():
    """pip users: -DCMAKE_PREFIX_PATH=<site-packages> finds <site-packages>/visionipc/lib/cmake/visionipc."""
    import importlib.metadata

    root = pathlib.Path(importlib.metadata.distribution("visionipc").locate_file("")) / "visionipc"
    assert (root / "lib" / "cmake" / "visionipc" / "visionipc-config.cmake").is_file()
    assert (root / "include" / "visionipc" / "vipc" / "vipc.h").is_file()
    assert (root / "include" / "visionipc" / "msgq" / "ipc.h").is_file()
    assert (root / "lib" / "libvisionipc.so.0.1").is_file()  # test_wheel.py: the only copy, and no libvisionipc.a


@pytest.mark.parametrize("suite", ["test_messaging", "test_poller", "test_visionipc"])
def test_the_reference_test_scenarios_pass_in_cpp(installed, suite):
    out = _run([_find(installed, f"compat_{suite}")], timeout=60)
    assert "test(s) passed" in out


def test_the_native_api_topics_frames_errors_fds_and_leases(installed):
    out = _run([_find(installed, "test_native_api")], timeout=60)
    assert "test(s) passed" in out


def test_the_compat_programs_use_only_the_reference_public_headers(installed):
    """They compile unchanged against commaai/msgq's own headers (syntax only: no library needed)."""
    if not os.path.isfile(os.path.join(REFERENCE, "msgq", "ipc.h")):
        pytest.skip(f"no commaai/msgq checkout at {REFERENCE} (set VIPC_REFERENCE_MSGQ)")
    compat = ROOT / "cpp" / "tests" / "compat"
    procs = [
        subprocess.Popen(
            ["c++", "-std=c++20", "-fsyntax-only", f"-I{REFERENCE}", f"-I{compat}", str(compat / source)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for source in ("test_messaging.cc", "test_poller.cc", "test_visionipc.cc")
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{proc.args[-1]} does not compile against the reference's headers:\n{out}"


def _pattern_ok(data, stride, height, uv_offset, frame_id):
    """examples/cpp/pattern.h: frame id in the first 8 bytes, row r of Y = (id * 7 + r) & 0xff, chroma 128."""
    a = np.frombuffer(data, dtype=np.uint8)
    if int(a[:8].view("<u8")[0]) != frame_id:
        return False
    y = a[: stride * height].reshape(height, stride).copy()
    y[0, :8] = (frame_id * 7) & 0xFF
    want = ((frame_id * 7 + np.arange(height)) & 0xFF).astype(np.uint8)[:, None]
    return bool((y == want).all() and (a[uv_offset:] == 128).all())


def test_cpp_daemon_frames_reach_a_python_client_intact(installed):
    from msgq.testing import unique_name
    from visionipc import VisionIpcClient

    name = unique_name("cam")
    daemon = subprocess.Popen(
        [
            _find(installed, "vipc_camera_daemon"),
            "--name",
            name,
            "--fps",
            "50",
            "--buffers",
            "8",
            "--width",
            "64",
            "--height",
            "48",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client = VisionIpcClient(name, 0, False)
        deadline = time.monotonic() + 30
        while not client.connect(False):
            assert daemon.poll() is None and time.monotonic() < deadline, "the daemon did not come up"
            time.sleep(0.02)
        ids, intact = [], 0
        while len(ids) < 25:
            buf = client.recv(timeout_ms=5000)
            assert buf is not None, "the daemon stopped sending"
            ok = _pattern_ok(buf.data, client.stride, client.height, client.uv_offset, buf.frame_id)
            if buf.valid:  # after reading: an intact frame must match, a recycled one says so
                assert ok, f"frame {buf.frame_id} is intact but not the pattern"
                intact += 1
            ids.append(buf.frame_id)
        assert ids == list(range(ids[0], ids[0] + len(ids))), "frames were lost or reordered"
        assert intact > 0 and (client.width, client.height, client.format) == (64, 48, "nv12")
        client.close()
    finally:
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=10)
    assert daemon.returncode == 0, out


def test_vipc_record_records_the_cpp_daemon_unchanged(installed, tmp_path):
    from msgq.testing import unique_name
    from visionipc.apps.record.reader import iter_frames

    name = unique_name("cam")
    daemon = subprocess.Popen(
        [_find(installed, "vipc_camera_daemon"), "--name", name, "--fps", "50", "--width", "64", "--height", "48"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        recorder = os.path.join(os.path.dirname(sys.executable), "vipc-record")
        out = tmp_path / "rec"
        _run([recorder, "--name", name, "--stream", "0", "--out", out, "--frames", "5", "--lossless", "-q"], timeout=60)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=10)
    frames = list(iter_frames(str(out), "0"))
    assert len(frames) == 5
    ids = [row["frame_id"] for row, _ in frames]
    assert ids == list(range(ids[0], ids[0] + 5))


def test_vipc_view_shows_the_cpp_daemon_unchanged(installed):
    import cv2
    from view_helpers import ViewProcess

    from msgq.testing import unique_name

    name = unique_name("cam")
    daemon = subprocess.Popen(
        [_find(installed, "vipc_camera_daemon"), "--name", name, "--fps", "30", "--width", "64", "--height", "48"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with ViewProcess("--name", name) as view:
            view.wait_for(lambda s: "0" in s["streams"] and s["streams"]["0"]["live"], what="stream 0 live")
            status, headers, body = view.get("/snapshot/0.jpg")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=10)
    assert status == 200 and int(headers["X-Frame-Id"]) >= 1
    img = cv2.imdecode(np.frombuffer(body, np.uint8), cv2.IMREAD_COLOR).astype(int)
    assert img.shape == (48, 64, 3)
    assert np.abs(img[..., 0] - img[..., 2]).mean() < 4, "the pattern's chroma is neutral: a grey image"


def test_a_python_server_frames_reach_the_cpp_consumer_intact(installed):
    from msgq.testing import unique_name
    from visionipc import VisionIpcServer

    name = unique_name("cam")
    server = VisionIpcServer(name)
    server.create_buffers(0, 8, 64, 48)
    server.start_listener()
    consumer = subprocess.Popen(
        [_find(installed, "vipc_consumer"), "--name", name, "--stream", "0", "--frames", "20", "--check"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        frame_id = 0
        while consumer.poll() is None and frame_id < 5000:
            frame_id += 1
            buf = server.get_buffer(0)
            frame = buf.as_array()
            rows = ((frame_id * 7 + np.arange(buf.height)) & 0xFF).astype(np.uint8)
            frame[: buf.stride * buf.height] = np.repeat(rows, buf.stride)
            frame[buf.uv_offset :] = 128
            frame[:8] = np.frombuffer(np.uint64(frame_id).tobytes(), dtype=np.uint8)
            server.send(buf, frame_id=frame_id)
            try:
                consumer.wait(timeout=0.01)
            except subprocess.TimeoutExpired:
                pass
        out, _ = consumer.communicate(timeout=10)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()
        server.close()
    lines = [line.split() for line in out.splitlines() if line.startswith("frame ")]
    assert len(lines) == 20 and all(state in ("ok", "torn") for _, _, state in lines), out
    ids = [int(i) for _, i, _ in lines]
    assert ids == list(range(ids[0], ids[0] + 20)), out
    assert any(state == "ok" for _, _, state in lines), out


def test_the_daemon_refuses_a_missing_v4l2_device_clearly(installed):
    proc = subprocess.run(
        [_find(installed, "vipc_camera_daemon"), "--device", "/dev/video-none-such"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "/dev/video-none-such" in proc.stdout and "No such file" in proc.stdout


@pytest.mark.parametrize("value", ["sometimes", "ALL"])
def test_a_bad_msgq_wake_is_refused_in_the_same_words_by_cpp_and_python(installed, monkeypatch, value):
    import msgq
    from msgq.testing import unique_name, unique_topic

    monkeypatch.setenv("MSGQ_WAKE", value)
    with pytest.raises(msgq.InvalidArgumentError) as python:
        msgq.pub_sock(unique_topic())
    proc = subprocess.run(
        [_find(installed, "vipc_camera_daemon"), "--name", unique_name("cam"), "--frames", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and proc.stdout == f"vipc_camera_daemon: {python.value}\n"


@pytest.mark.parametrize(("env", "flag", "mode"), [(" handoff\t", None, "handoff"), ("handoff", "all", "all")])
def test_the_cpp_daemon_takes_its_wake_mode_from_msgq_wake_or_the_flag(installed, monkeypatch, env, flag, mode):
    """Blanks around MSGQ_WAKE do not count in C++ either; --wake wins over it."""
    from msgq.testing import unique_name

    monkeypatch.setenv("MSGQ_WAKE", env)
    cmd = [_find(installed, "vipc_camera_daemon"), "--name", unique_name("cam"), "--frames", "2", "--fps", "50"]
    out = _run(cmd + (["--wake", flag] if flag else []), timeout=30)
    assert out.startswith("serving ") and out.rstrip().endswith(f"synthetic pattern, wake {mode}"), out


def _docs_cpp_blocks(heading):
    """The ```cpp blocks of docs/cpp.md's section ``heading``, as written there."""
    text = (ROOT / "docs" / "cpp.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [block.split("```", 1)[0] for block in section.split("```cpp\n")[1:]]


def test_the_docs_producer_and_consumer_meet_as_written(installed, tmp_path):
    """Issue 34: docs/cpp.md's producer and consumer, built as the page says (pkg-config and
    an rpath, the standard given by the user: the .pc no longer forces one), run side by
    side: before, the producer was done in 26 ms, before the consumer connected."""
    producer_src, consumer_src = _docs_cpp_blocks("The native API: a producer and a consumer")
    pc = _find(PREFIX, "visionipc.pc")
    env = dict(os.environ, PKG_CONFIG_PATH=str(pc.parent))
    flags = _run(["pkg-config", "--cflags", "--libs", "visionipc"], env=env).split()
    assert not any(f.startswith("-std=") for f in flags), flags
    libdir = _run(["pkg-config", "--variable=libdir", "visionipc"], env=env).strip()
    programs = {}
    for name, src in (("producer", producer_src), ("consumer", consumer_src)):
        (tmp_path / f"{name}.cc").write_text(src)
        programs[name] = tmp_path / name
        source = tmp_path / f"{name}.cc"
        _run(["c++", "-std=c++20", "-O1", source, *flags, f"-Wl,-rpath,{libdir}", "-o", programs[name]])
    consumer = subprocess.Popen([programs["consumer"]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    producer = subprocess.Popen([programs["producer"]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = consumer.communicate(timeout=60)
        assert producer.wait(timeout=30) == 0, producer.stdout.read()
    finally:
        for proc in (consumer, producer):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert consumer.returncode == 0, out
    lines = out.splitlines()
    frames = [line for line in lines if line.startswith("frame ")]
    assert lines[-1] == f"{len(frames)} frames, then done", out
    # at 30 fps nothing need be lost, but a loaded machine may recycle some before they are read
    ids = [int(line.split()[1]) for line in frames]  # "frame ID starts with BYTE"
    assert ids and ids == sorted(set(ids)) and set(ids) <= set(range(1, 101)), out
    for line in frames:
        _, fid, _, _, first = line.split()
        assert int(first) == int(fid) % 256, line


def test_the_cpp_consumer_refuses_a_stream_whose_frames_are_in_device_memory(installed):
    """A pool in device memory (create_buffers(memory="cuda")) carries a CUDA IPC descriptor,
    not pixels: the C++ API, which reads host frames, refuses it in one line."""
    from msgq.testing import unique_name
    from visionipc import VisionIpcServer, _visionipc

    name = unique_name("cam")
    server = VisionIpcServer(name)
    server._server().create_buffers("0", 2, 64, 48, "nv12", pool_flags=_visionipc.POOL_IN_DEVICE_MEMORY)
    server.start_listener()
    try:
        proc = subprocess.run(
            [_find(installed, "vipc_consumer"), "--name", name, "--stream", "0", "--frames", "1", "--check"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        server.close()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    message = (proc.stdout + proc.stderr).strip()
    assert "keeps its frames in GPU memory" in message and len(message.splitlines()) == 1, message
