// Fuzz target: the ring protocol (cpp/msgq/ring.h) against a hostile peer
// that controls every shared byte: the write pointer, last_message, the
// reader's slot (read pointer, validity), the reader mask and every size
// prefix in the ring. The ring lives on the heap at its exact size, so any
// read or write outside it is an AddressSanitizer report.
//
// Input: [data size selector][header words][slot][rounds of operations...]
// where each round either lets the hostile peer overwrite bytes of the ring
// or header, reads messages (plain or conflating), or publishes a message as
// an honest writer would after the hostile peer's scribbling.
#include <cstdint>
#include <cstring>
#include <new>

#include "common/errors.h"
#include "fuzz_input.h"
#include "msgq/layout.h"
#include "msgq/ring.h"

namespace {

using namespace vipc::msgq;

struct HeapSegment {
  explicit HeapSegment(uint32_t data_size) : data_size(data_size) {
    bytes = kHeaderSize + data_size;
    mem = static_cast<uint8_t*>(::operator new(bytes, std::align_val_t{kCacheLine}));
    std::memset(mem, 0, bytes);
    SegmentHeader& h = header();
    h.magic = kMagic;
    h.layout_version = kLayoutVersion;
    h.header_size = kHeaderSize;
    h.data_size = data_size;
    h.max_readers = kMaxReaders;
  }
  ~HeapSegment() { ::operator delete(mem, std::align_val_t{kCacheLine}); }
  SegmentHeader& header() { return *reinterpret_cast<SegmentHeader*>(mem); }
  uint8_t* data() { return mem + kHeaderSize; }
  RingView view() { return RingView{&header(), data(), data_size}; }

  uint32_t data_size;
  size_t bytes;
  uint8_t* mem;
};

constexpr int kMaxRounds = 64;
constexpr int kMaxReadsPerRound = 16;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  // Small rings wrap often: 4 KiB .. 20 KiB in 64-byte steps.
  const uint32_t data_size = kMinDataSize + 64u * (in.take<uint8_t>() % 257u);
  HeapSegment seg(data_size);
  SegmentHeader& h = seg.header();
  const uint32_t slot = in.take<uint8_t>() % kMaxReaders;
  h.write_pointer.store(in.take<uint64_t>(), std::memory_order_relaxed);
  h.last_message.store(in.take<uint64_t>(), std::memory_order_relaxed);
  h.reader_mask.store(in.take<uint64_t>() | (uint64_t{1} << slot), std::memory_order_relaxed);
  h.readers[slot].read_pointer.store(in.take<uint64_t>(), std::memory_order_relaxed);
  h.readers[slot].valid.store(in.take<uint8_t>() & 1, std::memory_order_relaxed);
  in.fill(seg.data(), in.take<uint16_t>() % (data_size + 1));  // initial ring contents

  RingReader reader(seg.view(), slot);
  if (in.take<uint8_t>() & 1) reader.reset();
  fuzz::ExactSink sink;
  for (int round = 0; round < kMaxRounds && !in.empty(); round++) {
    const uint8_t op = in.take<uint8_t>();
    try {
      switch (op % 6) {
        case 0: {  // the hostile peer writes a few bytes anywhere in the ring
          const uint32_t at = in.take<uint16_t>() % data_size;
          const uint32_t n = in.take<uint8_t>() % 65u;
          in.fill(seg.data() + at, n < data_size - at ? n : data_size - at);
          break;
        }
        case 1:  // ... or a size prefix (aligned, as a writer would place it)
          store_prefix(seg.data() + (in.take<uint16_t>() % (data_size / 8)) * 8, in.take<int64_t>());
          break;
        case 2:  // ... or the shared positions and flags
          h.write_pointer.store(in.take<uint64_t>(), std::memory_order_relaxed);
          h.readers[slot].valid.store(in.take<uint8_t>() & 1, std::memory_order_relaxed);
          break;
        case 3:
        case 4:  // read: plain (3) or conflating (4)
          for (int i = 0; i < kMaxReadsPerRound; i++) {
            if (reader.read(sink, op % 6 == 4) != ReadStatus::kMessage) break;
          }
          break;
        case 5: {  // an honest writer publishes after the scribbling (may refuse a corrupt pointer)
          RingWriter writer(seg.view());
          const size_t n = in.take<uint16_t>() % (max_message_size(data_size) + 1);
          uint8_t* dst = writer.reserve(n);
          std::memset(dst, op, n);
          writer.commit(n);
          break;
        }
      }
    } catch (const vipc::common::Error&) {
      // A corrupt segment is reported as an error: that is the contract.
    }
  }
  return 0;
}
