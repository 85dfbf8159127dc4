// The reference's VisionIPC wire types (commaai/msgq msgq/visionipc/visionipc.h),
// source-compatible. Our wire protocol is our own (docs/cpp.md): only the
// public types are kept, not the reference's ipc_connect/ipc_bind helpers.
#pragma once

#include <cstddef>
#include <cstdint>

constexpr int VISIONIPC_MAX_FDS = 128;

struct VisionIpcBufExtra {
  uint32_t frame_id;
  uint64_t timestamp_sof;
  uint64_t timestamp_eof;
  bool valid;  // receive side: the buffer still held this frame when recv() returned
};

struct VisionIpcPacket {
  uint64_t server_id;
  size_t idx;
  struct VisionIpcBufExtra extra;
};
