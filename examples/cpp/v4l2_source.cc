#include "v4l2_source.h"

#include <fcntl.h>
#include <linux/videodev2.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace {

int xioctl(int fd, unsigned long request, void* arg) {
  int r;
  do r = ioctl(fd, request, arg);
  while (r == -1 && errno == EINTR);
  return r;
}

}  // namespace

V4l2Source::V4l2Source(const std::string& device, uint32_t width, uint32_t height) : device_(device) {
  auto fail = [&](const std::string& what) {
    throw std::runtime_error(device_ + ": " + what + ": " + std::strerror(errno));
  };
  fd_ = open(device.c_str(), O_RDWR | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open the capture device");
  v4l2_capability cap{};
  if (xioctl(fd_, VIDIOC_QUERYCAP, &cap) != 0) fail("not a V4L2 device");
  if (!(cap.capabilities & V4L2_CAP_VIDEO_CAPTURE) || !(cap.capabilities & V4L2_CAP_STREAMING)) {
    errno = ENODEV;
    fail("no video capture with streaming I/O");
  }
  v4l2_format fmt{};
  fmt.type = V4L2_BUF_TYPE_VIDEO_CAPTURE;
  fmt.fmt.pix.width = width;
  fmt.fmt.pix.height = height;
  fmt.fmt.pix.pixelformat = V4L2_PIX_FMT_YUYV;
  fmt.fmt.pix.field = V4L2_FIELD_NONE;
  if (xioctl(fd_, VIDIOC_S_FMT, &fmt) != 0) fail("VIDIOC_S_FMT (YUYV)");
  if (fmt.fmt.pix.pixelformat != V4L2_PIX_FMT_YUYV) {
    errno = EINVAL;
    fail("the device offers no YUYV capture");
  }
  width_ = fmt.fmt.pix.width & ~1u;
  height_ = fmt.fmt.pix.height & ~1u;
  bytes_per_line_ = fmt.fmt.pix.bytesperline;
  v4l2_requestbuffers req{};
  req.count = 4;
  req.type = V4L2_BUF_TYPE_VIDEO_CAPTURE;
  req.memory = V4L2_MEMORY_MMAP;
  if (xioctl(fd_, VIDIOC_REQBUFS, &req) != 0 || req.count == 0) fail("VIDIOC_REQBUFS");
  for (uint32_t i = 0; i < req.count; i++) {
    v4l2_buffer b{};
    b.type = V4L2_BUF_TYPE_VIDEO_CAPTURE;
    b.memory = V4L2_MEMORY_MMAP;
    b.index = i;
    if (xioctl(fd_, VIDIOC_QUERYBUF, &b) != 0) fail("VIDIOC_QUERYBUF");
    void* p = mmap(nullptr, b.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, b.m.offset);
    if (p == MAP_FAILED) fail("mmap");
    buffers_.emplace_back(static_cast<uint8_t*>(p), b.length);
    if (xioctl(fd_, VIDIOC_QBUF, &b) != 0) fail("VIDIOC_QBUF");
  }
  v4l2_buf_type type = V4L2_BUF_TYPE_VIDEO_CAPTURE;
  if (xioctl(fd_, VIDIOC_STREAMON, &type) != 0) fail("VIDIOC_STREAMON");
}

V4l2Source::~V4l2Source() {
  if (fd_ < 0) return;
  v4l2_buf_type type = V4L2_BUF_TYPE_VIDEO_CAPTURE;
  xioctl(fd_, VIDIOC_STREAMOFF, &type);
  for (auto& b : buffers_) munmap(b.data(), b.size());
  close(fd_);
}

void V4l2Source::capture(std::span<std::byte> out, const vipc::Geometry& g) {
  v4l2_buffer b{};
  b.type = V4L2_BUF_TYPE_VIDEO_CAPTURE;
  b.memory = V4L2_MEMORY_MMAP;
  if (xioctl(fd_, VIDIOC_DQBUF, &b) != 0) throw std::runtime_error(device_ + ": VIDIOC_DQBUF: " + std::strerror(errno));
  const uint8_t* src = buffers_[b.index].data();
  auto* dst = reinterpret_cast<uint8_t*>(out.data());
  // YUYV -> NV12: Y as is; U and V from every other row.
  for (uint32_t r = 0; r < height_; r++) {
    const uint8_t* row = src + uint64_t{r} * bytes_per_line_;
    uint8_t* y = dst + uint64_t{r} * g.stride;
    uint8_t* uv = dst + g.uv_offset + uint64_t{r / 2} * g.stride;
    for (uint32_t c = 0; c < width_; c += 2) {
      y[c] = row[2 * c];
      y[c + 1] = row[2 * c + 2];
      if (r % 2 == 0) {
        uv[c] = row[2 * c + 1];
        uv[c + 1] = row[2 * c + 3];
      }
    }
  }
  if (xioctl(fd_, VIDIOC_QBUF, &b) != 0) throw std::runtime_error(device_ + ": VIDIOC_QBUF: " + std::strerror(errno));
}
