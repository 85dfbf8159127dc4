// The synthetic test pattern of the example daemon, checkable by any consumer:
// the first 8 bytes of a frame are its frame id (little-endian), every other
// byte of Y-plane row r is (frame_id * 7 + r) & 0xff, and the chroma bytes are 128.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include <vipc/frames.h>

namespace pattern {

inline uint8_t row_value(uint64_t frame_id, uint32_t row) { return static_cast<uint8_t>(frame_id * 7 + row); }

inline void fill(std::span<std::byte> frame, const vipc::Geometry& g, uint64_t frame_id) {
  auto* p = reinterpret_cast<uint8_t*>(frame.data());
  for (uint32_t r = 0; r < g.height; r++) std::memset(p + uint64_t{r} * g.stride, row_value(frame_id, r), g.stride);
  std::memset(p + g.uv_offset, 128, g.size - g.uv_offset);
  std::memcpy(p, &frame_id, sizeof(frame_id));
}

// True when the bytes are frame_id's pattern.
inline bool check(std::span<const std::byte> frame, const vipc::Geometry& g, uint64_t frame_id) {
  const auto* p = reinterpret_cast<const uint8_t*>(frame.data());
  uint64_t head = 0;
  std::memcpy(&head, p, sizeof(head));
  if (head != frame_id) return false;
  for (uint32_t r = 0; r < g.height; r++) {
    const uint8_t want = row_value(frame_id, r);
    for (uint32_t c = r == 0 ? sizeof(head) : 0; c < g.stride; c++) {
      if (p[uint64_t{r} * g.stride + c] != want) return false;
    }
  }
  for (uint64_t i = g.uv_offset; i < g.size; i++) {
    if (p[i] != 128) return false;
  }
  return true;
}

}  // namespace pattern
