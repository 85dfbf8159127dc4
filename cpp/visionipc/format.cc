#include "visionipc/format.h"

#include "common/errors.h"

namespace vipc::visionipc {

namespace {

[[noreturn]] void invalid(const std::string& what) { common::fail(common::ErrorKind::kInvalidArgument, what); }

void check_dimensions(uint32_t width, uint32_t height) {
  if (width == 0 || height == 0 || width > kMaxDimension || height > kMaxDimension) {
    invalid("frame size " + std::to_string(width) + "x" + std::to_string(height) + " must be 1.." +
            std::to_string(kMaxDimension) + " on each side");
  }
}

uint32_t bytes_per_pixel(Format f) { return kFormats[static_cast<uint32_t>(f)].bytes_per_pixel; }

}  // namespace

Geometry make_geometry(Format format, uint32_t width, uint32_t height) {
  check_dimensions(width, height);
  Geometry g;
  g.format = format;
  g.width = width;
  g.height = height;
  switch (format) {
    case Format::kNV12:
    case Format::kI420:
      if (width % 2 || height % 2) invalid(std::string(format_name(format)) + " needs an even width and height");
      g.stride = static_cast<uint32_t>(align_up(width, kStrideAlign));
      g.uv_offset = g.stride * height;
      g.size = uint64_t{g.stride} * height * 3 / 2;
      break;
    case Format::kGray8:
    case Format::kRGB8:
    case Format::kBGR8:
    case Format::kRaw16:
      g.stride = static_cast<uint32_t>(align_up(uint64_t{width} * bytes_per_pixel(format), kStrideAlign));
      g.size = uint64_t{g.stride} * height;
      break;
    default:
      invalid("unknown pixel format " + std::to_string(static_cast<uint32_t>(format)));
  }
  return g;
}

Geometry custom_geometry(uint32_t width, uint32_t height, uint64_t size, uint32_t stride, uint32_t uv_offset) {
  check_dimensions(width, height);
  Geometry g{Format::kCustom, width, height, stride, uv_offset, size};
  const std::string problem = geometry_problem(g);
  if (!problem.empty()) invalid(problem);
  return g;
}

std::string geometry_problem(const Geometry& g) {
  if (g.width == 0 || g.height == 0 || g.width > kMaxDimension || g.height > kMaxDimension) return "bad frame size";
  if (g.size == 0 || g.size > kMaxBufferSize) return "buffer size must be 1.." + std::to_string(kMaxBufferSize);
  if (g.stride == 0) return "stride must be positive";
  if (g.format == Format::kCustom) {
    if (g.stride < g.width) return "stride is smaller than the width";
    if (uint64_t{g.stride} * g.height > g.size) return "stride * height exceeds the buffer size";
    if (g.uv_offset > g.size) return "uv_offset lies outside the buffer";
    return "";
  }
  const auto format = static_cast<uint32_t>(g.format);
  if (format >= static_cast<uint32_t>(Format::kCustom)) return "unknown pixel format";
  Geometry expect;
  try {
    expect = make_geometry(g.format, g.width, g.height);
  } catch (const common::Error& e) {
    return e.what();
  }
  if (expect.stride != g.stride || expect.uv_offset != g.uv_offset || expect.size != g.size) {
    return "layout does not match the documented one for the format";
  }
  return "";
}

const char* format_name(Format f) {
  const auto i = static_cast<uint32_t>(f);
  return i <= static_cast<uint32_t>(Format::kCustom) ? kFormats[i].name : "unknown";
}

bool parse_format(const std::string& name, Format& out) {
  for (const FormatInfo& info : kFormats) {
    if (name == info.name) {
      out = info.format;
      return true;
    }
  }
  return false;
}

}  // namespace vipc::visionipc
