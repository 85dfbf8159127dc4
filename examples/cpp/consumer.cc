// A frame consumer on the native C++ API: receives frames of a VisionIPC
// stream (from the C++ daemon, or a Python VisionIpcServer) and checks each
// against the example pattern (pattern.h) with --check.
//
//   vipc_consumer [--name camerad] [--stream 0] [--frames 10] [--timeout-ms 5000] [--check]
// Prints one line per frame ("frame ID ok|bad|torn"), then a summary.
// Exit status: 0 every frame arrived (and checked), 1 otherwise, 2 bad arguments.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <vipc/vipc.h>

#include "pattern.h"

int main(int argc, char** argv) {
  std::string name = "camerad", stream = "0";
  long frames = 10, timeout_ms = 5000;
  bool check = false;
  for (int i = 1; i < argc; i++) {
    const std::string flag = argv[i];
    if (flag == "--check") {
      check = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "vipc_consumer: missing value after %s\n", flag.c_str());
      return 2;
    }
    const char* v = argv[++i];
    if (flag == "--name")
      name = v;
    else if (flag == "--stream")
      stream = v;
    else if (flag == "--frames")
      frames = std::strtol(v, nullptr, 10);
    else if (flag == "--timeout-ms")
      timeout_ms = std::strtol(v, nullptr, 10);
    else {
      std::fprintf(stderr, "vipc_consumer: unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    vipc::FrameClient client(name, stream, {.run = vipc::RunOptions::from_environment()});
    if (!client.connect(vipc::Timeout(timeout_ms))) {
      std::fprintf(stderr, "vipc_consumer: no server '%s' with stream '%s' within %ld ms\n", name.c_str(),
                   stream.c_str(), timeout_ms);
      return 1;
    }
    const vipc::Geometry g = client.geometry();
    long good = 0;
    for (long n = 0; n < frames; n++) {
      std::optional<vipc::Frame> f = client.recv(vipc::Timeout(timeout_ms));
      if (!f) {
        std::fprintf(stderr, "vipc_consumer: no frame within %ld ms after %ld\n", timeout_ms, n);
        break;
      }
      const bool ok = !check || pattern::check(f->data(), g, f->info().frame_id);
      const bool intact = f->valid();  // after reading: the server did not recycle it meanwhile
      std::printf("frame %llu %s\n", static_cast<unsigned long long>(f->info().frame_id),
                  !intact ? "torn"
                  : ok    ? "ok"
                          : "bad");
      good += ok && intact;
    }
    std::printf("received %ld/%ld frames intact%s\n", good, frames, check ? " and matching the pattern" : "");
    return good == frames ? 0 : 1;
  } catch (const vipc::Error& e) {
    std::fprintf(stderr, "vipc_consumer: %s\n", e.what());
    return 1;
  }
}
