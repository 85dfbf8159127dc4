// The reference's VisionBuf (commaai/msgq), source-compatible: one frame
// buffer, its address, size and YUV plane pointers. Buffers of a server or a
// client point into their stream's shared pool; allocate() makes a standalone
// buffer (a memfd) as in the reference.
#pragma once

#include <cstddef>
#include <cstdint>

#include "msgq/visionipc/visionipc.h"
#include "vipc/export.h"

#define VISIONBUF_SYNC_FROM_DEVICE 0
#define VISIONBUF_SYNC_TO_DEVICE 1

// Stream ids are opaque numbers; VISION_STREAM_LIST is reserved.
typedef uint32_t VisionStreamType;
constexpr VisionStreamType VISION_STREAM_LIST = 0xffffffff;
constexpr size_t VISIONIPC_MAX_STREAMS = 64;

class VIPC_API VisionBuf {
 public:
  size_t len = 0;
  size_t mmap_len = 0;
  void* addr = nullptr;
  uint64_t* frame_id = nullptr;  // the frame id of the last frame sent / received in this buffer
  int fd = 0;                    // -1 for pool buffers (the pool's memfd is not handed out)

  size_t width = 0;
  size_t height = 0;
  size_t stride = 0;
  size_t uv_offset = 0;

  // YUV
  uint8_t* y = nullptr;
  uint8_t* uv = nullptr;

  // Visionipc
  uint64_t server_id = 0;
  size_t idx = 0;
  VisionStreamType type = 0;

  // ion (unused: always 0)
  int handle = 0;

  void allocate(size_t len);  // a standalone buffer of len bytes (a memfd); throws vipc::Error on failure
  void import();              // maps fd (mmap_len bytes) as allocate() laid it out
  void init_yuv(size_t width, size_t height, size_t stride, size_t uv_offset);
  int sync(int dir);  // shared memory is coherent: a no-op returning 0
  int free();         // unmaps a standalone buffer; 0 on success

  void set_frame_id(uint64_t id);
  uint64_t get_frame_id();

 private:
  uint64_t frame_id_storage_ = 0;  // where frame_id points for pool buffers
  bool standalone_ = false;
  friend class VisionIpcServer;
  friend class VisionIpcClient;
};
