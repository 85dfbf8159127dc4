"""vipc-view against real producers (VisionIpcServer in this process), as a real
child process, seen through HTTP and through headless Chromium (Selenium with the
system chromedriver; tools/setup.sh installs both)."""

import shutil
import signal
import time

import cv2
import numpy as np
import pytest
from view_helpers import MjpegReader, Producer, ViewProcess, assert_shows_pattern, pattern

from msgq.testing import unique_name
from visionipc.apps.view import main

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def decode(jpeg):
    img = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert img is not None, "not a JPEG"
    return img


def live(stream):
    return lambda s: stream in s["streams"] and s["streams"][stream]["live"]


@pytest.fixture
def name():
    return unique_name("cam")


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(path), f"{path} is missing: run bash tools/setup.sh (apt: chromium chromium-driver)"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,900",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    # a profile of our own, removed with tmp_path (by default Chromium leaves a
    # /tmp/org.chromium.Chromium.* folder behind per run)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def test_the_page_in_headless_chromium_shows_the_live_test_pattern(name, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with Producer(name, ["road"], 320, 240, fps=30), ViewProcess("--name", name) as view:
        browser.get(view.page_url)  # the printed URL, with the token; the page's own requests use the cookie
        wait = WebDriverWait(browser, 20)
        card = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, '.card[data-stream="road"]'))
        img = card.find_element(By.TAG_NAME, "img")
        wait.until(lambda d: img.get_property("naturalWidth") == 320)
        frame_id = card.find_element(By.CSS_SELECTOR, "dd.frame-id")
        wait.until(lambda d: frame_id.text.isdigit())
        first_id = int(frame_id.text)
        wait.until(lambda d: frame_id.text.isdigit() and int(frame_id.text) > first_id)

        shot = decode(img.screenshot_as_png)
        assert shot.shape[:2] == (240, 320)
        assert_shows_pattern(shot)
        deadline = time.monotonic() + 10
        while np.array_equal(decode(img.screenshot_as_png), shot):  # the moving bar moves
            assert time.monotonic() < deadline, "the picture in the page never changed"
            time.sleep(0.1)
        fps = card.find_element(By.CSS_SELECTOR, "dd.fps").text
        assert float(fps) > 0
        assert view.stats()["streams"]["road"]["viewers"] >= 1


def test_snapshot_is_a_jpeg_of_the_newest_frame(name):
    with Producer(name, ["road"], 320, 240, fps=30) as producer, ViewProcess("--name", name) as view:
        view.wait_for(live("road"), what="road live")
        status, headers, body = view.get("/snapshot/road.jpg")
        assert status == 200 and headers["Content-Type"] == "image/jpeg"
        img = decode(body)
        assert img.shape == (240, 320, 3)
        assert_shows_pattern(img)
        frame_id = int(headers["X-Frame-Id"])
        assert 1 <= frame_id <= producer.sent + 1  # +1: the frame whose send() has not returned yet
        # the bar of that very frame is where the pattern put it
        bar = pattern(320, 240, frame_id)[200:, :, 0] == 255
        assert img[200:, :, 0][bar].mean() > 200 and img[200:, :, 0][~bar].mean() < 180


def test_stats_reports_every_stream_with_rates_latency_and_drops(name):
    with Producer(name, ["road", "wide"], 160, 120, fps=30), ViewProcess("--name", name) as view:
        stats = view.wait_for(lambda s: live("road")(s) and live("wide")(s), what="both streams live")
        assert stats["server"] == name
        assert sorted(stats["streams"]) == ["road", "wide"]
        time.sleep(1.2)  # a full rate window
        later = view.stats()
        for stream in ("road", "wide"):
            s, t = stats["streams"][stream], later["streams"][stream]
            assert t["frame_id"] > s["frame_id"]
            assert 0 < t["fps"] <= 100 and 0 < t["source_fps"] <= 100
            assert (t["width"], t["height"], t["format"]) == (160, 120, "nv12")
            assert t["latency_ms"] >= 0 and t["handoff_ms"] >= 0  # the producer stamps eof with the monotonic clock
            assert t["drops"] >= 0 and t["viewers"] == 0
            assert t["frames_encoded"] == 0  # nobody watched: nothing encoded
            assert t["frames_received"] > s["frames_received"]


def test_unknown_stream_is_a_404_that_names_the_known_ones(name):
    with Producer(name, ["road"], 160, 120), ViewProcess("--name", name, "--stream", "road") as view:
        for path in ("/snapshot/nope.jpg", "/stream/nope.mjpg"):
            status, _, body = view.get(path)
            assert status == 404
            assert "unknown stream 'nope'" in body.decode() and "road" in body.decode()


def test_a_slow_viewer_skips_frames_and_frames_are_encoded_once_not_per_viewer(name):
    with Producer(name, ["road"], 640, 480, fps=30, texture=True) as producer, ViewProcess("--name", name) as view:
        view.wait_for(live("road"), what="road live")
        fast = [MjpegReader(view.url, "road", token=view.token) for _ in range(2)]
        slow = MjpegReader(view.url, "road", delay=0.5, token=view.token)
        assert fast[0].status == 200 and fast[0].content_type.startswith("multipart/x-mixed-replace")
        sent_before = producer.sent
        before = view.stats()["streams"]["road"]
        time.sleep(3)
        after = view.wait_for(lambda s: s["streams"]["road"]["viewers"] == 3, what="3 viewers")["streams"]["road"]
        sent = producer.sent - sent_before
        for reader in (*fast, slow):
            reader.close()
            assert reader.error is None, reader.error
        received = after["frames_received"] - before["frames_received"]
        encoded = after["frames_encoded"] - before["frames_encoded"]
        assert sent > 0  # sanity: the producer kept going (about 90 at 30 fps; fewer on a loaded machine)
        # Each received frame has its own, newer frame id; each is encoded at most once
        # whatever the viewer count (+1: a snapshot of the counters may fall between
        # receiving a frame and encoding it).
        assert 0 < encoded <= received + 1 and received <= after["frame_id"] - before["frame_id"]
        # nothing the producer has not sent (+1: it counts a frame once send() returned, and
        # the viewer may hold that frame a moment before: seen once beside stress-ng, 169 > 168)
        assert after["frame_id"] <= sent_before + sent + 1
        for reader in fast:
            assert len(reader.frame_ids) >= encoded // 3, (len(reader.frame_ids), encoded)
            assert reader.frame_ids == sorted(set(reader.frame_ids))
            assert_shows_pattern(decode(reader.last_jpeg))
        assert 1 <= len(slow.frame_ids) <= 8  # one part per 0.5 s, whatever the frame rate
        assert slow.frame_ids == sorted(set(slow.frame_ids))
        assert after["frames_skipped"] > 0, after  # the slow one got the newest frame, not a backlog
        assert after["frames_sent"] <= 3 * after["frames_encoded"]


def test_streams_that_appear_late_and_a_restarted_server_are_picked_up(name):
    with ViewProcess("--name", name) as view:  # no server yet
        assert view.stats()["streams"] == {}
        status, _, body = view.get("/snapshot/road.jpg")
        assert status == 404
        with Producer(name, ["road"], 320, 240):
            first = view.wait_for(live("road"), what="road live")["streams"]["road"]
            assert first["width"] == 320
        # the server restarts: another size and one more stream; frame ids start again
        with Producer(name, ["road", "late"], 160, 120):
            stats = view.wait_for(
                lambda s: live("late")(s) and s["streams"]["road"]["width"] == 160,
                what="the restarted server's streams",
            )
            assert stats["streams"]["road"]["restarts"] >= 1
            status, _, body = view.get("/snapshot/late.jpg")
            assert status == 200 and decode(body).shape == (120, 160, 3)
        assert view.stop(signal.SIGTERM) == 0
        assert "vipc-view: stopped" in view.out.text()


def test_sigint_stops_it_cleanly_while_viewers_are_connected(name):
    with Producer(name, ["road"], 160, 120):
        view = ViewProcess("--name", name, "--stream", "road")
        view.wait_for(live("road"), what="road live")
        reader = MjpegReader(view.url, "road", token=view.token)
        deadline = time.monotonic() + 10
        while not reader.frame_ids and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reader.frame_ids
        assert view.stop(signal.SIGINT) == 0
        reader.close()


def test_window_without_a_display_is_a_clear_error(name, monkeypatch, capsys):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert main(["--name", name, "--window"]) == 2
    assert "--window needs a display" in capsys.readouterr().err
    if "GUI:                           NONE" in cv2.getBuildInformation():  # opencv-python-headless
        monkeypatch.setenv("DISPLAY", ":0")
        assert main(["--name", name, "--window"]) == 2
        assert "no GUI" in capsys.readouterr().err.replace("has none", "no GUI")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--http", "127.0.0.1:http"], "HOST:PORT"),
        (["--http", "99999"], "0..65535"),
        (["--stream", "a/b"], "stream name"),
        (["--quality", "0"], "--quality"),
    ],
)
def test_bad_arguments_are_clear_errors(name, args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--name", name, *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_port_in_use_is_a_clear_error(name):
    with ViewProcess("--name", name) as first:
        port = first.url.rsplit(":", 1)[1]
        import subprocess

        from view_helpers import VIEW

        done = subprocess.run(
            [VIEW, "--name", name, "--http", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 1
        assert f"cannot serve on 127.0.0.1:{port}" in done.stderr
