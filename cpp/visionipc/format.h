// Pixel formats and the byte layout of one frame buffer.
//
// Every row starts on a 64-byte boundary (kStrideAlign: one cache line, and
// what SIMD loads and most DMA engines want), so stride = align64(bytes per
// row). Plane offsets are multiples of the stride, so every plane starts
// aligned too. Buffers inside a pool start on 4096-byte boundaries
// (kBufferAlign, one page), see pool.h.
//
//   format  planes (offset: rows x bytes)                            size
//   NV12    Y 0: h x stride; UV uv_offset = stride*h: h/2 x stride    stride*h*3/2
//   I420    Y 0: h x stride; U stride*h: h/2 x stride/2;
//           V stride*h + stride*h/4: h/2 x stride/2                   stride*h*3/2
//   GRAY8   0: h x stride                                             stride*h
//   RGB8    0: h x stride, 3 bytes a pixel (BGR8 likewise)            stride*h
//   RAW16   0: h x stride, 2 bytes a pixel (little-endian 16-bit raw/Bayer)
//
// NV12 and I420 need an even width and height (chroma is subsampled 2x2).
// kCustom is the reference's create_buffers_with_sizes(): NV12-shaped, with
// the caller's size, stride and uv_offset taken as given (within bounds).
#pragma once

#include <cstdint>
#include <string>

namespace vipc::visionipc {

enum class Format : uint32_t { kNV12 = 0, kI420 = 1, kGray8 = 2, kRGB8 = 3, kBGR8 = 4, kRaw16 = 5, kCustom = 6 };

inline constexpr uint32_t kStrideAlign = 64;
inline constexpr uint64_t kBufferAlign = 4096;
inline constexpr uint32_t kMaxDimension = 1 << 15;      // 32768 pixels a side
inline constexpr uint64_t kMaxBufferSize = 1ull << 30;  // 1 GiB a frame

// The format table: one row per Format, in enum order (kCustom last). Everything
// the Python package knows about a format (names, plane shapes, sample sizes)
// comes from here through the binding.
//
// The last three columns name, for the Python side, the frame's *compact image* (its
// planes without row padding, one after the other: visionipc.pixels) in the vocabulary of
// the libraries that convert it: OpenCV's cv::COLOR_<code> to and from a BGR image ("" when
// it is one already; a 16-bit sample converts through its high byte), and FFmpeg's
// pixel format of the same bytes.
struct FormatInfo {
  Format format;
  const char* name;
  const char* aliases;       // other names the Python API accepts, space-separated
  uint32_t bytes_per_pixel;  // in the first (Y or only) plane
  uint32_t channels;         // samples a pixel in that plane; a sample is bytes_per_pixel / channels
  bool yuv420;               // a Y plane followed by 2x2-subsampled chroma (uv_offset)
  uint32_t planes;           // 1; yuv420: 2 (Y, interleaved UV) or 3 (Y, U, V)
  const char* cv_to_bgr;     // OpenCV conversion code of the compact image to BGR
  const char* cv_from_bgr;   // and from BGR (YUV: to I420 planes, interleaved for 2 planes)
  const char* av_format;     // FFmpeg's pixel format of the compact image
};

inline constexpr FormatInfo kFormats[] = {
    {Format::kNV12, "nv12", "", 1, 1, true, 2, "YUV2BGR_NV12", "BGR2YUV_I420", "nv12"},
    {Format::kI420, "i420", "", 1, 1, true, 3, "YUV2BGR_I420", "BGR2YUV_I420", "yuv420p"},
    {Format::kGray8, "gray8", "gray grey", 1, 1, false, 1, "GRAY2BGR", "BGR2GRAY", "gray"},
    {Format::kRGB8, "rgb8", "rgb", 3, 3, false, 1, "RGB2BGR", "BGR2RGB", "rgb24"},
    {Format::kBGR8, "bgr8", "bgr", 3, 3, false, 1, "", "", "bgr24"},
    {Format::kRaw16, "raw16", "raw bayer16", 2, 1, false, 1, "GRAY2BGR", "BGR2GRAY", "gray16le"},
    {Format::kCustom, "custom", "", 1, 1, true, 2, "YUV2BGR_NV12", "BGR2YUV_I420", "nv12"},
};

constexpr bool format_table_in_enum_order() {
  if (sizeof(kFormats) / sizeof(kFormats[0]) != static_cast<uint32_t>(Format::kCustom) + 1) return false;
  for (uint32_t i = 0; i < sizeof(kFormats) / sizeof(kFormats[0]); i++) {
    if (static_cast<uint32_t>(kFormats[i].format) != i) return false;
  }
  return true;
}
static_assert(format_table_in_enum_order(), "kFormats is indexed by Format");

struct Geometry {
  Format format = Format::kNV12;
  uint32_t width = 0;
  uint32_t height = 0;
  uint32_t stride = 0;     // bytes from one row to the next (Y plane for NV12/I420)
  uint32_t uv_offset = 0;  // start of the chroma plane(s); 0 for single-plane formats
  uint64_t size = 0;       // bytes of one frame
};

constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Throws common::Error(kInvalidArgument) for zero or oversized dimensions, odd
// NV12/I420 dimensions, or an unknown format.
Geometry make_geometry(Format format, uint32_t width, uint32_t height);
Geometry custom_geometry(uint32_t width, uint32_t height, uint64_t size, uint32_t stride, uint32_t uv_offset);

// Empty if the geometry is internally consistent (every plane inside `size`),
// else why not. Clients run it on what a server sent before trusting it.
std::string geometry_problem(const Geometry& g);

const char* format_name(Format f);
bool parse_format(const std::string& name, Format& out);

}  // namespace vipc::visionipc
