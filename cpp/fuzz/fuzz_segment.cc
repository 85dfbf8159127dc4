// Fuzz target: attaching to a segment file another process wrote
// (cpp/msgq/segment.cc, stats.cc, subscriber.cc, publisher.cc). The input
// becomes the file; a second open file description holds the presence lock,
// so the file counts as in use and must be adopted or refused (never
// silently re-initialised). Then msgq-top's read-only snapshot, a
// subscriber's attach and reads, and a publisher's attach and send run on it.
// Everything must end in data or an vipc::common::Error, never a crash or a read
// outside the mapping.
//
// Input: [flags][file size selector][file bytes...]
//   flags bit 0: stamp a valid identity (magic, version, sizes) over the
//   header so the fuzzer spends its time past the identity checks.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/files.h"
#include "fuzz_input.h"
#include "msgq/layout.h"
#include "msgq/publisher.h"
#include "msgq/segment.h"
#include "msgq/stats.h"
#include "msgq/subscriber.h"

namespace {

using namespace vipc::msgq;

std::string g_dir;
constexpr const char* kName = "msgq@fuzz@topic";

struct Sink {
  std::vector<uint8_t> bytes;
  char* prepare(size_t n) {
    bytes.assign(n, 0);
    return reinterpret_cast<char*>(bytes.data());
  }
  void discard() { bytes.clear(); }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_dir = fuzz::make_temp_dir();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t flags = in.take<uint8_t>();
  // Mostly a plausible segment size (header + 4 KiB or 8 KiB ring), sometimes anything small.
  const uint8_t size_sel = in.take<uint8_t>();
  size_t file_size = size_sel < 128   ? kHeaderSize + kMinDataSize
                     : size_sel < 224 ? kHeaderSize + 2 * kMinDataSize
                                      : size_sel * 97u;
  if (flags & 2) file_size += 64;  // a size the header cannot match
  std::vector<uint8_t> file(file_size, 0);
  in.fill(file.data(), file.size());
  if ((flags & 1) && file_size >= sizeof(SegmentHeader)) {
    auto* h = reinterpret_cast<SegmentHeader*>(file.data());
    h->magic = kMagic;
    h->layout_version = kLayoutVersion;
    h->header_size = kHeaderSize;
    h->data_size = file_size - kHeaderSize;
    h->max_readers = kMaxReaders;
  }

  const std::string path = g_dir + "/" + kName;
  vipc::common::UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd || write(fd.get(), file.data(), file.size()) != static_cast<ssize_t>(file.size())) abort();
  vipc::common::ofd_lock(fd.get(), kLockPresence, false);  // "a live process uses it"

  SegmentSpec spec;
  spec.dir = g_dir;
  spec.basename = kName;
  try {
    (void)read_segment_stats(g_dir, kName);
  } catch (const vipc::common::Error&) {
  }
  try {
    Subscriber sub(spec, (flags & 4) != 0);
    Sink sink;
    for (int i = 0; i < 64 && sub.try_read(sink); i++) {
    }
  } catch (const vipc::common::Error&) {
  }
  if (flags & 8) {
    try {
      Publisher pub(spec);
      const uint8_t msg[24] = {1, 2, 3};
      pub.send(msg, sizeof(msg));
    } catch (const vipc::common::Error&) {
    }
  }
  unlink(path.c_str());
  return 0;
}
