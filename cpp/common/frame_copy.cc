#include "common/frame_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#include <emmintrin.h>
#define VIPC_STREAMING_COPY 1
#endif

namespace vipc::common {

void copy_frame(void* dst, const void* src, size_t n) {
#ifdef VIPC_STREAMING_COPY
  // (Sanitizer builds take memcpy: the sanitizers see the bytes it writes.)
  if (n >= kStreamingCopyMin) {
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;  // up to a 16-byte boundary
    std::memcpy(d, s, head);
    d += head, s += head, n -= head;
    size_t k = 0;
    for (; k + 64 <= n; k += 64) {  // one cache line per iteration
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + k), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + k + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + k + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + k + 48), e);
    }
    std::memcpy(d + k, s + k, n - k);
    // Streaming stores are weakly ordered, even against later plain stores (which
    // x86 otherwise keeps in order): the fence orders them before the publish.
    _mm_sfence();
    return;
  }
#endif
  if (n != 0) std::memcpy(dst, src, n);
}

}  // namespace vipc::common
