// The reference's VisionIpcClient (commaai/msgq), source-compatible, on
// vipc::FrameClient: buffers[] point into the stream's shared pool (zero copy).
#pragma once

#include <memory>
#include <set>
#include <string>

#include "msgq/ipc.h"
#include "msgq/visionipc/visionbuf.h"

class VIPC_API VisionIpcClient {
 private:
  struct Impl;
  std::unique_ptr<Impl> impl;
  void describe_buffers();  // buffers[] and num_buffers from the current mapping

 public:
  bool connected = false;
  VisionStreamType type;
  int num_buffers = 0;
  VisionBuf buffers[VISIONIPC_MAX_FDS];
  VisionIpcClient(std::string name, VisionStreamType type, bool conflate);
  ~VisionIpcClient();
  // The next frame's buffer, or nullptr after timeout_ms (-1: no limit). extra
  // (when given) gets its frame id, timestamps and validity.
  VisionBuf* recv(VisionIpcBufExtra* extra = nullptr, const int timeout_ms = 100);
  // blocking: retry every 100 ms until the server offers the stream.
  bool connect(bool blocking = true);
  bool is_connected() { return connected; }
  static std::set<VisionStreamType> getAvailableStreams(const std::string& name, bool blocking = true);
};
