// Copying a frame into shared memory that other processes read.
#pragma once

#include <cstddef>

namespace vipc::common {

// Frames at least this large are copied with non-temporal (streaming) stores.
// A frame this size does not stay in the caches for its reader anyway (it is
// read on another core, usually after more frames have been written), and
// streaming stores skip reading each destination line before writing it. On our
// 2-vCPU EPYC VM (L2 1 MiB per core, L3 8 MiB): 1080p NV12 (3.1 MB) 5.7 -> 16
// GB/s, 4K NV12 (12.4 MB) 5.2 -> 7.5 GB/s; at 1 MiB a copy then read back on
// the same core was slower (the lines were in L2), hence the threshold.
inline constexpr size_t kStreamingCopyMin = size_t{2} << 20;

// Copies n bytes (the ranges must not overlap). Ordering contract: every byte
// is written (visible to other cores) before any store the caller makes after
// the call returns; a release store that publishes the frame may follow it
// directly (streaming stores are fenced before returning).
void copy_frame(void* dst, const void* src, size_t n);

}  // namespace vipc::common
