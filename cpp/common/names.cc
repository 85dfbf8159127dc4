#include "common/names.h"

#include <cstdio>

#include "common/errors.h"

namespace vipc::common {

namespace {

bool name_char(char ch) { return kNameCharacters.find(ch) != std::string_view::npos; }

}  // namespace

std::string escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (byte < 0x20 || byte >= 0x7f || ch == '\\') {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", byte);
      out += hex;
    } else {
      out += ch;
    }
  }
  return out;
}

std::string run_segment_prefix(std::string_view prefix) {
  std::string out(kSegmentPrefix);
  if (!prefix.empty()) out.append(prefix).push_back('@');
  return out;
}

void check_name(std::string_view kind, std::string_view name, size_t max_length) {
  const std::string what(kind);
  if (name.empty()) fail(ErrorKind::kInvalidArgument, what + " must not be empty");
  if (name.size() > max_length) {
    fail(ErrorKind::kInvalidArgument, what + " '" + escaped(name.substr(0, 40)) + "'... is " +
                                          std::to_string(name.size()) + " characters long (at most " +
                                          std::to_string(max_length) + ")");
  }
  bool ok = name[0] != '.' && name.find("..") == std::string_view::npos;
  for (const char ch : name) ok = ok && name_char(ch);
  if (!ok) {
    fail(ErrorKind::kInvalidArgument, what + " '" + escaped(name) +
                                          "' may only use letters, digits and _ . : - (no '/', no '..', not "
                                          "starting with '.')");
  }
}

}  // namespace vipc::common
