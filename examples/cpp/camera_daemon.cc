// A camera daemon on the native C++ API: publishes NV12 frames on a VisionIPC
// stream that Python (VisionIpcClient, vipc-view, vipc-record) and C++ clients
// consume. The synthetic pattern (pattern.h) by default; a V4L2 camera with
// --device /dev/videoN.
//
//   vipc_camera_daemon [--name camerad] [--stream 0] [--width 320] [--height 240]
//                      [--fps 20] [--frames N (0: until killed)] [--buffers 4]
//                      [--device /dev/videoN] [--wake all|handoff (default: MSGQ_WAKE, else all)]
// Exit status: 0 done, 1 runtime error, 2 bad arguments or no such device.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <vipc/vipc.h>

#include "pattern.h"
#include "v4l2_source.h"

namespace {

volatile std::sig_atomic_t stop = 0;

struct Args {
  std::string name = "camerad", stream = "0", device, wake;
  uint32_t width = 320, height = 240, buffers = 4;
  double fps = 20;
  uint64_t frames = 0;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "vipc_camera_daemon: %s\n", why.c_str());
  std::exit(2);
}

uint64_t number(const char* flag, const char* text) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (*text == '\0' || *end != '\0' || *text == '-')
    usage(std::string(flag) + " needs a non-negative integer, not '" + text + "'");
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i++) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage("missing value after " + flag);
    const char* v = argv[++i];
    if (flag == "--name")
      a.name = v;
    else if (flag == "--stream")
      a.stream = v;
    else if (flag == "--device")
      a.device = v;
    else if (flag == "--wake")
      a.wake = v;
    else if (flag == "--width")
      a.width = static_cast<uint32_t>(number("--width", v));
    else if (flag == "--height")
      a.height = static_cast<uint32_t>(number("--height", v));
    else if (flag == "--buffers")
      a.buffers = static_cast<uint32_t>(number("--buffers", v));
    else if (flag == "--frames")
      a.frames = number("--frames", v);
    else if (flag == "--fps")
      a.fps = static_cast<double>(number("--fps", v));
    else
      usage("unknown option " + flag);
  }
  if (a.fps <= 0) usage("--fps must be at least 1");
  if (!a.wake.empty() && a.wake != "all" && a.wake != "handoff")
    usage("--wake must be 'all' or 'handoff', not '" + a.wake + "'");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  std::signal(SIGINT, [](int) { stop = 1; });
  std::signal(SIGTERM, [](int) { stop = 1; });
  std::unique_ptr<V4l2Source> camera;
  uint32_t width = args.width, height = args.height;
  if (!args.device.empty()) {
    try {
      camera = std::make_unique<V4l2Source>(args.device, width, height);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "vipc_camera_daemon: %s\n", e.what());
      return 2;
    }
    width = camera->width();
    height = camera->height();
  }
  try {
    const vipc::Wake wake = args.wake.empty()        ? vipc::RunOptions::wake_from_environment()
                            : args.wake == "handoff" ? vipc::Wake::handoff
                                                     : vipc::Wake::all;
    vipc::FrameServer server(args.name, {.run = vipc::RunOptions::from_environment(), .wake = wake});
    server.create_buffers(args.stream, args.buffers, width, height, vipc::PixelFormat::nv12);
    server.start_listener();
    const vipc::Geometry g = server.geometry(args.stream);
    std::printf("serving %s/%s: %ux%u nv12, %u buffers, %s, wake %s\n", args.name.c_str(), args.stream.c_str(), g.width,
                g.height, args.buffers, camera ? args.device.c_str() : "synthetic pattern",
                server.wake() == vipc::Wake::handoff ? "handoff" : "all");
    std::fflush(stdout);
    const auto period = std::chrono::duration<double>(1.0 / args.fps);
    auto next = std::chrono::steady_clock::now();
    for (uint64_t id = 1; !stop && (args.frames == 0 || id <= args.frames); id++) {
      vipc::WriteBuffer buf = server.get_buffer(args.stream);
      const uint64_t sof = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
      if (camera)
        camera->capture(buf.data(), g);
      else
        pattern::fill(buf.data(), g, id);
      const uint64_t eof = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
      server.send(std::move(buf), {id, sof, eof});
      next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
      std::this_thread::sleep_until(next);
    }
  } catch (const vipc::Error& e) {
    std::fprintf(stderr, "vipc_camera_daemon: %s\n", e.what());
    return e.kind() == vipc::ErrorKind::invalid_argument ? 2 : 1;
  }
  return 0;
}
