// The reference's VisionIpcServer (commaai/msgq), source-compatible, on
// vipc::FrameServer. Errors (bad sizes, a stream created twice, a name in
// use) throw vipc::Error where the reference asserted.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "msgq/ipc.h"
#include "msgq/visionipc/visionbuf.h"

// The msgq topic a stream's frames are announced on.
VIPC_API std::string get_endpoint_name(std::string name, VisionStreamType type);
// Our servers listen on an abstract socket, so this is its name ("@..."), not a file.
VIPC_API std::string get_ipc_path(const std::string& name);

class VIPC_API VisionIpcServer {
 private:
  struct Impl;
  std::unique_ptr<Impl> impl;

 public:
  VisionIpcServer(std::string name);
  ~VisionIpcServer();

  // The next buffer to fill (idx < 0), or buffer idx of the stream.
  VisionBuf* get_buffer(VisionStreamType type, int idx = -1);

  void create_buffers(VisionStreamType type, size_t num_buffers, size_t width, size_t height);
  void create_buffers_with_sizes(VisionStreamType type, size_t num_buffers, size_t width, size_t height, size_t size,
                                 size_t stride, size_t uv_offset);
  // Publishes buf with extra's frame id and timestamps (sync is accepted and ignored).
  void send(VisionBuf* buf, VisionIpcBufExtra* extra, bool sync = true);
  void start_listener();
};
