// A V4L2 capture device as a frame source: YUYV (4:2:2) frames, converted to
// NV12 into the daemon's buffers. Linux only; throws std::runtime_error with
// the device path and errno text when the device is missing or unusable.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <vipc/frames.h>

class V4l2Source {
 public:
  V4l2Source(const std::string& device, uint32_t width, uint32_t height);
  ~V4l2Source();
  V4l2Source(const V4l2Source&) = delete;
  V4l2Source& operator=(const V4l2Source&) = delete;
  uint32_t width() const { return width_; }  // what the driver agreed to
  uint32_t height() const { return height_; }
  // Waits for the next captured frame and writes it, as NV12, into `out`.
  void capture(std::span<std::byte> out, const vipc::Geometry& g);

 private:
  std::string device_;
  int fd_ = -1;
  uint32_t width_ = 0, height_ = 0, bytes_per_line_ = 0;
  std::vector<std::span<uint8_t>> buffers_;
};
